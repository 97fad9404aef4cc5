-- pgqueue core schema, revision 0001.
-- The schema-name and channel markers (in braces) are replaced by the quoted
-- schema name and NOTIFY channel when the file is rendered; nothing else is.

CREATE TYPE {schema}.job_status AS ENUM (
    'queued',      -- ready to lease now
    'scheduled',   -- waits for run_at; staged to 'queued' by lease_jobs when due
    'running',     -- leased by a worker
    'succeeded',
    'dead',
    'cancelled'
);

CREATE TYPE {schema}.attempt_outcome AS ENUM (
    'running', 'succeeded', 'failed', 'retry', 'timeout',
    'lease_expired', 'cancelled', 'released'
);

CREATE SEQUENCE {schema}.attempt_id_seq AS bigint;

-- Bookkeeping of enqueue_batch while it settles dedup keys.
CREATE TYPE {schema}.enqueued AS (
    ord bigint, job_id bigint, created boolean, queue text, dedup_key text
);

-- The hot table. It holds live jobs and recently finished ones until
-- `archive` moves them out. The current (or final) attempt lives in the row
-- itself (attempt_id, worker_id, attempt_started_at, lease_expires_at), so a
-- job that succeeds on its first attempt costs one insert and two updates;
-- job_attempts only receives attempts that did not end the job successfully.
CREATE TABLE {schema}.jobs (
    id                 bigint PRIMARY KEY,
    priority           smallint NOT NULL DEFAULT 0,
    status             {schema}.job_status NOT NULL,
    attempts           integer NOT NULL DEFAULT 0,
    max_attempts       integer NOT NULL DEFAULT 5,
    lease_seconds      integer NOT NULL DEFAULT 60,
    run_at             timestamptz NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    attempt_id         bigint,
    attempt_started_at timestamptz,
    lease_expires_at   timestamptz,
    finished_at        timestamptz,
    cancel_requested   boolean NOT NULL DEFAULT false,
    notify_finish      boolean NOT NULL DEFAULT false,
    backoff_base       real,     -- NULL: the default backoff (1s, x2, 3600s, 10% jitter)
    backoff_factor     real,
    backoff_max        real,
    backoff_jitter     real,
    queue              text NOT NULL,
    task               text NOT NULL,
    payload            jsonb NOT NULL,
    worker_id          text,
    dedup_key          text,
    serial_key         text,
    last_error         text,
    result             jsonb
) WITH (
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

CREATE SEQUENCE {schema}.jobs_id_seq AS bigint OWNED BY {schema}.jobs.id;
ALTER TABLE {schema}.jobs ALTER COLUMN id SET DEFAULT nextval('{schema}.jobs_id_seq');

-- The lease scan: one queue at a time, in DESIGN order, over ready jobs only.
CREATE INDEX jobs_ready_idx ON {schema}.jobs (queue, priority DESC, run_at, id)
    WHERE status = 'queued';
-- Staging of scheduled jobs and the worker's "next due" wake-up.
CREATE INDEX jobs_scheduled_idx ON {schema}.jobs (run_at)
    WHERE status = 'scheduled';
-- Reaper (expired leases), concurrency limits (running per queue).
CREATE INDEX jobs_running_idx ON {schema}.jobs (queue, lease_expires_at)
    WHERE status = 'running';
-- Archive cutoffs, dead-letter listing, per-queue finished counts.
CREATE INDEX jobs_finished_idx ON {schema}.jobs (status, finished_at) INCLUDE (queue)
    WHERE status IN ('succeeded', 'dead', 'cancelled');
-- At most one live job per (queue, dedup_key); arbiter of enqueue's ON CONFLICT.
CREATE UNIQUE INDEX jobs_dedup_key_idx ON {schema}.jobs (queue, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('queued', 'scheduled', 'running');
-- Per-key FIFO: "is an earlier live job of this serial key still pending?"
CREATE INDEX jobs_serial_key_idx ON {schema}.jobs (serial_key, id)
    WHERE serial_key IS NOT NULL AND status IN ('queued', 'scheduled', 'running');

-- Every attempt that is not the job's current or final successful one.
CREATE TABLE {schema}.job_attempts (
    id            bigint PRIMARY KEY,          -- the attempt id (fencing token)
    job_id        bigint NOT NULL,
    attempt       integer NOT NULL,
    outcome       {schema}.attempt_outcome NOT NULL,
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz NOT NULL,
    worker_id     text,
    error_code    text,
    error_message text,
    traceback     text
);
CREATE INDEX job_attempts_job_id_idx ON {schema}.job_attempts (job_id);

-- Finished jobs moved out of the hot table by `archive`.
CREATE TABLE {schema}.jobs_archive (
    LIKE {schema}.jobs INCLUDING DEFAULTS,
    archived_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id)
);
ALTER TABLE {schema}.jobs_archive ALTER COLUMN id DROP DEFAULT;
CREATE INDEX jobs_archive_finished_idx ON {schema}.jobs_archive (finished_at);

-- One row per queue that ever received a job or a setting.
CREATE TABLE {schema}.queues (
    name              text PRIMARY KEY,
    paused            boolean NOT NULL DEFAULT false,
    concurrency_limit integer CHECK (concurrency_limit > 0),
    rate_limit        integer CHECK (rate_limit > 0),
    rate_period       interval CHECK (rate_period > interval '0'),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit IS NULL) = (rate_period IS NULL))
);

-- Lease start times of rate-limited queues inside their sliding window.
CREATE TABLE {schema}.queue_lease_log (
    queue     text NOT NULL,
    leased_at timestamptz NOT NULL
);
CREATE INDEX queue_lease_log_idx ON {schema}.queue_lease_log (queue, leased_at);

CREATE TABLE {schema}.workers (
    id                text PRIMARY KEY,
    host              text NOT NULL,
    pid               integer NOT NULL,
    queues            text[],                  -- NULL: every queue
    concurrency       integer NOT NULL,
    started_at        timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- The one backoff formula, used by fail and by the reaper:
-- min(max, base * factor^(attempt-1)), then +/- jitter, never below zero.
-- NULL parameters take the defaults of pgqueue.Backoff().
CREATE FUNCTION {schema}.retry_delay(
    p_attempt integer, p_base real, p_factor real, p_max real, p_jitter real
) RETURNS interval
LANGUAGE sql VOLATILE AS $$
    -- The exponent is capped where the delay passes max, so that no attempt
    -- count overflows a float.
    SELECT make_interval(secs => greatest(0.0, least(b.max, CASE
            WHEN b.base <= 0 THEN 0.0
            WHEN b.factor <= 1 THEN b.base
            ELSE b.base * power(b.factor::float8, least(greatest(p_attempt - 1, 0),
                                ln(greatest(b.max, b.base) / b.base) / ln(b.factor) + 1))
        END) * (1.0 + b.jitter * (2.0 * random() - 1.0))))
    FROM (SELECT coalesce(p_base, 1.0)::float8 AS base, coalesce(p_factor, 2.0)::float8 AS factor,
                 coalesce(p_max, 3600.0)::float8 AS max, coalesce(p_jitter, 0.1)::float8 AS jitter) b
$$;

-- The status users see: a queued job whose run_at is still ahead is
-- 'scheduled', a scheduled one that is due but not yet staged is 'queued'.
CREATE FUNCTION {schema}.visible_status(p_status {schema}.job_status, p_run_at timestamptz)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_status IN ('queued', 'scheduled')
                THEN CASE WHEN p_run_at > now() THEN 'scheduled' ELSE 'queued' END
                ELSE p_status::text END
$$;

-- When the oldest ready job of a queue became ready (NULL: none). The ready
-- index is ordered by priority first, so min(run_at) would read every ready
-- job; instead this takes the first entry of each distinct priority (a loose
-- index scan: a few index probes however long the queue). Due jobs still
-- stored as 'scheduled' (not yet staged) count too.
CREATE FUNCTION {schema}.queue_oldest_ready(p_queue text, p_now timestamptz DEFAULT NULL)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE levels AS (
        (SELECT j.priority FROM {schema}.jobs j
         WHERE j.queue = p_queue AND j.status = 'queued'
         ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM {schema}.jobs j
                WHERE j.queue = p_queue AND j.status = 'queued' AND j.priority < l.priority
                ORDER BY j.priority DESC LIMIT 1)
        FROM levels l WHERE l.priority IS NOT NULL
    )
    SELECT least(
        (SELECT min((SELECT j.run_at FROM {schema}.jobs j
                     WHERE j.queue = p_queue AND j.status = 'queued' AND j.priority = l.priority
                     ORDER BY j.run_at LIMIT 1))
         FROM levels l WHERE l.priority IS NOT NULL),
        (SELECT min(j.run_at) FROM {schema}.jobs j
         WHERE j.status = 'scheduled' AND j.run_at <= coalesce(p_now, now()) AND j.queue = p_queue))
$$;

-- The jobs of p_jobs (a JSON array of job objects, see enqueue_batch) as
-- rows with the defaults applied, with their 1-based position. A plain SQL
-- function, so the planner inlines it into the statements that use it.
CREATE FUNCTION {schema}.enqueue_input(p_jobs jsonb)
RETURNS TABLE (
    ord bigint, task text, payload jsonb, queue text, priority smallint, run_at timestamptz,
    status {schema}.job_status, max_attempts integer, lease_seconds integer, dedup_key text,
    serial_key text, backoff_base real, backoff_factor real, backoff_max real,
    backoff_jitter real
)
LANGUAGE sql STABLE AS $$
    SELECT r.ord, r.task, coalesce(r.payload, '{}'::jsonb), coalesce(r.queue, 'default'),
           coalesce(r.priority, 0)::smallint, t.run_at,
           CASE WHEN t.run_at > now() THEN 'scheduled' ELSE 'queued' END::{schema}.job_status,
           coalesce(r.max_attempts, 5), coalesce(r.lease_seconds, 60), r.dedup_key, r.serial_key,
           r.backoff[1], r.backoff[2], r.backoff[3], r.backoff[4]
    FROM ROWS FROM (jsonb_to_recordset(p_jobs) AS (
        task text, payload jsonb, queue text, priority integer,
        run_at timestamptz, delay float8, max_attempts integer, lease_seconds integer,
        dedup_key text, serial_key text, backoff real[]))
        WITH ORDINALITY AS r(task, payload, queue, priority, run_at, delay, max_attempts,
                             lease_seconds, dedup_key, serial_key, backoff, ord)
    -- delay is added to the database clock, never the client's.
    CROSS JOIN LATERAL (SELECT coalesce(r.run_at, now() + make_interval(secs => coalesce(r.delay, 0)))
                        AS run_at) t
$$;

-- One enqueue attempt for the jobs of p_jobs, or only those at the 1-based
-- positions p_only, keeping track of positions: the path for batches with
-- dedup keys. Rows whose dedup key is held by a live job are skipped (ON
-- CONFLICT DO NOTHING takes no lock on that job, so an open caller
-- transaction never holds up its worker). Returns every considered input
-- with its new id, or NULL when skipped. One notification per queue that
-- received jobs.
CREATE FUNCTION {schema}.enqueue_rows(p_jobs jsonb, p_only bigint[] DEFAULT NULL)
RETURNS TABLE (ord bigint, job_id bigint, queue text, dedup_key text)
LANGUAGE sql AS $$
    WITH input AS MATERIALIZED (
        SELECT nextval('{schema}.jobs_id_seq') AS id, i.*
        FROM {schema}.enqueue_input(p_jobs) i
        WHERE p_only IS NULL OR i.ord = ANY (p_only)
    ),
    inserted AS (
        INSERT INTO {schema}.jobs AS j (
            id, task, payload, queue, priority, run_at, status, max_attempts,
            lease_seconds, dedup_key, serial_key,
            backoff_base, backoff_factor, backoff_max, backoff_jitter)
        SELECT i.id, i.task, i.payload, i.queue, i.priority, i.run_at, i.status, i.max_attempts,
               i.lease_seconds, i.dedup_key, i.serial_key,
               i.backoff_base, i.backoff_factor, i.backoff_max, i.backoff_jitter
        FROM input i
        ORDER BY i.ord
        ON CONFLICT (queue, dedup_key)
            WHERE dedup_key IS NOT NULL AND status IN ('queued', 'scheduled', 'running')
        DO NOTHING
        RETURNING j.id, j.queue
    ),
    new_queues AS (
        SELECT DISTINCT queue FROM inserted
    ),
    registered AS (
        INSERT INTO {schema}.queues (name) SELECT queue FROM new_queues
        ON CONFLICT (name) DO NOTHING
    ),
    -- Scheduled jobs notify too: idle workers recompute when to wake up.
    notified AS (
        SELECT count(pg_notify({channel}, 'j:' || n.queue)) AS n FROM new_queues n
    )
    SELECT i.ord, d.id, i.queue, i.dedup_key
    FROM input i
    LEFT JOIN inserted d ON d.id = i.id
    CROSS JOIN notified
$$;

-- Enqueue a batch given as a JSON array of objects
-- {task, payload, queue, priority, run_at or delay (seconds), max_attempts,
--  dedup_key, serial_key, lease_seconds, backoff: [base, factor, max, jitter]};
-- absent keys take the defaults. A caller that knows whether any job has a
-- dedup key may pass {"jobs": [...], "dedup": true|false} instead, which
-- saves a pass over the jobs (a wrong false fails on the dedup index, it
-- never skips dedup). Queues are registered from the rows actually inserted.
-- Returns one row per job, in input order: the job
-- id and whether it was created (false: a live job with the same
-- (queue, dedup_key) exists and its id is returned).
CREATE FUNCTION {schema}.enqueue_batch(p_jobs jsonb)
RETURNS TABLE (job_id bigint, created boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_jobs    jsonb := p_jobs;
    v_dedup   boolean;
    v_rows    {schema}.enqueued[];
    v_missing bigint[];
BEGIN
    IF jsonb_typeof(p_jobs) = 'object' THEN
        v_jobs := p_jobs -> 'jobs';
        v_dedup := (p_jobs ->> 'dedup')::boolean;
    END IF;
    IF v_dedup IS NULL THEN
        v_dedup := jsonb_path_exists(v_jobs, '$[*] ? (exists(@.dedup_key))');
    END IF;

    IF NOT v_dedup THEN
        -- Nothing can conflict: one plain insert. Ids are drawn from the
        -- sequence in input order, so sorted ids are in input order too.
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO {schema}.jobs AS j (
                id, task, payload, queue, priority, run_at, status, max_attempts,
                lease_seconds, dedup_key, serial_key, backoff_base, backoff_factor,
                backoff_max, backoff_jitter)
            SELECT nextval('{schema}.jobs_id_seq'), i.task, i.payload, i.queue, i.priority,
                   i.run_at, i.status, i.max_attempts, i.lease_seconds, i.dedup_key,
                   i.serial_key, i.backoff_base, i.backoff_factor, i.backoff_max,
                   i.backoff_jitter
            FROM {schema}.enqueue_input(v_jobs) i
            RETURNING j.id, j.queue
        ),
        new_queues AS (
            SELECT DISTINCT queue FROM inserted
        ),
        registered AS (
            INSERT INTO {schema}.queues (name) SELECT queue FROM new_queues
            ON CONFLICT (name) DO NOTHING
        ),
        notified AS (
            SELECT count(pg_notify({channel}, 'j:' || q.queue)) AS n FROM new_queues q
        )
        SELECT d.id, true FROM inserted d CROSS JOIN notified ORDER BY d.id;
        RETURN;
    END IF;

    SELECT array_agg(ROW(e.ord, e.job_id, e.job_id IS NOT NULL, e.queue, e.dedup_key)::{schema}.enqueued)
    INTO v_rows FROM {schema}.enqueue_rows(v_jobs) e;
    FOR attempt IN 1..10 LOOP
        -- A new statement, so a new snapshot: it sees the live duplicate that
        -- made the insert skip (committed before, or inserted by this batch).
        SELECT array_agg(ROW(r.ord, coalesce(r.job_id, live.id), r.created, r.queue,
                             r.dedup_key)::{schema}.enqueued)
        INTO v_rows
        FROM unnest(v_rows) r
        LEFT JOIN LATERAL (
            SELECT j.id FROM {schema}.jobs j
            WHERE r.job_id IS NULL AND j.queue = r.queue AND j.dedup_key = r.dedup_key
              AND j.status IN ('queued', 'scheduled', 'running')
            LIMIT 1
        ) live ON true;
        SELECT array_agg(r.ord) INTO v_missing FROM unnest(v_rows) r WHERE r.job_id IS NULL;
        IF v_missing IS NULL THEN
            RETURN QUERY SELECT r.job_id, r.created FROM unnest(v_rows) r ORDER BY r.ord;
            RETURN;
        END IF;
        -- The live duplicate finished in between: enqueue those after all.
        SELECT array_agg(ROW(r.ord, coalesce(r.job_id, e.job_id),
                             r.created OR e.job_id IS NOT NULL, r.queue, r.dedup_key)::{schema}.enqueued)
        INTO v_rows
        FROM unnest(v_rows) r
        LEFT JOIN {schema}.enqueue_rows(v_jobs, v_missing) e ON e.ord = r.ord;
    END LOOP;
    RAISE EXCEPTION 'pgqueue: dedup keys kept changing under this enqueue; retry it'
        USING ERRCODE = '40001';
END;
$$;

-- The SQL API: enqueue one job from any language, inside the caller's
-- transaction. Returns the job id (the live job's id on a dedup hit).
CREATE FUNCTION {schema}.enqueue(
    task         text,
    payload      jsonb DEFAULT '{}',
    queue        text DEFAULT 'default',
    priority     integer DEFAULT 0,
    run_at       timestamptz DEFAULT now(),
    max_attempts integer DEFAULT NULL,
    dedup_key    text DEFAULT NULL,
    serial_key   text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    IF task IS NULL OR btrim(task) = '' OR length(task) > 255 OR task ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgqueue: invalid task name %', quote_literal(left(coalesce(task, 'NULL'), 80))
            USING ERRCODE = '22023',
                  HINT = 'task names are 1 to 255 characters without control characters';
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9_.:-]{1,128}$' THEN
        RAISE EXCEPTION 'pgqueue: invalid queue name %', quote_literal(coalesce(queue, 'NULL'))
            USING ERRCODE = '22023',
                  HINT = 'queue names are 1 to 128 characters from A-Z a-z 0-9 _ . : -';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'pgqueue: payload must be a JSON object'
            USING ERRCODE = '22023';
    END IF;
    IF dedup_key = '' OR serial_key = '' THEN
        RAISE EXCEPTION 'pgqueue: dedup_key and serial_key must be NULL or non-empty'
            USING ERRCODE = '22023';
    END IF;
    IF max_attempts IS NOT NULL AND max_attempts < 1 THEN
        RAISE EXCEPTION 'pgqueue: max_attempts must be at least 1'
            USING ERRCODE = '22023';
    END IF;
    IF priority IS NULL OR priority NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'pgqueue: priority must be a smallint'
            USING ERRCODE = '22023';
    END IF;
    SELECT b.job_id INTO v_id
    FROM {schema}.enqueue_batch(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'task', task, 'payload', payload, 'queue', queue, 'priority', priority,
        'run_at', coalesce(run_at, now()), 'max_attempts', max_attempts,
        'dedup_key', dedup_key, 'serial_key', serial_key)))) AS b;
    RETURN v_id;
END;
$$;

-- Lease up to p_limit ready jobs for a worker, across the given queues
-- (NULL: every queue), honouring pause, per-queue concurrency and rate
-- limits, and serial keys. Also stages due scheduled jobs first.
--
-- Each statement of a VOLATILE plpgsql function takes a fresh snapshot, which
-- is what makes the limits exact: a limited queue's row is locked first, and
-- only then are its running jobs and recent leases counted, so the count sees
-- every lease committed by whoever held the lock before.
CREATE FUNCTION {schema}.lease_jobs(
    p_queues    text[],
    p_worker_id text,
    p_limit     integer,
    p_lease_seconds integer DEFAULT NULL,   -- NULL: each job's own lease_seconds
    p_now       timestamptz DEFAULT NULL
) RETURNS TABLE (
    job_id           bigint,
    attempt_id       bigint,
    attempt          integer,
    task             text,
    queue            text,
    payload          jsonb,
    lease_expires_at timestamptz,
    lease_seconds    integer
)
LANGUAGE plpgsql
-- Plan every statement with the table as it is now. A plan cached while the
-- table was empty (or before autovacuum analyzed a sudden backlog) would scan
-- and sort the whole table on every lease.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_left    integer := p_limit;
    v_cap     integer;
    v_got     integer;
    v_queue   record;
    v_ctl     record;
    v_staged  text[];
BEGIN
    -- Stage due scheduled jobs (any queue); other queues' workers are told.
    WITH due AS MATERIALIZED (
        SELECT id FROM {schema}.jobs
        WHERE status = 'scheduled' AND run_at <= v_now
        ORDER BY run_at
        LIMIT 1000
        FOR UPDATE SKIP LOCKED
    ), staged AS (
        UPDATE {schema}.jobs j SET status = 'queued'
        WHERE j.id = ANY (ARRAY(SELECT id FROM due))
        RETURNING j.queue
    )
    SELECT array_agg(DISTINCT s.queue) INTO v_staged FROM staged s;
    IF v_staged IS NOT NULL THEN
        PERFORM pg_notify({channel}, 'j:' || s) FROM unnest(v_staged) s;
    END IF;

    FOR v_queue IN
        SELECT q.name, q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL AS limited
        FROM {schema}.queues q
        WHERE NOT q.paused AND (p_queues IS NULL OR q.name = ANY (p_queues))
        ORDER BY random()   -- no queue is always served first
    LOOP
        EXIT WHEN v_left <= 0;
        v_cap := v_left;

        IF v_queue.limited THEN
            SELECT q.paused, q.concurrency_limit, q.rate_limit, q.rate_period INTO v_ctl
            FROM {schema}.queues q WHERE q.name = v_queue.name
            FOR UPDATE;
            CONTINUE WHEN v_ctl.paused;
            IF p_now IS NULL THEN
                v_now := clock_timestamp();  -- leases of this queue are ordered by the lock
            END IF;
            IF v_ctl.concurrency_limit IS NOT NULL THEN
                v_cap := least(v_cap, v_ctl.concurrency_limit - (
                    SELECT count(*) FROM {schema}.jobs j
                    WHERE j.queue = v_queue.name AND j.status = 'running'
                      AND j.lease_expires_at > v_now)::integer);
            END IF;
            IF v_ctl.rate_limit IS NOT NULL THEN
                DELETE FROM {schema}.queue_lease_log l
                WHERE l.queue = v_queue.name AND l.leased_at <= v_now - v_ctl.rate_period;
                v_cap := least(v_cap, v_ctl.rate_limit - (
                    SELECT count(*) FROM {schema}.queue_lease_log l
                    WHERE l.queue = v_queue.name)::integer);
            END IF;
            CONTINUE WHEN v_cap <= 0;
        END IF;

        RETURN QUERY
        WITH picked AS MATERIALIZED (
            -- MATERIALIZED keeps LIMIT + SKIP LOCKED in one scan; inlined, the
            -- planner may re-run the subquery per joined row.
            SELECT j.id FROM {schema}.jobs j
            WHERE j.queue = v_queue.name AND j.status = 'queued' AND j.run_at <= v_now
              AND (j.serial_key IS NULL OR NOT EXISTS (
                    SELECT 1 FROM {schema}.jobs s
                    WHERE s.serial_key = j.serial_key
                      AND s.status IN ('queued', 'scheduled', 'running')
                      AND (s.id < j.id OR s.status = 'running')))
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT v_cap
            FOR UPDATE SKIP LOCKED
        )
        , leased AS (
        UPDATE {schema}.jobs j
        SET status = 'running',
            attempts = j.attempts + 1,
            attempt_id = nextval('{schema}.attempt_id_seq'),
            worker_id = p_worker_id,
            attempt_started_at = v_now,
            lease_expires_at = v_now + make_interval(secs => coalesce(p_lease_seconds, j.lease_seconds))
        -- = ANY(ARRAY(...)): primary-key lookups; a join lets the planner
        -- hash the whole table instead.
        WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
        RETURNING j.id, j.attempt_id, j.attempts, j.task, j.queue, j.payload, j.lease_expires_at,
                  coalesce(p_lease_seconds, j.lease_seconds) AS lease_seconds, j.priority, j.run_at
        )
        SELECT l.id, l.attempt_id, l.attempts, l.task, l.queue, l.payload, l.lease_expires_at,
               l.lease_seconds
        FROM leased l
        ORDER BY l.priority DESC, l.run_at, l.id;  -- the batch in DESIGN order

        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
        IF v_queue.limited AND v_got > 0 THEN
            IF v_ctl.rate_limit IS NOT NULL THEN
                INSERT INTO {schema}.queue_lease_log (queue, leased_at)
                SELECT v_queue.name, v_now FROM generate_series(1, v_got);
            END IF;
        END IF;
    END LOOP;
END;
$$;
