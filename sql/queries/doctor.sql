-- `pgqueue doctor`: what holds the database back. Catalog and statistics
-- views only, plus capped reads of the queue tables. Sessions, prepared
-- transactions and logical slots of other databases are left out: they do
-- not hold back the vacuum of this database's tables.

-- name: doctor_transactions
-- Sessions of this database with an open transaction or a snapshot, oldest
-- first: their xmin is what VACUUM must keep rows visible to.
SELECT pid, usename AS user_name, application_name, host(client_addr) AS client_addr,
       state, backend_xmin::text AS xmin, age(backend_xmin) AS xmin_age,
       extract(epoch FROM now() - xact_start)::float8 AS transaction_seconds,
       extract(epoch FROM now() - state_change)::float8 AS state_seconds,
       left(query, 200) AS last_query
FROM pg_catalog.pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND xact_start IS NOT NULL AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
ORDER BY xact_start
LIMIT 10;

-- name: doctor_prepared_transactions
-- Prepared (two-phase) transactions of this database: they hold their xmin
-- and locks until someone commits or rolls them back, even across restarts.
SELECT gid, owner AS owner_name, transaction::text AS xid, age(transaction) AS xmin_age,
       extract(epoch FROM now() - prepared)::float8 AS age_seconds
FROM pg_catalog.pg_prepared_xacts
WHERE database = current_database()
ORDER BY prepared;

-- name: doctor_replication_slots
-- Replication slots (physical ones, and logical ones of this database): an
-- inactive slot keeps WAL, and its xmin holds back vacuum.
SELECT slot_name, slot_type, active, active_pid, xmin::text AS xmin,
       catalog_xmin::text AS catalog_xmin,
       greatest(age(xmin), age(catalog_xmin)) AS xmin_age,
       CASE WHEN pg_is_in_recovery() THEN NULL
            ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint END AS retained_wal_bytes
FROM pg_catalog.pg_replication_slots
WHERE database IS NULL OR database = current_database()
ORDER BY slot_name;

-- name: doctor_tables
-- Dead tuples, size and last vacuum of the queue tables.
SELECT c.relname AS table_name, s.n_live_tup AS live_tuples, s.n_dead_tup AS dead_tuples,
       pg_total_relation_size(c.oid) AS total_bytes,
       s.last_autovacuum, s.last_vacuum, s.last_autoanalyze
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_stat_all_tables s ON s.relid = c.oid
WHERE n.nspname = %(schema)s AND c.relkind = 'r'
ORDER BY s.n_dead_tup DESC;

-- name: doctor_notify_queue
-- How full the server's NOTIFY queue is (0 to 1).
SELECT pg_notification_queue_usage()::float8 AS usage;

-- name: doctor_connections
-- Client connections of the whole server against max_connections, and the
-- heaviest users.
SELECT (SELECT count(*) FROM pg_catalog.pg_stat_activity
        WHERE backend_type = 'client backend')::integer AS in_use,
       current_setting('max_connections')::integer AS max_connections,
       current_setting('superuser_reserved_connections')::integer AS reserved,
       (SELECT coalesce(jsonb_agg(t ORDER BY t.connections DESC), '[]')
        FROM (SELECT usename AS user_name, datname AS database, application_name,
                     count(*) AS connections
              FROM pg_catalog.pg_stat_activity WHERE backend_type = 'client backend'
              GROUP BY 1, 2, 3 ORDER BY 4 DESC LIMIT 5) t) AS top;

-- name: doctor_backend
-- This connection as the server sees it: who is at the other end.
SELECT pg_backend_pid() AS pid, inet_server_port() AS server_port,
       host(inet_server_addr()) AS server_addr, inet_client_port() AS client_port,
       host(inet_client_addr()) AS client_addr;

-- name: doctor_archive_backlog
-- Finished jobs past their retention that are still stored (up to the cap,
-- per status), the oldest of them, and the maintenance row: who applies
-- retention and when a pass last finished.
WITH r AS (SELECT * FROM {schema}.retention),
late AS (
    SELECT finished_at FROM (
        (SELECT j.finished_at FROM {schema}.jobs j, r
         WHERE j.status = 'succeeded' AND j.finished_at < now() - r.succeeded LIMIT %(cap)s)
        UNION ALL
        (SELECT j.finished_at FROM {schema}.jobs j, r
         WHERE j.status = 'dead' AND j.finished_at < now() - r.dead LIMIT %(cap)s)
        UNION ALL
        (SELECT j.finished_at FROM {schema}.jobs j, r
         WHERE j.status = 'cancelled' AND j.finished_at < now() - r.cancelled LIMIT %(cap)s)) x
)
SELECT (SELECT count(*) FROM late)::bigint AS waiting,
       extract(epoch FROM now() - (SELECT min(finished_at) FROM late))::float8 AS oldest_seconds,
       extract(epoch FROM now() - m.last_run_at)::float8 AS last_run_age_seconds,
       m.last_run_by, m.last_error, m.holder,
       extract(epoch FROM r.succeeded)::float8 AS succeeded_seconds,
       EXISTS (SELECT 1 FROM {schema}.jobs j WHERE j.status IN ('succeeded', 'dead', 'cancelled'))
           AS any_finished
FROM {schema}.maintenance m, r;

