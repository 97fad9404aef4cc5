-- pgqueue revision 0013: worker identity.
--
-- * workers.version: the pgqueue version a worker runs (dashboard /workers,
--   `pgqueue workers list`).
-- * workers.token_hash: sha256 of a secret each worker process draws at
--   start. Registration, heartbeats and deregistration go through the
--   SECURITY DEFINER functions below, which touch a row only when the
--   caller presents its secret: a worker role can write its own row and
--   nothing else (it held INSERT/UPDATE/DELETE on workers before: any worker
--   could rewrite or delete every other worker's registration).
-- * mark_lost_workers / prune_lost_workers: the reaper's bookkeeping of
--   silent workers, which every worker runs, bounded so that a worker role
--   cannot declare a live worker lost (silent for at least 60 s, the window
--   in which every reader counts a worker alive) nor forget one that still
--   holds jobs.

-- Objects are created as the schema's owner even when a member of it
-- migrates, as in 0005: the SECURITY DEFINER functions run as that owner.
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

ALTER TABLE {schema}.workers
    ADD COLUMN version    text,    -- pgqueue version of the worker process
    ADD COLUMN token_hash bytea;   -- sha256 of the process's secret (NULL: registered before 0013)

-- The checks shared by register_worker and heartbeat_worker (plain: runs
-- as the definer functions' owner; not granted to anyone).
CREATE FUNCTION {schema}.check_worker(
    p_worker_id text, p_token text, p_host text, p_pid integer, p_queues text[],
    p_concurrency integer, p_tasks text[], p_version text
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_worker_id IS NULL OR btrim(p_worker_id) = '' OR length(p_worker_id) > 255
       OR p_worker_id ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgqueue: worker_id must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_token IS NULL OR length(p_token) NOT BETWEEN 16 AND 200 THEN
        RAISE EXCEPTION 'pgqueue: a worker secret must be 16 to 200 characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_host IS NULL OR length(p_host) > 255 OR p_host ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgqueue: worker host must be at most 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_pid IS NULL OR p_pid <= 0 THEN
        RAISE EXCEPTION 'pgqueue: worker pid must be a positive integer' USING ERRCODE = '22023';
    END IF;
    IF p_concurrency IS NULL OR p_concurrency NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'pgqueue: worker concurrency must be between 1 and 1000000'
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_queues) > 10000 OR cardinality(p_tasks) > 10000 THEN
        RAISE EXCEPTION 'pgqueue: a worker lists at most 10000 queues and 10000 tasks'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(coalesce(p_queues, '{}') || coalesce(p_tasks, '{}')) n
               WHERE n IS NULL OR n = '' OR length(n) > 255 OR n ~ '[[:cntrl:]]') THEN
        RAISE EXCEPTION 'pgqueue: worker queue and task names must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_version IS NOT NULL AND (length(p_version) > 64 OR p_version ~ '[[:cntrl:]]') THEN
        RAISE EXCEPTION 'pgqueue: worker version must be at most 64 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
END;
$$;

-- Register (or re-register) the calling worker process. A row of that id
-- registered under another secret is refused and left alone.
CREATE FUNCTION {schema}.register_worker(
    p_worker_id text, p_token text, p_host text, p_pid integer, p_queues text[],
    p_concurrency integer, p_tasks text[], p_version text
) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    PERFORM {schema}.check_worker(p_worker_id, p_token, p_host, p_pid, p_queues, p_concurrency,
                                  p_tasks, p_version);
    INSERT INTO {schema}.workers AS w
        (id, host, pid, queues, concurrency, tasks, version, token_hash)
    VALUES (p_worker_id, p_host, p_pid, p_queues, p_concurrency, p_tasks, p_version,
            sha256(convert_to(p_token, 'UTF8')))
    ON CONFLICT (id) DO UPDATE
    SET host = EXCLUDED.host, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
        concurrency = EXCLUDED.concurrency, tasks = EXCLUDED.tasks, version = EXCLUDED.version,
        last_heartbeat_at = now(), lost_at = NULL
    WHERE w.token_hash = EXCLUDED.token_hash;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n = 0 THEN
        -- 22023 like every other refused input: the caller's error names it.
        RAISE EXCEPTION 'pgqueue: worker id % is registered by another worker process: give this worker another worker_id', p_worker_id
            USING ERRCODE = '22023';
    END IF;
END;
$$;

-- The worker's periodic heartbeat: alive now (a worker declared lost that
-- speaks again is alive again); re-registers it when a cleanup removed its
-- row. False (nothing changed) when the row belongs to another secret.
CREATE FUNCTION {schema}.heartbeat_worker(
    p_worker_id text, p_token text, p_host text, p_pid integer, p_queues text[],
    p_concurrency integer, p_tasks text[], p_version text
) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    PERFORM {schema}.check_worker(p_worker_id, p_token, p_host, p_pid, p_queues, p_concurrency,
                                  p_tasks, p_version);
    INSERT INTO {schema}.workers AS w
        (id, host, pid, queues, concurrency, tasks, version, token_hash)
    VALUES (p_worker_id, p_host, p_pid, p_queues, p_concurrency, p_tasks, p_version,
            sha256(convert_to(p_token, 'UTF8')))
    ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = now(), lost_at = NULL
    WHERE w.token_hash = EXCLUDED.token_hash;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n > 0;
END;
$$;

-- A clean exit removes the worker's own row; false when there is none
-- under that secret.
CREATE FUNCTION {schema}.deregister_worker(p_worker_id text, p_token text) RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM {schema}.workers
        WHERE id = p_worker_id AND token_hash = sha256(convert_to(p_token, 'UTF8'))
        RETURNING 1
    )
    SELECT count(*) > 0 FROM gone;
$$;

-- The reaper's bookkeeping (every worker runs it): declare workers silent
-- for longer than p_seconds lost. Never sooner than 60 s, the window in
-- which every reader counts a worker alive, whoever calls it.
CREATE FUNCTION {schema}.mark_lost_workers(p_seconds float8) RETURNS SETOF text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_seconds IS NULL OR NOT (p_seconds >= 60 AND p_seconds < 'Infinity'::float8) THEN
        RAISE EXCEPTION 'pgqueue: a worker is declared lost after at least 60 seconds of silence, got %', p_seconds
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    UPDATE {schema}.workers SET lost_at = now()
    WHERE lost_at IS NULL AND last_heartbeat_at < now() - make_interval(secs => p_seconds)
    RETURNING id;
END;
$$;

-- Forget workers lost for longer than p_seconds whose jobs were all reaped
-- (a forgotten worker that speaks again registers again).
CREATE FUNCTION {schema}.prune_lost_workers(p_seconds float8) RETURNS SETOF text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_seconds IS NULL OR NOT (p_seconds >= 0 AND p_seconds < 'Infinity'::float8) THEN
        RAISE EXCEPTION 'pgqueue: seconds must be a finite number of 0 or more, got %', p_seconds
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    DELETE FROM {schema}.workers w
    WHERE w.lost_at < now() - make_interval(secs => p_seconds)
      AND NOT EXISTS (SELECT 1 FROM {schema}.jobs j
                      WHERE j.status = 'running' AND j.worker_id = w.id)
    RETURNING w.id;
END;
$$;

-- Nothing new is for PUBLIC (0005); `pgqueue grant` gives EXECUTE per kind.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;
