-- Reverts 0001_core: removes every object it created (the schema itself stays,
-- it also holds Alembic's version table).
DROP FUNCTION IF EXISTS {schema}.lease_jobs(text[], text, integer, integer, timestamptz);
DROP FUNCTION IF EXISTS {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text);
DROP FUNCTION IF EXISTS {schema}.enqueue_batch(jsonb);
DROP FUNCTION IF EXISTS {schema}.enqueue_rows(jsonb, bigint[]);
DROP FUNCTION IF EXISTS {schema}.enqueue_input(jsonb);
DROP FUNCTION IF EXISTS {schema}.queue_oldest_ready(text, timestamptz);
DROP FUNCTION IF EXISTS {schema}.visible_status({schema}.job_status, timestamptz);
DROP FUNCTION IF EXISTS {schema}.retry_delay(integer, real, real, real, real);
DROP TABLE IF EXISTS {schema}.workers;
DROP TABLE IF EXISTS {schema}.queue_lease_log;
DROP TABLE IF EXISTS {schema}.queues;
DROP TABLE IF EXISTS {schema}.jobs_archive;
DROP TABLE IF EXISTS {schema}.job_attempts;
DROP TABLE IF EXISTS {schema}.jobs;
DROP SEQUENCE IF EXISTS {schema}.attempt_id_seq;
DROP TYPE IF EXISTS {schema}.attempt_outcome;
DROP TYPE IF EXISTS {schema}.enqueued;
DROP TYPE IF EXISTS {schema}.job_status;
