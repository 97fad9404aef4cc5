-- The partitioned archive (revision 0010; pgqueue/ops/partitions.py). Every
-- function called here does nothing while the archive is a plain table.

-- name: archive_partitioning_get
-- How the archive is laid out: partitioned or not, the period, and its partitions.
SELECT c.relkind = 'p' AS partitioned,
       s.period,
       s.legacy_upper,
       s.converted_at,
       (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid) AS partitions
FROM pg_class c
LEFT JOIN {schema}.archive_partitioning s ON true
WHERE c.oid = to_regclass('{schema}.jobs_archive');

-- name: archive_partitions_for_archive
-- Partitions for every row an archive run with this cutoff may move (from the
-- oldest candidate's finish time), and for the next two periods, so that the
-- brief lock that creating one takes falls in a run, never on a busy path.
SELECT {schema}.archive_partitions_ensure(
    (SELECT min(finished_at) FROM {schema}.jobs
     WHERE status = ANY (%(statuses)s::{schema}.job_status[])
       AND finished_at < (coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval)),
    coalesce(%(now)s::timestamptz, now())
        + 2 * ('1 ' || (SELECT period FROM {schema}.archive_partitioning))::interval);

-- name: archive_partitions_drop
-- Drop whole partitions of rows finished before the cutoff (at most
-- %(max_rows)s rows, NULL: no bound); the rows dropped.
SELECT {schema}.archive_partitions_drop(
    coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval, %(max_rows)s::bigint);

-- name: archive_partition_prepare
SELECT {schema}.archive_partition_prepare(%(period)s::text);

-- name: archive_partition_validate
ALTER TABLE {schema}.jobs_archive VALIDATE CONSTRAINT jobs_archive_legacy_bound;

-- name: archive_partition_index
-- The archive's partitioned index on id will adopt this one (a unique index,
-- like the primary key, does not match a non-unique one), so that ATTACH builds
-- nothing under its lock. CONCURRENTLY: archives and readers go on meanwhile.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_archive_legacy_id_idx ON {schema}.jobs_archive (id);

-- name: archive_partition_switch
SELECT {schema}.archive_partition_switch(%(period)s::text, %(bound)s::timestamptz);
