"""Interpreter exit with an elector left running: the process exits promptly,
no callback starts once shutdown began, nothing crashes or hangs."""

import time

import pytest

EXIT_WITH_RUNNING_ELECTOR = """
import atexit, os, sys, threading, time

def out(*words):
    os.write(1, (" ".join(str(w) for w in words) + "\\n").encode())

# Registered before the package is imported, so it runs after the package's
# own exit hook: from here on no callback may start.
atexit.register(lambda: out("SHUTDOWN"))

import gc
import pymongo
from mongoelector import MongoLeaderElector, MongoLocker

db = pymongo.MongoClient(os.environ["MONGOELECTOR_TEST_URI"])[os.environ["MONGOELECTOR_TEST_DB"]]
looping = threading.Event()

def callback(name, busy):
    def run():
        out("CB", name, "FINALIZING" if sys.is_finalizing() else "-")
        if busy:
            # Pure Python for two seconds: wants the GIL through the exit.
            looping.set()
            t0 = time.monotonic(); n = 0
            while time.monotonic() - t0 < 2:
                n += 1
    return run

# A short ttl: rounds (and on_loop) come often.
elector = MongoLeaderElector(
    "exit-election", db, ttl=1.5,
    on_leader=callback("leader", False),
    on_leader_loss=callback("loss", False),
    on_loop=callback("loop", True),
)
elector.start()
deadline = time.monotonic() + 20
while not elector.is_leader and time.monotonic() < deadline:
    time.sleep(0.02)
assert elector.is_leader, "not elected"
looping.wait(10)

# A daemon thread blocked in an acquire, too.
holder = MongoLocker("exit-held", db, ttl=30)
holder.acquire(blocking=False)
threading.Thread(target=lambda: MongoLocker("exit-held", db, ttl=30).acquire(), daemon=True).start()

# Garbage in a cycle, collected while the interpreter finalizes: its __del__
# releases the GIL for a while there, which lets any thread that wants the
# GIL try for it then.
class Slow:
    def __del__(self):
        time.sleep(0.3)
gc.disable()
cycle = Slow(); cycle.me = cycle; del cycle

out("EXIT", time.monotonic())
"""


@pytest.mark.parametrize("run", range(3))
def test_exit_with_a_running_elector(run_python, run):
    done = run_python(EXIT_WITH_RUNNING_ELECTOR, timeout=60, check=False, prelude=False)
    ended = time.monotonic()
    assert done.returncode == 0, "exit status %s\nstdout:\n%s\nstderr:\n%s" % (
        done.returncode,
        done.stdout,
        done.stderr,
    )
    assert "Fatal Python error" not in done.stderr and "panicked" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    exit_line = [w for w in lines if w.startswith("EXIT")]
    assert exit_line and "SHUTDOWN" in lines, done.stdout
    # Promptly: not after a stop timeout (the ttl), a lease, or a busy callback.
    took = ended - float(exit_line[0].split()[1])
    assert took < 5, "the process took %.1fs to exit" % took
    after = lines[lines.index("SHUTDOWN") :]
    assert not [w for w in after if w.startswith("CB")], "a callback started after shutdown began:\n" + done.stdout
    assert not [w for w in lines if "FINALIZING" in w], "a callback ran while finalizing:\n" + done.stdout
