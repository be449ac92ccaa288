"""A child forked from a parent that already used the package (multiprocessing's
default `fork` start method on Linux) gets a working runtime of its own."""

import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is the default on Linux")


def test_a_forked_child_locks_and_elects(run_python):
    done = run_python(
        """
        import multiprocessing, warnings
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        ctx = multiprocessing.get_context("fork")

        # The parent uses the package first: its runtime, store and elector
        # threads are running when it forks; it holds a lock across the fork.
        used = MongoLocker("fork-used", db, ttl=30)
        assert used.acquire(blocking=False)
        used.release()
        held = MongoLocker("fork-held", db, ttl=30)
        held.acquire(blocking=False)
        parent_held_uuid = held.uuid
        events = []
        elector = MongoLeaderElector("fork-parent-election", db, ttl=6, on_leader=lambda: events.append("leader"))
        elector.start()
        until(lambda: elector.is_leader, 20, "the parent's leadership")

        def child():
            # New objects in the child.
            lock = MongoLocker("fork-child", db, ttl=30)
            assert lock.acquire(blocking=False)
            assert lock.owned()
            lock.release()
            assert not lock.locked()
            # Objects made before the fork are the child's own, not the parent's.
            assert used.acquire(blocking=False) and used.owned()
            used.release()
            assert held.locked() and not held.owned(), "the child must not own the parent's lease"
            assert held.uuid != parent_held_uuid
            held.release()          # nothing of the child's to release
            assert not elector.running and not elector.is_leader
            assert elector.leader_exists
            # A new elector in the child: elected, callbacks run, stopped.
            seen = []
            mine = MongoLeaderElector(
                "fork-child-election", db, ttl=6,
                on_leader=lambda: seen.append("leader"), on_leader_loss=lambda: seen.append("loss"),
            )
            mine.start()
            until(lambda: mine.is_leader and "leader" in seen, 20, "the child's leadership")
            mine.stop()
            assert seen == ["leader", "loss"], seen
            assert not mine.leader_exists

        p = ctx.Process(target=child)
        p.start()
        p.join(60)
        assert p.exitcode == 0, "the forked child failed (exit %s)" % p.exitcode

        # A pool of forked workers, each taking the same lock in turn.
        def work(i):
            lock = MongoLocker("fork-pool", db, ttl=30)
            lock.acquire(timeout=20)
            try:
                return os.getpid()
            finally:
                lock.release()

        with ctx.Pool(2) as pool:
            pids = pool.map(work, range(6))
        assert len(pids) == 6 and os.getpid() not in pids

        # The parent is unharmed: its lease, its leadership, its runtime.
        assert held.owned(), "the child released the parent's lock"
        assert elector.is_leader and elector.running and events == ["leader"]
        held.release()
        assert used.acquire(blocking=False)
        used.release()
        elector.stop()
        out("OK")
        """,
        timeout=120,
    )
    assert done.stdout.strip().endswith("OK"), done.stdout + done.stderr
