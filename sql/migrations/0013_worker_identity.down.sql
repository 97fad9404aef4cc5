-- Reverts 0013_worker_identity: workers write their own rows again (run
-- `pgqueue grant` again with the code of 0006 to give the worker role its
-- table privileges back).
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

DROP FUNCTION {schema}.prune_lost_workers(float8);
DROP FUNCTION {schema}.mark_lost_workers(float8);
DROP FUNCTION {schema}.deregister_worker(text, text);
DROP FUNCTION {schema}.heartbeat_worker(text, text, text, integer, text[], integer, text[], text);
DROP FUNCTION {schema}.register_worker(text, text, text, integer, text[], integer, text[], text);
DROP FUNCTION {schema}.check_worker(text, text, text, integer, text[], integer, text[], text);

ALTER TABLE {schema}.workers DROP COLUMN token_hash, DROP COLUMN version;
