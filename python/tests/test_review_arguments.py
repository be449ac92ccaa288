"""Adversarial review (#31): arguments a user of the seed may pass, which must
give a clear, typed error (or work), never an unrelated exception."""

import math

import pymongo
import pytest

from mongoelector import ArgumentError, CoordinationError, MongoLeaderElector, MongoLocker


def test_review_db_keyword_of_1_0_2(db):
    """1.0.2's signatures are ``MongoLocker(key, db, *, ...)`` and
    ``MongoLeaderElector(key, db, *, ...)``: ``db=`` by keyword must work."""
    lock = MongoLocker("kw", db=db, ttl=5)
    assert lock.acquire(blocking=False)
    assert lock.owned()
    lock.release()
    elector = MongoLeaderElector("kw-election", db=db, ttl=5)
    assert not elector.running
    with pytest.raises(ArgumentError):
        MongoLocker("kw", db.client, db=db)


def test_review_nan_timeout_is_a_value_error(db):
    """The seed's ``timedelta(seconds=nan)`` raises ValueError; a NaN timeout
    must not silently mean "no wait at all"."""
    holder = MongoLocker("nan-timeout", db, ttl=30)
    holder.acquire()
    try:
        other = MongoLocker("nan-timeout", db, ttl=30)
        with pytest.raises(ValueError):
            other.acquire(timeout=math.nan)
    finally:
        holder.release()


@pytest.mark.parametrize("name", ["a.b", "a$b", "a/b", "a b", "a\x00b", "d" * 64])
def test_review_bad_database_name_is_an_argument_error(client, name):
    """A bad ``dbname`` is a bad argument (as a bad ``dbcollection`` is a
    ValueError), not a ``CoordinationError`` that reads like a store fault."""
    with pytest.raises(ArgumentError):
        MongoLocker("k", client, dbname=name)
    with pytest.raises(ArgumentError):
        MongoLeaderElector("k", client, dbname=name)


def test_review_unix_socket_client():
    """A MongoClient on a Unix socket (seed port None) gives a typed error or
    works; never ``TypeError: %d format: a real number is required``."""
    c = pymongo.MongoClient("mongodb://%2Ftmp%2Fno-such-mongod.sock", connect=False, serverSelectionTimeoutMS=300)
    try:
        with pytest.raises((ArgumentError, CoordinationError)) as err:
            MongoLocker("k", c)
        assert "%d format" not in str(err.value)
    finally:
        c.close()
