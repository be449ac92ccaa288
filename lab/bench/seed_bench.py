"""Drives the Python `mongoelector` from PyPI (the seed's own implementation) for
`cargo xtask bench`, so both are measured on the same server in the same run.

    seed_bench.py DB lock-cycles N      -> prints cycles per second, after one
                                           cycle untimed
    seed_bench.py DB elect KEY TTL FILE -> on leadership appends "<ns> <pid>" to FILE;
                                           SIGTERM stops the elector cleanly

The server's URI is read from MONGODB_URI, not the command line, where `ps`
would show a password in it.
"""
import os
import signal
import sys
import threading
import time

from pymongo import MongoClient
from mongoelector import MongoLeaderElector, MongoLocker


def main():
    uri = os.environ["MONGODB_URI"]
    dbname, mode = sys.argv[1], sys.argv[2]
    db = MongoClient(uri)[dbname]
    if mode == "lock-cycles":
        n = int(sys.argv[3])
        lock = MongoLocker("seed-bench-lock", db, ttl=30)
        # The connection's handshake and the clock check (`timeparanoid`,
        # which trusts its answer for ten minutes) are not a cycle's cost:
        # ours are timed on a warm client too.
        lock.acquire(blocking=False)
        lock.release()
        start = time.perf_counter()
        for _ in range(n):
            lock.acquire(blocking=False)
            lock.release()
        print(n / (time.perf_counter() - start))
        return
    if mode == "elect":
        key, ttl, path = sys.argv[3], float(sys.argv[4]), sys.argv[5]

        def on_leader():
            with open(path, "a") as f:
                f.write(f"{time.time_ns()} {os.getpid()}\n")

        elector = MongoLeaderElector(key, db, ttl=ttl, on_leader=on_leader, report_status=False)
        done = threading.Event()

        def stop(*_):
            elector.stop()
            done.set()

        signal.signal(signal.SIGTERM, stop)
        elector.start()
        done.wait()
        return
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
