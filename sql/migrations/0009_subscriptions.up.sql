-- pgqueue revision 0009: notifications that a public event stream can use.
--
-- The channel carries hints for workers and for app.subscribe() (see
-- pgqueue/events.py for every payload). This revision changes what enqueue
-- sends; the statements in sql/queries change the rest.
--
--   j:<queue>          new ready jobs in queue (how many, unknown)
--   j:<queue>#<id>     one new ready job ('#' cannot occur in a queue name)
--   w:<queue>          no new ready job, but a worker may want to wake:
--                      a scheduled job or retry was stored (its due time
--                      may be earlier than the one the worker sleeps to)
--
-- A statement sends one notification per queue, as before: 'w:' when none
-- of its jobs there is ready, else 'j:' (a batch of ready and scheduled
-- jobs sends 'j:', and whoever receives it also looks at due times again).
--
-- Coalescing stays as it was: one notification per queue per statement,
-- and at most two per queue per transaction. The first enqueue of a
-- transaction into a queue names its job when it was one job; every later
-- one sends the plain 'j:<queue>', which PostgreSQL folds into one because
-- identical notifications of one transaction are delivered once. A
-- transaction-local setting (pgqueue.enqueued) remembers which queues were
-- already named.

-- The one notification of a statement that inserted p_count jobs into
-- p_queue, p_ready of them ready now, the lowest id p_job_id.
CREATE FUNCTION {schema}.notify_enqueued(
    p_queue text, p_count bigint, p_ready bigint, p_job_id bigint
) RETURNS void
-- One SQL expression, so that the planner inlines it into the enqueue statements.
LANGUAGE sql AS $$
    SELECT pg_catalog.pg_notify({channel}, CASE
        WHEN p_ready = 0 THEN 'w:' || p_queue
        WHEN p_count = 1
             -- Not yet named in this transaction: name it, and remember.
             -- set_config(..., true) lasts until the end of the transaction
             -- (or of a rolled-back savepoint, with the notifications it sent).
             AND pg_catalog.strpos(
                     coalesce(pg_catalog.current_setting('pgqueue.enqueued', true), ''),
                     '|' || {channel} || '/' || p_queue || '|') = 0
             AND pg_catalog.set_config('pgqueue.enqueued',
                     coalesce(pg_catalog.current_setting('pgqueue.enqueued', true), '')
                     || '|' || {channel} || '/' || p_queue || '|', true) IS NOT NULL
        THEN 'j:' || p_queue || '#' || p_job_id
        -- Ready jobs, maybe scheduled ones too: workers wake and recompute
        -- their next due time anyway; subscribers' listeners do as well.
        ELSE 'j:' || p_queue END)
$$;

-- As in 0001, only the notification changed (per_queue, notified).
CREATE OR REPLACE FUNCTION {schema}.enqueue_rows(p_jobs jsonb, p_only bigint[] DEFAULT NULL)
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

-- As in 0001 (with the attributes 0003 and 0004 gave it); only the
-- notification of the plain path changed.
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
