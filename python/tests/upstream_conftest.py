"""conftest.py for upstream mongoelector's own tests, run unedited against this
package by `cargo xtask upstream` (which copies this file next to their
`tests/`).

- The default `MongoClient()` (the 0.5 tests call it bare) points at the test
  server: `MongoClient.HOST` is set to the URI in `MONGOELECTOR_TEST_URI`.
- A fresh database per test: the `db` fixture (what 1.0.2's tests expect) is
  a database named from the test's node id, dropped before and after; the
  databases the 0.5 tests name (`ml_unittest`, the default `mongoelector`)
  are dropped before each test.
- The package under test must be ours, native core and all, never PyPI's;
  with `MONGOELECTOR_CONTROL` set (the control run), it must be PyPI's.
"""

import hashlib
import os

import pymongo
import pytest

URI = os.environ["MONGOELECTOR_TEST_URI"]
pymongo.MongoClient.HOST = URI

import mongoelector  # noqa: E402

if os.environ.get("MONGOELECTOR_CONTROL"):
    # The control run: upstream's own package from PyPI, never ours.
    assert not getattr(mongoelector, "NATIVE", False), "the control must run PyPI's mongoelector"
else:
    import mongoelector._native  # noqa: E402

    assert getattr(mongoelector, "NATIVE", False) is True, "not mongocoord's mongoelector: %s" % mongoelector.__file__
    assert mongoelector.MongoLocker.__module__ == "mongoelector.locker"
    assert hasattr(mongoelector._native, "NativeLock") and hasattr(mongoelector._native, "NativeElector")


@pytest.fixture(autouse=True)
def _fresh_seed_databases():
    client = pymongo.MongoClient()
    for name in ("ml_unittest", "mongoelector"):
        client.drop_database(name)
    yield


@pytest.fixture
def db(request):
    client = pymongo.MongoClient()
    name = "t_" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:16]
    client.drop_database(name)
    yield client[name]
    client.drop_database(name)
