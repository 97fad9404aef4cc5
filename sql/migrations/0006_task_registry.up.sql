-- pgqueue revision 0006: the task registry, live task settings, per-task
-- limits, unlimited attempts, and lost workers.
--
-- * tasks: what workers published at start-up (one row per task name: its
--   declared queue, priority, max_attempts, lease, timeout and backoff, and
--   when a worker last published it). Enqueue by name reads it for the
--   fields the producer left unset, so a producer that never imported a
--   task still gets its declared defaults. Which live workers have a task is
--   workers.tasks.
-- * task_settings: what operators set (`pgqueue task set|limit`). Live
--   settings apply to every job of the task from its next lease on:
--   lease_seconds by the lease statement, max_attempts and backoff where an
--   attempt fails (the jobs' own columns are left as enqueued), timeout by
--   the Python worker, priority to jobs enqueued without one.
--   Limits (concurrency, rate) are enforced by the lease statement across
--   all workers, without holding back the other tasks of a queue.
-- * max_attempts = 0: retry forever (the backoff's max caps the delay).
-- * workers.lost_at: when a silent worker was declared lost.
--
-- Since 0005 failing and reaping run in its SECURITY DEFINER functions:
-- fail_jobs and reap_jobs are replaced here (live settings, hand-backs of
-- unknown tasks), and workers publish their tasks through publish_tasks (the
-- worker role writes no table but workers).

-- Objects are created as the schema's owner even when a member of it (an
-- admin of `pgqueue grant --admin`) migrates, as in 0005: the SECURITY
-- DEFINER functions run as that owner and must be able to use them.
DO $$
DECLARE
    v_owner name := (SELECT r.rolname FROM pg_class c
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     JOIN pg_roles r ON r.oid = n.nspowner
                     WHERE c.oid = '{schema}.jobs'::regclass);
BEGIN
    IF v_owner <> current_user AND pg_has_role(current_user, v_owner, 'MEMBER') THEN
        EXECUTE format('SET LOCAL ROLE %I', v_owner);
    END IF;
END;
$$;

CREATE TABLE {schema}.tasks (
    name            text PRIMARY KEY,
    queue           text NOT NULL,
    priority        smallint NOT NULL DEFAULT 0,
    max_attempts    integer NOT NULL DEFAULT 5 CHECK (max_attempts >= 0),
    lease_seconds   integer NOT NULL DEFAULT 60 CHECK (lease_seconds > 0),
    timeout_seconds float8 CHECK (timeout_seconds > 0),
    backoff         real[] CHECK (cardinality(backoff) = 4),
    published_by    text,                   -- the worker that published it last
    first_seen_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.task_settings (
    name              text PRIMARY KEY,
    max_attempts      integer CHECK (max_attempts >= 0),
    lease_seconds     integer CHECK (lease_seconds > 0),
    timeout_seconds   float8 CHECK (timeout_seconds > 0),
    priority          smallint,
    backoff           real[] CHECK (cardinality(backoff) = 4),
    concurrency_limit integer CHECK (concurrency_limit > 0),
    rate_limit        integer CHECK (rate_limit > 0),
    rate_period       interval CHECK (rate_period > interval '0'),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit IS NULL) = (rate_period IS NULL))
);

-- Lease start times of rate-limited tasks inside their sliding window.
CREATE TABLE {schema}.task_lease_log (
    task      text NOT NULL,
    leased_at timestamptz NOT NULL
);
CREATE INDEX task_lease_log_idx ON {schema}.task_lease_log (task, leased_at);

-- Task statistics over a time window: failed attempts by when they ended
-- (finished jobs have jobs_finished_idx and jobs_archive_finished_idx). No
-- index on jobs for the running count per task: every lease and completion
-- would pay for it; the count reads jobs_running_idx (running jobs only).
CREATE INDEX job_attempts_finished_idx ON {schema}.job_attempts (finished_at);

ALTER TABLE {schema}.workers
    ADD COLUMN tasks   text[],        -- the task names this worker can run
    ADD COLUMN lost_at timestamptz;   -- set when declared lost (silent too long)

-- (max_attempts 0 is valid for jobs and schedules since 0005.)

-- As in 0005 (every row validated by plain expressions, else check_job),
-- with defaults now coming, field by field, from (first wins): the job
-- object; the operator's task setting (priority only: the other settings
-- apply at lease); the producer's code ("default_priority", sent only when
-- it is not 0); the task registry (only for jobs marked "lookup": the
-- producer did not know the task); the built-in defaults. The lookups are
-- scalar subqueries, run only for the rows that need them, so rows keep
-- their input order. Registry values were validated when published
-- (publish_tasks).
CREATE OR REPLACE FUNCTION {schema}.enqueue_input(p_jobs jsonb)
RETURNS TABLE (
    ord bigint, task text, payload jsonb, queue text, priority smallint, run_at timestamptz,
    status {schema}.job_status, max_attempts integer, lease_seconds integer, dedup_key text,
    serial_key text, backoff_base real, backoff_factor real, backoff_max real,
    backoff_jitter real
)
LANGUAGE sql STABLE AS $$
    SELECT r.ord, r.task, coalesce(r.payload, '{}'::jsonb),
           coalesce(r.queue, CASE WHEN r.lookup THEN (
               SELECT g.queue FROM {schema}.tasks g WHERE g.name = r.task) END, 'default'),
           coalesce(r.priority,
                    CASE WHEN (SELECT EXISTS (SELECT 1 FROM {schema}.task_settings s
                                              WHERE s.priority IS NOT NULL)) THEN (
                        SELECT s.priority FROM {schema}.task_settings s WHERE s.name = r.task) END,
                    r.default_priority,
                    CASE WHEN r.lookup THEN (
                        SELECT g.priority FROM {schema}.tasks g WHERE g.name = r.task) END,
                    0)::smallint,
           t.run_at,
           CASE WHEN t.run_at > now() THEN 'scheduled' ELSE 'queued' END::{schema}.job_status,
           coalesce(r.max_attempts, CASE WHEN r.lookup THEN (
               SELECT g.max_attempts FROM {schema}.tasks g WHERE g.name = r.task) END, 5),
           coalesce(r.lease_seconds, CASE WHEN r.lookup THEN (
               SELECT g.lease_seconds FROM {schema}.tasks g WHERE g.name = r.task) END, 60),
           r.dedup_key, r.serial_key,
           b.backoff[1], b.backoff[2], b.backoff[3], b.backoff[4]
    FROM ROWS FROM (jsonb_to_recordset(p_jobs) AS (
        task text, payload jsonb, queue text, priority integer,
        run_at timestamptz, delay float8, max_attempts integer, lease_seconds integer,
        dedup_key text, serial_key text, backoff real[], lookup boolean,
        default_priority integer))
        WITH ORDINALITY AS r(task, payload, queue, priority, run_at, delay, max_attempts,
                             lease_seconds, dedup_key, serial_key, backoff, lookup,
                             default_priority, ord)
    -- delay is added to the database clock, never the client's.
    CROSS JOIN LATERAL (SELECT coalesce(r.run_at, now() + make_interval(secs => CASE
                            WHEN r.delay BETWEEN 0 AND 3153600000 THEN coalesce(r.delay, 0) ELSE 0 END))
                        AS run_at) t
    CROSS JOIN LATERAL (SELECT coalesce(r.backoff, CASE WHEN r.lookup THEN (
                            SELECT g.backoff FROM {schema}.tasks g WHERE g.name = r.task) END)
                        AS backoff) b
    -- The common case is decided by plain expressions (no function call per
    -- row); anything else goes to check_job, which names the problem.
    -- (No bounded repetitions like {1,255} in the patterns: PostgreSQL's
    -- regex engine makes them ~100 times slower than a length check.)
    WHERE CASE WHEN length(r.task) BETWEEN 1 AND 255 AND r.task !~ '[[:cntrl:]]'
                    AND btrim(r.task) <> ''
                    AND length(coalesce(r.queue, 'default')) BETWEEN 1 AND 128
                    AND coalesce(r.queue, 'default') !~ '[^A-Za-z0-9_.:-]'
                    AND jsonb_typeof(coalesce(r.payload, '{}'::jsonb)) = 'object'
                    AND pg_column_size(coalesce(r.payload, '{}'::jsonb)) * 8 <= least(8000,
                            (SELECT l.max_payload_bytes FROM {schema}.limits l))
                    AND (r.dedup_key IS NULL OR octet_length(r.dedup_key) BETWEEN 1 AND 1024)
                    AND (r.serial_key IS NULL OR octet_length(r.serial_key) BETWEEN 1 AND 1024)
                    AND (r.priority IS NULL OR r.priority BETWEEN -32768 AND 32767)
                    AND (r.default_priority IS NULL OR r.default_priority BETWEEN -32768 AND 32767)
                    AND (r.delay IS NULL OR r.delay BETWEEN 0 AND 3153600000)
                    AND t.run_at >= '1970-01-01 00:00:00+00' AND t.run_at < '2500-01-01 00:00:00+00'
                    AND (r.max_attempts IS NULL OR r.max_attempts >= 0)
                    AND (r.lease_seconds IS NULL OR r.lease_seconds >= 1)
                    AND r.backoff IS NULL
               THEN true
               ELSE {schema}.check_job(
        CASE WHEN jsonb_array_length(p_jobs) > 1 THEN r.ord END, r.task,
        coalesce(r.payload, '{}'::jsonb), coalesce(r.queue, 'default'),
        coalesce(r.priority, r.default_priority),
        CASE WHEN r.delay IS NULL OR r.delay BETWEEN 0 AND 3153600000 THEN t.run_at
             ELSE now() END,
        r.delay, r.max_attempts, r.lease_seconds, r.dedup_key, r.serial_key, r.backoff,
        coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576)) END
$$;

-- The SQL API's plain path, as in 0005 (every check is check_job's), with
-- queue and priority defaulting to NULL: the task's declared defaults
-- (registry) or live setting apply, else 'default' and 0. max_attempts 0
-- means unlimited.
CREATE OR REPLACE FUNCTION {schema}.enqueue_plain(
    task         text,
    payload      jsonb DEFAULT '{}',
    queue        text DEFAULT NULL,
    priority     integer DEFAULT NULL,
    run_at       timestamptz DEFAULT now(),
    max_attempts integer DEFAULT NULL,
    dedup_key    text DEFAULT NULL,
    serial_key   text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        -- Before jsonb_build_object, which would drop a JSON null.
        RAISE EXCEPTION 'pgqueue: payload must be a JSON object' USING ERRCODE = '22023';
    END IF;
    PERFORM {schema}.check_job(NULL, task, payload, coalesce(queue, 'default'), priority,
                               coalesce(run_at, now()), NULL, max_attempts, NULL, dedup_key,
                               serial_key, NULL,
                               coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576));
    SELECT b.job_id INTO v_id
    FROM {schema}.enqueue_batch(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'task', task, 'payload', payload, 'queue', queue, 'priority', priority,
        'run_at', coalesce(run_at, now()), 'max_attempts', max_attempts,
        'dedup_key', dedup_key, 'serial_key', serial_key, 'lookup', true)))) AS b;
    RETURN v_id;
END;
$$;

-- Lease, as in 0005 (SECURITY DEFINER, trusted clock, bounded limit, only
-- queues holding ready jobs), plus:
--  * a task's live lease_seconds setting for the lease of each of its jobs
--    (its max_attempts and backoff settings are read when an attempt fails:
--    fail_jobs, reap_jobs);
--  * per-task limits. A limited task's settings row is locked with SKIP
--    LOCKED (a task another lease is counting is left to it this time, so
--    leases never wait on each other for a task, and cannot deadlock), its
--    running jobs and recent leases are counted after the lock (exact, like
--    queue limits), and jobs of a task at its limit are skipped while the
--    other tasks of the queue are leased. Without limited tasks the lease
--    statement is the one of 0005.
CREATE OR REPLACE FUNCTION {schema}.lease_jobs(
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
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = auto
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    -- (A call only when a clock is passed: it costs more than the rest of an idle lease.)
    v_fixed   timestamptz := CASE WHEN p_now IS NOT NULL THEN {schema}.trusted_clock(p_now) END;
    v_now     timestamptz := coalesce(v_fixed, clock_timestamp());
    v_limit   integer := least(coalesce(p_limit, 1), 10000);
    v_left    integer := v_limit;
    -- (greatest() would turn a NULL, "each job's own", into 1)
    v_lease   integer := CASE WHEN p_lease_seconds IS NOT NULL THEN greatest(p_lease_seconds, 1) END;
    v_cap     integer;
    v_got     integer;
    v_queue   record;
    v_ctl     record;
    v_staged  text[];
    v_tuned   boolean;      -- some task has a live lease_seconds setting
    v_limited text[];       -- tasks with a concurrency or rate limit
    v_blocked text[] := '{}';  -- limited tasks this call may not lease (full, or counted by another lease)
    v_caps    jsonb := '{}';   -- free slots of the limited tasks this call holds
    v_ids     bigint[];
    v_tasks   text[];
    v_take    bigint[];
    v_t       text;
    v_n       integer;
    v_tctl    record;
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

    SELECT coalesce(bool_or(s.lease_seconds IS NOT NULL), false),
           array_agg(s.name) FILTER (WHERE s.concurrency_limit IS NOT NULL OR s.rate_limit IS NOT NULL)
    INTO v_tuned, v_limited
    FROM {schema}.task_settings s;

    FOR v_queue IN
        SELECT q.name, q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL AS limited
        FROM {schema}.queues q
        WHERE NOT q.paused AND q.name = ANY (CASE
            WHEN p_queues IS NOT NULL THEN p_queues
            -- Every queue: only those holding ready jobs, found by a loose
            -- index scan of the ready index (one probe per such queue).
            ELSE ARRAY(
                WITH RECURSIVE ready(name) AS (
                    (SELECT j.queue FROM {schema}.jobs j
                     WHERE j.status = 'queued' ORDER BY j.queue LIMIT 1)
                    UNION ALL
                    SELECT (SELECT j.queue FROM {schema}.jobs j
                            WHERE j.queue > r.name AND j.status = 'queued'
                            ORDER BY j.queue LIMIT 1)
                    FROM ready r WHERE r.name IS NOT NULL
                )
                SELECT r.name FROM ready r WHERE r.name IS NOT NULL)
            END)
        ORDER BY random()   -- no queue is always served first
    LOOP
        EXIT WHEN v_left <= 0;
        v_cap := v_left;

        IF v_queue.limited THEN
            SELECT q.paused, q.concurrency_limit, q.rate_limit, q.rate_period INTO v_ctl
            FROM {schema}.queues q WHERE q.name = v_queue.name
            FOR UPDATE;
            CONTINUE WHEN v_ctl.paused;
            IF v_fixed IS NULL THEN
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

        v_got := 0;
        IF v_limited IS NULL THEN
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
                lease_expires_at = v_now + make_interval(secs => coalesce(v_lease,
                    CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END,
                    j.lease_seconds))
            -- = ANY(ARRAY(...)): primary-key lookups; a join lets the planner
            -- hash the whole table instead.
            WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
            RETURNING j.id, j.attempt_id, j.attempts, j.task, j.queue, j.payload, j.lease_expires_at,
                      coalesce(v_lease, CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END, j.lease_seconds) AS lease_seconds, j.priority, j.run_at
            )
            SELECT l.id, l.attempt_id, l.attempts, l.task, l.queue, l.payload, l.lease_expires_at,
                   l.lease_seconds
            FROM leased l
            ORDER BY l.priority DESC, l.run_at, l.id;  -- the batch in DESIGN order
            GET DIAGNOSTICS v_got = ROW_COUNT;
        ELSE
            -- Each round drops only jobs of tasks that just reached their
            -- limit (and are blocked from then on), so this ends after at
            -- most one round per limited task.
            LOOP
                SELECT array_agg(p.id ORDER BY p.ord), array_agg(p.task ORDER BY p.ord)
                INTO v_ids, v_tasks
                FROM (
                    SELECT j.id, j.task, row_number() OVER () AS ord FROM (
                        SELECT j.id, j.task FROM {schema}.jobs j
                        WHERE j.queue = v_queue.name AND j.status = 'queued' AND j.run_at <= v_now
                          AND j.task <> ALL (v_blocked)
                          AND (j.serial_key IS NULL OR NOT EXISTS (
                                SELECT 1 FROM {schema}.jobs s
                                WHERE s.serial_key = j.serial_key
                                  AND s.status IN ('queued', 'scheduled', 'running')
                                  AND (s.id < j.id OR s.status = 'running')))
                        ORDER BY j.priority DESC, j.run_at, j.id
                        LIMIT v_cap
                        FOR UPDATE SKIP LOCKED
                    ) j
                ) p;
                EXIT WHEN v_ids IS NULL;

                -- Count the limited tasks met for the first time in this call.
                FOR v_t IN
                    SELECT DISTINCT t FROM unnest(v_tasks) t
                    WHERE t = ANY (v_limited) AND NOT v_caps ? t
                    ORDER BY t
                LOOP
                    SELECT s.concurrency_limit, s.rate_limit, s.rate_period INTO v_tctl
                    FROM {schema}.task_settings s WHERE s.name = v_t
                    FOR UPDATE SKIP LOCKED;
                    IF NOT FOUND THEN
                        v_blocked := v_blocked || v_t;
                        v_caps := v_caps || jsonb_build_object(v_t, 0);
                        CONTINUE;
                    END IF;
                    IF v_fixed IS NULL THEN
                        v_now := clock_timestamp();
                    END IF;
                    v_n := v_limit;
                    IF v_tctl.concurrency_limit IS NOT NULL THEN
                        v_n := least(v_n, v_tctl.concurrency_limit - (
                            SELECT count(*) FROM {schema}.jobs j
                            WHERE j.task = v_t AND j.status = 'running'
                              AND j.lease_expires_at > v_now)::integer);
                    END IF;
                    IF v_tctl.rate_limit IS NOT NULL THEN
                        DELETE FROM {schema}.task_lease_log l
                        WHERE l.task = v_t AND l.leased_at <= v_now - v_tctl.rate_period;
                        v_n := least(v_n, v_tctl.rate_limit - (
                            SELECT count(*) FROM {schema}.task_lease_log l
                            WHERE l.task = v_t)::integer);
                    END IF;
                    v_caps := v_caps || jsonb_build_object(v_t, greatest(v_n, 0));
                END LOOP;

                -- Keep every job of an unlimited task, and the first free-slot
                -- many of each limited one, in lease order.
                SELECT array_agg(x.id ORDER BY x.ord) INTO v_take
                FROM (
                    SELECT u.id, u.ord, u.task,
                           row_number() OVER (PARTITION BY u.task ORDER BY u.ord) AS nth
                    FROM unnest(v_ids, v_tasks) WITH ORDINALITY AS u(id, task, ord)
                ) x
                WHERE NOT v_caps ? x.task OR x.nth <= (v_caps ->> x.task)::integer;

                IF v_take IS NOT NULL THEN
                    RETURN QUERY
                    WITH leased AS (
                    UPDATE {schema}.jobs j
                    SET status = 'running',
                        attempts = j.attempts + 1,
                        attempt_id = nextval('{schema}.attempt_id_seq'),
                        worker_id = p_worker_id,
                        attempt_started_at = v_now,
                        lease_expires_at = v_now + make_interval(secs => coalesce(v_lease,
                            CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END,
                    j.lease_seconds))
                    WHERE j.id = ANY (v_take)
                    RETURNING j.id, j.attempt_id, j.attempts, j.task, j.queue, j.payload,
                              j.lease_expires_at,
                              coalesce(v_lease, CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END, j.lease_seconds) AS lease_seconds,
                              j.priority, j.run_at
                    )
                    SELECT l.id, l.attempt_id, l.attempts, l.task, l.queue, l.payload,
                           l.lease_expires_at, l.lease_seconds
                    FROM leased l
                    ORDER BY l.priority DESC, l.run_at, l.id;
                    GET DIAGNOSTICS v_n = ROW_COUNT;
                    v_got := v_got + v_n;
                    v_cap := v_cap - v_n;

                    -- Use up the slots of the limited tasks just leased.
                    FOR v_t, v_n IN
                        SELECT u.task, count(*)::integer FROM unnest(v_ids, v_tasks) AS u(id, task)
                        WHERE u.id = ANY (v_take) AND v_caps ? u.task
                        GROUP BY u.task
                    LOOP
                        v_caps := v_caps || jsonb_build_object(v_t, (v_caps ->> v_t)::integer - v_n);
                        IF EXISTS (SELECT 1 FROM {schema}.task_settings s
                                   WHERE s.name = v_t AND s.rate_limit IS NOT NULL) THEN
                            INSERT INTO {schema}.task_lease_log (task, leased_at)
                            SELECT v_t, v_now FROM generate_series(1, v_n);
                        END IF;
                    END LOOP;
                END IF;
                SELECT coalesce(array_agg(e.key), '{}') INTO v_blocked
                FROM jsonb_each_text(v_caps) e WHERE e.value::integer <= 0;

                -- Done unless jobs were dropped for a limit and room is left.
                EXIT WHEN coalesce(cardinality(v_take), 0) = cardinality(v_ids) OR v_cap <= 0;
            END LOOP;
        END IF;

        IF v_queue.limited AND v_got > 0 THEN
            IF v_ctl.rate_limit IS NOT NULL THEN
                INSERT INTO {schema}.queue_lease_log (queue, leased_at)
                SELECT v_queue.name, v_now FROM generate_series(1, v_got);
            END IF;
        END IF;
        v_left := v_left - v_got;
    END LOOP;
END;
$$;

-- The SQL API as of 0008 (0007's dedup_window/debounce plus traceparent),
-- with queue and priority defaulting to NULL as above. A windowed enqueue
-- needs the queue before the job exists (its key lock and lookup are per
-- queue): the registry's.
CREATE OR REPLACE FUNCTION {schema}.enqueue(
    task         text,
    payload      jsonb DEFAULT '{}',
    queue        text DEFAULT NULL,
    priority     integer DEFAULT NULL,
    run_at       timestamptz DEFAULT now(),
    max_attempts integer DEFAULT NULL,
    dedup_key    text DEFAULT NULL,
    serial_key   text DEFAULT NULL,
    dedup_window interval DEFAULT NULL,
    debounce     interval DEFAULT NULL,
    traceparent  text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id      bigint;
    v_context text;
BEGIN
    IF traceparent IS NOT NULL THEN
        IF traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
            RAISE EXCEPTION 'pgqueue: traceparent must be a W3C traceparent like 00-<32 hex>-<16 hex>-01, got %',
                    quote_literal(left(traceparent, 80))
                USING ERRCODE = '22023';
        END IF;
        -- Set for this call only: put back below (an error aborts the
        -- transaction or savepoint, which puts it back too).
        v_context := current_setting('pgqueue.trace_context', true);
        PERFORM set_config('pgqueue.trace_context',
                           jsonb_build_object('traceparent', traceparent)::text, true);
    END IF;
    IF dedup_window IS NOT NULL OR debounce IS NOT NULL THEN
        queue := coalesce(queue, (SELECT g.queue FROM {schema}.tasks g WHERE g.name = task),
                          'default');
        PERFORM {schema}.dedup_lock(ARRAY[{schema}.dedup_lock_key(queue, dedup_key)]);
        v_id := {schema}.dedup_claim(queue, dedup_key, dedup_window, debounce, payload);
        IF v_id IS NOT NULL THEN
            IF traceparent IS NOT NULL THEN
                PERFORM set_config('pgqueue.trace_context', coalesce(v_context, ''), true);
            END IF;
            RETURN v_id;
        END IF;
        IF debounce IS NOT NULL THEN
            run_at := now() + debounce;
        END IF;
    END IF;
    v_id := {schema}.enqueue_plain(task, payload, queue, priority, run_at, max_attempts,
                                   dedup_key, serial_key);
    IF traceparent IS NOT NULL THEN
        PERFORM set_config('pgqueue.trace_context', coalesce(v_context, ''), true);
    END IF;
    RETURN v_id;
END;
$$;

-- Record failed attempts: 0005's fail_jobs plus
--  * an operator's live max_attempts and backoff for the task (pgqueue task
--    set), read here rather than copied into the jobs;
--  * p_graces: per failure, the grace period (seconds) of a task the worker
--    does not know. Within it of the job's creation, or while a live worker
--    knows the task, the job is handed back (a 'released' attempt, not
--    counted): soon when a live worker knows the task, else later the longer
--    the job has waited (at most a minute). After it: dead, as before.
-- A new parameter: dropped and created again (the worker's grant is given
-- again by `pgqueue migrate`).
DROP FUNCTION {schema}.fail_jobs(bigint[], bigint[], text[], timestamptz[], float8[], boolean[], text[], text[], text[], timestamptz);
CREATE FUNCTION {schema}.fail_jobs(
    p_job_ids bigint[], p_attempt_ids bigint[], p_outcomes text[], p_retry_ats timestamptz[],
    p_retry_delays float8[], p_permanent boolean[], p_error_codes text[],
    p_error_messages text[], p_tracebacks text[], p_now timestamptz DEFAULT NULL,
    p_graces float8[] DEFAULT NULL
) RETURNS TABLE (job_id bigint, attempt_id bigint, status text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- EXECUTE: planned for the arrays at hand on every call, as the
    -- statement was before; a cached generic plan joins them quadratically.
    RETURN QUERY EXECUTE $q$
WITH clock AS MATERIALIZED (
    SELECT CASE WHEN $10 IS NULL THEN now() ELSE coalesce({schema}.trusted_clock($10), now()) END AS now
), failed AS (
    SELECT f.job_id, f.attempt_id,
           CASE WHEN f.outcome IN ('failed', 'retry', 'timeout', 'cancelled', 'lease_expired')
                THEN f.outcome ELSE 'failed' END::{schema}.attempt_outcome AS outcome,
           f.retry_at, f.retry_delay, coalesce(f.permanent, false) AS permanent,
           coalesce(f.error_code, 'error') AS error_code, f.error_message, f.traceback,
           -- (bounded: a year at most)
           CASE WHEN f.grace >= 0 THEN least(f.grace, 31536000) END AS grace
    FROM unnest($1, $2, $3, $4, $5, $6,
                $7, $8, $9, $11)
        AS f(job_id, attempt_id, outcome, retry_at, retry_delay, permanent, error_code,
             error_message, traceback, grace)
    WHERE f.job_id IS NOT NULL
), decided AS (
    SELECT f.*, j.attempts, j.attempt_started_at, j.worker_id, j.notify_finish,
           CASE WHEN j.cancel_requested THEN 'cancelled'
                -- A task this worker does not know: handed back (not counted)
                -- within the grace period, or while a live worker knows it.
                WHEN f.grace IS NOT NULL AND (
                    j.created_at > c.now - make_interval(secs => f.grace) OR k.known)
                    THEN 'defer'
                WHEN f.permanent OR (m.max_attempts > 0 AND j.attempts >= m.max_attempts) THEN 'dead'
                ELSE 'retry' END AS next,
           CASE WHEN f.grace IS NOT NULL THEN
               -- Handed back: soon when a live worker knows the task, else
               -- later the longer the job has waited (at most a minute).
               c.now + make_interval(secs => (0.75 + 0.5 * random())
                   * CASE WHEN k.known THEN 0.5
                          ELSE least(60.0, greatest(1.0, extract(epoch FROM
                                   c.now - j.created_at) / 10.0))
                     END)
           ELSE least(greatest(coalesce(f.retry_at, c.now + coalesce(
               CASE WHEN f.retry_delay IS NOT NULL  -- (greatest() would turn NULL into 0)
                    THEN make_interval(secs => CASE WHEN f.retry_delay BETWEEN 0 AND 31536000
                                                    THEN f.retry_delay
                                                    WHEN f.retry_delay > 0 THEN 31536000
                                                    ELSE 0 END) END,
               {schema}.retry_delay(j.attempts, m.backoff_base, m.backoff_factor,
                                    m.backoff_max, m.backoff_jitter))), '1970-01-01 00:00:00+00'),
                 '2499-12-31 00:00:00+00') END AS next_run_at
    FROM failed f
    CROSS JOIN clock c
    JOIN {schema}.jobs j ON j.id = f.job_id AND j.attempt_id = f.attempt_id AND j.status = 'running'
    -- An operator's live max_attempts/backoff for the task (pgqueue task set) wins.
    CROSS JOIN LATERAL (
        SELECT coalesce(s.max_attempts, j.max_attempts) AS max_attempts,
               coalesce(s.backoff[1], j.backoff_base) AS backoff_base,
               coalesce(s.backoff[2], j.backoff_factor) AS backoff_factor,
               coalesce(s.backoff[3], j.backoff_max) AS backoff_max,
               coalesce(s.backoff[4], j.backoff_jitter) AS backoff_jitter
        FROM (SELECT 1) one
        LEFT JOIN {schema}.task_settings s ON s.name = j.task
    ) m
    -- Only for unknown tasks: whether a live worker has the task.
    CROSS JOIN LATERAL (
        SELECT f.grace IS NOT NULL AND EXISTS (
                   SELECT 1 FROM {schema}.workers w
                   WHERE j.task = ANY (w.tasks) AND w.lost_at IS NULL
                     AND w.last_heartbeat_at > now() - interval '1 minute') AS known
    ) k
    WHERE j.id = ANY ($1)
    FOR UPDATE OF j
), updated AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN d.next IN ('retry', 'defer')
            THEN CASE WHEN d.next_run_at > (SELECT now FROM clock)
                      THEN 'scheduled' ELSE 'queued' END
            ELSE d.next END::{schema}.job_status,
        run_at = CASE WHEN d.next IN ('retry', 'defer') THEN d.next_run_at ELSE j.run_at END,
        attempts = CASE WHEN d.next = 'defer' THEN j.attempts - 1 ELSE j.attempts END,
        finished_at = CASE WHEN d.next IN ('retry', 'defer') THEN NULL
                           ELSE (SELECT now FROM clock) END,
        lease_expires_at = NULL,
        last_error = left(d.error_code || ': ' || coalesce(d.error_message, ''), 2000)
    FROM decided d
    WHERE j.id = ANY ($1) AND j.id = d.job_id
    RETURNING j.id, j.attempt_id, j.status, j.queue
), attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id,
         error_code, error_message, traceback)
    SELECT d.attempt_id, d.job_id, d.attempts,
           CASE WHEN d.next = 'cancelled' THEN 'cancelled'
                WHEN d.next = 'defer' THEN 'released' ELSE d.outcome END::{schema}.attempt_outcome,
           d.attempt_started_at, (SELECT now FROM clock), d.worker_id,
           d.error_code, d.error_message, d.traceback
    FROM decided d
), notified AS (
    -- Finished: tell result() waiters. Retried now: new ready work; retried
    -- later or a freed slot: the queue's workers recompute when to wake.
    SELECT count(pg_notify({channel}, n.payload)) AS n
    FROM (SELECT 'f:' || u.id || ':' || u.status || ':' || u.queue AS payload
          FROM decided d JOIN updated u ON u.id = d.job_id
          WHERE d.notify_finish AND d.next NOT IN ('retry', 'defer')
          UNION
          SELECT DISTINCT 'j:' || u.queue FROM updated u WHERE u.status = 'queued'
          UNION
          SELECT DISTINCT 'w:' || u.queue FROM updated u
          WHERE u.status = 'scheduled'
             OR u.queue IN (SELECT name FROM {schema}.queues WHERE concurrency_limit IS NOT NULL)) n
)
SELECT u.id, u.attempt_id, u.status::text FROM updated u CROSS JOIN notified
$q$ USING p_job_ids, p_attempt_ids, p_outcomes, p_retry_ats, p_retry_delays, p_permanent, p_error_codes, p_error_messages, p_tracebacks, p_now, p_graces;
END;
$$;

-- The reaper: 0005's reap_jobs, with an operator's live max_attempts and
-- backoff for the task (pgqueue task set).
CREATE OR REPLACE FUNCTION {schema}.reap_jobs(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (job_id bigint, status text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- EXECUTE: planned for the arrays at hand on every call, as the
    -- statement was before; a cached generic plan joins them quadratically.
    RETURN QUERY EXECUTE $q$
WITH clock AS MATERIALIZED (
    SELECT CASE WHEN $2 IS NULL THEN now() ELSE coalesce({schema}.trusted_clock($2), now()) END AS now
), expired AS MATERIALIZED (
    SELECT j.id FROM {schema}.jobs j
    WHERE j.status = 'running' AND j.lease_expires_at < (SELECT now FROM clock)
    ORDER BY j.lease_expires_at
    LIMIT least(greatest($1, 1), 10000)
    FOR UPDATE SKIP LOCKED
), decided AS (
    SELECT j.id, j.attempt_id, j.attempts, j.worker_id, j.attempt_started_at, j.notify_finish,
           CASE WHEN j.cancel_requested THEN 'cancelled'
                WHEN m.max_attempts > 0 AND j.attempts >= m.max_attempts THEN 'dead'
                ELSE 'retry' END AS next,
           least((SELECT now FROM clock)
               + {schema}.retry_delay(j.attempts, m.backoff_base, m.backoff_factor,
                                      m.backoff_max, m.backoff_jitter),
                 '2499-12-31 00:00:00+00') AS next_run_at
    FROM {schema}.jobs j
    -- An operator's live max_attempts/backoff for the task (pgqueue task set) wins.
    CROSS JOIN LATERAL (
        SELECT coalesce(s.max_attempts, j.max_attempts) AS max_attempts,
               coalesce(s.backoff[1], j.backoff_base) AS backoff_base,
               coalesce(s.backoff[2], j.backoff_factor) AS backoff_factor,
               coalesce(s.backoff[3], j.backoff_max) AS backoff_max,
               coalesce(s.backoff[4], j.backoff_jitter) AS backoff_jitter
        FROM (SELECT 1) one
        LEFT JOIN {schema}.task_settings s ON s.name = j.task
    ) m
    WHERE j.id = ANY (ARRAY(SELECT id FROM expired))
), updated AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN d.next = 'retry' THEN 'scheduled' ELSE d.next END::{schema}.job_status,
        run_at = CASE WHEN d.next = 'retry' THEN d.next_run_at ELSE j.run_at END,
        finished_at = CASE WHEN d.next = 'retry' THEN NULL ELSE (SELECT now FROM clock) END,
        lease_expires_at = NULL,
        last_error = 'lease_expired: worker ' || coalesce(d.worker_id, '?')
                     || ' did not finish or extend its lease'
    FROM decided d
    WHERE j.id = ANY (ARRAY(SELECT id FROM decided)) AND j.id = d.id
    RETURNING j.id, j.status, j.queue
), attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id, error_code, error_message)
    SELECT d.attempt_id, d.id, d.attempts,
           CASE WHEN d.next = 'cancelled' THEN 'cancelled' ELSE 'lease_expired' END::{schema}.attempt_outcome,
           d.attempt_started_at, (SELECT now FROM clock), d.worker_id,
           'lease_expired', 'lease expired while the job was running on worker '
                            || coalesce(d.worker_id, '?')
    FROM decided d
), notified AS (
    SELECT count(pg_notify({channel}, n.payload)) AS n
    FROM (SELECT 'f:' || u.id || ':' || u.status || ':' || u.queue AS payload
          FROM decided d JOIN updated u ON u.id = d.id
          WHERE d.notify_finish AND d.next <> 'retry'
          UNION
          SELECT DISTINCT 'w:' || u.queue FROM updated u WHERE u.status = 'scheduled') n
)
SELECT u.id, u.status::text FROM updated u CROSS JOIN notified
$q$ USING p_limit, p_now;
END;
$$;

-- A worker publishes the tasks it runs (name, declared queue and defaults):
-- the worker role has no write privilege on tasks. Every value is checked as
-- a job's would be (check_job), so enqueue by name can use them as they are.
CREATE FUNCTION {schema}.publish_tasks(
    p_worker_id text, p_names text[], p_queues text[], p_priorities smallint[],
    p_max_attempts integer[], p_lease_seconds integer[], p_timeouts float8[],
    p_b1 real[], p_b2 real[], p_b3 real[], p_b4 real[]
) RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    IF p_worker_id IS NULL OR btrim(p_worker_id) = '' OR length(p_worker_id) > 255
       OR p_worker_id ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgqueue: worker_id must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_names) > 10000 THEN
        RAISE EXCEPTION 'pgqueue: at most 10000 tasks per publish' USING ERRCODE = '22023';
    END IF;
    PERFORM {schema}.check_job(NULL, p.name, '{}'::jsonb, p.queue, p.priority, now(), NULL,
                               p.max_attempts, p.lease_seconds, NULL, NULL,
                               ARRAY[p.b1, p.b2, p.b3, p.b4], 1048576)
    FROM unnest(p_names, p_queues, p_priorities, p_max_attempts, p_lease_seconds,
                p_b1, p_b2, p_b3, p_b4)
        AS p(name, queue, priority, max_attempts, lease_seconds, b1, b2, b3, b4);
    IF EXISTS (SELECT 1 FROM unnest(p_timeouts) t
               WHERE NOT (t > 0 AND t < 'Infinity'::float8)) THEN
        RAISE EXCEPTION 'pgqueue: a task timeout must be a finite number of seconds above 0'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO {schema}.tasks AS t
        (name, queue, priority, max_attempts, lease_seconds, timeout_seconds, backoff, published_by)
    SELECT p.name, p.queue, coalesce(p.priority, 0), coalesce(p.max_attempts, 5),
           coalesce(p.lease_seconds, 60), p.timeout_seconds,
           ARRAY[p.b1, p.b2, p.b3, p.b4]::real[], p_worker_id
    FROM unnest(p_names, p_queues, p_priorities, p_max_attempts, p_lease_seconds,
                p_timeouts, p_b1, p_b2, p_b3, p_b4)
        AS p(name, queue, priority, max_attempts, lease_seconds, timeout_seconds, b1, b2, b3, b4)
    ORDER BY p.name
    ON CONFLICT (name) DO UPDATE
    SET queue = EXCLUDED.queue, priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
        lease_seconds = EXCLUDED.lease_seconds, timeout_seconds = EXCLUDED.timeout_seconds,
        backoff = EXCLUDED.backoff, published_by = EXCLUDED.published_by, last_seen_at = now();
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

-- Nothing new is for PUBLIC (0005); `pgqueue grant` gives EXECUTE per kind.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;
