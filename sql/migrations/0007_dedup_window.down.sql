-- Reverts 0007_dedup_window: the SQL API loses dedup_window and debounce.
DROP FUNCTION {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval);
ALTER FUNCTION {schema}.enqueue_plain(text, jsonb, text, integer, timestamptz, integer, text, text)
    RENAME TO enqueue;
DROP FUNCTION {schema}.enqueue_windowed(jsonb);
DROP FUNCTION {schema}.dedup_claim(text, text, interval, interval, jsonb);
DROP FUNCTION {schema}.dedup_lock(bigint[]);
DROP FUNCTION {schema}.dedup_lock_key(text, text);
DROP INDEX {schema}.jobs_archive_dedup_created_idx;
DROP INDEX {schema}.jobs_dedup_created_idx;
