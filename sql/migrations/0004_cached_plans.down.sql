-- Reverts 0004_cached_plans: lease_jobs plans every statement on every call
-- again, and enqueue_batch follows the session's plan_cache_mode.
ALTER FUNCTION {schema}.lease_jobs(text[], text, integer, integer, timestamptz)
    SET plan_cache_mode = force_custom_plan
    RESET enable_seqscan
    RESET enable_sort
    RESET jit;

ALTER FUNCTION {schema}.enqueue_batch(jsonb)
    RESET plan_cache_mode
    RESET enable_seqscan
    RESET jit;
