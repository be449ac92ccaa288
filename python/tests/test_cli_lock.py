"""A lock held through the CLI (`mongocoord lock KEY -- CMD`) excludes a
Python `MongoLocker` on the same key and collection, and the other way round
(the CLI waits, or with `--timeout` gives up with exit status 74)."""

import subprocess
import threading
import time

import pytest

from mongoelector import AcquireTimeout, LockExists, MongoLocker

#: `mongocoord lock --timeout`: exit status when it gave up.
EXIT_TIMEOUT = 74


def cli(mongocoord, uri, db_name, *args):
    return [mongocoord, "--uri", uri, "--db", db_name, *args]


def test_a_lock_held_by_the_cli_excludes_python(mongocoord, uri, client, db_name, tmp_path, wait_until):
    held, go = tmp_path / "held", tmp_path / "go"
    script = 'echo "$MONGOCOORD_FENCE" > %s.tmp && mv %s.tmp %s; while [ ! -e %s ]; do sleep 0.05; done' % (
        held,
        held,
        held,
        go,
    )
    args = ["lock", "cli-first", "--collection", "sharedlocks", "--ttl", "10", "--", "sh", "-c", script]
    runner = subprocess.Popen(cli(mongocoord, uri, db_name, *args), stderr=subprocess.PIPE, text=True)
    try:
        wait_until(held.exists, 30, "the CLI to hold the lock and run its command")
        cli_fence = int(held.read_text())
        lock = MongoLocker("cli-first", client, dbname=db_name, dbcollection="sharedlocks", ttl=10)
        with pytest.raises(LockExists):
            lock.acquire(blocking=False)
        with pytest.raises(AcquireTimeout):
            lock.acquire(timeout=1)
        assert lock.locked() and not lock.owned()
        current = lock.get_current()
        assert current["fence"] == cli_fence and current["pid"] == runner.pid, current

        # A blocking acquire waits for the CLI to let go, and no longer.
        got = {}

        def acquire():
            lock.acquire(timeout=30)
            got["at"] = time.monotonic()

        waiter = threading.Thread(target=acquire)
        waiter.start()
        time.sleep(0.5)
        assert not got, "acquired while the CLI held the lock"
        released = time.monotonic()
        go.touch()
        assert runner.wait(timeout=30) == 0, runner.stderr.read()
        waiter.join(35)
        assert "at" in got, "the Python acquire did not get the lock after the CLI let go"
        assert got["at"] - released < 10
        assert lock.owned() and lock.status["fence"] > cli_fence
        lock.release()
    finally:
        go.touch()
        if runner.poll() is None:
            runner.kill()
            runner.wait()


def test_a_lock_held_by_python_excludes_the_cli(mongocoord, uri, client, db_name, tmp_path, wait_until):
    # The default collections agree: Python's `dbcollection` and the CLI's
    # `--collection` are both `mongolocker`.
    lock = MongoLocker("python-first", client, dbname=db_name, ttl=10)
    lock.acquire(blocking=False)
    python_fence = lock.status["fence"]
    ran = tmp_path / "ran"
    command = ["sh", "-c", 'echo "$MONGOCOORD_FENCE" > %s.tmp && mv %s.tmp %s' % (ran, ran, ran)]

    # With --timeout the CLI gives up, and never runs its command.
    started = time.monotonic()
    done = subprocess.run(
        cli(mongocoord, uri, db_name, "lock", "python-first", "--timeout", "1", "--", *command),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_TIMEOUT, (done.returncode, done.stderr)
    assert time.monotonic() - started >= 1
    assert not ran.exists(), "the CLI ran its command while Python held the lock"
    assert lock.owned()

    # Without, it waits until Python lets go, then runs it.
    runner = subprocess.Popen(
        cli(mongocoord, uri, db_name, "lock", "python-first", "--", *command), stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(1.5)
        assert runner.poll() is None and not ran.exists(), "the CLI did not wait for the Python holder"
        lock.release()
        assert runner.wait(timeout=30) == 0, runner.stderr.read()
        assert ran.exists() and int(ran.read_text()) > python_fence
        assert not lock.locked(), "the CLI did not release the lock after its command"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
