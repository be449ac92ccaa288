// Agenda on the same server, for `cargo xtask bench`: `node bench.mjs DB N`
// (a throughput run) or `node bench.mjs DB 0 PICKS` (pickups), the server's URI
// in MONGODB_URI (not on the command line, where `ps` would show a password).
// Prints one JSON line: {"tasks_per_s", "commands_per_task", "completed",
// "timed_out", "lock_limit", "process_every_ms"}, or {"pickup_ms_p50",
// "picks_seen", "picks"}. DB is dropped first: give it a database of its own.
//
// - throughput: N trivial jobs saved one by one with `agenda.now()` before
//   start (as an application enqueues them; saving triggers no processing
//   without a notification channel), one Agenda, concurrency AGENDA_CONCURRENCY (16); the clock
//   runs from start() to the N-th completion (with AGENDA_INSTANCES k, k
//   Agendas of concurrency AGENDA_CONCURRENCY each, each with its own client). Commands are counted with the
//   driver's command monitoring over that span.
//   Settings (`lab bench` sweeps them and reports each, and the best):
//   AGENDA_LOCK_LIMIT (default 0, Agenda's own: no limit) and
//   AGENDA_PROCESS_EVERY_MS (default 100; Agenda's own is 5 s). Locks are
//   refilled only on processEvery ticks, so a lock limit
//   of 4 with processEvery 5 s caps Agenda at 0.8 jobs/s, and with 100 ms at 40.
//   Agenda starts another fill on every processEvery tick while fewer than
//   lockLimit jobs are locked, without waiting for the fill in flight: when one
//   lock query takes longer than processEvery (a slow or loaded server), the
//   queries in flight pile up and throughput falls to a few jobs/s (on
//   SecantusDB with lockLimit 4: 0.3-0.85 jobs/s, against 42 with no limit).
//   That is Agenda's behaviour at that setting, so it is measured, not worked
//   around; the sweep finds the setting at which Agenda does its best.
//   After AGENDA_TIME_LIMIT_S seconds (default 600) the run stops and reports
//   the jobs completed so far per second, with "timed_out": true.
// - pickup (N = 0: the pickups alone, on a server of their own, so no lock
//   query left in flight by a throughput run slows them): Agenda's defaults
//   (processEvery 5 s, no notification channel); a job created with now()
//   while it runs, timed from the call to the handler's start. Agenda finds
//   a job only on its tick, so each job is created at a random point of the
//   tick (after a pause drawn from 300 ms to 300 ms + 5 s): created at a
//   fixed pause after the last pickup, every job would come just after a
//   tick and wait nearly a whole one. A pick not seen within 30 s ends the
//   pickups, as does a start, save or stop that does not return within 30 s:
//   "pickup_ms_p50" is then over the picks seen, or null, and "picks_seen"
//   says how many.
// - idle (AGENDA_IDLE_S set, instead of the above): one Agenda with a job
//   defined and none saved, at AGENDA_PROCESS_EVERY_MS, measured over
//   AGENDA_IDLE_S seconds after a warm-up of AGENDA_IDLE_WARM_UP_S (3 s; lab
//   passes the warm-up ours get); prints {"commands_per_min",
//   "cpu_s_per_min", "rss_mb", "process_every_ms"}.
import { Agenda } from 'agenda';
import { MongoBackend } from '@agendajs/mongo-backend';
import { MongoClient } from 'mongodb';

const uri = process.env.MONGODB_URI;
const [dbName, nArg, picksArg] = process.argv.slice(2);
const n = Number(nArg ?? 400);
const picks = Number(picksArg ?? 0);
// The slots our side has (4 agents × concurrency 4): lab passes 16.
const concurrency = Number(process.env.AGENDA_CONCURRENCY ?? 16);
// Agenda instances on the queue (AGENDA_INSTANCES, default 1), each with a
// client of its own, as processes would have: one instance locks jobs one
// `findOneAndUpdate` after another, so a deployment that wants more runs
// more instances, as ours runs 4 agents.
const instances = Number(process.env.AGENDA_INSTANCES ?? 1);
const lockLimit = Number(process.env.AGENDA_LOCK_LIMIT ?? 0);
const timeLimitMs = Number(process.env.AGENDA_TIME_LIMIT_S ?? 600) * 1000;
const processEvery = Number(process.env.AGENDA_PROCESS_EVERY_MS ?? 100);
const pickupLimitMs = 30_000;
// Agenda's own processEvery, at which the pickups run.
const defaultProcessEveryMs = 5000;
// Connecting, dropping the database, Agenda's indexes and saving the jobs
// (before any clock runs) get a minute plus 100 ms a job; past that the
// harness exits 3, saying so, and lab reports the setting as not run.
const setupLimitMs = 60_000 + 100 * n;
const setup = setTimeout(() => {
  console.error(`  agenda: setting up took over ${setupLimitMs / 1000} s; giving up`);
  process.exit(3);
}, setupLimitMs);
let commands = 0;
async function connect() {
  const client = await MongoClient.connect(uri, { monitorCommands: true });
  client.on('commandStarted', () => (commands += 1));
  return client.db(dbName);
}
const db = await connect();
await db.dropDatabase();

// Resolves to `p`'s value, or to `fallback` after `ms` or should `p` fail (the
// work in flight is left to run: a choked server may never answer it; a
// failed stop must not cost a run its measured figures).
async function within(p, ms, fallback) {
  let timer;
  const settled = Promise.resolve(p).catch((e) => {
    console.error(`  agenda: ${e?.message ?? e}`);
    return fallback;
  });
  const out = await Promise.race([settled, new Promise((resolve) => (timer = setTimeout(() => resolve(fallback), ms)))]);
  clearTimeout(timer);
  return out;
}

async function throughput() {
  const dbs = [db];
  while (dbs.length < instances) dbs.push(await connect());
  const agendas = dbs.map(
    (d) => new Agenda({ backend: new MongoBackend({ mongo: d, collection: 'agenda_bench' }), processEvery }),
  );
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  for (const agenda of agendas) {
    agenda.define('bench', async () => {
      done += 1;
      if (done === n) finish();
    }, { concurrency, lockLimit });
  }
  // Agenda creates its indexes on connect; wait for it before saving jobs.
  await Promise.all(agendas.map((a) => a.ready));
  const saving = performance.now();
  for (let i = 0; i < n; i++) await agendas[0].now('bench', { i });
  console.error(`  agenda: saved ${n} jobs one by one in ${((performance.now() - saving) / 1000).toFixed(1)} s`);
  clearTimeout(setup);
  const c0 = commands;
  const t0 = performance.now();
  // Instance i starts i/k of a tick after the first, as processes started
  // apart would: started together, k instances would fill on the same
  // ticks, each racing the others for the same next job.
  const starting = Promise.all(
    agendas.map((a, i) => new Promise((r) => setTimeout(r, (i * processEvery) / instances)).then(() => a.start())),
  );
  const timedOut = await within(finished.then(() => false), timeLimitMs, true);
  const completed = done;
  const secs = (performance.now() - t0) / 1000;
  const used = commands - c0;
  console.error(`  agenda: ${completed} of ${n} jobs in ${secs.toFixed(1)} s${timedOut ? ' (time limit)' : ''}; stopping`);
  // Stopping waits for the lock queries in flight, which a choked server
  // may take minutes to answer.
  await within(
    starting.then(() => Promise.all(agendas.map((a) => a.stop()))),
    pickupLimitMs,
    null,
  );
  return { tasksPerS: completed / secs, commandsPerTask: used / Math.max(completed, 1), completed, timedOut };
}

async function pickup() {
  const agenda = new Agenda({ backend: new MongoBackend({ mongo: db, collection: 'agenda_pickup' }) });
  const lat = [];
  let got;
  agenda.define('pickup', async (job) => {
    lat.push(performance.now() - job.attrs.data.sent);
    got();
  });
  const late = Symbol('late');
  if ((await within(agenda.start(), pickupLimitMs, late)) === late) return { p50: null, seen: 0 };
  for (let i = 0; i < picks; i++) {
    const seen = new Promise((resolve) => (got = resolve));
    await new Promise((r) => setTimeout(r, 300 + Math.random() * defaultProcessEveryMs));
    const saved = await within(agenda.now('pickup', { sent: performance.now() }), pickupLimitMs, late);
    if (saved === late) break;
    if (!(await within(seen.then(() => true), pickupLimitMs, false))) break;
  }
  await within(agenda.stop(), pickupLimitMs, null);
  if (lat.length === 0) return { p50: null, seen: 0 };
  lat.sort((a, b) => a - b);
  return { p50: lat[Math.floor((lat.length - 1) / 2)], seen: lat.length };
}

async function idle(seconds) {
  const agenda = new Agenda({ backend: new MongoBackend({ mongo: db, collection: 'agenda_idle' }), processEvery });
  agenda.define('idle', async () => {});
  await agenda.ready;
  await agenda.start();
  await new Promise((r) => setTimeout(r, Number(process.env.AGENDA_IDLE_WARM_UP_S ?? 3) * 1000));
  const c0 = commands;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  await new Promise((r) => setTimeout(r, seconds * 1000));
  const minutes = (performance.now() - t0) / 60000;
  const cpu = process.cpuUsage(cpu0);
  const out = {
    commands_per_min: (commands - c0) / minutes,
    cpu_s_per_min: (cpu.user + cpu.system) / 1e6 / minutes,
    rss_mb: process.memoryUsage().rss / (1024 * 1024),
    process_every_ms: processEvery,
  };
  await within(agenda.stop(), pickupLimitMs, null);
  return out;
}

// The idle and pickup runs bound their own waits.
if (process.env.AGENDA_IDLE_S) {
  clearTimeout(setup);
  console.log(JSON.stringify(await idle(Number(process.env.AGENDA_IDLE_S))));
  process.exit(0);
}

if (n === 0) {
  clearTimeout(setup);
  const { p50, seen } = await pickup();
  console.log(JSON.stringify({ pickup_ms_p50: p50, picks_seen: seen, picks }));
  process.exit(0);
}

const { tasksPerS, commandsPerTask, completed, timedOut } = await throughput();
console.log(
  JSON.stringify({
    tasks_per_s: tasksPerS,
    commands_per_task: commandsPerTask,
    completed,
    timed_out: timedOut,
    lock_limit: lockLimit,
    process_every_ms: processEvery,
    instances,
  }),
);
// Not client.close(): after a timed-out run, lock queries are still in flight
// and closing the client under them throws.
process.exit(0);
