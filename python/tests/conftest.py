"""conftest.py for our own tests of the package (`python/tests/test_*.py`),
which `cargo xtask upstream` runs after upstream's, in the same venv.

- The server: `MONGOELECTOR_TEST_URI` (what the xtask passes), else
  `MONGODB_URI`, else a fresh in-memory SecantusDB started here
  (`secantusd-py`, beside this interpreter or on `PATH`), as
  `xtask/src/server.rs` starts one.
- The CLI (for the lock-exclusion tests): `MONGOCOORD_BIN` (what the xtask
  passes), else `target/debug/mongocoord` of this checkout.
- Without either, a test skips; with `CI` set, it fails instead.
- A fresh database per test, named from its node id.
- Scenarios that could deadlock or crash run in a child interpreter with a
  timeout (`run_python`), so a hang fails the test instead of hanging CI.
"""

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pymongo
import pytest

import mongoelector
import mongoelector._native

assert getattr(mongoelector, "NATIVE", False) is True, "not mongocoord's mongoelector: %s" % mongoelector.__file__

CHECKOUT = Path(__file__).resolve().parents[2]


def _unavailable(why):
    """Skip, or under CI fail: a test that cannot get what it needs never
    passes silently there."""
    if os.environ.get("CI"):
        pytest.fail(why + " (CI is set: failing instead of skipping)")
    pytest.skip(why)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def uri():
    for name in ("MONGOELECTOR_TEST_URI", "MONGODB_URI"):
        if os.environ.get(name):
            yield os.environ[name]
            return
    server = Path(sys.executable).parent / "secantusd-py"
    found = str(server) if server.exists() else shutil.which("secantusd-py")
    if not found:
        _unavailable("no MongoDB: set MONGODB_URI, or install SecantusDB (secantusd-py)")
    port = _free_port()
    proc = subprocess.Popen(
        [found, "--port", str(port), "--storage-path", ":memory:", "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    _unavailable("SecantusDB did not start")
                time.sleep(0.1)
        yield "mongodb://127.0.0.1:%d/?directConnection=true&retryWrites=false&serverSelectionTimeoutMS=5000" % port
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def client(uri):
    c = pymongo.MongoClient(uri)
    try:
        c.admin.command("ping")
    except Exception as e:  # noqa: BLE001 - any failure to reach it
        _unavailable("cannot reach the MongoDB server at %s: %s" % (uri, e))
    yield c
    c.close()


@pytest.fixture
def db_name(request, client):
    name = "py_" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:16]
    client.drop_database(name)
    yield name
    client.drop_database(name)


@pytest.fixture
def db(client, db_name):
    return client[db_name]


@pytest.fixture(scope="session")
def mongocoord():
    path = os.environ.get("MONGOCOORD_BIN") or str(CHECKOUT / "target" / "debug" / "mongocoord")
    if not os.access(path, os.X_OK):
        _unavailable("no mongocoord binary at %s (set MONGOCOORD_BIN)" % path)
    return path


PRELUDE = """\
import os, sys, time, threading
import pymongo
import mongoelector
from mongoelector import MongoElector, MongoLeaderElector, MongoLocker, LockExists, AcquireTimeout
URI = os.environ["MONGOELECTOR_TEST_URI"]
DB = os.environ["MONGOELECTOR_TEST_DB"]
client = pymongo.MongoClient(URI)
db = client[DB]

def out(*words):
    # Straight to the file descriptor: also from threads, also during exit.
    os.write(1, (" ".join(str(w) for w in words) + "\\n").encode())

def until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(0.02)
"""


@pytest.fixture
def run_python(uri, db_name, tmp_path):
    """Runs `script` (after PRELUDE, unless not `prelude`: `URI`, `DB`,
    `client`, `db`, `out`, `until`) in a child interpreter, with a timeout;
    returns the completed process. With `check`, asserts it exited 0."""

    def run(script, timeout=60, check=True, env=None, prelude=True):
        path = tmp_path / ("script_%d.py" % time.monotonic_ns())
        path.write_text((PRELUDE if prelude else "") + textwrap.dedent(script))
        full_env = dict(os.environ, MONGOELECTOR_TEST_URI=uri, MONGOELECTOR_TEST_DB=db_name, **(env or {}))
        try:
            done = subprocess.run(
                [sys.executable, str(path)],
                cwd=tmp_path,
                env=full_env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise AssertionError(
                "the child did not finish within %ss (a hang)\nstdout:\n%s\nstderr:\n%s"
                % (timeout, _text(e.stdout), _text(e.stderr))
            ) from None
        if check:
            assert done.returncode == 0, "exit status %s\nstdout:\n%s\nstderr:\n%s" % (
                done.returncode,
                done.stdout,
                done.stderr,
            )
        return done

    return run


def _text(b):
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def _wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(0.02)


@pytest.fixture
def wait_until():
    """`wait_until(cond, timeout, what)`: polls `cond` until true; fails after
    `timeout` seconds."""
    return _wait_until
