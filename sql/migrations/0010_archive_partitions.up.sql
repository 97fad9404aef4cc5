-- pgqueue revision 0010: the archive may be range-partitioned by finished_at.
--
-- Pruning an unpartitioned archive deletes row by row: on weeks of history
-- that is the largest write load a queue puts on its database (WAL, dead
-- tuples, vacuum). Partitioned by finish time, prune drops whole partitions
-- instead. Partitioning is opt-in (`pgqueue migrate --partitioned-archive`,
-- pgqueue/partitions.py converts the table online); this revision installs
-- what both layouts share: the setting and the two functions archive and
-- prune call. Both functions do nothing while the archive is not partitioned.

-- One row once the archive is partitioned: the period of a partition, and the
-- upper bound of the partition that holds the rows archived before (NULL once
-- that partition was dropped).
CREATE TABLE {schema}.archive_partitioning (
    only_row      boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    period        text NOT NULL CHECK (period IN ('day', 'week', 'month')),
    legacy_upper  timestamptz CHECK (isfinite(legacy_upper)),
    converted_at  timestamptz NOT NULL DEFAULT now()
);

-- Create the missing partitions that cover [p_from, p_to]; returns how many.
-- Ranges already held by the legacy partition are left to it. Serialised by a
-- transaction-scoped advisory lock so that concurrent archives do not race to
-- create the same partition; lock_timeout bounds the wait for the parent's
-- lock behind a long reader instead of queueing every reader behind us.
CREATE FUNCTION {schema}.archive_partitions_ensure(p_from timestamptz, p_to timestamptz)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_period  text;
    v_legacy  timestamptz;
    v_start   timestamptz;
    v_end     timestamptz;
    v_name    text;
    v_created integer := 0;
BEGIN
    SELECT period, legacy_upper INTO v_period, v_legacy FROM {schema}.archive_partitioning;
    IF v_period IS NULL OR p_from IS NULL OR p_to IS NULL
       OR NOT isfinite(p_from) OR NOT isfinite(p_to) OR p_from > p_to THEN
        RETURN 0;
    END IF;
    v_start := date_trunc(v_period, p_from AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    IF v_legacy IS NOT NULL AND v_start < v_legacy THEN
        v_start := v_legacy;
    END IF;
    IF p_to - v_start > interval '3700 days' THEN
        RAISE EXCEPTION 'archive partitions: refusing to create partitions over % (from % to %)',
            p_to - v_start, v_start, p_to
            USING ERRCODE = '22023';
    END IF;
    WHILE v_start <= p_to LOOP
        v_end := ((v_start AT TIME ZONE 'UTC') + ('1 ' || v_period)::interval) AT TIME ZONE 'UTC';
        v_name := 'jobs_archive_' || to_char(v_start AT TIME ZONE 'UTC', 'YYYYMMDD');
        IF to_regclass(format('%s.%I', '{schema}', v_name)) IS NULL THEN
            PERFORM pg_advisory_xact_lock(hashtext('pgqueue.archive_partitions'),
                                          '{schema}.jobs_archive'::regclass::oid::integer);
            IF to_regclass(format('%s.%I', '{schema}', v_name)) IS NULL THEN
                EXECUTE format('CREATE TABLE %s.%I PARTITION OF {schema}.jobs_archive'
                               ' FOR VALUES FROM (%L) TO (%L)', '{schema}', v_name, v_start, v_end);
                v_created := v_created + 1;
            END IF;
        END IF;
        v_start := v_end;
    END LOOP;
    RETURN v_created;
END
$$;

-- Detach and drop every partition whose rows all finished before p_cutoff and
-- that holds at most p_max_rows rows (NULL: any); returns the rows dropped.
-- Rows are counted before the drop so that prune reports what it removed;
-- the count reads the partition but writes nothing (no WAL, no dead tuples).
CREATE FUNCTION {schema}.archive_partitions_drop(p_cutoff timestamptz, p_max_rows bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_part    record;
    v_rows    bigint;
    v_total   bigint := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {schema}.archive_partitioning) THEN
        RETURN 0;
    END IF;
    FOR v_part IN
        SELECT c.oid::regclass AS part,
               substring(pg_get_expr(c.relpartbound, c.oid) FROM $r$TO \('([^']*)'\)$r$)::timestamptz
                   AS upper_bound,
               pg_get_expr(c.relpartbound, c.oid) LIKE '%MINVALUE%' AS is_legacy
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = '{schema}.jobs_archive'::regclass
        ORDER BY 2
    LOOP
        EXIT WHEN v_part.upper_bound IS NULL OR v_part.upper_bound > p_cutoff;
        EXECUTE format('SELECT count(*) FROM %s', v_part.part) INTO v_rows;
        EXIT WHEN p_max_rows IS NOT NULL AND v_total + v_rows > p_max_rows;
        EXECUTE format('ALTER TABLE {schema}.jobs_archive DETACH PARTITION %s', v_part.part);
        EXECUTE format('DROP TABLE %s', v_part.part);
        IF v_part.is_legacy THEN
            UPDATE {schema}.archive_partitioning SET legacy_upper = NULL;
        END IF;
        v_total := v_total + v_rows;
    END LOOP;
    RETURN v_total;
END
$$;

-- Step 1 of converting a plain archive (pgqueue/ops/partitions.py drives the
-- steps): a NOT VALID check that every row finished before the upper bound of
-- the partition the table will become. Validated next, in its own statement,
-- under a lock that lets reads and archives go on; ATTACH then trusts it and
-- does not scan the table under its stronger lock. The bound leaves one whole
-- period of slack, so rows archived while the conversion runs still fit.
CREATE FUNCTION {schema}.archive_partition_prepare(p_period text)
RETURNS timestamptz
LANGUAGE plpgsql
AS $$
DECLARE
    v_bound timestamptz;
BEGIN
    IF p_period IS NULL OR p_period NOT IN ('day', 'week', 'month') THEN
        RAISE EXCEPTION 'archive partitions: period must be day, week or month, not %', p_period
            USING ERRCODE = '22023';
    END IF;
    v_bound := (date_trunc(p_period, now() AT TIME ZONE 'UTC')
                + 2 * ('1 ' || p_period)::interval) AT TIME ZONE 'UTC';
    ALTER TABLE {schema}.jobs_archive DROP CONSTRAINT IF EXISTS jobs_archive_legacy_bound;
    EXECUTE format('ALTER TABLE {schema}.jobs_archive ADD CONSTRAINT jobs_archive_legacy_bound'
                   ' CHECK (finished_at IS NOT NULL AND finished_at < %L::timestamptz) NOT VALID',
                   v_bound);
    RETURN v_bound;
END
$$;

-- Step 3: in one short transaction, the plain table becomes the first
-- partition (everything before p_bound) of a new partitioned jobs_archive,
-- which takes over its name, indexes (ATTACH adopts the old table's matching
-- ones instead of building new) and privileges; partitions for the next
-- periods are created. Readers wait for this transaction, never fail.
CREATE FUNCTION {schema}.archive_partition_switch(p_period text, p_bound timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_grant record;
BEGIN
    ALTER TABLE {schema}.jobs_archive RENAME TO jobs_archive_legacy;
    ALTER INDEX {schema}.jobs_archive_finished_idx RENAME TO jobs_archive_legacy_finished_idx;
    ALTER INDEX {schema}.jobs_archive_dedup_created_idx
        RENAME TO jobs_archive_legacy_dedup_created_idx;
    CREATE TABLE {schema}.jobs_archive (
        LIKE {schema}.jobs_archive_legacy INCLUDING DEFAULTS INCLUDING STORAGE INCLUDING COMMENTS
    ) PARTITION BY RANGE (finished_at);
    CREATE INDEX jobs_archive_finished_idx ON {schema}.jobs_archive (finished_at);
    CREATE INDEX jobs_archive_id_idx ON {schema}.jobs_archive (id);
    -- dedup windows (0007) look archived jobs up by key
    CREATE INDEX jobs_archive_dedup_created_idx ON {schema}.jobs_archive (queue, dedup_key, created_at)
        WHERE dedup_key IS NOT NULL;
    EXECUTE format('ALTER TABLE {schema}.jobs_archive ATTACH PARTITION {schema}.jobs_archive_legacy'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)', p_bound);
    -- The partition constraint now says the same.
    ALTER TABLE {schema}.jobs_archive_legacy DROP CONSTRAINT jobs_archive_legacy_bound;
    -- Whoever could read or write the archive still can.
    FOR v_grant IN
        SELECT a.privilege_type,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
                   AS grantee
        FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
        WHERE c.oid = '{schema}.jobs_archive_legacy'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON {schema}.jobs_archive TO %s',
                       v_grant.privilege_type, v_grant.grantee);
    END LOOP;
    INSERT INTO {schema}.archive_partitioning (period, legacy_upper) VALUES (p_period, p_bound);
    PERFORM {schema}.archive_partitions_ensure(p_bound, now() + 2 * ('1 ' || p_period)::interval);
END
$$;

-- These change the archive's layout: they run as the owner (lock_timeout:
-- waiting behind a long reader for the parent's lock would queue every
-- reader behind them; fail instead and let the next run retry) (partitions
-- belong to the owner whoever archives), with a pinned search_path, and only
-- for roles given the right (`pgqueue grant --admin`).
ALTER FUNCTION {schema}.archive_partitions_ensure(timestamptz, timestamptz)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10s';
ALTER FUNCTION {schema}.archive_partitions_drop(timestamptz, bigint)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10s';
ALTER FUNCTION {schema}.archive_partition_prepare(text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10s';
ALTER FUNCTION {schema}.archive_partition_switch(text, timestamptz)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10s';
REVOKE EXECUTE ON FUNCTION
    {schema}.archive_partitions_ensure(timestamptz, timestamptz),
    {schema}.archive_partitions_drop(timestamptz, bigint),
    {schema}.archive_partition_prepare(text),
    {schema}.archive_partition_switch(text, timestamptz)
FROM PUBLIC;
