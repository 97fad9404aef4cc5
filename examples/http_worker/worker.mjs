// A pgqueue worker in Node that speaks only HTTP (Node >= 18: global fetch).
//
//   PGQUEUE_URL=http://127.0.0.1:8485 PGQUEUE_TOKEN=... node worker.mjs [queue]
//
// Long-polls POST /v1/queues/{queue}/lease, runs each job, and reports it
// with ack / fail, every call fenced by the attempt_id the lease returned.
// PGQUEUE_EXIT_IDLE=1: exit after a long poll that returns nothing (for CI).
const base = process.env.PGQUEUE_URL ?? "http://127.0.0.1:8485";
const token = process.env.PGQUEUE_TOKEN;
const queue = process.argv[2] ?? "default";
const exitIdle = process.env.PGQUEUE_EXIT_IDLE === "1";
const workerId = `node-${process.pid}`;

const handlers = {
  add: ({ a, b }) => ({ sum: a + b }),
  upper: ({ text }) => text.toUpperCase(),
  fail: () => {
    throw new Error("this task always fails");
  },
};

const retryFor = Number(process.env.PGQUEUE_RETRY_FOR ?? "Infinity") * 1000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// What a restart or an overload looks like (connection refused or reset, 503
// busy or unavailable, 429 rate_limited) is retried with jittered exponential
// backoff (0.1 s doubling to 5 s), honouring Retry-After; PGQUEUE_RETRY_FOR
// seconds bounds it. A retried ack that had committed answers lease_lost.
async function call(path, body) {
  const started = Date.now();
  for (let attempt = 0; ; attempt++) {
    let response;
    try {
      response = await fetch(`${base}${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
    } catch (err) {
      if (Date.now() - started > retryFor) throw err;
      const ms = Math.min(5000, 100 * 2 ** attempt) * (0.5 + Math.random() / 2);
      console.error(`${path}: ${err.cause?.code ?? err.message}; retrying in ${Math.round(ms)} ms`);
      await sleep(ms);
      continue;
    }
    const answer = await response.json();
    if ((response.status === 503 || response.status === 429) && Date.now() - started < retryFor) {
      const after = Number(response.headers.get("retry-after"));
      await sleep(after > 0 ? after * 1000 : Math.min(5000, 100 * 2 ** attempt));
      continue;
    }
    if (!response.ok) {
      // 409 lease_lost: the lease expired and someone else holds the job; drop it.
      throw Object.assign(new Error(`${path}: ${answer.error}: ${answer.message}`), { answer });
    }
    return answer;
  }
}

let done = 0;
for (;;) {
  const { jobs } = await call(`/v1/queues/${encodeURIComponent(queue)}/lease`, {
    worker_id: workerId, max: 10, wait: 2,
  });
  if (jobs.length === 0 && exitIdle) break;
  const acks = [];
  for (const job of jobs) {
    const handler = handlers[job.task];
    try {
      if (!handler) throw new Error(`unknown task ${job.task}`);
      acks.push({ job_id: job.job_id, attempt_id: job.attempt_id, result: await handler(job.payload) });
    } catch (err) {
      await call(`/v1/jobs/${job.job_id}/fail`, {
        attempt_id: job.attempt_id, error: String(err), permanent: !handler,
      }).catch((e) => console.error(e.message));
    }
  }
  if (acks.length) {
    const { acked, lease_lost } = await call("/v1/ack", { acks }); // one statement for the batch
    done += acked.length;
    if (lease_lost.length) console.error(`lease lost: ${lease_lost.join(", ")}`);
  }
}
console.log(JSON.stringify({ worker_id: workerId, acked: done }));
