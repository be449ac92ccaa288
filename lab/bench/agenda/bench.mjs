// Agenda on the same server, for `cargo xtask bench`: `node bench.mjs URI DB N [PICKS]`.
// Prints one JSON line: {"tasks_per_s": .., "pickup_ms_p50": ..}.
// - throughput: N trivial jobs preloaded, concurrency 4, processEvery 100 ms;
//   the clock runs from start() to the N-th completion.
// - pickup: Agenda's defaults; a job created with now() while it runs, timed
//   from the call to the handler's start.
import { Agenda } from 'agenda';
import { MongoBackend } from '@agendajs/mongo-backend';
import { MongoClient } from 'mongodb';

const [uri, dbName, nArg, picksArg] = process.argv.slice(2);
const n = Number(nArg ?? 400);
const picks = Number(picksArg ?? 10);
const client = await MongoClient.connect(uri);
const db = client.db(dbName);
await db.dropDatabase();

async function throughput() {
  const agenda = new Agenda({ backend: new MongoBackend({ mongo: db, collection: 'agenda_bench' }), processEvery: 100 });
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  agenda.define('bench', async () => {
    done += 1;
    if (done === n) finish();
  }, { concurrency: 4 });
  const jobs = [];
  for (let i = 0; i < n; i++) jobs.push(agenda.create('bench', { i }).save());
  await Promise.all(jobs);
  const t0 = performance.now();
  await agenda.start();
  await finished;
  const secs = (performance.now() - t0) / 1000;
  await agenda.stop();
  return n / secs;
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
    await seen;
  }
  await agenda.stop();
  lat.sort((a, b) => a - b);
  return lat[Math.floor((lat.length - 1) / 2)];
}

const tasksPerS = await throughput();
const pickupP50 = picks > 0 ? await pickup() : null;
console.log(JSON.stringify({ tasks_per_s: tasksPerS, pickup_ms_p50: pickupP50 }));
await client.close();
process.exit(0);
