-- Reverts 0010_archive_partitions. A partitioned archive stays partitioned
-- (its rows are kept); archive and prune then treat it like a plain table.
DROP FUNCTION {schema}.archive_partition_switch(text, timestamptz);
DROP FUNCTION {schema}.archive_partition_prepare(text);
DROP FUNCTION {schema}.archive_partitions_drop(timestamptz, bigint);
DROP FUNCTION {schema}.archive_partitions_ensure(timestamptz, timestamptz);
DROP TABLE {schema}.archive_partitioning;
