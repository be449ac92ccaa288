"""``MongoElector`` (the seed) and ``MongoLeaderElector`` (upstream 1.0.2):
argument handling around the native elector (``mongoelector::Elector``); the
campaign, renewal and status reports run in Rust, the callbacks on Python
daemon threads that it starts (see ``python/src/callbacks.rs``)."""

import logging
import threading
from datetime import datetime, timezone

from . import _native
from ._connection import check_key, check_ttl, merge_db, resolve

log = logging.getLogger(__name__)

#: ``shared`` of the callback this thread runs, if any (see ``_threaded``).
_running = threading.local()


def _utc(ms):
    return None if ms is None else datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)


class _Shared:
    """What an elector's callbacks share with it. Never the elector itself:
    the native elector holds the callbacks, and a cycle through Rust is one
    that Python's collector cannot see."""

    def __init__(self):
        #: A release or stop ended the term: its ``on_leader_loss`` is logged
        #: as upstream 1.0.2 logs one fired by ``release()``.
        self.releasing = False


def _threaded(callback, name, shared):
    """``callback`` as the native elector calls it: ``start(done)`` runs it on
    a daemon thread of its own, logs its exceptions as upstream 1.0.2 does
    (logger ``mongoelector.elector``, ``Error in <name> callback``), then calls
    ``done()``, which the elector waits for (never on its renewal path)."""
    if callback is None:
        return None

    def run(done):
        label = name
        if name == "on_leader_loss" and shared.releasing:
            shared.releasing = False
            label = "on_leader_loss during release"
        _running.shared = shared
        try:
            callback()
        except Exception:
            log.exception("Error in %s callback", label)
        finally:
            _running.shared = None
            done()

    def start(done):
        threading.Thread(target=run, args=(done,), name="mongoelector-" + name, daemon=True).start()

    return start


class MongoLeaderElector:
    """Leader election backed by MongoDB.

    Accepts the seed's arguments (``dbconn``, ``dbname``, ``onmaster``,
    ``onmasterloss``, ``onloop``) and upstream 1.0.2's (a ``Database``, also as ``db=``,
    ``on_leader``, ``on_leader_loss``, ``on_loop``, ``app_version``).
    """

    def __init__(
        self,
        key,
        dbconn=None,
        dbname="mongoelector",
        ttl=15,
        onmaster=None,
        onmasterloss=None,
        onloop=None,
        report_status=True,
        *,
        db=None,
        on_leader=None,
        on_leader_loss=None,
        on_loop=None,
        app_version=None,
        uri=None,
    ):
        dbconn = merge_db(dbconn, db)
        check_key(key)
        check_ttl(ttl)
        address, database = resolve(dbconn, dbname, uri)
        self.key = key
        self.ttl = ttl
        self._report_status = bool(report_status)
        self._app_version = app_version
        self.callback_on_leader = on_leader or onmaster
        self.callback_on_leader_loss = on_leader_loss or onmasterloss
        self.callback_on_loop = on_loop or onloop
        self._shared = _Shared()
        self._elector = _native.NativeElector(
            address,
            database,
            key,
            float(ttl),
            _threaded(self.callback_on_leader, "on_leader", self._shared),
            _threaded(self.callback_on_leader_loss, "on_leader_loss", self._shared),
            _threaded(self.callback_on_loop, "on_loop", self._shared),
            self._report_status,
            None if app_version is None else str(app_version),
        )

    @property
    def uuid(self):
        """This instance's id (a new one in a forked child)."""
        return self._elector.instance

    def __repr__(self):
        leader = "leader" if self.is_leader else "follower"
        running = "running" if self.running else "stopped"
        return "%s(key=%r, %s, %s, uuid=%r)" % (type(self).__name__, self.key, leader, running, self.uuid)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.stop()
        return False

    def start(self, blocking=False):
        """Starts the election in the background and returns; with
        ``blocking``, returns only after ``stop()`` (from another thread, or
        a callback) or Ctrl-C."""
        self._shared.releasing = False
        if blocking:
            self._elector.run()
        else:
            self._elector.start()

    def stop(self):
        """Stops, and surrenders leadership at once (``on_leader_loss`` has run
        when this returns, unless it takes longer than the ttl). Called from
        one of this elector's callbacks, it does not wait for them (they wait
        for the caller): it returns once the elector is stopped, and the
        release and ``on_leader_loss`` follow."""
        inside = getattr(_running, "shared", None) is self._shared
        self._shared.releasing = self._elector.is_leader()
        self._elector.stop(not inside)
        if not inside:
            self._shared.releasing = False

    def poll(self):
        """One round by hand: renew or campaign once, then ``on_loop``, then
        the status report. After ``stop()`` it never campaigns."""
        self._elector.poll()

    def release(self):
        """Releases leadership if held (calling ``on_leader_loss``); the
        election keeps running and campaigns again later."""
        self._shared.releasing = True
        if not self._elector.release():
            self._shared.releasing = False

    @property
    def is_leader(self):
        """Whether this instance leads."""
        return self._elector.is_leader()

    ismaster = is_leader

    @property
    def leader_exists(self):
        """Whether any instance leads now."""
        return self._elector.leader_exists()

    master_exists = leader_exists

    @property
    def running(self):
        """Whether the election runs in the background."""
        return self._elector.running()

    @property
    def node_status(self):
        s = self._elector.node_status()
        status = {
            "_id": self.uuid,
            "uuid": self.uuid,
            "node": s["node"],
            "key": self.key,
            "ttl": self.ttl,
            "timestamp": datetime.now(tz=timezone.utc),
            "host": s["host"],
            "pid": s["pid"],
            "is_leader": s["is_leader"],
            "ismaster": s["is_leader"],
            "lock_owned": s["is_leader"],
            "elector_running": s["running"],
            "fence": s["fence"],
            "terms_won": s["terms_won"],
            "last_poll": _utc(s["last_round_ms"]),
        }
        if self._app_version:
            status["app_version"] = self._app_version
        return status

    @property
    def cluster_detail(self):
        c = self._elector.cluster_detail()
        members = [
            {
                "key": n["key"],
                "node": n["node"],
                "host": n["host"],
                "pid": n["pid"],
                "app_version": n["version"],
                "is_leader": n["is_leader"],
                "timestamp": _utc(n["last_round_ms"]),
            }
            for n in c["nodes"]
        ]
        leader = c["leader"]
        return {
            "member_detail": members,
            "leader": None
            if leader is None
            else {
                "host": leader["host"],
                "process_id": leader["pid"],
                "uuid": leader["owner"].rsplit("/", 2)[1] if leader["owner"].count("/") >= 2 else leader["owner"],
                "fence": leader["fence"],
            },
            "timestamp": _utc(c["now_ms"]),
        }

    def report_status(self):
        """Upserts this instance's status document now."""
        self._elector.report_status()


class MongoElector(MongoLeaderElector):
    """The seed's name for ``MongoLeaderElector``."""
