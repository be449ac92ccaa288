"""Every call that waits on the server releases the GIL, and `stop()` never
deadlocks against a callback that needs it."""

import subprocess
import sys
import threading
import time
from urllib.parse import quote

import pytest

from mongoelector import AcquireTimeout, MongoLeaderElector, MongoLocker

#: How long the proxy holds each chunk the client sends: every round trip
#: through it takes at least this long.
DELAY = 0.15

PROXY = r"""
import socket, sys, threading, time
target = (sys.argv[1], int(sys.argv[2]))
delay = float(sys.argv[3])
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(64)
print(listener.getsockname()[1], flush=True)

def pump(src, dst, delay):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if delay:
                time.sleep(delay)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

while True:
    c, _ = listener.accept()
    s = socket.create_connection(target)
    threading.Thread(target=pump, args=(c, s, delay), daemon=True).start()
    threading.Thread(target=pump, args=(s, c, 0), daemon=True).start()
"""


@pytest.fixture
def slow_uri(client):
    """A URI to the test server through a proxy (another process) that delays
    every request by DELAY seconds."""
    host, port = client.address
    proc = subprocess.Popen(
        [sys.executable, "-c", PROXY, host, str(port), str(DELAY)], stdout=subprocess.PIPE, text=True
    )
    try:
        listen = int(proc.stdout.readline())
        creds = ""
        opts = client.options.pool_options
        cred = getattr(opts, "_credentials", None)
        if cred is not None:
            creds = "%s:%s@" % (quote(cred.username, safe=""), quote(cred.password, safe=""))
        yield "mongodb://%s127.0.0.1:%d/?directConnection=true&retryWrites=false&serverSelectionTimeoutMS=30000" % (
            creds,
            listen,
        )
    finally:
        proc.kill()
        proc.wait()


class Ticker:
    """Counts how often a Python thread gets to run while a call runs."""

    def __enter__(self):
        self.ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self.started = time.monotonic()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.ticks += 1
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.elapsed = time.monotonic() - self.started
        self._stop.set()
        self._thread.join(5)
        return False


def test_every_call_that_waits_on_the_server_releases_the_gil(slow_uri, db_name, client):
    held = []
    other = MongoLocker("gil-contended", client, dbname=db_name, timeparanoid=False)
    other.acquire(blocking=False)

    def measure(what, call):
        with Ticker() as t:
            result = call()
        # The call waited on the server (at least one delayed round trip), and
        # another Python thread ran meanwhile.
        held.append((what, round(t.elapsed, 3), t.ticks))
        assert t.elapsed >= DELAY * 0.9, "%s did not wait on the server (%.3fs)" % (what, t.elapsed)
        assert t.ticks >= 10, "%s held the GIL: another thread ran %d times in %.3fs" % (what, t.ticks, t.elapsed)
        return result

    lock = measure("MongoLocker()", lambda: MongoLocker("gil", None, dbname=db_name, uri=slow_uri, ttl=30))
    assert measure("acquire(blocking=False)", lambda: lock.acquire(blocking=False)) is True
    measure("touch()", lock.touch)
    assert measure("locked()", lock.locked) is True
    assert measure("owned()", lock.owned) is True
    assert measure("get_current()", lock.get_current)["uuid"] == lock.uuid
    assert measure("status", lambda: lock.status)["lock_owned"] is True
    measure("release()", lock.release)
    measure("acquire(force=True)", lambda: lock.acquire(force=True))
    measure("release(force=True)", lambda: lock.release(force=True))
    waiter = MongoLocker("gil-contended", None, dbname=db_name, uri=slow_uri, timeparanoid=False)
    with pytest.raises(AcquireTimeout):
        measure("acquire(timeout=0.5)", lambda: waiter.acquire(timeout=0.5))

    elector = MongoLeaderElector("gil-election", None, dbname=db_name, uri=slow_uri, ttl=10)
    try:
        measure("poll()", elector.poll)
        assert elector.is_leader
        assert measure("leader_exists", lambda: elector.leader_exists) is True
        assert measure("cluster_detail", lambda: elector.cluster_detail)["leader"] is not None
        measure("report_status()", elector.report_status)
        measure("release()", elector.release)
        assert not elector.is_leader
        elector.start()
        deadline = time.monotonic() + 20
        while not elector.is_leader and time.monotonic() < deadline:
            time.sleep(0.05)
        assert elector.is_leader
        measure("stop()", elector.stop)
        assert not elector.running
    finally:
        elector.stop()
        other.release()


def test_stop_waits_for_a_callback_that_needs_the_gil(run_python):
    # on_leader_loss runs Python for half a second (it needs the GIL all the
    # while); stop() from the main thread waits for it with the GIL released.
    # Held, stop() would give up only after the ttl (20 s) with the callback
    # unfinished.
    done = run_python(
        """
        finished = threading.Event()
        def busy():
            t0 = time.monotonic(); n = 0
            while time.monotonic() - t0 < 0.5:
                n += 1
            finished.set()
        e = MongoLeaderElector("gil-stop", db, ttl=20, on_leader_loss=busy, on_loop=lambda: sum(range(10000)))
        e.start()
        until(lambda: e.is_leader, 20, "leadership")
        t0 = time.monotonic()
        e.stop()
        took = time.monotonic() - t0
        assert finished.is_set(), "stop() returned before on_leader_loss finished"
        assert took < 5, "stop() took %.1fs" % took
        assert not e.running and not e.is_leader
        out("OK", round(took, 2))
        """,
        timeout=60,
    )
    assert done.stdout.startswith("OK"), done.stdout
