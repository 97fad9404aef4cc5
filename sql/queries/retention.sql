-- Retention and the maintenance that applies it (pgqueue/ops/retention.py).
-- The functions are in sql/schema.sql ("Retention: finished jobs leave by
-- themselves"); every step of a pass runs in a transaction of its own.

-- name: retention_get
-- How long finished jobs are kept, by status.
SELECT succeeded, cancelled, dead, updated_at FROM {schema}.retention;

-- name: retention_set
-- Change how long finished jobs are kept (NULL: unchanged); the new settings.
SELECT succeeded, cancelled, dead, updated_at
FROM {schema}.set_retention(%(succeeded)s::interval, %(cancelled)s::interval, %(dead)s::interval);

-- name: retention_plan
-- What one maintenance pass does, in order (see retention_plan); with
-- %(cutoffs)s ([succeeded, cancelled, dead]) instead of the stored retention.
SELECT action, status::text, leaf, lower, upper
FROM {schema}.retention_plan(%(now)s::timestamptz, %(cutoffs)s::interval[]);

-- name: retention_create_leaf
-- Create a leaf of a finished partition; its name (NULL: one covers it already).
SELECT {schema}.retention_create_leaf(%(status)s::{schema}.job_status, %(lower)s::timestamptz,
                                      %(upper)s::timestamptz);

-- name: retention_drop_leaf
-- Drop a leaf past retention; how many jobs it held (counted, or estimated).
SELECT {schema}.retention_drop_leaf(%(leaf)s::text, %(count)s::boolean);

-- name: retention_purge
-- Delete up to %(limit)s jobs finished before %(before)s from a default leaf
-- or (by status) from jobs_archive; how many.
SELECT {schema}.retention_purge(%(table)s::text, %(status)s::{schema}.job_status,
                                %(before)s::timestamptz, %(limit)s::integer);

-- name: maintenance_claim
-- Take or keep the maintenance turn for %(seconds)s; whether this worker holds it.
SELECT {schema}.maintenance_claim(%(worker_id)s::text, %(seconds)s::float8);

-- name: maintenance_done
-- Record a finished pass of the turn's holder (and what went wrong, if anything).
SELECT {schema}.maintenance_done(%(worker_id)s::text, %(error)s::text);

-- name: maintenance_release
-- Hand the maintenance turn on (a worker that stops).
SELECT {schema}.maintenance_release(%(worker_id)s::text);

-- name: maintenance_state
-- Who holds the maintenance turn, until when, and the last pass (doctor);
-- with the rows finished jobs left in default leaves (finished while no
-- worker made leaves).
SELECT m.holder, m.held_until, m.last_run_at, m.last_run_by, m.last_error,
       extract(epoch FROM now() - m.last_run_at)::float8 AS last_run_age_seconds,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs_succeeded_default LIMIT 1000) d)
       + (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs_dead_default LIMIT 1000) d)
       + (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs_cancelled_default LIMIT 1000) d)
           AS unpartitioned
FROM {schema}.maintenance m;
