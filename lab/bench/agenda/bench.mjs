// Agenda on the same server, for `cargo xtask bench`: `node bench.mjs URI DB N [PICKS]`.
// Prints one JSON line: {"tasks_per_s", "commands_per_task", "completed",
// "timed_out", "lock_limit", "pickup_ms_p50"}. DB is dropped first: give it a
// database of its own.
//
// - throughput: N trivial jobs preloaded (one insertMany of the document
//   Agenda's own `create().save()` writes, due one millisecond apart, as jobs
//   saved one after another are), one Agenda, concurrency 4, processEvery
//   100 ms; the clock runs from start() to the N-th completion. Commands are
//   counted with the driver's command monitoring over that span.
//   `lockLimit` is the concurrency, 4 (env AGENDA_LOCK_LIMIT overrides it; 0
//   is Agenda's default, "no limit"). With no limit, a fill locks jobs one
//   `findOneAndUpdate` at a time until none is left and nothing runs before the
//   first fill ends, so N=2,000 would lock all 2,000 first. Locks are refilled
//   only on processEvery ticks, so a limit of 4 caps Agenda at 40 jobs/s; yet
//   on SecantusDB (N=100, a loaded machine, one session) it ran 11-17 jobs/s
//   with 4, against 4-6 with 8, 16 or no limit: every extra lock is one more
//   sorted `findOneAndUpdate` on a slow server.
//   Agenda starts another fill on every processEvery tick while fewer than
//   lockLimit jobs are locked, without waiting for the fill in flight: when one
//   lock query takes longer than processEvery (a slow or loaded server), the
//   queries in flight pile up and throughput falls to a few jobs/s. That is
//   Agenda's behaviour on that server, so it is measured, not worked around.
//   After AGENDA_TIME_LIMIT_S seconds (default 600) the run stops and reports
//   the jobs completed so far per second, with "timed_out": true.
//   (AGENDA_PROCESS_EVERY_MS overrides the 100 ms, for exploration only.)
// - pickup: Agenda's defaults (processEvery 5 s, no notification channel); a
//   job created with now() while it runs, timed from the call to the handler's
//   start. A pick not seen within 30 s ends the pickups (the server may still
//   be working off the throughput run's lock queries), as does a stop that
//   does not return within 30 s: "pickup_ms_p50" is then over the picks seen,
//   or null.
import { Agenda } from 'agenda';
import { MongoBackend } from '@agendajs/mongo-backend';
import { MongoClient } from 'mongodb';

const [uri, dbName, nArg, picksArg] = process.argv.slice(2);
const n = Number(nArg ?? 400);
const picks = Number(picksArg ?? 10);
const concurrency = 4;
const lockLimit = Number(process.env.AGENDA_LOCK_LIMIT ?? concurrency);
const timeLimitMs = Number(process.env.AGENDA_TIME_LIMIT_S ?? 600) * 1000;
const processEvery = Number(process.env.AGENDA_PROCESS_EVERY_MS ?? 100);
const pickupLimitMs = 30_000;
const client = await MongoClient.connect(uri, { monitorCommands: true });
let commands = 0;
client.on('commandStarted', () => (commands += 1));
const db = client.db(dbName);
await db.dropDatabase();

async function throughput() {
  const agenda = new Agenda({ backend: new MongoBackend({ mongo: db, collection: 'agenda_bench' }), processEvery });
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  agenda.define('bench', async () => {
    done += 1;
    if (done === n) finish();
  }, { concurrency, lockLimit });
  // Agenda creates its indexes on connect; wait for it before preloading.
  await agenda.ready;
  // One job saved through Agenda, as the template of the documents it writes.
  await agenda.create('bench', { i: 0 }).save();
  const { _id, ...template } = await db.collection('agenda_bench').findOne({});
  const rest = [];
  const due = template.nextRunAt.getTime();
  for (let i = 1; i < n; i++) rest.push({ ...template, data: { i }, nextRunAt: new Date(due - n + i) });
  if (rest.length > 0) await db.collection('agenda_bench').insertMany(rest);
  const c0 = commands;
  const t0 = performance.now();
  await agenda.start();
  let timer;
  const timedOut = await Promise.race([
    finished.then(() => false),
    new Promise((resolve) => (timer = setTimeout(() => resolve(true), timeLimitMs))),
  ]);
  clearTimeout(timer);
  const completed = done;
  const secs = (performance.now() - t0) / 1000;
  const used = commands - c0;
  // Stopping waits for the lock queries in flight, which a choked server
  // may take minutes to answer.
  await Promise.race([agenda.stop(), new Promise((r) => setTimeout(r, pickupLimitMs))]);
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
  await agenda.start();
  for (let i = 0; i < picks; i++) {
    const seen = new Promise((resolve) => (got = resolve));
    await new Promise((r) => setTimeout(r, 300));
    await agenda.now('pickup', { sent: performance.now() });
    // A server still working off the throughput run's piled-up lock queries
    // may not answer for minutes: a pick not seen within PICKUP_LIMIT_MS
    // ends the pickups, reported as missing rather than waited for.
    let timer;
    const inTime = await Promise.race([
      seen.then(() => true),
      new Promise((resolve) => (timer = setTimeout(() => resolve(false), pickupLimitMs))),
    ]);
    clearTimeout(timer);
    if (!inTime) break;
  }
  await Promise.race([agenda.stop(), new Promise((r) => setTimeout(r, pickupLimitMs))]);
  if (lat.length === 0) return null;
  lat.sort((a, b) => a - b);
  return lat[Math.floor((lat.length - 1) / 2)];
}

const { tasksPerS, commandsPerTask, completed, timedOut } = await throughput();
const pickupP50 = picks > 0 ? await pickup() : null;
console.log(
  JSON.stringify({
    tasks_per_s: tasksPerS,
    commands_per_task: commandsPerTask,
    completed,
    timed_out: timedOut,
    lock_limit: lockLimit,
    pickup_ms_p50: pickupP50,
  }),
);
// Not client.close(): after a timed-out run, lock queries are still in flight
// and closing the client under them throws.
process.exit(0);
