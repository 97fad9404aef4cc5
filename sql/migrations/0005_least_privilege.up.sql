-- pgqueue revision 0005: least privilege that holds against a hostile
-- producer, worker or bystander; one bad row never stops the fleet.
--
--  1. One validation of every enqueued job, in the database, shared by every
--     enqueue path (enqueue, enqueue_batch and so Python, the CLI and
--     schedules): names, payload (object, size, depth), finite in-range
--     times, max_attempts, lease_seconds, backoff. CHECK constraints back it
--     for any other writer; rows stored before this revision are repaired.
--  2. Every computation of the completer and the reaper is bounded (backoff,
--     retry times, extensions), so no stored value can fail a batch.
--  3. Producers and workers get no write privilege on the hot tables: every
--     change goes through SECURITY DEFINER functions that check what the
--     caller may do (fenced by attempt id). These are also the SQL worker API
--     (lease, ack, ack_many, fail, nack, extend, job_status) for workers
--     written in any language.
--  4. The lease visits only queues that have ready jobs (the cost no longer
--     grows with the number of idle queues), and optional quotas.
--  5. Grants given with `pgqueue grant` are recorded so that `migrate`
--     re-applies them to the objects of later revisions.

-- Objects are created as the schema's owner even when a member of it (an
-- admin of `pgqueue grant --admin`) migrates: the SECURITY DEFINER functions
-- run as that owner and must be able to use them.
DO $$
DECLARE
    v_owner name := (SELECT r.rolname FROM pg_class c
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     JOIN pg_roles r ON r.oid = n.nspowner
                     WHERE c.oid = '{schema}.jobs'::regclass);
    v_fn    regprocedure;
    v_rel   regclass;
BEGIN
    IF v_owner <> current_user AND pg_has_role(current_user, v_owner, 'MEMBER') THEN
        -- Objects an earlier revision created while a member migrated go to the owner too.
        FOR v_fn IN
            SELECT p.oid::regprocedure FROM pg_proc p
            JOIN pg_class c ON c.relnamespace = p.pronamespace AND c.oid = '{schema}.jobs'::regclass
            WHERE p.proowner = current_user::regrole
        LOOP
            EXECUTE format('ALTER FUNCTION %s OWNER TO %I', v_fn, v_owner);
        END LOOP;
        FOR v_rel IN
            SELECT r.oid::regclass FROM pg_class r
            JOIN pg_class c ON c.relnamespace = r.relnamespace AND c.oid = '{schema}.jobs'::regclass
            WHERE r.relowner = current_user::regrole AND r.relkind IN ('r', 'S', 'v')
        LOOP
            EXECUTE format('ALTER TABLE %s OWNER TO %I', v_rel, v_owner);
        END LOOP;
        EXECUTE format('SET LOCAL ROLE %I', v_owner);
    END IF;
END;
$$;

-- Schema-wide limits, one row. max_payload_bytes is measured on the JSON
-- text of a payload (PostgreSQL's rendering). The quotas are off (NULL)
-- unless an operator sets them.
CREATE TABLE {schema}.limits (
    singleton            boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_payload_bytes    integer NOT NULL DEFAULT 1048576 CHECK (max_payload_bytes > 0),
    max_queues           integer CHECK (max_queues > 0),
    max_queued_per_queue integer CHECK (max_queued_per_queue > 0)
);
INSERT INTO {schema}.limits DEFAULT VALUES;

-- Roles given rights with `pgqueue grant`, re-applied by `pgqueue migrate`.
CREATE TABLE {schema}.role_grants (
    role       text PRIMARY KEY,
    kind       text NOT NULL CHECK (kind IN ('producer', 'worker', 'admin')),
    granted_at timestamptz NOT NULL DEFAULT now()
);

-- Schedules registered from code (@app.periodic) may be re-registered by
-- workers; the ones an operator added may not be rewritten by a worker.
CREATE TABLE {schema}.periodic_schedules (
    name text PRIMARY KEY
         REFERENCES {schema}.schedules (name) ON DELETE CASCADE ON UPDATE CASCADE
);

-- The clock a caller passes (tests freeze it) is honoured only for the
-- schema's owner and its members: anyone else gets the server's clock, so a
-- worker cannot reap other workers' jobs by claiming it is next year.
CREATE FUNCTION {schema}.trusted_clock(p_now timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_now IS NULL THEN NULL
                WHEN (SELECT pg_has_role(session_user, c.relowner, 'USAGE')
                      FROM pg_class c WHERE c.oid = '{schema}.jobs'::regclass)
                THEN p_now END
$$;

-- ---------------------------------------------------------------------------
-- 1. Validation
-- ---------------------------------------------------------------------------

-- Raises invalid_parameter_value (22023, message 'pgqueue: ...') naming the
-- first problem of one job; returns true otherwise. p_ord: its 1-based
-- position in a batch (NULL: a single job). Keep the numbers equal to
-- pgqueue.validation / pgqueue.payloads.
CREATE FUNCTION {schema}.check_job(
    p_ord bigint, p_task text, p_payload jsonb, p_queue text, p_priority integer,
    p_run_at timestamptz, p_delay float8, p_max_attempts integer, p_lease_seconds integer,
    p_dedup_key text, p_serial_key text, p_backoff real[], p_max_payload_bytes integer
) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job  text := CASE WHEN p_ord IS NULL THEN '' ELSE format(' (job #%s of the batch)', p_ord) END;
    v_size integer;
BEGIN
    IF p_task IS NULL OR btrim(p_task) = '' OR length(p_task) > 255 OR p_task ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION '%', format('pgqueue: invalid task name %s%s', quote_literal(regexp_replace(left(coalesce(p_task, 'NULL'), 80), '[[:cntrl:]]', '?', 'g')), v_job)
            USING ERRCODE = '22023',
                  HINT = 'task names are 1 to 255 characters without control characters';
    END IF;
    IF p_queue IS NULL OR length(p_queue) NOT BETWEEN 1 AND 128 OR p_queue ~ '[^A-Za-z0-9_.:-]' THEN
        RAISE EXCEPTION '%', format('pgqueue: invalid queue name %s%s', quote_literal(regexp_replace(left(coalesce(p_queue, 'NULL'), 140), '[[:cntrl:]]', '?', 'g')), v_job)
            USING ERRCODE = '22023',
                  HINT = 'queue names are 1 to 128 characters from A-Z a-z 0-9 _ . : -';
    END IF;
    IF p_payload IS NULL OR jsonb_typeof(p_payload) <> 'object' THEN
        RAISE EXCEPTION 'pgqueue: payload must be a JSON object%', v_job USING ERRCODE = '22023';
    END IF;
    -- The text form is at most ~6 times the binary size: measure it only
    -- when it can be over the limit.
    IF pg_column_size(p_payload) > p_max_payload_bytes / 8 THEN
        v_size := octet_length(p_payload::text);
        IF v_size > p_max_payload_bytes THEN
            RAISE EXCEPTION 'pgqueue: payload is % bytes of JSON, over the %-byte limit%',
                v_size, p_max_payload_bytes, v_job USING ERRCODE = '22023';
        END IF;
    END IF;
    -- Each level of nesting takes at least 4 bytes of jsonb: smaller
    -- payloads cannot be 256 deep.
    IF pg_column_size(p_payload) > 1000 AND jsonb_path_exists(p_payload,
            'strict $.**{256 to last} ? (@.type() == "object" || @.type() == "array")') THEN
        RAISE EXCEPTION 'pgqueue: payload is nested deeper than 256 arrays/objects%', v_job
            USING ERRCODE = '22023';
    END IF;
    IF p_dedup_key = '' OR p_serial_key = '' THEN
        RAISE EXCEPTION 'pgqueue: dedup_key and serial_key must be NULL or non-empty%', v_job
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_dedup_key) > 1024 OR octet_length(p_serial_key) > 1024 THEN
        RAISE EXCEPTION 'pgqueue: dedup_key and serial_key must be at most 1024 bytes%', v_job
            USING ERRCODE = '22023';
    END IF;
    IF p_priority IS NOT NULL AND p_priority NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'pgqueue: priority must be between -32768 and 32767%', v_job
            USING ERRCODE = '22023';
    END IF;
    IF p_delay IS NOT NULL AND NOT (p_delay BETWEEN 0 AND 3153600000) THEN
        RAISE EXCEPTION '%', format('pgqueue: delay must be between 0 and 3153600000 seconds (100 years), got %s%s', p_delay, v_job)
            USING ERRCODE = '22023';
    END IF;
    IF p_run_at IS NULL OR NOT (p_run_at >= '1970-01-01 00:00:00+00' AND p_run_at < '2500-01-01 00:00:00+00') THEN
        RAISE EXCEPTION '%', format('pgqueue: run_at must be a finite time from 1970 to 2499, got %s%s', coalesce(p_run_at::text, 'NULL'), v_job)
            USING ERRCODE = '22023';
    END IF;
    -- 0: unlimited attempts.
    IF p_max_attempts IS NOT NULL AND p_max_attempts < 0 THEN
        RAISE EXCEPTION '%', format('pgqueue: max_attempts must be at least 0 (0: unlimited), got %s%s', p_max_attempts, v_job)
            USING ERRCODE = '22023';
    END IF;
    IF p_lease_seconds IS NOT NULL AND p_lease_seconds < 1 THEN
        RAISE EXCEPTION '%', format('pgqueue: lease_seconds must be at least 1, got %s%s', p_lease_seconds, v_job)
            USING ERRCODE = '22023';
    END IF;
    IF p_backoff IS NOT NULL AND (
            coalesce(array_length(p_backoff, 1), 0) > 4
            OR NOT coalesce(p_backoff[1] BETWEEN 0 AND 31536000, true)
            OR NOT coalesce(p_backoff[2] BETWEEN 1 AND 1000, true)
            OR NOT coalesce(p_backoff[3] BETWEEN 0 AND 31536000, true)
            OR NOT coalesce(p_backoff[4] BETWEEN 0 AND 1, true)) THEN
        RAISE EXCEPTION '%', format('pgqueue: backoff must be [base, factor, max, jitter] with base and max from 0 to 31536000 seconds, factor from 1 to 1000 and jitter from 0 to 1, got %s%s',
            p_backoff::text, v_job)
            USING ERRCODE = '22023';
    END IF;
    RETURN true;
END;
$$;

-- As in 0001, every row now passing check_job first (a filter evaluated
-- before the row is used). The delay only reaches make_interval when it is
-- in range, so a huge one gets check_job's error, not an overflow.
CREATE OR REPLACE FUNCTION {schema}.enqueue_input(p_jobs jsonb)
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
    CROSS JOIN LATERAL (SELECT coalesce(r.run_at, now() + make_interval(secs => CASE
                            WHEN r.delay BETWEEN 0 AND 3153600000 THEN coalesce(r.delay, 0) ELSE 0 END))
                        AS run_at) t
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
                    AND (r.delay IS NULL OR r.delay BETWEEN 0 AND 3153600000)
                    AND t.run_at >= '1970-01-01 00:00:00+00' AND t.run_at < '2500-01-01 00:00:00+00'
                    AND (r.max_attempts IS NULL OR r.max_attempts >= 0)
                    AND (r.lease_seconds IS NULL OR r.lease_seconds >= 1)
                    AND r.backoff IS NULL
               THEN true
               ELSE {schema}.check_job(
        CASE WHEN jsonb_array_length(p_jobs) > 1 THEN r.ord END, r.task,
        coalesce(r.payload, '{}'::jsonb), coalesce(r.queue, 'default'), r.priority,
        CASE WHEN r.delay IS NULL OR r.delay BETWEEN 0 AND 3153600000 THEN t.run_at
             ELSE now() END,
        r.delay, r.max_attempts, r.lease_seconds, r.dedup_key, r.serial_key, r.backoff,
        coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576)) END
$$;

-- As in 0009 (0001 with its notifications), with every job validated before
-- the first id is drawn.
CREATE OR REPLACE FUNCTION {schema}.enqueue_rows(p_jobs jsonb, p_only bigint[] DEFAULT NULL)
RETURNS TABLE (ord bigint, job_id bigint, queue text, dedup_key text)
LANGUAGE sql AS $$
    WITH input AS MATERIALIZED (
        SELECT nextval('{schema}.jobs_id_seq') AS id, i.*
        FROM (SELECT * FROM {schema}.enqueue_input(p_jobs) v
              WHERE p_only IS NULL OR v.ord = ANY (p_only)
              ORDER BY v.ord + 0 OFFSET 0) i  -- validate all before drawing ids
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
        RETURNING j.id, j.queue, j.status
    ),
    per_queue AS (
        SELECT d.queue, count(*) AS n, count(*) FILTER (WHERE d.status = 'queued') AS ready,
               min(d.id) AS job_id
        FROM inserted d GROUP BY d.queue
    ),
    registered AS (
        INSERT INTO {schema}.queues (name) SELECT p.queue FROM per_queue p
        ON CONFLICT (name) DO NOTHING
    ),
    notified AS (
        SELECT count({schema}.notify_enqueued(p.queue, p.n, p.ready, p.job_id)) AS n
        FROM per_queue p
    )
    SELECT i.ord, d.id, i.queue, i.dedup_key
    FROM input i
    LEFT JOIN inserted d ON d.id = i.id
    CROSS JOIN notified
$$;

-- The plain path of the SQL API (0001's enqueue(), renamed enqueue_plain by
-- 0007, whose enqueue() delegates to it); every check is check_job's now.
-- max_attempts 0 means unlimited.
CREATE OR REPLACE FUNCTION {schema}.enqueue_plain(
    task         text,
    payload      jsonb DEFAULT '{}',
    queue        text DEFAULT 'default',
    priority     integer DEFAULT 0,
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
    PERFORM {schema}.check_job(NULL, task, payload, queue, priority, coalesce(run_at, now()),
                               NULL, max_attempts, NULL, dedup_key, serial_key, NULL,
                               coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576));
    SELECT b.job_id INTO v_id
    FROM {schema}.enqueue_batch(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'task', task, 'payload', payload, 'queue', queue, 'priority', priority,
        'run_at', coalesce(run_at, now()), 'max_attempts', max_attempts,
        'dedup_key', dedup_key, 'serial_key', serial_key)))) AS b;
    RETURN v_id;
END;
$$;

-- Optional quotas, checked after an enqueue (in its transaction): at most
-- max_queues queues, at most max_queued_per_queue queued or scheduled jobs
-- in each queue this enqueue touched. Costs nothing while both are unset.
CREATE FUNCTION {schema}.check_quotas(p_jobs jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_lim   record;
    v_queue text;
BEGIN
    SELECT l.max_queues, l.max_queued_per_queue INTO v_lim FROM {schema}.limits l;
    IF v_lim.max_queues IS NULL AND v_lim.max_queued_per_queue IS NULL THEN
        RETURN;
    END IF;
    IF jsonb_typeof(p_jobs) = 'object' THEN
        p_jobs := p_jobs -> 'jobs';
    END IF;
    IF v_lim.max_queues IS NOT NULL
       AND (SELECT count(*) FROM {schema}.queues) > v_lim.max_queues THEN
        RAISE EXCEPTION 'pgqueue: quota exceeded: at most % queues (limits.max_queues)', v_lim.max_queues
            USING ERRCODE = '22023';
    END IF;
    IF v_lim.max_queued_per_queue IS NOT NULL THEN
        FOR v_queue IN
            SELECT DISTINCT coalesce(j ->> 'queue', 'default') FROM jsonb_array_elements(p_jobs) j
        LOOP
            IF (SELECT count(*) FROM (
                    SELECT 1 FROM {schema}.jobs j
                    WHERE j.queue = v_queue AND j.status IN ('queued', 'scheduled')
                    LIMIT v_lim.max_queued_per_queue + 1) c) > v_lim.max_queued_per_queue THEN
                RAISE EXCEPTION 'pgqueue: quota exceeded: queue % holds more than % queued jobs (limits.max_queued_per_queue)',
                    quote_literal(v_queue), v_lim.max_queued_per_queue
                    USING ERRCODE = '22023';
            END IF;
        END LOOP;
    END IF;
END;
$$;

-- As in 0009, plus the shape checks, validation before ids and the quota check.
CREATE OR REPLACE FUNCTION {schema}.enqueue_batch(p_jobs jsonb)
RETURNS TABLE (job_id bigint, created boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = auto
SET enable_seqscan = off
SET jit = off
AS $$
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
    IF jsonb_typeof(v_jobs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'pgqueue: enqueue_batch takes a JSON array of job objects'
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_path_exists(v_jobs, '$[*] ? (@.type() != "object")') THEN
        RAISE EXCEPTION 'pgqueue: every job of enqueue_batch must be a JSON object'
            USING ERRCODE = '22023';
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
            -- The sort reads (and so validates) every job before the first
            -- id is drawn: a refused batch consumes no ids. (On ord + 0: the
            -- scan is already ordered on ord, which would skip the sort.)
            FROM (SELECT * FROM {schema}.enqueue_input(v_jobs) v ORDER BY v.ord + 0 OFFSET 0) i
            RETURNING j.id, j.queue, j.status
        ),
        per_queue AS (
            SELECT d.queue, count(*) AS n, count(*) FILTER (WHERE d.status = 'queued') AS ready,
                   min(d.id) AS job_id
            FROM inserted d GROUP BY d.queue
        ),
        registered AS (
            INSERT INTO {schema}.queues (name) SELECT p.queue FROM per_queue p
            ON CONFLICT (name) DO NOTHING
        ),
        notified AS (
            SELECT count({schema}.notify_enqueued(p.queue, p.n, p.ready, p.job_id)) AS n
            FROM per_queue p
        )
        SELECT d.id, true FROM inserted d CROSS JOIN notified ORDER BY d.id;
        PERFORM {schema}.check_quotas(v_jobs);
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
            PERFORM {schema}.check_quotas(v_jobs);
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

-- ---------------------------------------------------------------------------
-- Rows stored before this revision: repaired so that every reader can read
-- them, then held to the same rules by CHECK constraints.
-- ---------------------------------------------------------------------------
UPDATE {schema}.jobs SET run_at = CASE WHEN run_at < '1970-01-01 00:00:00+00'
                                       THEN '1970-01-01 00:00:00+00'
                                       ELSE '2499-12-31 00:00:00+00' END::timestamptz
WHERE NOT (run_at >= '1970-01-01 00:00:00+00' AND run_at < '2500-01-01 00:00:00+00');
UPDATE {schema}.jobs SET lease_seconds = 60 WHERE lease_seconds < 1;
UPDATE {schema}.jobs SET max_attempts = 5 WHERE max_attempts < 0;
UPDATE {schema}.jobs SET backoff_base = NULL, backoff_factor = NULL, backoff_max = NULL,
                         backoff_jitter = NULL
WHERE NOT (coalesce(backoff_base BETWEEN 0 AND 31536000, true)
           AND coalesce(backoff_factor BETWEEN 0 AND 1000, true)
           AND coalesce(backoff_max BETWEEN 0 AND 31536000, true)
           AND coalesce(backoff_jitter BETWEEN 0 AND 1, true));
UPDATE {schema}.jobs_archive SET run_at = CASE WHEN run_at < '1970-01-01 00:00:00+00'
                                               THEN '1970-01-01 00:00:00+00'
                                               ELSE '2499-12-31 00:00:00+00' END::timestamptz
WHERE NOT (run_at >= '1970-01-01 00:00:00+00' AND run_at < '2500-01-01 00:00:00+00');
UPDATE {schema}.schedules SET enabled = false, next_fire_at = NULL
WHERE NOT (next_fire_at >= '1970-01-01 00:00:00+00' AND next_fire_at < '2500-01-01 00:00:00+00');
UPDATE {schema}.schedules SET last_fire_at = NULL
WHERE NOT (last_fire_at >= '1970-01-01 00:00:00+00' AND last_fire_at < '2500-01-01 00:00:00+00');

ALTER TABLE {schema}.jobs
    ADD CONSTRAINT jobs_run_at_range
        CHECK (run_at >= '1970-01-01 00:00:00+00' AND run_at < '2500-01-01 00:00:00+00') NOT VALID,
    ADD CONSTRAINT jobs_lease_seconds_positive CHECK (lease_seconds >= 1) NOT VALID,
    ADD CONSTRAINT jobs_max_attempts_not_negative CHECK (max_attempts >= 0) NOT VALID,
    ADD CONSTRAINT jobs_backoff_range CHECK (
        coalesce(backoff_base BETWEEN 0 AND 31536000, true)
        AND coalesce(backoff_factor BETWEEN 0 AND 1000, true)
        AND coalesce(backoff_max BETWEEN 0 AND 31536000, true)
        AND coalesce(backoff_jitter BETWEEN 0 AND 1, true)) NOT VALID;
-- VALIDATE takes a weaker lock than a checked ADD: workers keep running.
ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_run_at_range;
ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_lease_seconds_positive;
ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_max_attempts_not_negative;
ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_backoff_range;
ALTER TABLE {schema}.schedules
    ADD CONSTRAINT schedules_fire_at_range CHECK (
        coalesce(next_fire_at >= '1970-01-01 00:00:00+00' AND next_fire_at < '2500-01-01 00:00:00+00', true)
        AND coalesce(last_fire_at >= '1970-01-01 00:00:00+00' AND last_fire_at < '2500-01-01 00:00:00+00', true));
ALTER TABLE {schema}.schedules DROP CONSTRAINT schedules_max_attempts_check;
ALTER TABLE {schema}.schedules ADD CONSTRAINT schedules_max_attempts_check CHECK (max_attempts >= 0);

-- ---------------------------------------------------------------------------
-- 2. Bounded computations
-- ---------------------------------------------------------------------------

-- As in 0001, but any stored parameter (NaN, infinity, 1e38) falls back to
-- the default and no delay exceeds one year.
CREATE OR REPLACE FUNCTION {schema}.retry_delay(
    p_attempt integer, p_base real, p_factor real, p_max real, p_jitter real
) RETURNS interval
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT make_interval(secs => least(31536000.0, greatest(0.0, least(b.max, CASE
            WHEN b.base <= 0 THEN 0.0
            WHEN b.factor <= 1 THEN b.base
            ELSE b.base * power(b.factor, least(greatest(p_attempt - 1, 0),
                                ln(greatest(b.max, b.base) / b.base) / ln(b.factor) + 1))
        END) * (1.0 + b.jitter * (2.0 * random() - 1.0)))))
    FROM (SELECT CASE WHEN p_base BETWEEN 0 AND 31536000 THEN p_base ELSE 1.0 END::float8 AS base,
                 CASE WHEN p_factor BETWEEN 0 AND 1000 THEN p_factor ELSE 2.0 END::float8 AS factor,
                 CASE WHEN p_max BETWEEN 0 AND 31536000 THEN p_max ELSE 3600.0 END::float8 AS max,
                 CASE WHEN p_jitter BETWEEN 0 AND 1 THEN p_jitter ELSE 0.1 END::float8 AS jitter) b
$$;

-- ---------------------------------------------------------------------------
-- 3. Fenced functions: the only way producers and workers change jobs
-- ---------------------------------------------------------------------------

-- Lease (as 0001/0004), now visiting only queues that have ready jobs: with
-- no queue list, their names come from a loose index scan of the ready index
-- (one probe per queue holding ready jobs), so thousands of idle queues cost
-- nothing.
CREATE OR REPLACE FUNCTION {schema}.lease_jobs(
    p_queues    text[],
    p_worker_id text,
    p_limit     integer,
    p_lease_seconds integer DEFAULT NULL,
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
    v_left    integer := least(coalesce(p_limit, 1), 10000);
    -- (greatest() would turn a NULL, "each job's own", into 1)
    v_lease   integer := CASE WHEN p_lease_seconds IS NOT NULL THEN greatest(p_lease_seconds, 1) END;
    v_cap     integer;
    v_got     integer;
    v_queue   record;
    v_ctl     record;
    v_staged  text[];
BEGIN
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
                v_now := clock_timestamp();
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
            lease_expires_at = v_now + make_interval(secs => coalesce(v_lease, j.lease_seconds))
        WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
        RETURNING j.id, j.attempt_id, j.attempts, j.task, j.queue, j.payload, j.lease_expires_at,
                  coalesce(v_lease, j.lease_seconds) AS lease_seconds, j.priority, j.run_at
        )
        SELECT l.id, l.attempt_id, l.attempts, l.task, l.queue, l.payload, l.lease_expires_at,
               l.lease_seconds
        FROM leased l
        ORDER BY l.priority DESC, l.run_at, l.id;

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

-- Finish leased jobs successfully (cancelled if a cancel was requested while
-- they ran); the statement of job_ack_many before this revision. Returns the
-- (job, attempt) pairs that still held their lease.
CREATE FUNCTION {schema}.ack_jobs(
    p_job_ids bigint[], p_attempt_ids bigint[], p_results jsonb[], p_now timestamptz DEFAULT NULL,
    p_result_errors text[] DEFAULT NULL
) RETURNS TABLE (job_id bigint, attempt_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- EXECUTE: planned for the arrays at hand on every call, as the
    -- statement was before; a cached generic plan joins them quadratically.
    RETURN QUERY EXECUTE $q$
WITH clock AS MATERIALIZED (
    SELECT CASE WHEN $4 IS NULL THEN now() ELSE coalesce({schema}.trusted_clock($4), now()) END AS now
), done AS (
    SELECT * FROM unnest($1, $2,
                         coalesce($3, array_fill(NULL::jsonb, ARRAY[cardinality($1)])),
                         coalesce($5, array_fill(NULL::text, ARRAY[cardinality($1)])))
        AS d(job_id, attempt_id, result, result_error)
), finished AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'succeeded' END::{schema}.job_status,
        finished_at = (SELECT now FROM clock),
        lease_expires_at = NULL,
        result = CASE WHEN j.cancel_requested THEN NULL ELSE d.result END,
        -- A result that could not be stored: result NULL, the reason in last_error.
        last_error = CASE WHEN j.cancel_requested THEN j.last_error
                          ELSE coalesce(d.result_error, j.last_error) END
    FROM done d
    WHERE j.id = ANY ($1)
      AND j.id = d.job_id AND j.attempt_id = d.attempt_id AND j.status = 'running'
    RETURNING j.id, j.status, j.notify_finish, j.attempt_id, j.attempts, j.worker_id,
              j.attempt_started_at, j.finished_at, j.queue
), cancelled_attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id, error_code, error_message)
    SELECT f.attempt_id, f.id, f.attempts, 'cancelled', f.attempt_started_at, f.finished_at,
           f.worker_id, 'cancelled', 'cancelled while running'
    FROM finished f WHERE f.status = 'cancelled'
), notified AS (
    SELECT count(pg_notify({channel}, n.payload)) AS n
    FROM (SELECT 'f:' || f.id || ':' || f.status || ':' || f.queue AS payload
          FROM finished f WHERE f.notify_finish
          UNION
          SELECT DISTINCT 'w:' || f.queue FROM finished f
          WHERE f.queue IN (SELECT name FROM {schema}.queues WHERE concurrency_limit IS NOT NULL)) n
)
SELECT f.id, f.attempt_id FROM finished f CROSS JOIN notified
$q$ USING p_job_ids, p_attempt_ids, p_results, p_now, p_result_errors;
END;
$$;

-- Record failed attempts (job_fail_many before this revision). Retry times
-- are bounded (now .. one year ahead for a delay, 2499 for a time), so no
-- value a worker passes can fail the batch it belongs to.
CREATE FUNCTION {schema}.fail_jobs(
    p_job_ids bigint[], p_attempt_ids bigint[], p_outcomes text[], p_retry_ats timestamptz[],
    p_retry_delays float8[], p_permanent boolean[], p_error_codes text[],
    p_error_messages text[], p_tracebacks text[], p_now timestamptz DEFAULT NULL
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
           coalesce(f.error_code, 'error') AS error_code, f.error_message, f.traceback
    FROM unnest($1, $2, $3, $4, $5, $6,
                $7, $8, $9)
        AS f(job_id, attempt_id, outcome, retry_at, retry_delay, permanent, error_code,
             error_message, traceback)
), decided AS (
    SELECT f.*, j.attempts, j.attempt_started_at, j.worker_id, j.notify_finish,
           CASE WHEN j.cancel_requested THEN 'cancelled'
                WHEN f.permanent OR (j.max_attempts > 0 AND j.attempts >= j.max_attempts) THEN 'dead'
                ELSE 'retry' END AS next,
           least(greatest(coalesce(f.retry_at, c.now + coalesce(
               CASE WHEN f.retry_delay IS NOT NULL  -- (greatest() would turn NULL into 0)
                    THEN make_interval(secs => CASE WHEN f.retry_delay BETWEEN 0 AND 31536000
                                                    THEN f.retry_delay
                                                    WHEN f.retry_delay > 0 THEN 31536000
                                                    ELSE 0 END) END,
               {schema}.retry_delay(j.attempts, j.backoff_base, j.backoff_factor,
                                    j.backoff_max, j.backoff_jitter))), '1970-01-01 00:00:00+00'),
                 '2499-12-31 00:00:00+00') AS next_run_at
    FROM failed f
    CROSS JOIN clock c
    JOIN {schema}.jobs j ON j.id = f.job_id AND j.attempt_id = f.attempt_id AND j.status = 'running'
    WHERE j.id = ANY ($1)
    FOR UPDATE OF j
), updated AS (
    UPDATE {schema}.jobs j
    SET status = CASE d.next
            WHEN 'retry' THEN CASE WHEN d.next_run_at > (SELECT now FROM clock)
                                   THEN 'scheduled' ELSE 'queued' END
            ELSE d.next END::{schema}.job_status,
        run_at = CASE WHEN d.next = 'retry' THEN d.next_run_at ELSE j.run_at END,
        finished_at = CASE WHEN d.next = 'retry' THEN NULL ELSE (SELECT now FROM clock) END,
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
           CASE WHEN d.next = 'cancelled' THEN 'cancelled' ELSE d.outcome END,
           d.attempt_started_at, (SELECT now FROM clock), d.worker_id,
           d.error_code, d.error_message, d.traceback
    FROM decided d
), notified AS (
    -- Finished: tell result() waiters. Retried now: new ready work; retried
    -- later or a freed slot: the queue's workers recompute when to wake.
    SELECT count(pg_notify({channel}, n.payload)) AS n
    FROM (SELECT 'f:' || u.id || ':' || u.status || ':' || u.queue AS payload
          FROM decided d JOIN updated u ON u.id = d.job_id
          WHERE d.notify_finish AND d.next <> 'retry'
          UNION
          SELECT DISTINCT 'j:' || u.queue FROM updated u WHERE u.status = 'queued'
          UNION
          SELECT DISTINCT 'w:' || u.queue FROM updated u
          WHERE u.status = 'scheduled'
             OR u.queue IN (SELECT name FROM {schema}.queues WHERE concurrency_limit IS NOT NULL)) n
)
SELECT u.id, u.attempt_id, u.status::text FROM updated u CROSS JOIN notified
$q$ USING p_job_ids, p_attempt_ids, p_outcomes, p_retry_ats, p_retry_delays, p_permanent, p_error_codes, p_error_messages, p_tracebacks, p_now;
END;
$$;

-- Hand leased jobs back unrun (job_nack_many before this revision).
CREATE FUNCTION {schema}.release_jobs(
    p_job_ids bigint[], p_attempt_ids bigint[], p_now timestamptz DEFAULT NULL
) RETURNS TABLE (job_id bigint, attempt_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- EXECUTE: planned for the arrays at hand on every call, as the
    -- statement was before; a cached generic plan joins them quadratically.
    RETURN QUERY EXECUTE $q$
WITH clock AS MATERIALIZED (
    SELECT CASE WHEN $3 IS NULL THEN now() ELSE coalesce({schema}.trusted_clock($3), now()) END AS now
), released AS (
    SELECT * FROM unnest($1, $2) AS r(job_id, attempt_id)
), old AS (
    SELECT j.id, j.attempt_id, j.attempts, j.attempt_started_at, j.worker_id, j.cancel_requested
    FROM {schema}.jobs j JOIN released r ON j.id = r.job_id AND j.attempt_id = r.attempt_id
    WHERE j.id = ANY ($1) AND j.status = 'running'
    FOR UPDATE OF j
), updated AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN o.cancel_requested THEN 'cancelled' ELSE 'queued' END::{schema}.job_status,
        attempts = CASE WHEN o.cancel_requested THEN j.attempts ELSE j.attempts - 1 END,
        finished_at = CASE WHEN o.cancel_requested THEN (SELECT now FROM clock) END,
        lease_expires_at = NULL
    FROM old o
    WHERE j.id = ANY ($1) AND j.id = o.id
    RETURNING j.id, j.attempt_id, j.status, j.queue
), attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id)
    SELECT o.attempt_id, o.id, o.attempts,
           CASE WHEN o.cancel_requested THEN 'cancelled' ELSE 'released' END::{schema}.attempt_outcome,
           o.attempt_started_at, (SELECT now FROM clock), o.worker_id
    FROM old o
), notified AS (
    SELECT count(pg_notify({channel}, 'j:' || q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM updated WHERE status = 'queued') q
)
SELECT u.id, u.attempt_id FROM updated u CROSS JOIN notified
$q$ USING p_job_ids, p_attempt_ids, p_now;
END;
$$;

-- Push leases to now + seconds (bounded to 1 s .. 1 year). Returns, for every
-- job that still holds its lease, whether a cancel was requested.
CREATE FUNCTION {schema}.extend_jobs(
    p_job_ids bigint[], p_attempt_ids bigint[], p_seconds float8[], p_now timestamptz DEFAULT NULL
) RETURNS TABLE (job_id bigint, cancel_requested boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- EXECUTE: planned for the arrays at hand on every call, as the
    -- statement was before; a cached generic plan joins them quadratically.
    RETURN QUERY EXECUTE $q$
UPDATE {schema}.jobs j
SET lease_expires_at = CASE WHEN $4 IS NULL THEN now() ELSE coalesce({schema}.trusted_clock($4), now()) END
                       + make_interval(secs => CASE WHEN e.seconds BETWEEN 1 AND 31536000
                                                    THEN e.seconds
                                                    WHEN e.seconds > 31536000 THEN 31536000
                                                    ELSE 1 END)
FROM unnest($1, $2, $3) AS e(job_id, attempt_id, seconds)
WHERE j.id = ANY ($1)
  AND j.id = e.job_id AND j.attempt_id = e.attempt_id AND j.status = 'running'
RETURNING j.id, j.cancel_requested
$q$ USING p_job_ids, p_attempt_ids, p_seconds, p_now;
END;
$$;

-- The reaper (job_reap_expired before this revision): expired leases back
-- to the queue with backoff, dead, or cancelled. SKIP LOCKED leaves a row an
-- ack or fail is writing to that ack or fail.
CREATE FUNCTION {schema}.reap_jobs(p_limit integer, p_now timestamptz DEFAULT NULL)
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
                WHEN j.max_attempts > 0 AND j.attempts >= j.max_attempts THEN 'dead'
                ELSE 'retry' END AS next,
           least((SELECT now FROM clock)
               + {schema}.retry_delay(j.attempts, j.backoff_base, j.backoff_factor,
                                      j.backoff_max, j.backoff_jitter),
                 '2499-12-31 00:00:00+00') AS next_run_at
    FROM {schema}.jobs j
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

-- result(): ask for a notification when a live job finishes (the one write a
-- producer makes besides enqueueing). NULL: not live, or already watched.
CREATE FUNCTION {schema}.watch_job(p_job_id bigint)
RETURNS text
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
UPDATE {schema}.jobs SET notify_finish = true
WHERE id = p_job_id AND status IN ('queued', 'scheduled', 'running') AND NOT notify_finish
RETURNING status::text;
$$;

-- Fire due schedules (schedule_fire_many before this revision): only a
-- schedule that is due, enabled and unchanged since the caller read it, and
-- only moving its next fire time forward.
CREATE FUNCTION {schema}.fire_schedules(
    p_names text[], p_due_at timestamptz[], p_revisions bigint[], p_created_at timestamptz[],
    p_next_fire_at timestamptz[], p_last_fire_at timestamptz[], p_jobs jsonb[]
) RETURNS TABLE (name text, job_ids bigint[])
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH input AS (
    SELECT * FROM unnest(p_names, p_due_at, p_revisions, p_created_at, p_next_fire_at,
                         p_last_fire_at, p_jobs)
        AS i(name, due_at, revision, created_at, next_fire_at, last_fire_at, jobs)
), claimed AS MATERIALIZED (
    SELECT s.name, i.next_fire_at, i.last_fire_at, i.jobs
    FROM {schema}.schedules s
    JOIN input i ON i.name = s.name
    WHERE s.name = ANY (p_names)
      AND s.enabled AND s.next_fire_at = i.due_at
      AND i.next_fire_at > i.due_at
      AND s.revision = i.revision AND s.created_at = i.created_at
    ORDER BY s.name
    FOR UPDATE OF s SKIP LOCKED
), enqueued AS (
    SELECT c.name, array_agg(e.job_id ORDER BY e.job_id) AS job_ids
    FROM claimed c CROSS JOIN LATERAL {schema}.enqueue_batch(c.jobs) e
    GROUP BY c.name
)
UPDATE {schema}.schedules s
SET next_fire_at = c.next_fire_at,
    last_fire_at = c.last_fire_at,
    last_job_id = e.job_ids[array_upper(e.job_ids, 1)]
FROM claimed c
JOIN enqueued e ON e.name = c.name
WHERE s.name = c.name
RETURNING s.name, e.job_ids;
$$;

-- ---------------------------------------------------------------------------
-- The SQL worker API: consume from any language with plain SQL. Every call
-- is fenced by (job_id, attempt_id), exactly as the Python worker's.
-- ---------------------------------------------------------------------------

-- Lease up to max jobs of the given queues (NULL: every queue).
CREATE FUNCTION {schema}.lease(queues text[], worker_id text, max integer DEFAULT 1)
RETURNS TABLE (job_id bigint, attempt_id bigint, attempt integer, task text, queue text,
               payload jsonb, lease_expires_at timestamptz, lease_seconds integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF worker_id IS NULL OR btrim(worker_id) = '' OR length(worker_id) > 255
       OR worker_id ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgqueue: worker_id must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF max IS NULL OR max NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgqueue: max must be from 1 to 1000, got %', coalesce(max::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY SELECT * FROM {schema}.lease_jobs(queues, worker_id, max);
END;
$$;

-- Finish one leased job; false when the attempt no longer holds its lease.
CREATE FUNCTION {schema}.ack(job_id bigint, attempt_id bigint, result jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) > 0 FROM {schema}.ack_jobs(ARRAY[job_id], ARRAY[attempt_id], ARRAY[result])
$$;

-- Finish several leased jobs (without results); returns the ids still held.
CREATE FUNCTION {schema}.ack_many(job_ids bigint[], attempt_ids bigint[])
RETURNS TABLE (job_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(job_ids) IS DISTINCT FROM cardinality(attempt_ids) THEN
        RAISE EXCEPTION 'pgqueue: job_ids and attempt_ids must have the same length'
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY SELECT a.job_id FROM {schema}.ack_jobs(job_ids, attempt_ids, NULL) a;
END;
$$;

-- Record a failed attempt: retried (at retry_at, or after the job's backoff),
-- dead when permanent or out of attempts, cancelled when a cancel was
-- requested. Returns the job's new status; NULL when the lease was lost.
CREATE FUNCTION {schema}.fail(
    job_id bigint, attempt_id bigint, error text,
    retry_at timestamptz DEFAULT NULL, permanent boolean DEFAULT false
) RETURNS text
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT f.status FROM {schema}.fail_jobs(
        ARRAY[job_id], ARRAY[attempt_id], ARRAY['failed'], ARRAY[retry_at], ARRAY[NULL::float8],
        ARRAY[coalesce(permanent, false)], ARRAY['error'], ARRAY[left(coalesce(error, ''), 4000)],
        ARRAY[NULL::text]) f
$$;

-- Hand a leased job back unrun (its attempt is not counted).
CREATE FUNCTION {schema}.nack(job_id bigint, attempt_id bigint)
RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) > 0 FROM {schema}.release_jobs(ARRAY[job_id], ARRAY[attempt_id])
$$;

-- Extend a lease to now + seconds; false when the lease was lost.
CREATE FUNCTION {schema}.extend(job_id bigint, attempt_id bigint, seconds integer)
RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) > 0 FROM {schema}.extend_jobs(ARRAY[job_id], ARRAY[attempt_id],
                                                 ARRAY[seconds::float8])
$$;

-- A job's state, from the hot table or the archive (no row: unknown id).
CREATE FUNCTION {schema}.job_status(job_id bigint)
RETURNS TABLE (status text, attempts integer, max_attempts integer, cancel_requested boolean,
               run_at timestamptz, finished_at timestamptz, result jsonb, last_error text)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    (SELECT {schema}.visible_status(j.status, j.run_at), j.attempts, j.max_attempts,
            j.cancel_requested, j.run_at, j.finished_at, j.result, j.last_error
     FROM {schema}.jobs j WHERE j.id = job_status.job_id
     UNION ALL
     SELECT a.status::text, a.attempts, a.max_attempts, a.cancel_requested, a.run_at,
            a.finished_at, a.result, a.last_error
     FROM {schema}.jobs_archive a WHERE a.id = job_status.job_id)
    LIMIT 1
$$;

-- Register a periodic schedule from code (schedule_upsert with keep_enabled
-- before this revision): create it, or change one that was registered from
-- code too; a worker never rewrites an operator's schedule. An existing
-- schedule keeps its enabled state (an operator's disable survives a deploy).
CREATE FUNCTION {schema}.register_periodic(
    p_name text, p_cron text, p_timezone text, p_task text, p_queue text, p_payload jsonb,
    p_priority smallint, p_max_attempts integer, p_enabled boolean, p_next_fire_at timestamptz
) RETURNS SETOF {schema}.schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The schema's owner (and its members) may take over any schedule.
    IF EXISTS (SELECT 1 FROM {schema}.schedules s WHERE s.name = p_name)
       AND NOT EXISTS (SELECT 1 FROM {schema}.periodic_schedules p WHERE p.name = p_name)
       AND {schema}.trusted_clock(now()) IS NULL THEN
        RETURN;
    END IF;
    PERFORM {schema}.check_job(NULL, p_task, p_payload, coalesce(p_queue, 'default'), p_priority,
                               coalesce(p_next_fire_at, now()), NULL, p_max_attempts, NULL,
                               NULL, NULL, NULL,
                               coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576));
    RETURN QUERY
    INSERT INTO {schema}.schedules AS s
        (name, cron, timezone, task, queue, payload, priority, max_attempts, enabled,
         next_fire_at)
    VALUES (p_name, p_cron, p_timezone, p_task, p_queue, p_payload, p_priority, p_max_attempts,
            p_enabled, p_next_fire_at)
    ON CONFLICT (name) DO UPDATE
    SET cron = EXCLUDED.cron,
        timezone = EXCLUDED.timezone,
        task = EXCLUDED.task,
        queue = EXCLUDED.queue,
        payload = EXCLUDED.payload,
        priority = EXCLUDED.priority,
        max_attempts = EXCLUDED.max_attempts,
        next_fire_at = CASE
            WHEN NOT s.enabled THEN NULL
            WHEN s.cron = EXCLUDED.cron AND s.timezone = EXCLUDED.timezone THEN s.next_fire_at
            ELSE EXCLUDED.next_fire_at END,
        revision = s.revision + 1,
        updated_at = now()
    WHERE (s.cron, s.timezone, s.task, s.queue, s.payload, s.priority, s.max_attempts)
          IS DISTINCT FROM
          (EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.task, EXCLUDED.queue, EXCLUDED.payload,
           EXCLUDED.priority, EXCLUDED.max_attempts)
    RETURNING s.*;
    INSERT INTO {schema}.periodic_schedules (name) VALUES (p_name) ON CONFLICT DO NOTHING;
END;
$$;

-- Nothing here is for roles without a grant; `pgqueue grant` gives EXECUTE
-- per kind. Functions of later revisions are not PUBLIC either.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- Roles granted before this revision: recorded by what they hold (the
-- pgqueue grant of 0003), so that `pgqueue migrate` re-applies their kind
-- with this revision's narrower privileges. The owner's members need nothing.
INSERT INTO {schema}.role_grants (role, kind)
SELECT r.rolname,
       CASE WHEN has_table_privilege(r.oid, '{schema}.jobs', 'DELETE') THEN 'admin'
            WHEN has_column_privilege(r.oid, '{schema}.jobs', 'status', 'UPDATE') THEN 'worker'
            ELSE 'producer' END
FROM pg_roles r
WHERE has_schema_privilege(r.oid, (SELECT c.relnamespace FROM pg_class c
                                    WHERE c.oid = '{schema}.jobs'::regclass), 'USAGE')
  AND has_column_privilege(r.oid, '{schema}.jobs', 'notify_finish', 'UPDATE')
  AND NOT r.rolsuper AND r.rolname !~ '^pg_' AND r.rolname NOT IN ('public', 'none')
  AND NOT pg_has_role(r.oid, (SELECT c.relowner FROM pg_class c
                              WHERE c.oid = '{schema}.jobs'::regclass), 'USAGE')
ON CONFLICT (role) DO NOTHING;
