-- Reverts 0014_admin_replay: replay is a client-side read and enqueue again.
DROP FUNCTION {schema}.replay_job(bigint, text, timestamptz);
