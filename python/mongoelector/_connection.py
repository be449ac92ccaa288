"""Where to connect: the seed passes a pymongo ``MongoClient`` (or, as upstream
1.0.2, a ``Database``), but the locking runs in Rust on a client of its own,
and pymongo has no public accessor for a client's URI. So:

1. ``uri=`` when given;
2. else, for a plain deployment (no credentials, no TLS, not load balanced),
   the address rebuilt from the client's topology (its seeds, replica set
   name, ``directConnection``, ``retryWrites``, server selection timeout);
3. else ``MONGODB_URI``;
4. else ``ArgumentError``.
"""

import os
from urllib.parse import quote

from pymongo.database import Database
from pymongo.mongo_client import MongoClient


class ArgumentError(TypeError, ValueError):
    """A missing or wrong argument. Both a ``TypeError`` and a ``ValueError``:
    mongoelector 0.5 raised ``ValueError`` here and 1.0.2 ``TypeError``."""


def _split(dbconn):
    """(client, database name or None) of a MongoClient or a Database."""
    if dbconn is None:
        return None, None
    # isinstance, not hasattr: a MongoClient answers every attribute name with
    # a Database of that name.
    if isinstance(dbconn, Database):
        return dbconn.client, dbconn.name
    if isinstance(dbconn, MongoClient):
        return dbconn, None
    raise ArgumentError("dbconn must be a pymongo MongoClient or Database, not %s" % type(dbconn).__name__)


def _plain_uri(client):
    """The client's address as a URI, or None when it is not a plain deployment."""
    opts = client.options
    pool = opts.pool_options
    if getattr(pool, "_credentials", None) is not None or getattr(pool, "_ssl_context", None) is not None:
        return None
    if getattr(opts, "load_balanced", False):
        return None
    seeds = list(client.topology_description.server_descriptions().keys()) or list(client.nodes)
    if not seeds:
        return None
    hosts = ",".join(_host(h, p) for h, p in seeds)
    params = []
    if opts.replica_set_name:
        params.append("replicaSet=" + quote(opts.replica_set_name, safe=""))
    if getattr(opts, "direct_connection", False):
        params.append("directConnection=true")
    if opts.retry_writes is False:
        params.append("retryWrites=false")
    sst = getattr(opts, "server_selection_timeout", None)
    if sst is not None:
        params.append("serverSelectionTimeoutMS=%d" % int(sst * 1000))
    return "mongodb://%s/%s" % (hosts, ("?" + "&".join(params)) if params else "")


def _host(host, port):
    """One seed of a URI: ``host:port``, ``[v6]:port``, or a Unix socket's
    path, percent-encoded (pymongo gives it no port)."""
    if port is None or host.endswith(".sock"):
        return quote(host, safe="")
    return ("[%s]:%d" % (host, port)) if ":" in host else ("%s:%d" % (host, port))


#: What MongoDB (and pymongo) refuse in a database name.
_BAD_DB_CHARS = frozenset('/\\. "$\x00')


def check_dbname(name):
    """A bad database name is a bad argument, as pymongo's ``InvalidName``."""
    if not isinstance(name, str) or not name:
        raise ArgumentError("dbname must be a non-empty string")
    if _BAD_DB_CHARS.intersection(name) or len(name.encode()) >= 64:
        raise ArgumentError("invalid database name %r: no / \\ . space \" $ or NUL, under 64 bytes" % name)


def merge_db(dbconn, db):
    """``dbconn`` (the seed's name, positional) or ``db=`` (upstream 1.0.2's
    name), not both."""
    if db is None:
        return dbconn
    if dbconn is not None:
        raise ArgumentError("pass dbconn or db, not both")
    return db


def check_timeout(timeout):
    """None, or a finite non-negative number of seconds (NaN is refused, as
    the seed's ``timedelta(seconds=nan)`` refuses it)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ArgumentError("timeout must be a non-negative number of seconds")
    return float(timeout)


def resolve(dbconn, dbname, uri):
    """(uri, database name) for ``dbconn`` (a MongoClient, a Database or None)."""
    client, db_name = _split(dbconn)
    if db_name is None:
        db_name = dbname or "mongoelector"
    check_dbname(db_name)
    if uri:
        return uri, db_name
    if client is not None:
        rebuilt = _plain_uri(client)
        if rebuilt:
            return rebuilt, db_name
    env = os.environ.get("MONGODB_URI")
    if env:
        return env, db_name
    if client is None:
        raise ArgumentError("must provide a pymongo connection (dbconn), uri= or MONGODB_URI")
    raise ArgumentError(
        "cannot rebuild the address of a client with credentials, TLS or a load balancer: pass uri= or set MONGODB_URI"
    )


def check_key(key):
    if not isinstance(key, str) or not key:
        raise ArgumentError("must provide a non-empty lock key (a string)")


def check_ttl(ttl):
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0:
        raise ArgumentError("ttl must be a positive number (seconds)")
