"""Adversarial review (#31): Ctrl-C interrupts *every* blocking call, not only
``acquire()`` and ``start(blocking=True)``: connecting to a server that does not
answer, a read while the server hangs, and a ``stop()`` waiting on a slow
``on_leader_loss``."""

import os
import signal
import subprocess
import sys
import time

import pytest


def sigint_as_python_starts_it():
    """The child's SIGINT at its default, so Python installs its handler: a
    shell that starts a job in the background without job control (`cmd &`)
    hands its children SIGINT ignored, and Python then never raises
    KeyboardInterrupt, whatever the package does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


CHILD = r"""
import os, signal, socket, sys, threading, time
import pymongo
from mongoelector import MongoLeaderElector, MongoLocker
URI = os.environ["MONGOELECTOR_TEST_URI"]
DB = os.environ["MONGOELECTOR_TEST_DB"]
what = sys.argv[1]

def blackhole():
    # Accepts connections and never answers: a hung server.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(100)
    held = []
    def serve():
        while True:
            held.append(srv.accept())
    threading.Thread(target=serve, daemon=True).start()
    return "mongodb://127.0.0.1:%d/?directConnection=true&serverSelectionTimeoutMS=60000&connectTimeoutMS=60000&socketTimeoutMS=60000" % srv.getsockname()[1]

if what == "connect":
    uri = blackhole()
    call = lambda: MongoLocker("k", uri=uri, timeparanoid=False)
elif what == "stop":
    db = pymongo.MongoClient(URI)[DB]
    led = threading.Event()
    elector = MongoLeaderElector("slow-loss", db, ttl=60, on_leader=led.set,
                                 on_leader_loss=lambda: time.sleep(120))
    elector.start()
    if not led.wait(20):
        sys.exit("never led")
    call = elector.stop
print("WAITING", flush=True)
t0 = time.monotonic()
try:
    call()
    print("RETURNED", time.monotonic() - t0, flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", time.monotonic() - t0, flush=True)
    os._exit(0)
except BaseException as e:
    print("RAISED", type(e).__name__, str(e)[:200], time.monotonic() - t0, flush=True)
os._exit(1)
"""


@pytest.mark.parametrize("what", ["connect", "stop"])
def test_review_ctrl_c_interrupts_every_blocking_call(uri, db_name, what):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, what],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, MONGOELECTOR_TEST_URI=uri, MONGOELECTOR_TEST_DB=db_name),
        preexec_fn=sigint_as_python_starts_it,
    )
    try:
        first = child.stdout.readline().strip()
        assert first == "WAITING", first + child.communicate(timeout=30)[1]
        time.sleep(1.5)
        assert child.poll() is None, "the call did not block: %s" % (child.communicate(timeout=5),)
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = child.communicate(timeout=15)
        took = time.monotonic() - sent
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        raise AssertionError("SIGINT did not end %s within 15 s\n%s%s" % (what, out, err)) from None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert "INTERRUPTED" in out, "%s was not interrupted by Ctrl-C:\n%s%s" % (what, out, err)
    assert took < 5, "Ctrl-C took %.1fs to interrupt %s" % (took, what)
