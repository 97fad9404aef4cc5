// A pgqueue worker in Node: leases jobs with plain SQL, runs them, and acks
// or fails each with its (job_id, attempt_id) fencing pair.
//
//   PGQUEUE_DSN=postgresql://... node worker.js --queue mail --until-idle 3
//
// Without PGQUEUE_DSN, libpq's variables (PGHOST, PGPORT, PGUSER, ...) apply.
// Tasks: "add" returns a + b; "fail" throws (retried with the job's backoff,
// then dead); anything else is failed permanently as unknown.
// With --until-idle N it exits after N seconds without a job and prints a
// JSON summary; otherwise it runs until SIGINT/SIGTERM.
"use strict";
const { Client } = require("pg");

const args = process.argv.slice(2);
function option(name, fallback) {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : fallback;
}
const schema = option("--schema", "pgqueue");
if (!/^[a-z_][a-z0-9_]{0,47}$/.test(schema)) throw new Error(`invalid schema ${schema}`);
const queue = option("--queue", null);
const untilIdle = Number(option("--until-idle", "0"));
const workerId = `node-${require("os").hostname()}-${process.pid}`;

const tasks = {
  add: (payload) => payload.a + payload.b,
  fail: () => {
    throw new Error("this task always fails");
  },
};

async function main() {
  const dsn = process.env.PGQUEUE_DSN;
  const db = new Client(dsn ? { connectionString: dsn } : {});
  await db.connect();
  await db.query(`LISTEN "pgqueue.${schema}"`);
  let wake = null;
  db.on("notification", () => wake && wake());
  let stopping = false;
  for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => { stopping = true; wake && wake(); });

  const summary = { acked: 0, failed: 0, lost: 0 };
  let idleSince = Date.now();
  while (!stopping) {
    const { rows } = await db.query(
      `SELECT job_id, attempt_id, task, payload FROM "${schema}".lease($1::text[], $2, 10)`,
      [queue ? [queue] : null, workerId],
    );
    for (const job of rows) {
      const handler = tasks[job.task];
      try {
        if (!handler) throw new Error(`unknown task ${job.task}`);
        const result = await handler(job.payload);
        const { rows: [r] } = await db.query(
          `SELECT "${schema}".ack($1::bigint, $2::bigint, $3::jsonb) AS held`,
          [job.job_id, job.attempt_id, JSON.stringify(result === undefined ? null : result)],
        );
        r.held ? summary.acked++ : summary.lost++;
      } catch (err) {
        const { rows: [r] } = await db.query(
          `SELECT "${schema}".fail($1::bigint, $2::bigint, $3, permanent => $4) AS status`,
          [job.job_id, job.attempt_id, String(err.message || err), !handler],
        );
        r.status === null ? summary.lost++ : summary.failed++;
      }
    }
    if (rows.length > 0) {
      idleSince = Date.now();
      continue;
    }
    if (untilIdle > 0 && Date.now() - idleSince > untilIdle * 1000) break;
    // Sleep until a notification or the poll interval.
    await new Promise((resolve) => { wake = resolve; setTimeout(resolve, 500); });
    wake = null;
  }
  await db.end();
  console.log(JSON.stringify(summary));
}

main().catch((err) => {
  console.error(`error: ${err.message}`);
  process.exit(1);
});
