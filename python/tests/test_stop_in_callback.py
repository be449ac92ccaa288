"""`stop()` called from inside one of the elector's own callbacks does not wait
on itself: it returns at once, the elector stops, the lease is released and
`on_leader_loss` follows."""

import pytest

SCENARIO = """
kind = {kind!r}
ref = {{}}
seen = []
stopped_in = []

def stop_here(name):
    t0 = time.monotonic()
    ref["e"].stop()
    stopped_in.append((name, time.monotonic() - t0))

def on_leader():
    seen.append("leader")
    if kind in ("onmaster", "on_leader"):
        stop_here(kind)

def on_loss():
    seen.append("loss")
    if kind == "on_leader_loss":
        stop_here(kind)

def on_loop():
    if kind == "onloop" and ref["e"].is_leader and not stopped_in:
        stop_here(kind)

# ttl 20: a stop that waited for its own callback would return after 20 s.
if kind == "onmaster":
    e = MongoElector("stop-inside", client, dbname=DB, ttl=20, onmaster=on_leader, onmasterloss=on_loss, onloop=on_loop)
else:
    e = MongoLeaderElector("stop-inside", db, ttl=20, on_leader=on_leader, on_leader_loss=on_loss, on_loop=on_loop)
ref["e"] = e
e.start()
until(lambda: "leader" in seen, 20, "leadership")
if kind == "on_leader_loss":
    e.release()
until(lambda: stopped_in, 10, "the stop inside the callback to return")
name, took = stopped_in[0]
assert took < 3, "stop() inside %s took %.1fs" % (name, took)
assert not e.running
until(lambda: seen[-1:] == ["loss"], 10, "on_leader_loss after the stop")
until(lambda: not e.leader_exists, 10, "the lease to be released")
assert not e.is_leader
time.sleep(1)
assert not e.leader_exists, "a stopped elector campaigned again"
assert seen == ["leader", "loss"], seen
# And the stop from outside afterwards returns at once.
t0 = time.monotonic()
e.stop()
assert time.monotonic() - t0 < 3
out("OK", name, round(took, 3))
"""


@pytest.mark.parametrize("kind", ["onmaster", "on_leader", "onloop", "on_leader_loss"])
def test_stop_from_inside_a_callback(run_python, kind):
    done = run_python(SCENARIO.format(kind=kind), timeout=90)
    assert done.stdout.startswith("OK " + kind), done.stdout + done.stderr
