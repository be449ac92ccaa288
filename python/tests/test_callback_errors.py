"""An exception raised in a callback is logged as upstream mongoelector 1.0.2
logs it, and the elector keeps running.

Upstream 1.0.2 (`mongoelector/elector.py`, `_fire_callback`) catches
`Exception` around each callback and calls
`logging.getLogger("mongoelector.elector").exception("Error in %s callback",
name)`: level ERROR, with the traceback, `name` being `on_leader`,
`on_leader_loss`, `on_loop`, or `on_leader_loss during release` for the loss
that `release()` (and so `stop()`) reports.
"""

import logging
import time

import pytest

from mongoelector import MongoElector, MongoLeaderElector

LOGGER = "mongoelector.elector"


def records(caplog, message):
    return [
        r
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.ERROR and r.getMessage() == message and r.exc_info
    ]


@pytest.mark.parametrize("names", ["seed", "1.0.2"])
def test_errors_in_callbacks_are_logged_and_the_elector_keeps_running(db, client, db_name, caplog, wait_until, names):
    caplog.set_level(logging.ERROR, logger=LOGGER)
    loops = []

    def on_leader():
        raise RuntimeError("on_leader failed")

    def on_loop():
        loops.append(time.monotonic())
        raise ValueError("on_loop failed")

    if names == "seed":
        e = MongoElector("errors", client, dbname=db_name, ttl=1.5, onmaster=on_leader, onloop=on_loop)
    else:
        e = MongoLeaderElector("errors", db, ttl=1.5, on_leader=on_leader, on_loop=on_loop)
    try:
        e.start()
        wait_until(lambda: records(caplog, "Error in on_leader callback"), 20, "on_leader's error to be logged")
        wait_until(lambda: len(loops) >= 3, 20, "three rounds")
        assert e.running and e.is_leader, "the elector stopped after a callback failed"
        leader = records(caplog, "Error in on_leader callback")
        assert len(leader) == 1 and leader[0].exc_info[0] is RuntimeError
        assert str(leader[0].exc_info[1]) == "on_leader failed"
        loop = records(caplog, "Error in on_loop callback")
        assert len(loop) >= 2 and all(r.exc_info[0] is ValueError for r in loop)
    finally:
        e.stop()
    assert not e.running


def test_an_error_in_on_leader_loss_from_release_and_stop(db, caplog, wait_until):
    caplog.set_level(logging.ERROR, logger=LOGGER)
    losses = []
    leads = []

    def on_loss():
        losses.append(1)
        raise KeyError("on_leader_loss failed")

    e = MongoLeaderElector("loss-errors", db, ttl=1.5, on_leader=lambda: leads.append(1), on_leader_loss=on_loss)
    try:
        e.start()
        wait_until(lambda: e.is_leader, 20, "leadership")
        e.release()
        wait_until(lambda: len(losses) == 1, 10, "on_leader_loss")
        wait_until(lambda: records(caplog, "Error in on_leader_loss during release callback"), 10, "the log record")
        # It campaigns again, and wins again.
        wait_until(lambda: e.is_leader and len(leads) == 2, 20, "leadership again")
    finally:
        e.stop()
    assert len(losses) == 2
    logged = records(caplog, "Error in on_leader_loss during release callback")
    assert len(logged) == 2 and all(r.exc_info[0] is KeyError for r in logged)
    assert not records(caplog, "Error in on_leader_loss callback")
