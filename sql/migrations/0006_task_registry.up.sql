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

ALTER TABLE {schema}.schedules DROP CONSTRAINT schedules_max_attempts_check;
ALTER TABLE {schema}.schedules ADD CONSTRAINT schedules_max_attempts_check
    CHECK (max_attempts >= 0);

-- Defaults now come, field by field, from (first wins): the job object; the
-- operator's task setting (priority only: the other settings apply at
-- lease); the producer's code ("default_priority", sent only when it is not
-- 0); the task registry (only for jobs marked "lookup": the producer did not
-- know the task); the built-in defaults. The lookups are scalar subqueries,
-- run only for the rows that need them, so rows keep their input order.
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
    CROSS JOIN LATERAL (SELECT coalesce(r.run_at, now() + make_interval(secs => coalesce(r.delay, 0)))
                        AS run_at) t
    CROSS JOIN LATERAL (SELECT coalesce(r.backoff, CASE WHEN r.lookup THEN (
                            SELECT g.backoff FROM {schema}.tasks g WHERE g.name = r.task) END)
                        AS backoff) b
$$;

-- The SQL API's plain path (0007 renamed the 0003 enqueue() to enqueue_plain
-- and delegates to it). queue and priority now default to NULL: the task's
-- declared defaults (registry) or live setting apply, else 'default' and 0.
-- max_attempts 0 means unlimited.
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
    IF task IS NULL OR btrim(task) = '' OR length(task) > 255 OR task ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgqueue: invalid task name %', quote_literal(left(coalesce(task, 'NULL'), 80))
            USING ERRCODE = '22023',
                  HINT = 'task names are 1 to 255 characters without control characters';
    END IF;
    IF queue IS NOT NULL AND queue !~ '^[A-Za-z0-9_.:-]{1,128}$' THEN
        RAISE EXCEPTION 'pgqueue: invalid queue name %', quote_literal(left(queue, 140))
            USING ERRCODE = '22023',
                  HINT = 'queue names are 1 to 128 characters from A-Z a-z 0-9 _ . : -';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'pgqueue: payload must be a JSON object'
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_path_exists(payload,
            'strict $.**{256 to last} ? (@.type() == "object" || @.type() == "array")') THEN
        RAISE EXCEPTION 'pgqueue: payload is nested deeper than 256 arrays/objects'
            USING ERRCODE = '22023';
    END IF;
    IF dedup_key = '' OR serial_key = '' THEN
        RAISE EXCEPTION 'pgqueue: dedup_key and serial_key must be NULL or non-empty'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(dedup_key) > 1024 OR octet_length(serial_key) > 1024 THEN
        RAISE EXCEPTION 'pgqueue: dedup_key and serial_key must be at most 1024 bytes'
            USING ERRCODE = '22023';
    END IF;
    IF max_attempts IS NOT NULL AND max_attempts < 0 THEN
        RAISE EXCEPTION 'pgqueue: max_attempts must be 0 (unlimited) or more'
            USING ERRCODE = '22023';
    END IF;
    IF priority NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'pgqueue: priority must be a smallint'
            USING ERRCODE = '22023';
    END IF;
    SELECT b.job_id INTO v_id
    FROM {schema}.enqueue_batch(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'task', task, 'payload', payload, 'queue', queue, 'priority', priority,
        'run_at', coalesce(run_at, now()), 'max_attempts', max_attempts,
        'dedup_key', dedup_key, 'serial_key', serial_key, 'lookup', true)))) AS b;
    RETURN v_id;
END;
$$;

-- Lease, as in 0001/0004, plus:
--  * a task's live lease_seconds setting for the lease of each of its jobs
--    (its max_attempts and backoff settings are read when an attempt fails:
--    job_fail_many, job_reap_expired);
--  * per-task limits. A limited task's settings row is locked with SKIP
--    LOCKED (a task another lease is counting is left to it this time, so
--    leases never wait on each other for a task, and cannot deadlock), its
--    running jobs and recent leases are counted after the lock (exact, like
--    queue limits), and jobs of a task at its limit are skipped while the
--    other tasks of the queue are leased. Without limited tasks the lease
--    statement is the one of 0004.
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
SET plan_cache_mode = auto
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
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
                lease_expires_at = v_now + make_interval(secs => coalesce(p_lease_seconds,
                    CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END,
                    j.lease_seconds))
            -- = ANY(ARRAY(...)): primary-key lookups; a join lets the planner
            -- hash the whole table instead.
            WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
            RETURNING j.id, j.attempt_id, j.attempts, j.task, j.queue, j.payload, j.lease_expires_at,
                      coalesce(p_lease_seconds, CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END, j.lease_seconds) AS lease_seconds, j.priority, j.run_at
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
                    IF p_now IS NULL THEN
                        v_now := clock_timestamp();
                    END IF;
                    v_n := p_limit;
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
                        lease_expires_at = v_now + make_interval(secs => coalesce(p_lease_seconds,
                            CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END,
                    j.lease_seconds))
                    WHERE j.id = ANY (v_take)
                    RETURNING j.id, j.attempt_id, j.attempts, j.task, j.queue, j.payload,
                              j.lease_expires_at,
                              coalesce(p_lease_seconds, CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END, j.lease_seconds) AS lease_seconds,
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

-- The SQL API of 0007 (dedup_window, debounce), with queue and priority
-- defaulting to NULL as above. A windowed enqueue needs the queue before the
-- job exists (its key lock and lookup are per queue): the registry's.
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
    debounce     interval DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF dedup_window IS NOT NULL OR debounce IS NOT NULL THEN
        queue := coalesce(queue, (SELECT g.queue FROM {schema}.tasks g WHERE g.name = task),
                          'default');
        PERFORM {schema}.dedup_lock(ARRAY[{schema}.dedup_lock_key(queue, dedup_key)]);
        v_id := {schema}.dedup_claim(queue, dedup_key, dedup_window, debounce, payload);
        IF v_id IS NOT NULL THEN
            RETURN v_id;
        END IF;
        IF debounce IS NOT NULL THEN
            run_at := now() + debounce;
        END IF;
    END IF;
    RETURN {schema}.enqueue_plain(task, payload, queue, priority, run_at, max_attempts,
                                  dedup_key, serial_key);
END;
$$;

-- An admin migrates as a member of the schema owner's role, so the tables
-- above would belong to the admin; the enqueue and lease functions run as
-- the owner (SECURITY DEFINER) and must read them: give them to the owner.
DO $$
DECLARE
    v_owner text := (SELECT c.relowner::regrole::text FROM pg_class c
                     WHERE c.oid = '{schema}.jobs'::regclass);
BEGIN
    EXECUTE format('ALTER TABLE {schema}.tasks OWNER TO %s', v_owner);
    EXECUTE format('ALTER TABLE {schema}.task_settings OWNER TO %s', v_owner);
    EXECUTE format('ALTER TABLE {schema}.task_lease_log OWNER TO %s', v_owner);
END;
$$;
