"""``MongoLocker``: argument handling around the native lock
(``mongolock::Lock``); every acquire, release, renewal and read runs in Rust,
with the GIL released."""

from datetime import datetime, timedelta, timezone

from . import _native
from ._connection import ArgumentError, check_key, check_timeout, check_ttl, merge_db, resolve

LockExists = _native.LockExists
AcquireTimeout = _native.AcquireTimeout
ForeignLock = _native.ForeignLock
CoordinationError = _native.CoordinationError

# Defined in the extension as `_native.X`, a module that cannot be imported by
# that name: named from the package instead, so that they pickle (a LockExists
# raised in a multiprocessing worker reaches the parent), as the seed's do.
for _exc in (LockExists, AcquireTimeout, ForeignLock, CoordinationError):
    _exc.__module__ = "mongoelector"
del _exc


class TimeOffsetError(Exception):
    """The clock offset between this host and the server is above ``maxoffset``."""


def _utcnow():
    return datetime.now(tz=timezone.utc)


def _utc(ms):
    """A store time (epoch ms) as an aware UTC datetime."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)


def _instance(owner):
    """The instance id in an owner string ``host/pid/instance/seq``."""
    parts = owner.rsplit("/", 2)
    return parts[1] if len(parts) == 3 else owner


class MongoLocker:
    """Distributed lock backed by MongoDB, with the seed's API.

    ``dbconn`` is a pymongo ``MongoClient`` (then ``dbname`` names the
    database) or a ``Database`` (as mongoelector 1.0.2, which also names it
    ``db=``); see
    ``mongoelector._connection`` for how the address is found.
    """

    def __init__(
        self,
        key,
        dbconn=None,
        dbname="mongoelector",
        dbcollection="mongolocker",
        ttl=600,
        timeparanoid=True,
        maxoffset=0.5,
        *,
        db=None,
        uri=None,
        step=0.25,
    ):
        dbconn = merge_db(dbconn, db)
        check_key(key)
        check_ttl(ttl)
        address, database = resolve(dbconn, dbname, uri)
        self.key = key
        self.timeparanoid = timeparanoid
        self.ts_expire = None
        self._ttl = ttl
        self._maxoffset = maxoffset
        self._sanetime = None
        self._dbname = database
        self._collection = dbcollection
        self._lock = _native.NativeLock(address, database, dbcollection, key, float(ttl), float(step))

    @property
    def uuid(self):
        """This instance's id (a new one in a forked child, which does not
        share the parent's acquisition)."""
        return self._lock.instance

    @property
    def host(self):
        return self._lock.host

    @property
    def pid(self):
        return self._lock.pid

    def __repr__(self):
        return "MongoLocker(key=%r, uuid=%r, host=%r, owned=%r)" % (self.key, self.uuid, self.host, self.owned())

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.release()
        return False

    @property
    def status(self):
        s = self._lock.status()
        holder = s["holder"]
        mine = bool(s["owned"])
        return {
            "uuid": self.uuid,
            "key": self.key,
            "ttl": self._ttl,
            "timestamp": _utc(s["now_ms"]),
            "host": self.host,
            "pid": self.pid,
            "lock_owned": mine,
            "lock_created": _utc(holder["since_ms"]) if mine else None,
            "lock_expires": _utc(holder["expires_ms"]) if mine else None,
            "fence": holder["fence"] if holder else None,
            "last_fence": s["last_fence"],
        }

    @staticmethod
    def _acquireretry(blocking, start, timeout, count):
        """The seed's retry rule, kept for compatibility (the Rust lock waits
        on its own): the first attempt always; then, if blocking, until
        ``timeout`` seconds after ``start``."""
        if not blocking and timeout:
            raise ValueError("blocking=False is incompatible with a timeout")
        if count == 0:
            return True
        if not blocking:
            return False
        if timeout is None:
            return True
        now = _utcnow() if start.tzinfo is not None else _utcnow().replace(tzinfo=None)
        return (now - start) <= timedelta(seconds=timeout)

    def _verifytime(self):
        """Checks that this host's clock is within ``maxoffset`` seconds of the
        server's. Leases never depend on it (they are measured on the server's
        clock); it is kept as the seed's sanity check."""
        now = _utcnow()
        if self._sanetime and self._sanetime > now - timedelta(minutes=10):
            return True
        offset = abs(self._lock.clock_offset_ms()) / 1000.0
        if offset > self._maxoffset:
            raise TimeOffsetError("Clock offset vs MongoDB is too high: %ss" % round(offset, 2))
        self._sanetime = now
        return True

    def acquire(self, blocking=True, timeout=None, step=0.25, force=False):
        """Acquires the lock; True once acquired. ``LockExists`` when not
        blocking and held; ``AcquireTimeout`` after ``timeout`` seconds;
        ``force`` takes it from any holder. Waiters are woken by the release
        or at the observed expiry; ``step`` is accepted for compatibility."""
        if not blocking and timeout:
            raise ValueError("blocking=False is incompatible with a timeout")
        timeout = check_timeout(timeout)
        if self.timeparanoid:
            self._verifytime()
        holder = self._lock.acquire(bool(blocking), timeout, bool(force))
        self.ts_expire = _utc(holder["expires_ms"])
        return True

    def locked(self):
        """Whether any instance holds the lock now."""
        return self._lock.locked()

    def owned(self):
        """Whether this instance holds the lock now."""
        return self._lock.owned()

    def get_current(self):
        """The live lock, whoever holds it, or None."""
        h = self._lock.get_current()
        if h is None:
            return None
        return {
            "_id": self.key,
            "locked": True,
            "host": h["host"],
            "pid": h["pid"],
            "uuid": _instance(h["owner"]),
            "owner": h["owner"],
            "ts_created": _utc(h["since_ms"]),
            "ts_expire": _utc(h["expires_ms"]),
            "fence": h["fence"],
        }

    def release(self, force=False):
        """Releases the lock if this instance holds it; with ``force``
        (CAUTION), whoever holds it."""
        self._lock.release(bool(force))

    def touch(self):
        """Renews the lease; the new expiry, or None when not held."""
        ms = self._lock.touch()
        if ms is None:
            return None
        self.ts_expire = _utc(ms)
        return self.ts_expire

