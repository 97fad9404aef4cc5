-- pgqueue 20e105c's lease plan setting (plan_cache_mode auto; its lease_jobs body
-- is otherwise today's) and jobs_ready_idx (deduplication on), run over head to
-- measure "before" beside "after" in one run (issue #26; docs/storage-layout.md):
--   PGQB_PGQUEUE_VARIANT=benchmarks/profiles/before-26.sql python -m benchmarks --systems floor,pgqueue-variant,pgqueue
--   python -m benchmarks.drain_cpu --variant before=benchmarks/profiles/before-26.sql
ALTER FUNCTION {schema}.lease_jobs(text[], text, integer, integer, timestamp with time zone)
    SET plan_cache_mode = auto;

ALTER INDEX {schema}.jobs_ready_idx SET (deduplicate_items = on);
