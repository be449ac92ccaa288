"""Ctrl-C (SIGINT, KeyboardInterrupt) interrupts a blocking wait promptly."""

import os
import signal
import subprocess
import sys
import time

from mongoelector import MongoLocker


def sigint_as_python_starts_it():
    """The child's SIGINT at its default, so Python installs its handler: a
    shell that starts a job in the background without job control (`cmd &`)
    hands its children SIGINT ignored, and Python then never raises
    KeyboardInterrupt, whatever the package does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


WAITER = """
import os, sys, time
import pymongo
from mongoelector import MongoLeaderElector, MongoLocker
db = pymongo.MongoClient(os.environ["MONGOELECTOR_TEST_URI"])[os.environ["MONGOELECTOR_TEST_DB"]]
what = sys.argv[1]
if what == "acquire":
    lock = MongoLocker("interrupted", db, ttl=60)
    wait = lock.acquire              # blocking=True, no timeout
else:
    elector = MongoLeaderElector("interrupted-election", db, ttl=30)
    wait = lambda: elector.start(blocking=True)
print("WAITING", flush=True)
try:
    wait()
except KeyboardInterrupt:
    print("INTERRUPTED", time.monotonic(), flush=True)
    sys.exit(0)
print("RETURNED", flush=True)
sys.exit(1)
"""


def interrupt(uri, db_name, what):
    """Starts a child blocked in `what`, sends it SIGINT; returns (seconds
    from the signal to the KeyboardInterrupt, its stdout)."""
    child = subprocess.Popen(
        [sys.executable, "-c", WAITER, what],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, MONGOELECTOR_TEST_URI=uri, MONGOELECTOR_TEST_DB=db_name),
        preexec_fn=sigint_as_python_starts_it,
    )
    try:
        assert child.stdout.readline().strip() == "WAITING"
        # Well inside the blocking call by now.
        time.sleep(1.5)
        assert child.poll() is None, "the child did not block: %s" % child.communicate(timeout=5)[1]
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        raise AssertionError("SIGINT did not interrupt %s within 10 s\n%s%s" % (what, out, err)) from None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, "exit %s\n%s%s" % (child.returncode, out, err)
    line = [w for w in out.splitlines() if w.startswith("INTERRUPTED")]
    assert line, out + err
    return float(line[0].split()[1]) - sent, out


def test_ctrl_c_interrupts_a_blocking_acquire(uri, db, db_name):
    holder = MongoLocker("interrupted", db, ttl=60)
    holder.acquire(blocking=False)
    try:
        took, _ = interrupt(uri, db_name, "acquire")
        assert took < 2.0, "KeyboardInterrupt came %.2fs after SIGINT" % took
        # The interrupted acquire took nothing, then or later.
        assert holder.owned()
    finally:
        holder.release()
    time.sleep(0.5)
    assert not holder.locked(), "the interrupted waiter took the lock after its holder let go"


def test_ctrl_c_interrupts_start_blocking(uri, db_name):
    took, _ = interrupt(uri, db_name, "start")
    assert took < 2.0, "KeyboardInterrupt came %.2fs after SIGINT" % took


def test_an_uncaught_interrupt_ends_the_process_as_python_does(uri, db, db_name):
    """Uncaught, the KeyboardInterrupt ends the process as Python's own does
    (status -SIGINT), without a crash or a hang."""
    holder = MongoLocker("interrupted", db, ttl=60)
    holder.acquire(blocking=False)
    script = (
        "import os, pymongo\n"
        "from mongoelector import MongoLocker\n"
        "db = pymongo.MongoClient(os.environ['MONGOELECTOR_TEST_URI'])[os.environ['MONGOELECTOR_TEST_DB']]\n"
        "lock = MongoLocker('interrupted', db, ttl=60)\n"
        "print('WAITING', flush=True)\n"
        "lock.acquire()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, MONGOELECTOR_TEST_URI=uri, MONGOELECTOR_TEST_DB=db_name),
        preexec_fn=sigint_as_python_starts_it,
    )
    try:
        assert child.stdout.readline().strip() == "WAITING"
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        holder.release()
    assert child.returncode == -signal.SIGINT, "exit status %s\n%s" % (child.returncode, err)
    assert "KeyboardInterrupt" in err
    assert "Fatal Python error" not in err and "panicked" not in err, err
