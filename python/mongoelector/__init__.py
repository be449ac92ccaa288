"""mongoelector: distributed locks and leader election on MongoDB, with the
API of the Python ``mongoelector`` (0.4–0.5 and 1.0.2), running on
mongocoord's Rust core (``mongolock``, ``mongoelector``)."""

import atexit
import os

from . import _native
from ._connection import ArgumentError
from .elector import MongoElector, MongoLeaderElector
from .locker import AcquireTimeout, CoordinationError, ForeignLock, LockExists, MongoLocker, TimeOffsetError

# No elector callback starts once the interpreter began to exit (see
# python/src/exit.rs). Registered on import, so it runs after the atexit hooks
# registered later (LIFO), such as those of the code that imports it.
atexit.register(_native._at_exit)
os.register_at_fork(after_in_child=_native._after_fork_in_child)

#: True in this package: the native core is what runs (the test runner checks it).
NATIVE = True

__version__ = "0.5.0+mongocoord"

__all__ = [
    "AcquireTimeout",
    "ArgumentError",
    "CoordinationError",
    "ForeignLock",
    "LockExists",
    "MongoElector",
    "MongoLeaderElector",
    "MongoLocker",
    "TimeOffsetError",
]
