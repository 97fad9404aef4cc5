-- Reverts the baseline: removes every pgqueue object of the schema. The
-- schema itself stays; it also holds Alembic's version table.
DO $$
DECLARE
    v_nsp oid := (SELECT oid FROM pg_namespace WHERE nspname = trim(both '"' from '{schema}'));
    r record;
BEGIN
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
             WHERE c.relnamespace = v_nsp AND c.relkind = 'v'
    LOOP
        EXECUTE format('DROP VIEW IF EXISTS %s CASCADE', r.rel);
    END LOOP;
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
             WHERE c.relnamespace = v_nsp AND c.relkind IN ('r', 'p', 'm')
               AND c.relname <> 'alembic_version' AND NOT c.relispartition
    LOOP
        EXECUTE format('DROP TABLE IF EXISTS %s CASCADE', r.rel);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p WHERE p.pronamespace = v_nsp
    LOOP
        EXECUTE format('DROP FUNCTION IF EXISTS %s CASCADE', r.fn);
    END LOOP;
    FOR r IN SELECT c.oid::regclass AS seq FROM pg_class c
             WHERE c.relnamespace = v_nsp AND c.relkind = 'S'
    LOOP
        EXECUTE format('DROP SEQUENCE IF EXISTS %s CASCADE', r.seq);
    END LOOP;
    FOR r IN SELECT t.oid::regtype AS typ FROM pg_type t
             WHERE t.typnamespace = v_nsp AND t.typtype IN ('e', 'c', 'd')
               AND NOT EXISTS (SELECT FROM pg_class c WHERE c.reltype = t.oid AND c.relkind <> 'c')
    LOOP
        EXECUTE format('DROP TYPE IF EXISTS %s CASCADE', r.typ);
    END LOOP;
END
$$;
ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT EXECUTE ON FUNCTIONS TO PUBLIC;
