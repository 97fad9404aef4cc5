-- pgqueue 20e105c's lease_jobs (plan_cache_mode auto) and jobs_ready_idx (deduplication on),
-- run over head to measure "before" beside "after" in one run (issue #26; docs/storage-layout.md):
--   PGQB_PGQUEUE_VARIANT=benchmarks/profiles/before-26.sql python -m benchmarks --systems floor,pgqueue-variant,pgqueue
--   python -m benchmarks.drain_cpu --variant before=benchmarks/profiles/before-26.sql
CREATE OR REPLACE FUNCTION {schema}.lease_jobs(p_queues text[], p_worker_id text, p_limit integer, p_lease_seconds integer DEFAULT NULL::integer, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(job_id bigint, attempt_id bigint, attempt integer, task text, queue text, payload jsonb, lease_expires_at timestamp with time zone, lease_seconds integer, run_at timestamp with time zone, trace_context jsonb, tags text[], meta jsonb)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'auto'
    SET enable_seqscan TO 'off'
    SET enable_sort TO 'off'
    SET jit TO 'off'
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
    -- Only when an index probe finds one: most calls find none, and the
    -- probe costs a fraction of the staging statement.
    IF EXISTS (SELECT 1 FROM {schema}.jobs j WHERE j.stage = 'scheduled' AND j.run_at <= v_now) THEN
        WITH due AS MATERIALIZED (
            SELECT id FROM {schema}.jobs
            WHERE stage = 'scheduled' AND run_at <= v_now
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
                     WHERE j.stage = 'queued' AND j.status = 'queued' ORDER BY j.queue LIMIT 1)
                    UNION ALL
                    SELECT (SELECT j.queue FROM {schema}.jobs j
                            WHERE j.queue > r.name AND j.stage = 'queued' AND j.status = 'queued'
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
                    WHERE j.queue = v_queue.name AND j.counted AND j.stage = 'queued'
                      AND j.status = 'running'
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
                -- The row versions this statement locked, by ctid: nobody else can
                -- change them until this transaction ends, so the update below
                -- fetches them directly (a TID scan) instead of descending the
                -- primary key once per job. A version committed after this
                -- statement's snapshot (watch_job's notify_finish, set meanwhile)
                -- is invisible to that scan: its job stays queued for the next lease.
                SELECT j.ctid AS tid FROM {schema}.jobs j
                WHERE j.queue = v_queue.name AND j.stage = 'queued' AND j.status = 'queued' AND NOT j.serial_held
                  AND j.run_at <= v_now
                  AND (j.serial_key IS NULL OR (
                    coalesce((SELECT s.id FROM {schema}.jobs s
                              WHERE s.serial_key = j.serial_key
                                AND s.stage IN ('queued', 'scheduled')
                              ORDER BY s.serial_key, s.id LIMIT 1), j.id) >= j.id
                    AND (SELECT 1 FROM {schema}.jobs s
                         WHERE s.serial_key = j.serial_key AND s.stage = 'queued' AND s.status = 'running'
                         LIMIT 1) IS NULL))
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT v_cap
                FOR UPDATE SKIP LOCKED
            )
            , leased AS (
            UPDATE {schema}.jobs j
            SET status = 'running',
                -- Only jobs of limited queues are counted (indexed); the
                -- others keep the flag, so their lease stays a HOT update.
                counted = j.counted OR v_queue.limited,
                attempts = j.attempts + 1,
                attempt_id = nextval('{schema}.attempt_id_seq'),
                worker_id = p_worker_id,
                attempt_started_at = v_now,
                lease_expires_at = v_now + make_interval(secs => coalesce(v_lease,
                    CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END,
                    j.lease_seconds))
            -- = ANY(ARRAY(...)): a TID scan of exactly those versions; a join
            -- lets the planner hash the whole table instead.
            WHERE j.ctid = ANY (ARRAY(SELECT tid FROM picked))
            RETURNING j.id, j.attempt_id, j.attempts, j.task, j.queue, j.payload, j.lease_expires_at,
                      coalesce(v_lease, CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END, j.lease_seconds) AS lease_seconds, j.priority, j.run_at, j.trace_context,
                      j.tags, j.meta
            )
            SELECT l.id, l.attempt_id, l.attempts, l.task, l.queue, l.payload, l.lease_expires_at,
                   l.lease_seconds, l.run_at, l.trace_context, l.tags, l.meta
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
                        WHERE j.queue = v_queue.name AND j.stage = 'queued' AND j.status = 'queued' AND NOT j.serial_held
                          AND j.run_at <= v_now
                          AND j.task <> ALL (v_blocked)
                          AND (j.serial_key IS NULL OR (
                            coalesce((SELECT s.id FROM {schema}.jobs s
                                      WHERE s.serial_key = j.serial_key
                                        AND s.stage IN ('queued', 'scheduled')
                                      ORDER BY s.serial_key, s.id LIMIT 1), j.id) >= j.id
                            AND (SELECT 1 FROM {schema}.jobs s
                                 WHERE s.serial_key = j.serial_key AND s.stage = 'queued' AND s.status = 'running'
                                 LIMIT 1) IS NULL))
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
                            WHERE j.task = v_t AND j.counted AND j.stage = 'queued'
                              AND j.status = 'running'
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
                        counted = j.counted OR v_queue.limited OR j.task = ANY (v_limited),
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
                              j.priority, j.run_at, j.trace_context, j.tags, j.meta
                    )
                    SELECT l.id, l.attempt_id, l.attempts, l.task, l.queue, l.payload,
                           l.lease_expires_at, l.lease_seconds, l.run_at, l.trace_context,
                           l.tags, l.meta
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

ALTER INDEX {schema}.jobs_ready_idx SET (deduplicate_items = on);
