"""Adversarial review (#31): scenarios that held, kept as regression tests —
threads racing on one key (separate objects and one shared object), touch()
after expiry, forced acquire/release against another holder, and callbacks
that call back into their elector."""

import threading
import time

import pytest

from mongoelector import LockExists, MongoLeaderElector, MongoLocker


@pytest.mark.parametrize("shared", [False, True])
def test_review_never_two_holders_under_thread_races(db, shared):
    inside, most, rounds, errors = [0], [0], [0], []
    mu = threading.Lock()
    one = MongoLocker("race", db, ttl=5)

    def worker():
        lock = one if shared else MongoLocker("race", db, ttl=5)
        end = time.monotonic() + 4
        while time.monotonic() < end:
            try:
                lock.acquire(timeout=10)
            except Exception as e:  # noqa: BLE001 - recorded, fails below
                errors.append(repr(e))
                continue
            with mu:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                rounds[0] += 1
            time.sleep(0.005)
            with mu:
                inside[0] -= 1
            lock.release()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert most[0] == 1, "%d holders at once" % most[0]
    assert rounds[0] > 6


def test_review_touch_after_expiry_does_not_resurrect(db):
    lock = MongoLocker("expired", db, ttl=1)
    lock.acquire()
    time.sleep(1.6)
    assert lock.touch() is None
    assert not lock.owned()
    assert not lock.locked()


def test_review_force_against_another_holder(db):
    a = MongoLocker("forced", db, ttl=30)
    b = MongoLocker("forced", db, ttl=30)
    a.acquire()
    b.acquire(force=True)
    assert b.owned() and not a.owned()
    assert a.touch() is None
    a.release()  # not a's any more: a no-op
    assert b.owned()
    a.release(force=True)
    assert not b.owned() and not b.locked()
    assert b.touch() is None
    b.release()
    assert a.acquire(blocking=False)
    with pytest.raises(LockExists):
        b.acquire(blocking=False)
    a.release()


def test_review_callbacks_reenter_their_elector(db):
    """release() in on_leader, poll() and start() in on_loop, stop() from a
    thread a callback starts and joins: none deadlocks."""
    holder = {}
    seen = {"leader": 0, "loss": 0, "loop": 0}

    def on_leader():
        seen["leader"] += 1
        holder["e"].release()

    def on_loop():
        seen["loop"] += 1
        e = holder["e"]
        if seen["loop"] < 3:
            e.poll()
        e.start()

    def on_loss():
        seen["loss"] += 1

    holder["e"] = e = MongoLeaderElector("reenter", db, ttl=1, on_leader=on_leader, on_leader_loss=on_loss, on_loop=on_loop)
    e.start()
    deadline = time.monotonic() + 20
    while (seen["leader"] < 2 or seen["loop"] < 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    e.stop()
    assert time.monotonic() - t0 < 5
    assert seen["leader"] >= 2 and seen["loop"] >= 3, seen

    done = threading.Event()

    def stopping_leader():
        t = threading.Thread(target=holder["f"].stop)
        t.start()
        t.join(10)
        done.set()

    holder["f"] = f = MongoLeaderElector("reenter-2", db, ttl=2, on_leader=stopping_leader)
    f.start()
    assert done.wait(20), "stop() from a thread joined by on_leader deadlocked"
    deadline = time.monotonic() + 10
    while f.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not f.running and not f.is_leader
