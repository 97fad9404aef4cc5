-- pgqueue revision 0004: the lease and the enqueue keep their query plans.
--
-- Until now lease_jobs planned every one of its statements on every call
-- (plan_cache_mode = force_custom_plan) and enqueue_batch inherited the
-- worker session's force_custom_plan: about 0.3 ms of planning per lease and
-- per single enqueue, most of what an idle worker adds to a job's pickup
-- latency. Both now reuse cached plans (plan_cache_mode = auto).
--
-- The reason for custom plans remains: a plan cached while the table was
-- small (a sequential scan, or a bitmap scan and a sort) would stay in a
-- long-lived worker session after a bulk load, until autovacuum analyzes the
-- table, and read every row on every lease. So the plans' shape is fixed
-- instead: with sequential scans and explicit sorts priced out
-- (enable_seqscan, enable_sort = off), every scan of jobs goes through the
-- partial index made for it, in that index's order, whatever the statistics
-- say. The sorts without an alternative (the returned batch, the random
-- order of queues) keep their price penalty, which would make PostgreSQL
-- JIT-compile the statement (~200 ms) on servers with jit on: jit = off.
ALTER FUNCTION {schema}.lease_jobs(text[], text, integer, integer, timestamptz)
    SET plan_cache_mode = auto
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off;

-- enqueue_batch scans jobs only to find the live job holding a dedup key.
ALTER FUNCTION {schema}.enqueue_batch(jsonb)
    SET plan_cache_mode = auto
    SET enable_seqscan = off
    SET jit = off;
