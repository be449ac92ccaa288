"""Adversarial review (#31): the package's exceptions pickle, as the seed's
plain-Python ones do, so a LockExists raised in a multiprocessing worker
reaches the parent as a LockExists (not a PicklingError)."""

import pickle

import pytest

from mongoelector import AcquireTimeout, CoordinationError, ForeignLock, LockExists


@pytest.mark.parametrize("cls", [LockExists, AcquireTimeout, ForeignLock, CoordinationError])
def test_review_exceptions_pickle(cls):
    back = pickle.loads(pickle.dumps(cls("held by someone")))
    assert type(back) is cls
    assert str(back) == "held by someone"
