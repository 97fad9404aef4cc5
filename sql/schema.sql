-- pgqueue schema: every type, table, index, function, trigger and grant rule.
--
-- Read it top-down: the types, the tables (each column that is not obvious
-- has a COMMENT, shown by \d+ and admin tools), their indexes, then the
-- functions in the order a job meets them (enqueue, lease, complete, the
-- graph and serial bookkeeping, maintain), the triggers, the grants.
-- docs/storage-layout.md says why the jobs table is laid out as it is and
-- what each choice cost; docs/schema.md how this file changes.
--
-- {schema} and {channel} stand for the schema's quoted name and its NOTIFY
-- channel; the baseline revision applies this file with them replaced.
-- tests/test_schema_file.py checks that a database migrated to head has
-- exactly what this file creates.

-- =====================================================================================
-- Types
-- =====================================================================================

CREATE TYPE {schema}.job_status AS ENUM (
    'queued',     -- ready to run (shown as 'scheduled' while run_at is ahead)
    'scheduled',  -- run_at is ahead; a lease stages it to 'queued' when due
    'running',    -- leased: an attempt is under way
    'succeeded',  -- finished: the task returned
    'dead',       -- finished: attempts used up, Permanent, or an unknown task past its grace
    'cancelled',  -- finished: cancelled, or a dependency failed
    'waiting'     -- enqueued with dependencies that have not all ended
);
COMMENT ON TYPE {schema}.job_status IS
    'A job''s state; queued, scheduled, running and waiting are live (jobs_live), the others finished (jobs_succeeded, jobs_dead, jobs_cancelled).';

CREATE TYPE {schema}.attempt_outcome AS ENUM (
    'running',
    'succeeded',
    'failed',         -- the task raised; retried or dead-lettered
    'retry',          -- the task raised Retry
    'timeout',        -- the task ran past its timeout
    'lease_expired',  -- the reaper took the job back from a silent worker
    'cancelled',      -- a cancel was requested while it ran
    'released',       -- handed back unrun (nack): not counted toward max_attempts
    'snoozed',        -- the task raised Snooze: queued again, not counted
    'slept',          -- context.sleep(): queued again at the wake-up time, not counted
    'waited'          -- context.wait_for_event(): waiting for the event, not counted
);
COMMENT ON TYPE {schema}.attempt_outcome IS 'How an attempt ended (job_attempts.outcome).';

CREATE TYPE {schema}.enqueued AS (
	ord bigint,
	job_id bigint,
	created boolean,
	queue text,
	dedup_key text
);
COMMENT ON TYPE {schema}.enqueued IS 'One input of a batch enqueue and the job it became (enqueue_batch).';

-- What an enqueue decides for a new job besides its id and payload: the one
-- list of the columns an enqueue writes. enqueue_resolve returns it, and
-- every insert expands it into the view jobs_new below (which follows this
-- type), so a new enqueue option is a field here and a column of jobs, and
-- no INSERT names it. Fixed-width fields first.
CREATE TYPE {schema}.job_values AS (
	priority smallint,
	run_at timestamp with time zone,
	status {schema}.job_status,
	max_attempts integer,
	lease_seconds integer,
	backoff_base real,
	backoff_factor real,
	backoff_max real,
	backoff_jitter real,
	has_records boolean,
	task text,
	queue text,
	dedup_key text,
	serial_key text,
	tags text[],
	meta jsonb,
	group_key text
);
COMMENT ON TYPE {schema}.job_values IS 'A new job''s columns besides id and payload, as enqueue_resolve decides them; jobs_new follows its fields.';

-- =====================================================================================
-- Tables
-- =====================================================================================

-- Jobs: one table, partitioned by status. Live jobs are in jobs_live, a
-- small, hot table. Completion moves a job's row once, to the partition of
-- its final status; those are partitioned by finish time, so that
-- retention drops a whole time range at once instead of deleting rows.
CREATE SEQUENCE {schema}.jobs_id_seq;

CREATE TABLE {schema}.jobs (
    id bigint DEFAULT nextval('{schema}.jobs_id_seq'::regclass) NOT NULL,
    run_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 5 NOT NULL,
    lease_seconds integer DEFAULT 60 NOT NULL,
    backoff_base real,
    backoff_factor real,
    backoff_max real,
    backoff_jitter real,
    cancel_requested boolean DEFAULT false NOT NULL,
    notify_finish boolean DEFAULT false NOT NULL,
    serial_held boolean DEFAULT false NOT NULL,
    queue text NOT NULL,
    task text NOT NULL,
    payload jsonb NOT NULL,
    dedup_key text,
    serial_key text,
    trace_context jsonb DEFAULT (NULLIF(current_setting('pgqueue.trace_context'::text, true), ''::text))::jsonb,
    tags text[],
    meta jsonb,
    group_key text,
    -- The columns a lease or a completion writes come last: PostgreSQL logs
    -- an update on the same page as the new tuple minus the prefix and
    -- suffix it shares with the old one, so the payload is not logged again.
    attempt_id bigint,
    attempt_started_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    finished_at timestamp with time zone,
    status {schema}.job_status NOT NULL,
    stage {schema}.job_status GENERATED ALWAYS AS (
CASE
    WHEN (status = 'running'::{schema}.job_status) THEN 'queued'::{schema}.job_status
    ELSE status
END) STORED,
    attempts integer DEFAULT 0 NOT NULL,
    counted boolean DEFAULT false NOT NULL,
    has_dependents boolean,
    has_records boolean,
    snoozes integer,
    worker_id text,
    last_error text,
    result jsonb,
    progress jsonb
) PARTITION BY LIST (status);
ALTER SEQUENCE {schema}.jobs_id_seq OWNED BY {schema}.jobs.id;

COMMENT ON TABLE {schema}.jobs IS
    'Every job, live or finished, until retention deletes it; partitioned by status (jobs_live, then jobs_succeeded/_dead/_cancelled by finish time). Write live jobs through the SQL functions.';
COMMENT ON COLUMN {schema}.jobs.priority IS 'Higher runs first.';
COMMENT ON COLUMN {schema}.jobs.run_at IS 'Not leased before this time (the queue order is priority desc, run_at, id).';
COMMENT ON COLUMN {schema}.jobs.max_attempts IS 'Attempts that ran before the job is dead; 0: unlimited.';
COMMENT ON COLUMN {schema}.jobs.lease_seconds IS 'The lease a worker takes on the job (heartbeats extend it).';
COMMENT ON COLUMN {schema}.jobs.backoff_base IS 'Retry backoff [base, factor, max, jitter] of the job''s task, when it has its own.';
COMMENT ON COLUMN {schema}.jobs.cancel_requested IS 'cancel() of a running job: its worker is asked to stop; the attempt ends cancelled.';
COMMENT ON COLUMN {schema}.jobs.notify_finish IS 'Someone waits for the job (result()): its end is announced (''f:<id>:<status>:<queue>'').';
COMMENT ON COLUMN {schema}.jobs.serial_held IS 'An earlier live job of the same serial_key exists: not leasable until it ends.';
COMMENT ON COLUMN {schema}.jobs.dedup_key IS 'At most one live job per (queue, dedup_key); with a window, one per window.';
COMMENT ON COLUMN {schema}.jobs.serial_key IS 'Jobs sharing it run one at a time, in id order.';
COMMENT ON COLUMN {schema}.jobs.trace_context IS 'The W3C trace context of the enqueue (OpenTelemetry), for the worker''s span.';
COMMENT ON COLUMN {schema}.jobs.group_key IS 'The tenant, customer, API key or domain the job belongs to (enqueue option group_key; NULL: none).';
COMMENT ON COLUMN {schema}.jobs.attempt_id IS 'The current (or last) attempt''s id: the fencing token every ack, fail, nack and extend presents.';
COMMENT ON COLUMN {schema}.jobs.stage IS
    'status with running folded into queued. Indexes of live jobs use stage, never status: a lease (queued -> running) leaves stage alone and stays a HOT update, writing no index entry.';
COMMENT ON COLUMN {schema}.jobs.attempts IS 'Attempts that ran (a nack or a snooze gives its attempt back).';
COMMENT ON COLUMN {schema}.jobs.counted IS
    'Set by the lease only in queues or tasks with a concurrency limit, so that a limit counts running jobs by an index probe while other leases stay HOT.';
COMMENT ON COLUMN {schema}.jobs.has_dependents IS 'Other jobs wait for this one (job_dependencies.depends_on).';
COMMENT ON COLUMN {schema}.jobs.has_records IS
    'Rows of job_attempts, job_waits or job_dependencies belong to the job: retention deletes them with it.';
COMMENT ON COLUMN {schema}.jobs.snoozes IS 'How often the task raised Snooze (NULL: never).';
COMMENT ON COLUMN {schema}.jobs.progress IS 'The last context.set_progress() value.';

-- The CHECKs hold on live jobs, where every job is written first: a
-- finished row is a moved live one, and checking it again would cost each
-- completion their evaluation.
CREATE TABLE {schema}.jobs_live PARTITION OF {schema}.jobs (
    CONSTRAINT jobs_pkey PRIMARY KEY (id),
    CONSTRAINT jobs_backoff_range CHECK (((LEAST(backoff_base, backoff_factor, backoff_max, backoff_jitter) >= (0)::double precision) AND (GREATEST((backoff_base)::double precision, (backoff_max)::double precision, (backoff_factor * (31536)::double precision), (backoff_jitter * (31536000)::double precision)) <= (31536000)::double precision))),
    CONSTRAINT jobs_lease_seconds_positive CHECK ((lease_seconds >= 1)),
    CONSTRAINT jobs_max_attempts_not_negative CHECK ((max_attempts >= 0)),
    CONSTRAINT jobs_run_at_range CHECK ((run_at <@ '["1970-01-01 00:00:00+00","2500-01-01 00:00:00+00")'::tstzrange))
) FOR VALUES IN ('queued', 'scheduled', 'running', 'waiting')
WITH (fillfactor='35', autovacuum_vacuum_scale_factor='0.02', autovacuum_vacuum_insert_scale_factor='0.05', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_delay='1');
COMMENT ON TABLE {schema}.jobs_live IS
    'Live jobs. fillfactor 35 leaves room on each page for the lease''s HOT update; a finished job''s row leaves for its status''s partition.';

-- Every enqueue inserts through this view: id, payload, then the fields of
-- job_values in their order (built from the type, so that the column list
-- is written once, there), then stage (read by ON CONFLICT's index
-- predicate; never written). An insert gives id, payload and a job_values
-- expanded, `SELECT nextval(...), payload, (v).*`, and the columns the view
-- leaves out take their defaults. A plain view: PostgreSQL rewrites the
-- insert into one on jobs_live when it plans the statement.
DO $do$
BEGIN
    EXECUTE format('CREATE VIEW {schema}.jobs_new AS SELECT id, payload, %s, stage FROM {schema}.jobs_live',
        (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
         FROM pg_catalog.pg_type t JOIN pg_catalog.pg_attribute a ON a.attrelid = t.typrelid
         WHERE t.oid = pg_catalog.pg_typeof(NULL::{schema}.job_values)::oid
           AND a.attnum > 0 AND NOT a.attisdropped));
END
$do$;
COMMENT ON VIEW {schema}.jobs_new IS
    'The insert path of every enqueue: id, payload, the fields of job_values, stage. Owner only: written through the enqueue functions.';

-- The finished partitions. Each has time-range leaves named
-- jobs_<status>_<start, UTC, yyyymmddThhmmss>, created ahead and dropped once
-- retention passed their end (pgqueue.retention, retention_plan below),
-- and a default leaf that catches a finish time no leaf covers yet.
CREATE TABLE {schema}.jobs_succeeded PARTITION OF {schema}.jobs
    FOR VALUES IN ('succeeded') PARTITION BY RANGE (finished_at);
CREATE TABLE {schema}.jobs_succeeded_default PARTITION OF {schema}.jobs_succeeded DEFAULT
    WITH (autovacuum_vacuum_insert_threshold='-1');
CREATE TABLE {schema}.jobs_dead PARTITION OF {schema}.jobs
    FOR VALUES IN ('dead') PARTITION BY RANGE (finished_at);
CREATE TABLE {schema}.jobs_dead_default PARTITION OF {schema}.jobs_dead DEFAULT
    WITH (autovacuum_vacuum_insert_threshold='-1');
CREATE TABLE {schema}.jobs_cancelled PARTITION OF {schema}.jobs
    FOR VALUES IN ('cancelled') PARTITION BY RANGE (finished_at);
CREATE TABLE {schema}.jobs_cancelled_default PARTITION OF {schema}.jobs_cancelled DEFAULT
    WITH (autovacuum_vacuum_insert_threshold='-1');
COMMENT ON TABLE {schema}.jobs_succeeded IS 'Succeeded jobs, by finish time, until retention drops their leaf.';
COMMENT ON TABLE {schema}.jobs_dead IS 'Dead jobs, by finish time, until retention drops their leaf.';
COMMENT ON TABLE {schema}.jobs_cancelled IS 'Cancelled jobs, by finish time, until retention drops their leaf.';

CREATE TABLE {schema}.job_attempts (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    outcome {schema}.attempt_outcome NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    worker_id text,
    error_code text,
    error_message text,
    traceback text,
    CONSTRAINT job_attempts_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE {schema}.job_attempts IS
    'Attempts that did not end the job successfully (a success is the job row itself); the job carries has_records.';
COMMENT ON COLUMN {schema}.job_attempts.id IS 'The attempt id (jobs.attempt_id while it ran).';

CREATE SEQUENCE {schema}.attempt_id_seq;

-- The archive: finished jobs `pgqueue archive` moved out of jobs, kept until
-- `pgqueue prune` (or retention) deletes them. Optional: retention alone
-- needs no archive.
CREATE TABLE {schema}.jobs_archive (
    id bigint NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    status {schema}.job_status NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 5 NOT NULL,
    lease_seconds integer DEFAULT 60 NOT NULL,
    run_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    attempt_id bigint,
    attempt_started_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    finished_at timestamp with time zone,
    cancel_requested boolean DEFAULT false NOT NULL,
    notify_finish boolean DEFAULT false NOT NULL,
    backoff_base real,
    backoff_factor real,
    backoff_max real,
    backoff_jitter real,
    queue text NOT NULL,
    task text NOT NULL,
    payload jsonb NOT NULL,
    worker_id text,
    dedup_key text,
    serial_key text,
    last_error text,
    result jsonb,
    archived_at timestamp with time zone DEFAULT now() NOT NULL,
    tags text[],
    meta jsonb,
    snoozes integer,
    progress jsonb,
    group_key text,
    CONSTRAINT jobs_archive_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE {schema}.jobs_archive IS
    'Finished jobs `pgqueue archive` moved here (optional); `pgqueue migrate --partitioned-archive` partitions it by finished_at.';

CREATE TABLE {schema}.archive_partitioning (
    only_row boolean DEFAULT true NOT NULL,
    period text NOT NULL,
    legacy_upper timestamp with time zone,
    converted_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT archive_partitioning_pkey PRIMARY KEY (only_row),
    CONSTRAINT archive_partitioning_legacy_upper_check CHECK (isfinite(legacy_upper)),
    CONSTRAINT archive_partitioning_only_row_check CHECK (only_row),
    CONSTRAINT archive_partitioning_period_check CHECK ((period = ANY (ARRAY['day'::text, 'week'::text, 'month'::text])))
);
COMMENT ON TABLE {schema}.archive_partitioning IS
    'Set once jobs_archive is partitioned: the period of its partitions and the upper bound of the partition holding the rows archived before.';

-- Retention and the maintenance that applies it.
CREATE TABLE {schema}.retention (
    only_row boolean DEFAULT true NOT NULL,
    succeeded interval DEFAULT '1 day'::interval NOT NULL,
    cancelled interval DEFAULT '7 days'::interval NOT NULL,
    dead interval DEFAULT '30 days'::interval NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT retention_pkey PRIMARY KEY (only_row),
    CONSTRAINT retention_only_row_check CHECK (only_row),
    CONSTRAINT retention_range CHECK (
        succeeded BETWEEN '0'::interval AND '100 years'::interval
        AND cancelled BETWEEN '0'::interval AND '100 years'::interval
        AND dead BETWEEN '0'::interval AND '100 years'::interval)
);
COMMENT ON TABLE {schema}.retention IS
    'How long finished jobs are kept, by status (0: deleted when they end); workers apply it (maintenance).';

CREATE TABLE {schema}.maintenance (
    only_row boolean DEFAULT true NOT NULL,
    holder text,
    held_until timestamp with time zone,
    last_run_at timestamp with time zone,
    last_run_by text,
    last_error text,
    CONSTRAINT maintenance_pkey PRIMARY KEY (only_row),
    CONSTRAINT maintenance_only_row_check CHECK (only_row)
);
COMMENT ON TABLE {schema}.maintenance IS
    'The election of the one worker that applies retention: holder keeps the turn while it renews held_until; any worker takes a lapsed turn.';
COMMENT ON COLUMN {schema}.maintenance.last_run_at IS 'The last finished pass (doctor warns when it is old).';

-- Queues, tasks and their limits.
CREATE TABLE {schema}.queues (
    name text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    concurrency_limit integer,
    rate_limit integer,
    rate_period interval,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT queues_pkey PRIMARY KEY (name),
    CONSTRAINT queues_check CHECK (((rate_limit IS NULL) = (rate_period IS NULL))),
    CONSTRAINT queues_concurrency_limit_check CHECK ((concurrency_limit > 0)),
    CONSTRAINT queues_rate_limit_check CHECK ((rate_limit > 0)),
    CONSTRAINT queues_rate_period_check CHECK ((rate_period > '00:00:00'::interval))
);
COMMENT ON TABLE {schema}.queues IS 'Every queue that got a job or a setting: paused, and its limits (enforced by the lease).';
COMMENT ON COLUMN {schema}.queues.rate_limit IS 'At most rate_limit leases per rate_period (queue_lease_log).';

CREATE TABLE {schema}.queue_lease_log (
    queue text NOT NULL,
    leased_at timestamp with time zone NOT NULL
);
COMMENT ON TABLE {schema}.queue_lease_log IS 'Leases of rate-limited queues within their period (the lease trims it).';

CREATE TABLE {schema}.tasks (
    name text NOT NULL,
    queue text NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 5 NOT NULL,
    lease_seconds integer DEFAULT 60 NOT NULL,
    timeout_seconds double precision,
    backoff real[],
    published_by text,
    first_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT tasks_pkey PRIMARY KEY (name),
    CONSTRAINT tasks_backoff_check CHECK ((cardinality(backoff) = 4)),
    CONSTRAINT tasks_lease_seconds_check CHECK ((lease_seconds > 0)),
    CONSTRAINT tasks_max_attempts_check CHECK ((max_attempts >= 0)),
    CONSTRAINT tasks_timeout_seconds_check CHECK ((timeout_seconds > (0)::double precision))
);
COMMENT ON TABLE {schema}.tasks IS
    'Task definitions workers publish at start-up: the defaults an enqueue by name applies.';

CREATE TABLE {schema}.task_settings (
    name text NOT NULL,
    max_attempts integer,
    lease_seconds integer,
    timeout_seconds double precision,
    priority smallint,
    backoff real[],
    concurrency_limit integer,
    rate_limit integer,
    rate_period interval,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT task_settings_pkey PRIMARY KEY (name),
    CONSTRAINT task_settings_backoff_check CHECK ((cardinality(backoff) = 4)),
    CONSTRAINT task_settings_check CHECK (((rate_limit IS NULL) = (rate_period IS NULL))),
    CONSTRAINT task_settings_concurrency_limit_check CHECK ((concurrency_limit > 0)),
    CONSTRAINT task_settings_lease_seconds_check CHECK ((lease_seconds > 0)),
    CONSTRAINT task_settings_max_attempts_check CHECK ((max_attempts >= 0)),
    CONSTRAINT task_settings_rate_limit_check CHECK ((rate_limit > 0)),
    CONSTRAINT task_settings_rate_period_check CHECK ((rate_period > '00:00:00'::interval)),
    CONSTRAINT task_settings_timeout_seconds_check CHECK ((timeout_seconds > (0)::double precision))
);
COMMENT ON TABLE {schema}.task_settings IS
    'Operators'' live settings of a task (pgqueue task set/limit): they win over the code''s defaults from the next lease on.';

CREATE TABLE {schema}.task_lease_log (
    task text NOT NULL,
    leased_at timestamp with time zone NOT NULL
);
COMMENT ON TABLE {schema}.task_lease_log IS 'Leases of rate-limited tasks within their period.';

CREATE TABLE {schema}.limits (
    singleton boolean DEFAULT true NOT NULL,
    max_payload_bytes integer DEFAULT 1048576 NOT NULL,
    max_queues integer,
    max_queued_per_queue integer,
    CONSTRAINT limits_pkey PRIMARY KEY (singleton),
    CONSTRAINT limits_max_payload_bytes_check CHECK ((max_payload_bytes > 0)),
    CONSTRAINT limits_max_queued_per_queue_check CHECK ((max_queued_per_queue > 0)),
    CONSTRAINT limits_max_queues_check CHECK ((max_queues > 0)),
    CONSTRAINT limits_singleton_check CHECK (singleton)
);
COMMENT ON TABLE {schema}.limits IS 'Installation-wide quotas checked at enqueue.';

-- Workers, schedules, workflows, roles.
CREATE TABLE {schema}.workers (
    id text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    queues text[],
    concurrency integer NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    last_heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    tasks text[],
    lost_at timestamp with time zone,
    version text,
    token_hash bytea,
    pool text,
    CONSTRAINT workers_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE {schema}.workers IS 'Running workers and their heartbeats (register_worker, heartbeat_worker).';
COMMENT ON COLUMN {schema}.workers.token_hash IS 'SHA-256 of the worker''s secret: only its holder may update or remove the row.';
COMMENT ON COLUMN {schema}.workers.pool IS 'Where the worker runs sync tasks: thread or process (--pool); NULL: not reported (a worker of the SQL or HTTP API).';
COMMENT ON COLUMN {schema}.workers.lost_at IS 'When the reaper declared the worker lost (silent for too long).';

CREATE TABLE {schema}.schedules (
    name text NOT NULL,
    cron text NOT NULL,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    task text NOT NULL,
    queue text,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    priority smallint,
    max_attempts integer,
    enabled boolean DEFAULT true NOT NULL,
    next_fire_at timestamp with time zone,
    last_fire_at timestamp with time zone,
    last_job_id bigint,
    revision bigint DEFAULT 1 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schedules_pkey PRIMARY KEY (name),
    CONSTRAINT schedules_check CHECK (((NOT enabled) OR (next_fire_at IS NOT NULL))),
    CONSTRAINT schedules_fire_at_range CHECK ((COALESCE(((next_fire_at >= '1970-01-01 00:00:00+00'::timestamp with time zone) AND (next_fire_at < '2500-01-01 00:00:00+00'::timestamp with time zone)), true) AND COALESCE(((last_fire_at >= '1970-01-01 00:00:00+00'::timestamp with time zone) AND (last_fire_at < '2500-01-01 00:00:00+00'::timestamp with time zone)), true))),
    CONSTRAINT schedules_max_attempts_check CHECK ((max_attempts >= 0)),
    CONSTRAINT schedules_payload_check CHECK ((jsonb_typeof(payload) = 'object'::text))
);
COMMENT ON TABLE {schema}.schedules IS
    'Cron schedules; a fire time is claimed by comparing next_fire_at and revision, so each enqueues one job however many schedulers run.';
COMMENT ON COLUMN {schema}.schedules.revision IS 'Bumped by every change: a scheduler holding an older copy cannot fire it.';

CREATE TABLE {schema}.periodic_schedules (
    name text NOT NULL,
    CONSTRAINT periodic_schedules_pkey PRIMARY KEY (name),
    CONSTRAINT periodic_schedules_name_fkey FOREIGN KEY (name) REFERENCES {schema}.schedules(name) ON UPDATE CASCADE ON DELETE CASCADE
);
COMMENT ON TABLE {schema}.periodic_schedules IS 'Schedules declared in code (@app.periodic), which workers may overwrite.';

CREATE TABLE {schema}.workflows (
    id bigint NOT NULL,
    name text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT workflows_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE {schema}.workflows IS 'A workflow''s name; its id is its first step''s job id.';

CREATE TABLE {schema}.job_dependencies (
    depends_on bigint NOT NULL,
    job_id bigint NOT NULL,
    CONSTRAINT job_dependencies_pkey PRIMARY KEY (depends_on, job_id)
);
COMMENT ON TABLE {schema}.job_dependencies IS 'job_id waits for depends_on to end.';

CREATE TABLE {schema}.job_waits (
    job_id bigint NOT NULL,
    workflow_id bigint,
    step text,
    allow_failed boolean DEFAULT false NOT NULL,
    pending integer DEFAULT 0 NOT NULL,
    blocker bigint,
    CONSTRAINT job_waits_pkey PRIMARY KEY (job_id)
);
COMMENT ON TABLE {schema}.job_waits IS 'A workflow step, or a job with dependencies: what it still waits for.';
COMMENT ON COLUMN {schema}.job_waits.pending IS 'Dependencies that have not ended yet (the job is released at 0).';
COMMENT ON COLUMN {schema}.job_waits.blocker IS 'A dependency that ended dead or cancelled (the job is cancelled unless allow_failed).';

-- Durable tasks (context.step, context.sleep, context.wait_for_event): what
-- each job's earlier runs stored, so that a run again from the task's top
-- skips it. Rows belong to their job (has_records): retention deletes them
-- with it. Nothing here is read or written for a job that uses none of it.
CREATE TABLE {schema}.job_steps (
    job_id bigint NOT NULL,
    name text NOT NULL,
    kind text NOT NULL,
    status text NOT NULL,
    result jsonb,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    wake_at timestamp with time zone,
    event_key text,
    attempt_id bigint,
    CONSTRAINT job_steps_pkey PRIMARY KEY (job_id, name),
    CONSTRAINT job_steps_kind_check CHECK ((kind = ANY (ARRAY['step'::text, 'sleep'::text, 'event'::text]))),
    CONSTRAINT job_steps_status_check CHECK ((status = ANY (ARRAY['succeeded'::text, 'sleeping'::text, 'waiting'::text, 'received'::text, 'timed_out'::text])))
);
COMMENT ON TABLE {schema}.job_steps IS
    'Durable tasks: the stored steps, sleeps and event waits of a job, by name; the job carries has_records.';
COMMENT ON COLUMN {schema}.job_steps.status IS
    'step: succeeded (result stored); sleep: sleeping (until wake_at); event: waiting (for event_key, until wake_at if set), received (result: the payload) or timed_out.';
COMMENT ON COLUMN {schema}.job_steps.attempt_id IS 'The attempt that stored the row.';

CREATE TABLE {schema}.events (
    key text NOT NULL,
    payload jsonb,
    sent_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT events_pkey PRIMARY KEY (key)
);
COMMENT ON TABLE {schema}.events IS
    'Events sent with send_event(key, payload) for jobs that wait for them; kept as long as cancelled jobs (retention).';

CREATE TABLE {schema}.role_grants (
    role text NOT NULL,
    kind text NOT NULL,
    granted_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT role_grants_pkey PRIMARY KEY (role),
    CONSTRAINT role_grants_kind_check CHECK ((kind = ANY (ARRAY['producer'::text, 'worker'::text, 'admin'::text])))
);
COMMENT ON TABLE {schema}.role_grants IS '`pgqueue grant`s, re-applied by `pgqueue migrate` after a revision.';

-- =====================================================================================
-- Indexes
-- =====================================================================================

-- Live jobs. None mentions a column the lease writes (status, attempts,
-- attempt_id, lease_expires_at, worker_id), so the lease is a HOT update.
CREATE INDEX jobs_ready_idx ON {schema}.jobs_live USING btree (queue, serial_held, priority DESC, run_at, id)
    WITH (deduplicate_items=off) WHERE (stage = 'queued'::{schema}.job_status);
COMMENT ON INDEX {schema}.jobs_ready_idx IS
    'The lease''s index, in lease order; queued and running jobs (a lease scans from its cursor). Its keys end with the id, hence no deduplication.';
CREATE INDEX jobs_scheduled_idx ON {schema}.jobs_live USING btree (run_at) WHERE (stage = 'scheduled'::{schema}.job_status);
CREATE INDEX jobs_waiting_idx ON {schema}.jobs_live USING btree (queue) WHERE (stage = 'waiting'::{schema}.job_status);
CREATE UNIQUE INDEX jobs_dedup_key_idx ON {schema}.jobs_live USING btree (queue, dedup_key)
    WHERE ((dedup_key IS NOT NULL) AND (stage = ANY (ARRAY['queued'::{schema}.job_status, 'scheduled'::{schema}.job_status])));
COMMENT ON INDEX {schema}.jobs_dedup_key_idx IS 'Prevents a second live job with the same (queue, dedup_key).';
CREATE INDEX jobs_dedup_created_idx ON {schema}.jobs_live USING btree (queue, dedup_key, created_at) WHERE (dedup_key IS NOT NULL);
CREATE INDEX jobs_serial_key_idx ON {schema}.jobs_live USING btree (serial_key, id)
    WHERE ((serial_key IS NOT NULL) AND (stage = ANY (ARRAY['queued'::{schema}.job_status, 'scheduled'::{schema}.job_status])));
CREATE INDEX jobs_serial_held_idx ON {schema}.jobs_live USING btree (id) WHERE (serial_held AND (stage = 'queued'::{schema}.job_status));
CREATE INDEX jobs_counted_queue_idx ON {schema}.jobs_live USING btree (queue) WHERE (counted AND (stage = 'queued'::{schema}.job_status));
CREATE INDEX jobs_counted_task_idx ON {schema}.jobs_live USING btree (task) WHERE (counted AND (stage = 'queued'::{schema}.job_status));
CREATE INDEX jobs_live_tags_idx ON {schema}.jobs_live USING gin (tags) WHERE (tags IS NOT NULL);

-- Finished jobs: by id (get_job, result, dependencies), by finish time
-- (bounded reads of the newest: dashboard, metrics, task statistics), and
-- partial indexes for the few that need more. (No INCLUDE columns: a leaf
-- is never vacuumed for its inserts, so an index-only scan would read the
-- heap anyway.)
CREATE INDEX jobs_succeeded_id_idx ON {schema}.jobs_succeeded USING btree (id);
CREATE INDEX jobs_succeeded_finished_idx ON {schema}.jobs_succeeded USING btree (finished_at);
CREATE INDEX jobs_succeeded_dedup_created_idx ON {schema}.jobs_succeeded USING btree (queue, dedup_key, created_at) WHERE (dedup_key IS NOT NULL);
CREATE INDEX jobs_succeeded_tags_idx ON {schema}.jobs_succeeded USING gin (tags) WHERE (tags IS NOT NULL);
CREATE INDEX jobs_succeeded_records_idx ON {schema}.jobs_succeeded USING btree (id) WHERE has_records;
CREATE INDEX jobs_dead_id_idx ON {schema}.jobs_dead USING btree (id);
CREATE INDEX jobs_dead_finished_idx ON {schema}.jobs_dead USING btree (finished_at);
CREATE INDEX jobs_dead_dedup_created_idx ON {schema}.jobs_dead USING btree (queue, dedup_key, created_at) WHERE (dedup_key IS NOT NULL);
CREATE INDEX jobs_dead_tags_idx ON {schema}.jobs_dead USING gin (tags) WHERE (tags IS NOT NULL);
CREATE INDEX jobs_dead_records_idx ON {schema}.jobs_dead USING btree (id) WHERE has_records;
CREATE INDEX jobs_cancelled_id_idx ON {schema}.jobs_cancelled USING btree (id);
CREATE INDEX jobs_cancelled_finished_idx ON {schema}.jobs_cancelled USING btree (finished_at);
CREATE INDEX jobs_cancelled_dedup_created_idx ON {schema}.jobs_cancelled USING btree (queue, dedup_key, created_at) WHERE (dedup_key IS NOT NULL);
CREATE INDEX jobs_cancelled_tags_idx ON {schema}.jobs_cancelled USING gin (tags) WHERE (tags IS NOT NULL);
CREATE INDEX jobs_cancelled_records_idx ON {schema}.jobs_cancelled USING btree (id) WHERE has_records;

CREATE INDEX job_attempts_job_id_idx ON {schema}.job_attempts USING btree (job_id);
CREATE INDEX job_attempts_finished_idx ON {schema}.job_attempts USING btree (finished_at);
CREATE INDEX jobs_archive_finished_idx ON {schema}.jobs_archive USING btree (finished_at);
CREATE INDEX jobs_archive_dedup_created_idx ON {schema}.jobs_archive USING btree (queue, dedup_key, created_at) WHERE (dedup_key IS NOT NULL);
CREATE INDEX job_dependencies_job_idx ON {schema}.job_dependencies USING btree (job_id);
CREATE UNIQUE INDEX job_waits_step_idx ON {schema}.job_waits USING btree (workflow_id, step) WHERE (workflow_id IS NOT NULL);
COMMENT ON INDEX {schema}.job_waits_step_idx IS 'Prevents two steps of one workflow with the same name.';
CREATE INDEX job_steps_event_idx ON {schema}.job_steps USING btree (event_key) WHERE (status = 'waiting'::text);
COMMENT ON INDEX {schema}.job_steps_event_idx IS 'The jobs waiting for an event, by key (send_event).';
CREATE INDEX job_steps_deadline_idx ON {schema}.job_steps USING btree (wake_at) WHERE ((status = 'waiting'::text) AND (wake_at IS NOT NULL));
COMMENT ON INDEX {schema}.job_steps_deadline_idx IS 'Event waits with a timeout, by deadline (the reaper ends those past it).';
CREATE INDEX job_steps_sleeping_idx ON {schema}.job_steps USING btree (wake_at) WHERE (status = 'sleeping'::text);
COMMENT ON INDEX {schema}.job_steps_sleeping_idx IS 'Sleeps by wake-up time (metrics count the jobs asleep now).';
CREATE INDEX events_sent_idx ON {schema}.events USING btree (sent_at);
CREATE INDEX workflows_created_idx ON {schema}.workflows USING btree (created_at);
CREATE INDEX queue_lease_log_idx ON {schema}.queue_lease_log USING btree (queue, leased_at);
CREATE INDEX task_lease_log_idx ON {schema}.task_lease_log USING btree (task, leased_at);
CREATE INDEX schedules_next_fire_idx ON {schema}.schedules USING btree (next_fire_at) WHERE enabled;

-- =====================================================================================
-- Functions: helpers shared by every stage
-- =====================================================================================

CREATE FUNCTION {schema}.trusted_clock(p_now timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN p_now IS NULL THEN NULL
                WHEN (SELECT pg_has_role(session_user, c.relowner, 'USAGE')
                      FROM pg_class c WHERE c.oid = '{schema}.jobs'::regclass)
                THEN p_now END
$$;

CREATE FUNCTION {schema}.visible_status(p_status {schema}.job_status, p_run_at timestamp with time zone) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE WHEN p_status IN ('queued', 'scheduled')
                THEN CASE WHEN p_run_at > now() THEN 'scheduled' ELSE 'queued' END
                ELSE p_status::text END
$$;

CREATE FUNCTION {schema}.retry_delay(p_attempt integer, p_base real, p_factor real, p_max real, p_jitter real) RETURNS interval
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT make_interval(secs => least(31536000.0, greatest(0.0, least(b.max, CASE
            WHEN b.base <= 0 THEN 0.0
            WHEN b.factor <= 1 THEN b.base
            ELSE b.base * power(b.factor, least(greatest(p_attempt - 1, 0),
                                ln(greatest(b.max, b.base) / b.base) / ln(b.factor) + 1))
        END) * (1.0 + b.jitter * (2.0 * random() - 1.0)))))
    FROM (SELECT CASE WHEN p_base BETWEEN 0 AND 31536000 THEN p_base ELSE 1.0 END::float8 AS base,
                 CASE WHEN p_factor BETWEEN 0 AND 1000 THEN p_factor ELSE 2.0 END::float8 AS factor,
                 CASE WHEN p_max BETWEEN 0 AND 31536000 THEN p_max ELSE 3600.0 END::float8 AS max,
                 CASE WHEN p_jitter BETWEEN 0 AND 1 THEN p_jitter ELSE 0.1 END::float8 AS jitter) b
$$;

CREATE FUNCTION {schema}.finished_payload(p_id bigint, p_status {schema}.job_status, p_queue text) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    -- The one NOTIFY payload of a finished job, 'f:<id>:<status>:<queue>'
    -- (pgqueue/events.py parses it): every statement that ends a job someone
    -- waits on (notify_finish) sends it through here.
    SELECT 'f:' || p_id || ':' || p_status::text || ':' || p_queue
$$;

CREATE FUNCTION {schema}.notify_enqueued(p_queue text, p_count bigint, p_ready bigint, p_job_id bigint) RETURNS void
    LANGUAGE sql
    AS $$
    SELECT pg_catalog.pg_notify({channel}, CASE
        WHEN p_ready = 0 THEN 'w:' || p_queue
        WHEN p_count = 1
             -- Not yet named in this transaction: name it, and remember.
             -- set_config(..., true) lasts until the end of the transaction
             -- (or of a rolled-back savepoint, with the notifications it sent).
             AND pg_catalog.strpos(
                     coalesce(pg_catalog.current_setting('pgqueue.enqueued', true), ''),
                     '|' || {channel} || '/' || p_queue || '|') = 0
             AND pg_catalog.set_config('pgqueue.enqueued',
                     coalesce(pg_catalog.current_setting('pgqueue.enqueued', true), '')
                     || '|' || {channel} || '/' || p_queue || '|', true) IS NOT NULL
        THEN 'j:' || p_queue || '#' || p_job_id
        -- Ready jobs, maybe scheduled ones too: workers wake and recompute
        -- their next due time anyway; subscribers' listeners do as well.
        ELSE 'j:' || p_queue END)
$$;

CREATE FUNCTION {schema}.announce_ready(p_queue text, p_priority integer, p_run_at timestamp with time zone, p_id bigint) RETURNS void
    LANGUAGE sql
    AS $$
    -- Where a job became ready, for the workers' lease cursors (lease_jobs'
    -- p_after): 'queue priority run_at id' (run_at in microseconds since the
    -- epoch) on the schema's second channel, {channel} || ':k'. A worker
    -- whose cursor for that queue is past the key moves it back. Sent once
    -- per queue and transaction, and again only for a key earlier in lease
    -- order than the one sent: an enqueue loop in one transaction sends one.
    SELECT pg_catalog.pg_notify({channel} || ':k',
               p_queue || ' ' || p_priority || ' ' || k.us || ' ' || p_id)
    FROM (SELECT (extract(epoch FROM p_run_at) * 1000000)::bigint AS us,
                 'pgqueue.ready_' || pg_catalog.md5({channel} || '/' || p_queue) AS name) k
    CROSS JOIN LATERAL (SELECT pg_catalog.current_setting(k.name, true) AS sent) s
    WHERE CASE WHEN s.sent IS NULL OR s.sent = ''
                    OR (-p_priority, k.us, p_id)
                       < (-pg_catalog.split_part(s.sent, ' ', 1)::integer,
                          pg_catalog.split_part(s.sent, ' ', 2)::bigint,
                          pg_catalog.split_part(s.sent, ' ', 3)::bigint)
               THEN pg_catalog.set_config(k.name, p_priority || ' ' || k.us || ' ' || p_id, true)
                    IS NOT NULL
               ELSE false END
$$;

-- =====================================================================================
-- Functions: enqueue (validate, resolve defaults, insert, announce)
-- =====================================================================================

CREATE FUNCTION {schema}.check_job(p_ord bigint, p_task text, p_payload jsonb, p_queue text, p_priority integer, p_run_at timestamp with time zone, p_delay double precision, p_max_attempts integer, p_lease_seconds integer, p_dedup_key text, p_serial_key text, p_backoff real[], p_max_payload_bytes integer, p_tags text[] DEFAULT NULL::text[], p_meta jsonb DEFAULT NULL::jsonb, p_group_key text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    v_job  text := CASE WHEN p_ord IS NULL THEN '' ELSE format(' (job #%s of the batch)', p_ord) END;
    v_size integer;
BEGIN
    IF p_task IS NULL OR btrim(p_task) = '' OR length(p_task) > 255 OR p_task ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION '%', format('pgqueue: invalid task name %s%s', quote_literal(regexp_replace(left(coalesce(p_task, 'NULL'), 80), '[[:cntrl:]]', '?', 'g')), v_job)
            USING ERRCODE = '22023',
                  HINT = 'task names are 1 to 255 characters without control characters';
    END IF;
    IF p_queue IS NULL OR length(p_queue) NOT BETWEEN 1 AND 128 OR p_queue ~ '[^A-Za-z0-9_.:-]' THEN
        RAISE EXCEPTION '%', format('pgqueue: invalid queue name %s%s', quote_literal(regexp_replace(left(coalesce(p_queue, 'NULL'), 140), '[[:cntrl:]]', '?', 'g')), v_job)
            USING ERRCODE = '22023',
                  HINT = 'queue names are 1 to 128 characters from A-Z a-z 0-9 _ . : -';
    END IF;
    IF p_payload IS NULL OR jsonb_typeof(p_payload) <> 'object' THEN
        RAISE EXCEPTION 'pgqueue: payload must be a JSON object%', v_job USING ERRCODE = '22023';
    END IF;
    -- The text form is at most ~6 times the binary size: measure it only
    -- when it can be over the limit.
    IF pg_column_size(p_payload) > p_max_payload_bytes / 8 THEN
        v_size := octet_length(p_payload::text);
        IF v_size > p_max_payload_bytes THEN
            RAISE EXCEPTION 'pgqueue: payload is % bytes of JSON, over the %-byte limit%',
                v_size, p_max_payload_bytes, v_job USING ERRCODE = '22023';
        END IF;
    END IF;
    -- Each level of nesting takes at least 4 bytes of jsonb: smaller
    -- payloads cannot be 256 deep.
    IF pg_column_size(p_payload) > 1000 AND jsonb_path_exists(p_payload,
            'strict $.**{256} ? (@.type() == "object" || @.type() == "array")') THEN
        RAISE EXCEPTION 'pgqueue: payload is nested deeper than 256 arrays/objects%', v_job
            USING ERRCODE = '22023';
    END IF;
    IF p_dedup_key = '' OR p_serial_key = '' THEN
        RAISE EXCEPTION 'pgqueue: dedup_key and serial_key must be NULL or non-empty%', v_job
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_dedup_key) > 1024 OR octet_length(p_serial_key) > 1024 THEN
        RAISE EXCEPTION 'pgqueue: dedup_key and serial_key must be at most 1024 bytes%', v_job
            USING ERRCODE = '22023';
    END IF;
    IF p_priority IS NOT NULL AND p_priority NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'pgqueue: priority must be between -32768 and 32767%', v_job
            USING ERRCODE = '22023';
    END IF;
    IF p_delay IS NOT NULL AND NOT (p_delay BETWEEN 0 AND 3153600000) THEN
        RAISE EXCEPTION '%', format('pgqueue: delay must be between 0 and 3153600000 seconds (100 years), got %s%s', p_delay, v_job)
            USING ERRCODE = '22023';
    END IF;
    IF p_run_at IS NULL OR NOT (p_run_at >= '1970-01-01 00:00:00+00' AND p_run_at < '2500-01-01 00:00:00+00') THEN
        RAISE EXCEPTION '%', format('pgqueue: run_at must be a finite time from 1970 to 2499, got %s%s', coalesce(p_run_at::text, 'NULL'), v_job)
            USING ERRCODE = '22023';
    END IF;
    -- 0: unlimited attempts.
    IF p_max_attempts IS NOT NULL AND p_max_attempts < 0 THEN
        RAISE EXCEPTION '%', format('pgqueue: max_attempts must be at least 0 (0: unlimited), got %s%s', p_max_attempts, v_job)
            USING ERRCODE = '22023';
    END IF;
    IF p_lease_seconds IS NOT NULL AND p_lease_seconds < 1 THEN
        RAISE EXCEPTION '%', format('pgqueue: lease_seconds must be at least 1, got %s%s', p_lease_seconds, v_job)
            USING ERRCODE = '22023';
    END IF;
    IF p_backoff IS NOT NULL AND (
            coalesce(array_length(p_backoff, 1), 0) > 4
            OR NOT coalesce(p_backoff[1] BETWEEN 0 AND 31536000, true)
            OR NOT coalesce(p_backoff[2] BETWEEN 1 AND 1000, true)
            OR NOT coalesce(p_backoff[3] BETWEEN 0 AND 31536000, true)
            OR NOT coalesce(p_backoff[4] BETWEEN 0 AND 1, true)) THEN
        RAISE EXCEPTION '%', format('pgqueue: backoff must be [base, factor, max, jitter] with base and max from 0 to 31536000 seconds, factor from 1 to 1000 and jitter from 0 to 1, got %s%s',
            p_backoff::text, v_job)
            USING ERRCODE = '22023';
    END IF;
    IF p_tags IS NOT NULL AND (
            coalesce(array_length(p_tags, 1), 0) > 16 OR array_ndims(p_tags) > 1
            OR EXISTS (SELECT 1 FROM unnest(p_tags) t
                       WHERE t IS NULL OR length(t) NOT BETWEEN 1 AND 64 OR t ~ '[^A-Za-z0-9_.:-]')) THEN
        RAISE EXCEPTION '%', format('pgqueue: tags must be at most 16 strings of 1 to 64 characters from A-Z a-z 0-9 _ . : -, got %s%s',
            left(p_tags::text, 200), v_job)
            USING ERRCODE = '22023';
    END IF;
    IF p_meta IS NOT NULL AND (jsonb_typeof(p_meta) <> 'object' OR octet_length(p_meta::text) > 8192) THEN
        RAISE EXCEPTION 'pgqueue: meta must be a JSON object of at most 8192 bytes%', v_job
            USING ERRCODE = '22023';
    END IF;
    IF p_group_key IS NOT NULL AND (length(p_group_key) NOT BETWEEN 1 AND 200 OR p_group_key ~ '[[:cntrl:]]') THEN
        RAISE EXCEPTION '%', format('pgqueue: group_key must be 1 to 200 characters without control characters, got %s (%s characters)%s',
            quote_literal(regexp_replace(left(p_group_key, 80), '[[:cntrl:]]', '?', 'g')), length(p_group_key), v_job)
            USING ERRCODE = '22023';
    END IF;
    RETURN true;
END;
$_$;

CREATE FUNCTION {schema}.check_quotas(p_jobs jsonb) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_lim   record;
    v_queue text;
BEGIN
    SELECT l.max_queues, l.max_queued_per_queue INTO v_lim FROM {schema}.limits l;
    IF v_lim.max_queues IS NULL AND v_lim.max_queued_per_queue IS NULL THEN
        RETURN;
    END IF;
    IF jsonb_typeof(p_jobs) = 'object' THEN
        p_jobs := p_jobs -> 'jobs';
    END IF;
    IF v_lim.max_queues IS NOT NULL
       AND (SELECT count(*) FROM {schema}.queues) > v_lim.max_queues THEN
        RAISE EXCEPTION 'pgqueue: quota exceeded: at most % queues (limits.max_queues)', v_lim.max_queues
            USING ERRCODE = '22023';
    END IF;
    IF v_lim.max_queued_per_queue IS NOT NULL THEN
        FOR v_queue IN
            SELECT DISTINCT coalesce(j ->> 'queue', 'default') FROM jsonb_array_elements(p_jobs) j
        LOOP
            IF (SELECT count(*) FROM (
                    SELECT 1 FROM {schema}.jobs_live j
                    WHERE j.queue = v_queue AND j.stage IN ('queued', 'scheduled') AND j.status <> 'running'
                    LIMIT v_lim.max_queued_per_queue + 1) c) > v_lim.max_queued_per_queue THEN
                RAISE EXCEPTION 'pgqueue: quota exceeded: queue % holds more than % queued jobs (limits.max_queued_per_queue)',
                    quote_literal(v_queue), v_lim.max_queued_per_queue
                    USING ERRCODE = '22023';
            END IF;
        END LOOP;
    END IF;
END;
$$;

CREATE FUNCTION {schema}.enqueue_resolve(p_ord bigint, p_task text, p_payload jsonb, p_queue text, p_priority integer, p_default_priority integer, p_run_at timestamp with time zone, p_delay double precision, p_max_attempts integer, p_lease_seconds integer, p_dedup_key text, p_serial_key text, p_backoff real[], p_tags text[], p_meta jsonb, p_lookup boolean, p_waiting boolean, p_records boolean, p_group_key text) RETURNS SETOF {schema}.job_values
    LANGUAGE sql STABLE
    AS $$
    -- The one place an enqueue's options are decided: every enqueue path
    -- (enqueue_job for one job; enqueue_input, and so enqueue_batch,
    -- enqueue_payloads, enqueue_windowed, enqueue_graph, replay_job and
    -- fire_schedules, for job documents) takes its defaults and checks from
    -- here. An option missing (NULL) takes, in order:
    --   queue:         the task registry's (p_lookup), else 'default';
    --   priority:      the operator's setting (pgqueue task set --priority),
    --                  then the caller's task default (p_default_priority),
    --                  then the registry's (p_lookup), else 0;
    --   run_at:        now() + p_delay (the database clock, never the
    --                  client's), else now();
    --   max_attempts, lease_seconds, backoff: the registry's, else 5, 60, none.
    -- p_lookup: the caller does not know the task (it sends only what it was
    -- given; the workers' published definitions fill in the rest).
    -- p_ord numbers the job in a batch's error messages (NULL: one job).
    -- The result is the new job's row but for id and payload (job_values):
    -- the inserts expand it, so a new option is decided here and nowhere else.
    -- (A single SELECT of a STABLE SQL function: the planner inlines it into
    -- its caller's statement, so a batch pays no function call per row, and
    -- the inserts' (v).* reads the expressions, not a built row.)
    SELECT -- (Out of range, a priority is refused below; clamped here so that
           -- the cast cannot fail first, when the planner folds constants.
           -- Each column is named once: the planner copies an inlined
           -- expression, subqueries included, into every place that names it.)
           least(greatest(p.priority, -32768), 32767)::smallint,
           t.run_at,
           CASE WHEN p_waiting THEN 'waiting'
                WHEN t.run_at > now() THEN 'scheduled' ELSE 'queued' END::{schema}.job_status,
           coalesce(p_max_attempts, g.max_attempts, 5),
           coalesce(p_lease_seconds, g.lease_seconds, 60),
           b.backoff[1], b.backoff[2], b.backoff[3], b.backoff[4],
           p_records, p_task, q.queue, p_dedup_key, p_serial_key, p_tags, p_meta, p_group_key
    -- The registry's row, read once (OFFSET 0 keeps the planner from
    -- copying the look-up into each column that uses it); none unless p_lookup.
    FROM (SELECT NULL) one
    LEFT JOIN LATERAL (SELECT g.queue, g.priority, g.max_attempts, g.lease_seconds, g.backoff
                       FROM {schema}.tasks g WHERE p_lookup AND g.name = p_task OFFSET 0) g ON true
    CROSS JOIN LATERAL (SELECT coalesce(p_queue, g.queue, 'default') AS queue) q
    CROSS JOIN LATERAL (SELECT coalesce(p_priority,
                        CASE WHEN (SELECT EXISTS (SELECT 1 FROM {schema}.task_settings s
                                                  WHERE s.priority IS NOT NULL)) THEN (
                            SELECT s.priority FROM {schema}.task_settings s
                            WHERE s.name = p_task) END,
                        p_default_priority,
                        g.priority, 0) AS priority) p
    CROSS JOIN LATERAL (SELECT coalesce(p_run_at, now() + make_interval(secs => CASE
                    WHEN p_delay BETWEEN 0 AND 3153600000 THEN coalesce(p_delay, 0) ELSE 0 END))
                AS run_at) t
    CROSS JOIN LATERAL (SELECT coalesce(p_backoff, g.backoff) AS backoff) b
    -- The common case is decided by plain expressions (no function call);
    -- anything else goes to check_job, which names the problem.
    -- (No bounded repetitions like {1,255} in the patterns: PostgreSQL's
    -- regex engine makes them ~100 times slower than a length check.)
    WHERE CASE WHEN length(p_task) BETWEEN 1 AND 255 AND p_task !~ '[[:cntrl:]]'
                    AND btrim(p_task) <> ''
                    -- (A queue from the registry was checked when it was published.)
                    AND length(coalesce(p_queue, 'default')) BETWEEN 1 AND 128
                    AND coalesce(p_queue, 'default') !~ '[^A-Za-z0-9_.:-]'
                    AND jsonb_typeof(p_payload) = 'object'
                    AND pg_column_size(p_payload) * 8 <= least(8000,
                            (SELECT l.max_payload_bytes FROM {schema}.limits l))
                    AND (p_dedup_key IS NULL OR octet_length(p_dedup_key) BETWEEN 1 AND 1024)
                    AND (p_serial_key IS NULL OR octet_length(p_serial_key) BETWEEN 1 AND 1024)
                    AND (p_priority IS NULL OR p_priority BETWEEN -32768 AND 32767)
                    AND (p_default_priority IS NULL OR p_default_priority BETWEEN -32768 AND 32767)
                    AND (p_delay IS NULL OR p_delay BETWEEN 0 AND 3153600000)
                    AND t.run_at >= '1970-01-01 00:00:00+00' AND t.run_at < '2500-01-01 00:00:00+00'
                    AND (p_max_attempts IS NULL OR p_max_attempts >= 0)
                    AND (p_lease_seconds IS NULL OR p_lease_seconds >= 1)
                    AND (p_group_key IS NULL OR length(p_group_key) BETWEEN 1 AND 200
                         AND p_group_key !~ '[[:cntrl:]]')
                    AND p_backoff IS NULL AND p_tags IS NULL AND p_meta IS NULL
               THEN true
               ELSE {schema}.check_job(
        p_ord, p_task, p_payload, q.queue, coalesce(p_priority, p_default_priority),
        CASE WHEN p_delay IS NULL OR p_delay BETWEEN 0 AND 3153600000 THEN t.run_at
             ELSE now() END,
        p_delay, p_max_attempts, p_lease_seconds, p_dedup_key, p_serial_key, p_backoff,
        coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576),
        p_tags, p_meta, p_group_key) END
$$;

CREATE FUNCTION {schema}.enqueue_input(p_jobs jsonb) RETURNS TABLE(ord bigint, payload jsonb, job {schema}.job_values)
    LANGUAGE sql STABLE
    AS $$
    -- The rows of a JSON array of job objects, resolved and checked by
    -- enqueue_resolve (both inlined: one statement for the whole batch).
    -- An insert expands job, (i.job).*, into jobs_new; once inlined, its
    -- fields are enqueue_resolve's expressions (no row is built per job).
    SELECT r.ord, coalesce(r.payload, '{}'::jsonb), v
    FROM ROWS FROM (jsonb_to_recordset(p_jobs) AS (
        task text, payload jsonb, queue text, priority integer,
        run_at timestamptz, delay float8, max_attempts integer, lease_seconds integer,
        dedup_key text, serial_key text, backoff real[], lookup boolean,
        default_priority integer, tags text[], meta jsonb, waiting boolean, records boolean,
        group_key text))
        WITH ORDINALITY AS r(task, payload, queue, priority, run_at, delay, max_attempts,
                             lease_seconds, dedup_key, serial_key, backoff, lookup,
                             default_priority, tags, meta, waiting, records, group_key, ord)
    CROSS JOIN LATERAL {schema}.enqueue_resolve(
        CASE WHEN jsonb_array_length(p_jobs) > 1 THEN r.ord END, r.task,
        coalesce(r.payload, '{}'::jsonb), r.queue, r.priority, r.default_priority, r.run_at,
        r.delay, r.max_attempts, r.lease_seconds, r.dedup_key, r.serial_key, r.backoff,
        r.tags, r.meta, coalesce(r.lookup, false), coalesce(r.waiting, false),
        CASE WHEN r.records THEN true END, r.group_key) v
$$;

CREATE FUNCTION {schema}.enqueue_job(p_task text, p_payload jsonb DEFAULT '{}'::jsonb, p_queue text DEFAULT NULL::text, p_priority integer DEFAULT NULL::integer, p_run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, p_delay double precision DEFAULT NULL::double precision, p_max_attempts integer DEFAULT NULL::integer, p_lease_seconds integer DEFAULT NULL::integer, p_dedup_key text DEFAULT NULL::text, p_serial_key text DEFAULT NULL::text, p_backoff real[] DEFAULT NULL::real[], p_lookup boolean DEFAULT false, p_default_priority integer DEFAULT NULL::integer, p_group_key text DEFAULT NULL::text) RETURNS TABLE(job_id bigint, created boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v          record;  -- the dedup path's job (job_values), quotas, known
    v_id       bigint;
    v_queue    text;
    v_status   {schema}.job_status;
    v_priority smallint;
    v_run_at   timestamptz;
    v_quotas   boolean;
    v_known    boolean;
    v_notified text;
BEGIN
    -- (Generic plans, cached: under 'auto' the planner keeps choosing
    -- custom plans for these statements, made again on every call, which
    -- cost as much as the rest of the enqueue.)
    IF p_dedup_key IS NULL THEN
        -- Nothing can conflict: one statement resolves and checks the options
        -- (enqueue_resolve, inlined; a refused job draws no id), inserts the
        -- job (no speculative insertion), and reads whether quotas are set and
        -- whether the queue is registered.
        INSERT INTO {schema}.jobs_new AS j
        SELECT nextval('{schema}.jobs_id_seq'), p_payload, r.*
        FROM {schema}.enqueue_resolve(
                 NULL, p_task, coalesce(p_payload, 'null'::jsonb), p_queue, p_priority,
                 p_default_priority, p_run_at, p_delay, p_max_attempts, p_lease_seconds,
                 NULL, p_serial_key, p_backoff, NULL, NULL, p_lookup, false, NULL, p_group_key) r
        RETURNING j.id, j.queue, j.status, j.priority, j.run_at,
                  EXISTS (SELECT 1 FROM {schema}.queues q WHERE q.name = j.queue),
                  (SELECT l.max_queues IS NOT NULL OR l.max_queued_per_queue IS NOT NULL
                   FROM {schema}.limits l)
        INTO v_id, v_queue, v_status, v_priority, v_run_at, v_known, v_quotas;
        created := true;
    ELSE
        SELECT r AS job,
               l.max_queues IS NOT NULL OR l.max_queued_per_queue IS NOT NULL AS quotas,
               EXISTS (SELECT 1 FROM {schema}.queues q WHERE q.name = r.queue) AS known
        INTO v
        FROM {schema}.enqueue_resolve(
                 NULL, p_task, coalesce(p_payload, 'null'::jsonb), p_queue, p_priority,
                 p_default_priority, p_run_at, p_delay, p_max_attempts, p_lease_seconds,
                 p_dedup_key, p_serial_key, p_backoff, NULL, NULL, p_lookup, false, NULL,
                 p_group_key) r
        LEFT JOIN {schema}.limits l ON true;
        v_queue := (v.job).queue;
        v_status := (v.job).status;
        v_priority := (v.job).priority;
        v_run_at := (v.job).run_at;
        v_quotas := v.quotas;
        v_known := v.known;
        FOR attempt IN 1..10 LOOP
            INSERT INTO {schema}.jobs_new AS j
            SELECT nextval('{schema}.jobs_id_seq'), p_payload, (v.job).*
            ON CONFLICT (queue, dedup_key)
                WHERE dedup_key IS NOT NULL AND stage IN ('queued', 'scheduled')
            DO NOTHING
            RETURNING j.id INTO v_id;
            IF v_id IS NOT NULL THEN
                created := true;
                EXIT;
            END IF;
            -- A new statement, so a new snapshot: it sees the live duplicate
            -- that made the insert skip.
            SELECT j.id INTO v_id FROM {schema}.jobs_live j
            WHERE j.queue = v_queue AND j.dedup_key = p_dedup_key
              AND j.stage IN ('queued', 'scheduled')
            LIMIT 1;
            IF v_id IS NOT NULL THEN
                created := false;
                EXIT;
            END IF;
            -- The live duplicate finished in between: try again.
        END LOOP;
        IF v_id IS NULL THEN
            RAISE EXCEPTION 'pgqueue: dedup keys kept changing under this enqueue; retry it'
                USING ERRCODE = '40001';
        END IF;
    END IF;
    IF created THEN
        -- Registered once; afterwards the look-up above, cheaper than ON CONFLICT.
        IF NOT v_known THEN
            INSERT INTO {schema}.queues (name) VALUES (v_queue) ON CONFLICT (name) DO NOTHING;
        END IF;
        -- An assignment, not PERFORM: evaluated as a simple expression.
        v_notified := {schema}.notify_enqueued(
            v_queue, 1, CASE WHEN v_status = 'queued' THEN 1 ELSE 0 END, v_id)::text;
        IF v_status = 'queued' THEN
            v_notified := {schema}.announce_ready(v_queue, v_priority, v_run_at, v_id)::text;
        END IF;
    END IF;
    IF v_quotas THEN
        PERFORM {schema}.check_quotas(jsonb_build_array(jsonb_build_object('queue', v_queue)));
    END IF;
    job_id := v_id;
    RETURN NEXT;
END;
$$;

CREATE FUNCTION {schema}.enqueue_payloads(p_job jsonb, p_payloads jsonb) RETURNS bigint[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'auto'
    SET jit TO 'off'
    AS $$
DECLARE
    v_job       {schema}.job_values;
    v_count     integer;
    v_max_bytes integer;
    v_quotas    boolean;
    v_ids       bigint[];
BEGIN
    IF jsonb_typeof(p_job) IS DISTINCT FROM 'object'
       OR p_job ?| ARRAY['payload', 'dedup_key', 'dedup_window', 'debounce'] THEN
        RAISE EXCEPTION 'pgqueue: enqueue_payloads takes a job object without payload, dedup_key, dedup_window or debounce'
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(p_payloads) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'pgqueue: enqueue_payloads takes a JSON array of payloads'
            USING ERRCODE = '22023';
    END IF;
    v_count := jsonb_array_length(p_payloads);
    IF v_count = 0 THEN
        RETURN '{}';
    END IF;
    SELECT l.max_payload_bytes, l.max_queues IS NOT NULL OR l.max_queued_per_queue IS NOT NULL
    INTO v_max_bytes, v_quotas FROM {schema}.limits l;
    -- The shared fields: checked and defaulted once, exactly as for one job.
    SELECT (i.job).* INTO v_job FROM {schema}.enqueue_input(jsonb_build_array(p_job)) i;
    -- Every payload, before any id is drawn: plain expressions, else
    -- check_job names the problem and the job.
    PERFORM count(*)
    FROM jsonb_array_elements(p_payloads) WITH ORDINALITY AS e(payload, ord)
    WHERE NOT coalesce(jsonb_typeof(e.payload) IN ('object', 'null')
                       AND pg_column_size(e.payload) * 8 <= least(8000, v_max_bytes), false)
      AND {schema}.check_job(
              CASE WHEN v_count > 1 THEN e.ord END, v_job.task, e.payload, v_job.queue,
              v_job.priority, v_job.run_at, NULL, v_job.max_attempts, v_job.lease_seconds,
              NULL, v_job.serial_key, NULL, coalesce(v_max_bytes, 1048576));

    -- jsonb_array_elements yields the payloads in order and nextval runs in
    -- that order: sorted ids are input order.
    -- (The shared fields are read out of v_job once, into a one-row CTE: a
    -- cached generic plan would otherwise take each field out of the
    -- composite again for every job.)
    WITH shared AS MATERIALIZED (SELECT (v_job).*),
    inserted AS (
        INSERT INTO {schema}.jobs_new AS j
        SELECT nextval('{schema}.jobs_id_seq'),
               CASE WHEN jsonb_typeof(e.payload) = 'null' THEN '{}'::jsonb ELSE e.payload END,
               s.*
        FROM shared s CROSS JOIN jsonb_array_elements(p_payloads) AS e(payload)
        RETURNING j.id
    )
    SELECT array_agg(i.id ORDER BY i.id) INTO v_ids FROM inserted i;

    IF NOT EXISTS (SELECT 1 FROM {schema}.queues q WHERE q.name = v_job.queue) THEN
        INSERT INTO {schema}.queues (name) VALUES (v_job.queue) ON CONFLICT (name) DO NOTHING;
    END IF;
    PERFORM {schema}.notify_enqueued(v_job.queue, v_count,
                                     CASE WHEN v_job.status = 'queued' THEN v_count ELSE 0 END,
                                     v_ids[1]);
    IF v_job.status = 'queued' THEN
        PERFORM {schema}.announce_ready(v_job.queue, v_job.priority, v_job.run_at, v_ids[1]);
    END IF;
    IF v_quotas THEN
        PERFORM {schema}.check_quotas(jsonb_build_array(jsonb_build_object('queue', v_job.queue)));
    END IF;
    RETURN v_ids;
END;
$$;

CREATE FUNCTION {schema}.enqueue_rows(p_jobs jsonb, p_only bigint[] DEFAULT NULL::bigint[]) RETURNS TABLE(ord bigint, job_id bigint, queue text, dedup_key text)
    LANGUAGE sql
    AS $$
    WITH input AS MATERIALIZED (
        -- jobs_new's columns, flat (nextval is computed after the sort,
        -- which reads, and so validates, every job first: a refused batch
        -- draws no id; and the ids follow the input order).
        SELECT nextval('{schema}.jobs_id_seq') AS id, v.payload, (v.job).*
        FROM {schema}.enqueue_input(p_jobs) v
        WHERE p_only IS NULL OR v.ord = ANY (p_only)
        ORDER BY v.ord + 0
    ),
    inserted AS (
        INSERT INTO {schema}.jobs_new AS j
        SELECT i.* FROM input i
        ORDER BY i.id
        ON CONFLICT (queue, dedup_key)
            WHERE dedup_key IS NOT NULL AND stage IN ('queued', 'scheduled')
        DO NOTHING
        RETURNING j.id, j.queue, j.status, j.priority, j.run_at
    ),
    per_queue AS (
        SELECT d.queue, count(*) AS n, count(*) FILTER (WHERE d.status = 'queued') AS ready,
               min(d.id) AS job_id
        FROM inserted d GROUP BY d.queue
    ),
    registered AS (
        INSERT INTO {schema}.queues (name) SELECT p.queue FROM per_queue p
        ON CONFLICT (name) DO NOTHING
    ),
    notified AS (
        SELECT (SELECT count({schema}.notify_enqueued(p.queue, p.n, p.ready, p.job_id))
                FROM per_queue p)
             + (SELECT count({schema}.announce_ready(f.queue, f.priority, f.run_at, f.id))
                FROM (SELECT DISTINCT ON (d.queue) d.queue, d.priority, d.run_at, d.id
                      FROM inserted d WHERE d.status = 'queued'
                      ORDER BY d.queue, d.priority DESC, d.run_at, d.id) f) AS n
    )
    -- Each job's place in the input: the ids were drawn in input order, so
    -- the n-th smallest id is the n-th job (of p_only's, when given).
    SELECT CASE WHEN p_only IS NULL THEN i.n
                ELSE (SELECT array_agg(o ORDER BY o) FROM unnest(p_only) o)[i.n] END,
           d.id, i.queue, i.dedup_key
    FROM (SELECT i.id, i.queue, i.dedup_key, row_number() OVER (ORDER BY i.id) AS n
          FROM input i) i
    LEFT JOIN inserted d ON d.id = i.id
    CROSS JOIN notified
$$;

CREATE FUNCTION {schema}.enqueue_batch(p_jobs jsonb) RETURNS TABLE(job_id bigint, created boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'auto'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $_$
#variable_conflict use_column
DECLARE
    v_jobs    jsonb := p_jobs;
    v_dedup   boolean;
    v_rows    {schema}.enqueued[];
    v_missing bigint[];
BEGIN
    IF jsonb_typeof(p_jobs) = 'object' AND p_jobs ? 'graph' THEN
        -- {"graph": steps, "workflow": name}: jobs that wait for other jobs
        -- (enqueue_graph; the workflow's id is in job_waits).
        RETURN QUERY SELECT g.job_id, true FROM {schema}.enqueue_graph(p_jobs ->> 'workflow', p_jobs -> 'graph') g;
        RETURN;
    END IF;
    IF jsonb_typeof(p_jobs) = 'object' THEN
        v_jobs := p_jobs -> 'jobs';
        v_dedup := (p_jobs ->> 'dedup')::boolean;
    END IF;
    IF jsonb_typeof(v_jobs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'pgqueue: enqueue_batch takes a JSON array of job objects'
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_path_exists(v_jobs, '$[*] ? (@.type() != "object")') THEN
        RAISE EXCEPTION 'pgqueue: every job of enqueue_batch must be a JSON object'
            USING ERRCODE = '22023';
    END IF;
    IF v_dedup IS NULL THEN
        v_dedup := jsonb_path_exists(v_jobs, '$[*] ? (exists(@.dedup_key))');
    END IF;

    IF NOT v_dedup THEN
        -- Nothing can conflict: one plain insert. Ids are drawn from the
        -- sequence in input order, so sorted ids are in input order too.
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO {schema}.jobs_new AS j
            SELECT nextval('{schema}.jobs_id_seq'), i.payload, (i.job).*
            FROM {schema}.enqueue_input(v_jobs) i
            -- The sort reads (and so validates) every job before the first
            -- id is drawn (the planner computes nextval above the sort): a
            -- refused batch consumes no ids. (On ord + 0: the scan is
            -- already ordered on ord, which would skip the sort.)
            ORDER BY i.ord + 0
            RETURNING j.id, j.queue, j.status, j.priority, j.run_at
        ),
        per_queue AS (
            SELECT d.queue, count(*) AS n, count(*) FILTER (WHERE d.status = 'queued') AS ready,
                   min(d.id) AS job_id
            FROM inserted d GROUP BY d.queue
        ),
        registered AS (
            INSERT INTO {schema}.queues (name) SELECT p.queue FROM per_queue p
            ON CONFLICT (name) DO NOTHING
        ),
        notified AS (
            SELECT (SELECT count({schema}.notify_enqueued(p.queue, p.n, p.ready, p.job_id))
                    FROM per_queue p)
                 + (SELECT count({schema}.announce_ready(f.queue, f.priority, f.run_at, f.id))
                    FROM (SELECT DISTINCT ON (d.queue) d.queue, d.priority, d.run_at, d.id
                          FROM inserted d WHERE d.status = 'queued'
                          ORDER BY d.queue, d.priority DESC, d.run_at, d.id) f) AS n
        )
        SELECT d.id, true FROM inserted d CROSS JOIN notified ORDER BY d.id;
        PERFORM {schema}.check_quotas(v_jobs);
        RETURN;
    END IF;

    SELECT array_agg(ROW(e.ord, e.job_id, e.job_id IS NOT NULL, e.queue, e.dedup_key)::{schema}.enqueued)
    INTO v_rows FROM {schema}.enqueue_rows(v_jobs) e;
    FOR attempt IN 1..10 LOOP
        -- A new statement, so a new snapshot: it sees the live duplicate that
        -- made the insert skip (committed before, or inserted by this batch).
        SELECT array_agg(ROW(r.ord, coalesce(r.job_id, live.id), r.created, r.queue,
                             r.dedup_key)::{schema}.enqueued)
        INTO v_rows
        FROM unnest(v_rows) r
        LEFT JOIN LATERAL (
            SELECT j.id FROM {schema}.jobs_live j
            WHERE r.job_id IS NULL AND j.queue = r.queue AND j.dedup_key = r.dedup_key
              AND j.stage IN ('queued', 'scheduled')
            LIMIT 1
        ) live ON true;
        SELECT array_agg(r.ord) INTO v_missing FROM unnest(v_rows) r WHERE r.job_id IS NULL;
        IF v_missing IS NULL THEN
            PERFORM {schema}.check_quotas(v_jobs);
            RETURN QUERY SELECT r.job_id, r.created FROM unnest(v_rows) r ORDER BY r.ord;
            RETURN;
        END IF;
        -- The live duplicate finished in between: enqueue those after all.
        SELECT array_agg(ROW(r.ord, coalesce(r.job_id, e.job_id),
                             r.created OR e.job_id IS NOT NULL, r.queue, r.dedup_key)::{schema}.enqueued)
        INTO v_rows
        FROM unnest(v_rows) r
        LEFT JOIN {schema}.enqueue_rows(v_jobs, v_missing) e ON e.ord = r.ord;
    END LOOP;
    RAISE EXCEPTION 'pgqueue: dedup keys kept changing under this enqueue; retry it'
        USING ERRCODE = '40001';
END;
$_$;

CREATE FUNCTION {schema}.dedup_lock_key(p_queue text, p_key text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN hashtextextended((((('{schema}'::text || '
'::text) || p_queue) || '
'::text) || p_key), (0)::bigint);

CREATE FUNCTION {schema}.dedup_lock(p_keys bigint[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_key bigint;
BEGIN
    FOR v_key IN SELECT DISTINCT k FROM unnest(p_keys) k WHERE k IS NOT NULL ORDER BY k LOOP
        IF NOT pg_try_advisory_xact_lock(v_key) THEN
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION 'pgqueue: another transaction is enqueueing the same dedup key; '
                                'retry this transaction'
                    USING ERRCODE = '40001',
                          HINT = 'windowed and debounced enqueues wait for each other under READ COMMITTED';
            END IF;
            PERFORM pg_advisory_xact_lock(v_key);
        END IF;
    END LOOP;
END;
$$;

CREATE FUNCTION {schema}.dedup_claim(p_queue text, p_key text, p_window interval, p_debounce interval, p_payload jsonb) RETURNS bigint
    LANGUAGE plpgsql
    AS $_$
DECLARE
    v_id    bigint;
    v_limit integer;
    v_size  integer;
    v_priority integer;
    v_run_at   timestamptz;
    v_ready    boolean;
BEGIN
    IF p_key IS NULL OR p_key = '' THEN
        RAISE EXCEPTION 'pgqueue: dedup_window and debounce need a dedup_key'
            USING ERRCODE = '22023';
    END IF;
    IF p_window IS NOT NULL AND p_debounce IS NOT NULL THEN
        RAISE EXCEPTION 'pgqueue: give dedup_window or debounce, not both'
            USING ERRCODE = '22023';
    END IF;
    IF p_window <= interval '0' THEN
        RAISE EXCEPTION 'pgqueue: dedup_window must be positive, got %', p_window
            USING ERRCODE = '22023';
    END IF;
    IF p_debounce < interval '0' THEN
        RAISE EXCEPTION 'pgqueue: debounce must not be negative, got %', p_debounce
            USING ERRCODE = '22023';
    END IF;

    IF p_debounce IS NOT NULL THEN
        IF p_debounce > make_interval(secs => 3153600000) THEN
            RAISE EXCEPTION 'pgqueue: debounce must be at most 3153600000 seconds (100 years), got %', p_debounce
                USING ERRCODE = '22023';
        END IF;
        IF p_payload IS NULL OR jsonb_typeof(p_payload) <> 'object' THEN
            RAISE EXCEPTION 'pgqueue: payload must be a JSON object' USING ERRCODE = '22023';
        END IF;
        -- The size limit, measured as check_job measures it.
        v_limit := coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576);
        IF pg_column_size(p_payload) > v_limit / 8 THEN
            v_size := octet_length(p_payload::text);
            IF v_size > v_limit THEN
                RAISE EXCEPTION 'pgqueue: payload is % bytes of JSON, over the %-byte limit',
                    v_size, v_limit USING ERRCODE = '22023';
            END IF;
        END IF;
        IF jsonb_path_exists(p_payload,
                'strict $.**{256} ? (@.type() == "object" || @.type() == "array")') THEN
            RAISE EXCEPTION 'pgqueue: payload is nested deeper than 256 arrays/objects'
                USING ERRCODE = '22023';
        END IF;
        UPDATE {schema}.jobs_live j
        SET payload = p_payload,
            run_at = now() + p_debounce,
            status = CASE WHEN p_debounce > interval '0' THEN 'scheduled' ELSE 'queued' END::{schema}.job_status
        WHERE j.queue = p_queue AND j.dedup_key = p_key AND j.stage IN ('queued', 'scheduled') AND j.status <> 'running'
        RETURNING j.id, j.priority, j.run_at, j.status = 'queued' INTO v_id, v_priority, v_run_at, v_ready;
        IF v_id IS NOT NULL THEN
            -- Idle workers recompute when to wake up.
            PERFORM pg_notify({channel}, 'j:' || p_queue);
            IF v_ready THEN
                PERFORM {schema}.announce_ready(p_queue, v_priority, v_run_at, v_id);
            END IF;
        END IF;
        RETURN v_id;
    END IF;

    SELECT j.id INTO v_id FROM (
        SELECT l.id, l.created_at FROM {schema}.jobs_live l
        WHERE l.queue = p_queue AND l.dedup_key = p_key AND l.created_at > now() - p_window
        UNION ALL
        -- Finished ones: a job created within the window finished within it
        -- too, so the finished partitions' older leaves are not read.
        SELECT h.id, h.created_at FROM {schema}.jobs h
        WHERE h.status IN ('succeeded', 'dead', 'cancelled') AND h.finished_at > now() - p_window
          AND h.queue = p_queue AND h.dedup_key = p_key AND h.created_at > now() - p_window
    ) j
    ORDER BY j.created_at DESC LIMIT 1;
    IF v_id IS NULL THEN
        SELECT a.id INTO v_id FROM {schema}.jobs_archive a
        WHERE a.queue = p_queue AND a.dedup_key = p_key AND a.created_at > now() - p_window
        ORDER BY a.created_at DESC LIMIT 1;
    END IF;
    IF v_id IS NULL THEN
        -- "At most one job per key created within the window, finished or
        -- not": a live job created before the window no longer holds the key
        -- (else a far-future job would squat it for ever). It keeps running
        -- without it; the caller holds the key's dedup lock.
        UPDATE {schema}.jobs_live j SET dedup_key = NULL
        WHERE j.queue = p_queue AND j.dedup_key = p_key
          AND j.stage IN ('queued', 'scheduled')
          AND j.created_at <= now() - p_window;
    END IF;
    RETURN v_id;
END;
$_$;

CREATE FUNCTION {schema}.enqueue_windowed(p_jobs jsonb) RETURNS TABLE(job_id bigint, created boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_job      jsonb;
    v_ord      bigint;
    v_slot     bigint;
    v_window   float8;
    v_debounce float8;
    v_queue    text;
    v_lock     text;
    v_id       bigint;
    v_created  boolean;
    v_ids      bigint[] := '{}';
    v_news     boolean[] := '{}';
    v_pending  jsonb[] := '{}';
    v_at       bigint[] := '{}';
    v_repeats  text[];
    v_keys     text[] := '{}';
BEGIN
    IF jsonb_typeof(p_jobs) <> 'array' THEN
        RAISE EXCEPTION 'pgqueue: enqueue_windowed takes a JSON array of jobs' USING ERRCODE = '22023';
    END IF;
    -- A windowed job of a task the caller does not know (lookup) goes to the
    -- task registry's queue, as enqueue_resolve decides: its dedup lock and
    -- claim must be in that queue, so the job names it from here on.
    IF jsonb_path_exists(p_jobs, '$[*] ? (@.lookup == true && !exists(@.queue))') THEN
        p_jobs := (SELECT jsonb_agg(CASE
                       WHEN e ? 'queue' OR NOT coalesce((e ->> 'lookup')::boolean, false) THEN e
                       ELSE e || jsonb_build_object('queue', coalesce(
                           (SELECT g.queue FROM {schema}.tasks g WHERE g.name = e ->> 'task'),
                           'default')) END ORDER BY x.o)
                   FROM jsonb_array_elements(p_jobs) WITH ORDINALITY x(e, o));
    END IF;
    PERFORM {schema}.dedup_lock(ARRAY(
        SELECT {schema}.dedup_lock_key(coalesce(e ->> 'queue', 'default'), e ->> 'dedup_key')
        FROM jsonb_array_elements(p_jobs) e
        WHERE (e ->> 'dedup_window') IS NOT NULL OR (e ->> 'debounce') IS NOT NULL));
    -- Keys that occur more than once (rare): only those need the early flush.
    v_repeats := ARRAY(
        SELECT coalesce(e ->> 'queue', 'default') || E'\n' || (e ->> 'dedup_key')
        FROM jsonb_array_elements(p_jobs) e
        WHERE (e ->> 'dedup_window') IS NOT NULL OR (e ->> 'debounce') IS NOT NULL
        GROUP BY 1 HAVING count(*) > 1);
    FOR v_job, v_ord IN SELECT e.value, e.ordinality FROM jsonb_array_elements(p_jobs) WITH ORDINALITY e
    LOOP
        v_window := (v_job ->> 'dedup_window')::float8;
        v_debounce := (v_job ->> 'debounce')::float8;
        IF v_window IS NOT NULL OR v_debounce IS NOT NULL THEN
            v_queue := coalesce(v_job ->> 'queue', 'default');
            v_lock := v_queue || E'\n' || coalesce(v_job ->> 'dedup_key', '');
            IF cardinality(v_repeats) > 0 AND v_lock = ANY (v_keys) THEN
                -- The key's earlier job of this batch must exist before this one is settled.
                FOR v_id, v_created, v_slot IN
                    SELECT b.job_id, b.created, v_at[b.n]
                    FROM {schema}.enqueue_batch(to_jsonb(v_pending)) WITH ORDINALITY AS b(job_id, created, n)
                LOOP
                    v_ids[v_slot] := v_id;
                    v_news[v_slot] := v_created;
                END LOOP;
                v_pending := '{}';
                v_at := '{}';
                v_keys := '{}';
            END IF;
            IF v_debounce IS NOT NULL AND (v_job ? 'run_at' OR v_job ? 'delay') THEN
                RAISE EXCEPTION 'pgqueue: debounce sets run_at to now + debounce; give no run_at or delay'
                    USING ERRCODE = '22023';
            END IF;
            v_id := {schema}.dedup_claim(
                v_queue, v_job ->> 'dedup_key',
                make_interval(secs => v_window), make_interval(secs => v_debounce),
                coalesce(v_job -> 'payload', '{}'));
            IF v_id IS NOT NULL THEN
                v_ids[v_ord] := v_id;
                v_news[v_ord] := false;
                CONTINUE;
            END IF;
            v_job := v_job - 'dedup_window' - 'debounce';
            IF v_debounce IS NOT NULL THEN
                v_job := v_job || jsonb_build_object('delay', v_debounce);
            END IF;
            IF v_lock = ANY (v_repeats) THEN
                v_keys := v_keys || v_lock;
            END IF;
        END IF;
        v_pending := v_pending || v_job;
        v_at := v_at || v_ord;
    END LOOP;
    IF cardinality(v_pending) > 0 THEN
        FOR v_id, v_created, v_slot IN
            SELECT b.job_id, b.created, v_at[b.n]
            FROM {schema}.enqueue_batch(to_jsonb(v_pending)) WITH ORDINALITY AS b(job_id, created, n)
        LOOP
            v_ids[v_slot] := v_id;
            v_news[v_slot] := v_created;
        END LOOP;
    END IF;
    RETURN QUERY SELECT u.id, u.created FROM unnest(v_ids, v_news) AS u(id, created);
END;
$$;

CREATE FUNCTION {schema}.enqueue_batch_traced(p_jobs jsonb, p_trace_context jsonb, p_windowed boolean DEFAULT false) RETURNS TABLE(job_id bigint, created boolean)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_context text := current_setting('pgqueue.trace_context', true);
BEGIN
    IF p_trace_context IS NOT NULL AND (jsonb_typeof(p_trace_context) <> 'object'
                                        OR octet_length(p_trace_context::text) > 4096) THEN
        RAISE EXCEPTION 'pgqueue: trace context must be a JSON object of at most 4096 bytes'
            USING ERRCODE = '22023';
    END IF;
    -- For this call only: the old value is put back (an error aborts the
    -- transaction or savepoint, which puts it back too).
    PERFORM pg_catalog.set_config('pgqueue.trace_context', coalesce(p_trace_context::text, ''), true);
    IF p_windowed THEN
        RETURN QUERY SELECT b.job_id, b.created FROM {schema}.enqueue_windowed(p_jobs) b;
    ELSE
        RETURN QUERY SELECT b.job_id, b.created FROM {schema}.enqueue_batch(p_jobs) b;
    END IF;
    PERFORM pg_catalog.set_config('pgqueue.trace_context', coalesce(v_context, ''), true);
END;
$$;

CREATE FUNCTION {schema}.enqueue_graph(p_name text, p_steps jsonb) RETURNS TABLE(workflow_id bigint, job_id bigint)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
-- Jobs that wait for other jobs, in one statement: p_steps is a JSON array
-- of {"job": <an enqueue_batch job object>, "after": [indexes of earlier
-- steps], "depends_on": [ids of existing jobs], "allow_failed": bool,
-- "name": step name}. With p_name a workflow is recorded and the steps are
-- its members. Dependencies that already ended are resolved here: a step
-- whose every dependency ended is queued at once (or cancelled, when one
-- ended dead or cancelled and allow_failed is false).
DECLARE
    v_workflow bigint;
    v_ids      bigint[];
    v_deps     bigint[];
    v_found    bigint[] := '{}';
    v_ended    bigint[] := '{}';  -- dependencies that already ended
    v_failed   bigint[] := '{}';  -- ... dead or cancelled
    v_missing  bigint;
BEGIN
    IF jsonb_typeof(p_steps) IS DISTINCT FROM 'array' OR jsonb_array_length(p_steps) = 0 THEN
        RAISE EXCEPTION 'pgqueue: a graph of jobs is a non-empty JSON array of steps'
            USING ERRCODE = '22023';
    END IF;
    SELECT coalesce(array_agg(DISTINCT d.id_text::bigint), '{}') INTO v_deps
    FROM jsonb_array_elements(p_steps) s(step),
         jsonb_array_elements_text(coalesce(s.step -> 'depends_on', '[]')) d(id_text);
    -- Existing jobs depended on: locked (a completion committing meanwhile
    -- either happened before and is read here, or waits for this
    -- transaction and then releases these steps), marked, their state read;
    -- archived ones ended long ago.
    IF cardinality(v_deps) > 0 THEN
        -- (Three tries: a dependency that finished while this statement
        -- waited for its lock left jobs_live and is found, finished, by the
        -- next statement's snapshot.)
        FOR v_try IN 1..3 LOOP
            WITH marked AS (
                UPDATE {schema}.jobs j SET has_dependents = true, has_records = true
                WHERE j.id = ANY (v_deps) AND j.id <> ALL (v_found)
                RETURNING j.id, j.stage
            ), known AS (
                SELECT m.id, m.stage::text AS stage FROM marked m
                UNION ALL
                SELECT a.id, a.status::text FROM {schema}.jobs_archive a
                WHERE a.id = ANY (v_deps) AND a.id <> ALL (v_found)
                  AND a.id NOT IN (SELECT m.id FROM marked m)
            )
            SELECT v_found || coalesce(array_agg(k.id), '{}'),
                   v_ended || coalesce(array_agg(k.id) FILTER (WHERE k.stage IN ('succeeded', 'dead', 'cancelled')), '{}'),
                   v_failed || coalesce(array_agg(k.id) FILTER (WHERE k.stage IN ('dead', 'cancelled')), '{}')
            INTO v_found, v_ended, v_failed
            FROM known k;
            SELECT d INTO v_missing FROM unnest(v_deps) d WHERE d <> ALL (v_found) LIMIT 1;
            EXIT WHEN v_missing IS NULL;
        END LOOP;
        IF v_missing IS NOT NULL THEN
            RAISE EXCEPTION 'pgqueue: job % not found', v_missing
                USING ERRCODE = 'P0002', HINT = 'depends_on takes ids of existing jobs';
        END IF;
    END IF;

    -- The jobs, waiting when they have a dependency (settled below).
    SELECT array_agg(b.job_id ORDER BY b.job_id) INTO v_ids
    FROM {schema}.enqueue_batch((
        SELECT jsonb_agg((s.step -> 'job') || jsonb_build_object(
                   'waiting', jsonb_array_length(coalesce(s.step -> 'after', '[]'))
                              + jsonb_array_length(coalesce(s.step -> 'depends_on', '[]')) > 0,
                   -- a row in job_waits (below) belongs to it
                   'records', p_name IS NOT NULL
                              OR jsonb_array_length(coalesce(s.step -> 'after', '[]'))
                                 + jsonb_array_length(coalesce(s.step -> 'depends_on', '[]')) > 0)
               ORDER BY s.ord)
        FROM jsonb_array_elements(p_steps) WITH ORDINALITY s(step, ord))) b;

    -- A workflow's id is its first step's job id: the caller knows it from
    -- the ids this returns, without another statement.
    IF p_name IS NOT NULL THEN
        v_workflow := v_ids[1];
        INSERT INTO {schema}.workflows (id, name) VALUES (v_workflow, p_name);
    END IF;

    INSERT INTO {schema}.job_dependencies (depends_on, job_id)
    SELECT v_ids[a.idx::integer + 1], v_ids[s.ord]
    FROM jsonb_array_elements(p_steps) WITH ORDINALITY s(step, ord),
         jsonb_array_elements_text(coalesce(s.step -> 'after', '[]')) a(idx)
    UNION
    SELECT d.id_text::bigint, v_ids[s.ord]
    FROM jsonb_array_elements(p_steps) WITH ORDINALITY s(step, ord),
         jsonb_array_elements_text(coalesce(s.step -> 'depends_on', '[]')) d(id_text);

    UPDATE {schema}.jobs_live j SET has_dependents = true, has_records = true
    WHERE j.id = ANY (ARRAY(SELECT DISTINCT d.depends_on FROM {schema}.job_dependencies d
                            WHERE d.job_id = ANY (v_ids)))
      AND j.has_dependents IS NOT TRUE;

    -- A workflow's members, and plain jobs with dependencies; pending counts
    -- the dependencies that have not ended yet.
    INSERT INTO {schema}.job_waits (job_id, workflow_id, step, allow_failed, pending, blocker)
    SELECT v_ids[s.ord], v_workflow, s.step ->> 'name',
           coalesce((s.step ->> 'allow_failed')::boolean, false),
           (SELECT count(*) FROM {schema}.job_dependencies d
            WHERE d.job_id = v_ids[s.ord] AND d.depends_on <> ALL (v_ended)),
           (SELECT min(d.depends_on) FROM {schema}.job_dependencies d
            WHERE d.job_id = v_ids[s.ord] AND d.depends_on = ANY (v_failed))
    FROM jsonb_array_elements(p_steps) WITH ORDINALITY s(step, ord)
    WHERE p_name IS NOT NULL
       OR jsonb_array_length(coalesce(s.step -> 'after', '[]'))
          + jsonb_array_length(coalesce(s.step -> 'depends_on', '[]')) > 0;

    -- Dependencies that had already ended: release or cancel those steps now.
    PERFORM {schema}.settle_waiting(ARRAY(
        SELECT w.job_id FROM {schema}.job_waits w
        WHERE w.job_id = ANY (v_ids)
          AND (w.pending = 0 OR (w.blocker IS NOT NULL AND NOT w.allow_failed))));

    RETURN QUERY SELECT v_workflow, i FROM unnest(v_ids) i;
END;
$$;

CREATE FUNCTION {schema}.enqueue_plain(task text, payload jsonb DEFAULT '{}'::jsonb, queue text DEFAULT NULL::text, priority integer DEFAULT NULL::integer, run_at timestamp with time zone DEFAULT now(), max_attempts integer DEFAULT NULL::integer, dedup_key text DEFAULT NULL::text, serial_key text DEFAULT NULL::text, tags text[] DEFAULT NULL::text[], meta jsonb DEFAULT NULL::jsonb, group_key text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'pgqueue: payload must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF tags IS NOT NULL OR meta IS NOT NULL THEN
        -- The batch path stores (and check_job validates) tags and meta;
        -- enqueue_job, the hot single-job path, has no parameters for them.
        RETURN (SELECT b.job_id FROM {schema}.enqueue_batch(jsonb_build_array(jsonb_build_object(
            'task', task, 'payload', payload, 'queue', queue, 'priority', priority,
            'run_at', coalesce(run_at, now()), 'max_attempts', max_attempts,
            'dedup_key', dedup_key, 'serial_key', serial_key, 'lookup', true,
            'tags', to_jsonb(tags), 'meta', meta, 'group_key', group_key))) b);
    END IF;
    RETURN (SELECT e.job_id FROM {schema}.enqueue_job(
        task, payload, queue, priority, coalesce(run_at, now()), NULL, max_attempts, NULL,
        dedup_key, serial_key, NULL, true, NULL, group_key) e);
END;
$$;

CREATE FUNCTION {schema}.enqueue(task text, payload jsonb DEFAULT '{}'::jsonb, queue text DEFAULT NULL::text, priority integer DEFAULT NULL::integer, run_at timestamp with time zone DEFAULT now(), max_attempts integer DEFAULT NULL::integer, dedup_key text DEFAULT NULL::text, serial_key text DEFAULT NULL::text, dedup_window interval DEFAULT NULL::interval, debounce interval DEFAULT NULL::interval, traceparent text DEFAULT NULL::text, tags text[] DEFAULT NULL::text[], meta jsonb DEFAULT NULL::jsonb, depends_on bigint[] DEFAULT NULL::bigint[], allow_failed boolean DEFAULT false, group_key text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    v_id      bigint;
    v_context text;
BEGIN
    IF traceparent IS NOT NULL THEN
        IF traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
            RAISE EXCEPTION 'pgqueue: traceparent must be a W3C traceparent like 00-<32 hex>-<16 hex>-01, got %',
                    quote_literal(left(traceparent, 80))
                USING ERRCODE = '22023';
        END IF;
        -- Set for this call only: put back below (an error aborts the
        -- transaction or savepoint, which puts it back too).
        v_context := current_setting('pgqueue.trace_context', true);
        PERFORM set_config('pgqueue.trace_context',
                           jsonb_build_object('traceparent', traceparent)::text, true);
    END IF;
    IF dedup_window IS NOT NULL OR debounce IS NOT NULL THEN
        queue := coalesce(queue, (SELECT g.queue FROM {schema}.tasks g WHERE g.name = task),
                          'default');
        PERFORM {schema}.dedup_lock(ARRAY[{schema}.dedup_lock_key(queue, dedup_key)]);
        v_id := {schema}.dedup_claim(queue, dedup_key, dedup_window, debounce, payload);
        IF v_id IS NOT NULL THEN
            IF traceparent IS NOT NULL THEN
                PERFORM set_config('pgqueue.trace_context', coalesce(v_context, ''), true);
            END IF;
            RETURN v_id;
        END IF;
        IF debounce IS NOT NULL THEN
            run_at := now() + debounce;
        END IF;
    END IF;
    IF depends_on IS NOT NULL AND cardinality(depends_on) > 0 OR allow_failed THEN
        IF dedup_key IS NOT NULL THEN
            RAISE EXCEPTION 'pgqueue: dedup_key cannot be used with depends_on'
                USING ERRCODE = '22023';
        END IF;
        IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
            RAISE EXCEPTION 'pgqueue: payload must be a JSON object' USING ERRCODE = '22023';
        END IF;
        SELECT g.job_id INTO v_id FROM {schema}.enqueue_graph(NULL, jsonb_build_array(jsonb_build_object(
            'job', jsonb_build_object(
                'task', task, 'payload', payload, 'queue', queue, 'priority', priority,
                'run_at', coalesce(run_at, now()), 'max_attempts', max_attempts,
                'serial_key', serial_key, 'lookup', true, 'tags', to_jsonb(tags), 'meta', meta,
                'group_key', group_key),
            'depends_on', to_jsonb(coalesce(depends_on, '{}')),
            'allow_failed', allow_failed))) g;
    ELSE
        v_id := {schema}.enqueue_plain(task, payload, queue, priority, run_at, max_attempts,
                                       dedup_key, serial_key, tags, meta, group_key);
    END IF;
    IF traceparent IS NOT NULL THEN
        PERFORM set_config('pgqueue.trace_context', coalesce(v_context, ''), true);
    END IF;
    RETURN v_id;
END;
$_$;

CREATE FUNCTION {schema}.replay_job(p_job_id bigint, p_queue text DEFAULT NULL::text, p_run_at timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(job_id bigint, created boolean, replayed_from bigint)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
SELECT b.job_id, b.created, p_job_id
FROM (
    SELECT task, payload, queue, priority, max_attempts, lease_seconds, dedup_key, serial_key,
           backoff_base, backoff_factor, backoff_max, backoff_jitter, group_key
    FROM {schema}.jobs WHERE id = p_job_id
    UNION ALL
    SELECT task, payload, queue, priority, max_attempts, lease_seconds, dedup_key, serial_key,
           backoff_base, backoff_factor, backoff_max, backoff_jitter, group_key
    FROM {schema}.jobs_archive WHERE id = p_job_id
    LIMIT 1
) src
CROSS JOIN LATERAL {schema}.enqueue_batch(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
    'task', src.task, 'payload', src.payload,
    'queue', coalesce(p_queue, src.queue), 'priority', src.priority,
    'run_at', coalesce(p_run_at, now()), 'max_attempts', src.max_attempts,
    'lease_seconds', src.lease_seconds, 'dedup_key', src.dedup_key,
    'serial_key', src.serial_key, 'group_key', src.group_key,
    'backoff', CASE WHEN src.backoff_base IS NOT NULL THEN jsonb_build_array(
        src.backoff_base, src.backoff_factor, src.backoff_max, src.backoff_jitter) END)))) b;
$$;

-- =====================================================================================
-- Functions: lease, and what a running job does
-- =====================================================================================

CREATE FUNCTION {schema}.lease_jobs(p_queues text[], p_worker_id text, p_limit integer, p_lease_seconds integer DEFAULT NULL::integer, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_after jsonb DEFAULT NULL::jsonb) RETURNS TABLE(job_id bigint, attempt_id bigint, attempt integer, task text, queue text, payload jsonb, lease_expires_at timestamp with time zone, lease_seconds integer, run_at timestamp with time zone, trace_context jsonb, tags text[], meta jsonb, group_key text, priority smallint, ordered boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_sort TO 'off'
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
-- force_generic_plan: under 'auto' the lease statement kept a custom plan,
-- planned again on every call (~0.7 µs per job of a 500-job lease, more for
-- an idle worker's one-job lease). Its generic plan has the same shape:
-- enable_seqscan and enable_sort are off, so the ready index in lease order
-- is the only way in however the table's statistics change.
DECLARE
    -- (A call only when a clock is passed: it costs more than the rest of an idle lease.)
    v_fixed   timestamptz := CASE WHEN p_now IS NOT NULL THEN {schema}.trusted_clock(p_now) END;
    v_now     timestamptz := coalesce(v_fixed, clock_timestamp());
    v_limit   integer := least(coalesce(p_limit, 1), 10000);
    v_left    integer := v_limit;
    -- (greatest() would turn a NULL, "each job's own", into 1)
    v_lease   integer := CASE WHEN p_lease_seconds IS NOT NULL THEN greatest(p_lease_seconds, 1) END;
    v_cap     integer;
    v_got     integer;
    v_queue   record;
    v_ctl     record;
    v_staged  text[];
    v_tuned   boolean;      -- some task has a live lease_seconds setting
    v_limited text[];       -- tasks with a concurrency or rate limit
    v_blocked text[] := '{}';  -- limited tasks this call may not lease (full, or counted by another lease)
    v_caps    jsonb := '{}';   -- free slots of the limited tasks this call holds
    v_ids     bigint[];
    v_tasks   text[];
    v_take    bigint[];
    v_t       text;
    v_n       integer;
    v_tctl    record;
    -- Where this call's scan of a queue starts (see p_after below): after
    -- (v_cp, v_cr, v_ci) in lease order; v_cp 32768 (no cursor): the head.
    v_cursor  jsonb;
    v_cp      integer;
    v_cr      timestamptz;
    v_ci      bigint;
    v_staged_at jsonb := '{}';  -- queue -> first staged job's [priority, run_at, id]
BEGIN
    -- p_after: a worker's lease cursors, {"<queue>": [priority, "run_at", id]
    -- or null}: the lease order key of the last job this worker leased from
    -- each queue. Its scan of a queue starts after that key instead of at the
    -- index's head, so it does not walk past the entries of jobs leased and
    -- finished since (dead versions a long transaction elsewhere keeps from
    -- being removed). A job that becomes ready behind a cursor is announced
    -- with its key (announce_ready) and the worker moves its cursor back.
    -- With p_queues NULL, p_after's queues are the ones leased from (a
    -- worker serving every queue knows them from the notifications);
    -- p_after NULL: every queue holding ready jobs, from the head.
    -- Stage due scheduled jobs (any queue); other queues' workers are told.
    -- Only when an index probe finds one: most calls find none, and the
    -- probe costs a fraction of the staging statement.
    IF EXISTS (SELECT 1 FROM {schema}.jobs_live j WHERE j.stage = 'scheduled' AND j.run_at <= v_now) THEN
        WITH due AS MATERIALIZED (
            SELECT id FROM {schema}.jobs_live
            WHERE stage = 'scheduled' AND run_at <= v_now
            ORDER BY run_at
            LIMIT 1000
            FOR UPDATE SKIP LOCKED
        ), staged AS (
            UPDATE {schema}.jobs_live j SET status = 'queued'
            WHERE j.id = ANY (ARRAY(SELECT id FROM due))
            RETURNING j.queue, j.priority, j.run_at, j.id
        ), firsts AS (
            SELECT DISTINCT ON (s.queue) s.queue, s.priority, s.run_at, s.id
            FROM staged s ORDER BY s.queue, s.priority DESC, s.run_at, s.id
        )
        SELECT array_agg(f.queue),
               jsonb_object_agg(f.queue, jsonb_build_array(f.priority, f.run_at, f.id))
        INTO v_staged, v_staged_at
        FROM firsts f;
        IF v_staged IS NOT NULL THEN
            PERFORM pg_notify({channel}, 'j:' || s) FROM unnest(v_staged) s;
            PERFORM {schema}.announce_ready(e.key, (e.value ->> 0)::integer,
                                            (e.value ->> 1)::timestamptz, (e.value ->> 2)::bigint)
            FROM jsonb_each(v_staged_at) e;
        ELSE
            v_staged_at := '{}';
        END IF;
    END IF;

    SELECT coalesce(bool_or(s.lease_seconds IS NOT NULL), false),
           array_agg(s.name) FILTER (WHERE s.concurrency_limit IS NOT NULL OR s.rate_limit IS NOT NULL)
    INTO v_tuned, v_limited
    FROM {schema}.task_settings s;

    FOR v_queue IN
        SELECT q.name, q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL AS limited
        FROM {schema}.queues q
        WHERE NOT q.paused AND q.name = ANY (CASE
            WHEN p_queues IS NOT NULL THEN p_queues
            WHEN p_after IS NOT NULL THEN ARRAY(SELECT jsonb_object_keys(p_after))
            -- Every queue: only those holding ready jobs, found by a loose
            -- index scan of the ready index (one probe per such queue).
            ELSE ARRAY(
                WITH RECURSIVE ready(name) AS (
                    (SELECT j.queue FROM {schema}.jobs_live j
                     WHERE j.stage = 'queued' AND j.status = 'queued' ORDER BY j.queue LIMIT 1)
                    UNION ALL
                    SELECT (SELECT j.queue FROM {schema}.jobs_live j
                            WHERE j.queue > r.name AND j.stage = 'queued' AND j.status = 'queued'
                            ORDER BY j.queue LIMIT 1)
                    FROM ready r WHERE r.name IS NOT NULL
                )
                SELECT r.name FROM ready r WHERE r.name IS NOT NULL)
            END)
        ORDER BY random()   -- no queue is always served first
    LOOP
        EXIT WHEN v_left <= 0;
        v_cap := v_left;

        IF v_queue.limited THEN
            SELECT q.paused, q.concurrency_limit, q.rate_limit, q.rate_period INTO v_ctl
            FROM {schema}.queues q WHERE q.name = v_queue.name
            FOR UPDATE;
            CONTINUE WHEN v_ctl.paused;
            IF v_fixed IS NULL THEN
                v_now := clock_timestamp();  -- leases of this queue are ordered by the lock
            END IF;
            IF v_ctl.concurrency_limit IS NOT NULL THEN
                v_cap := least(v_cap, v_ctl.concurrency_limit - (
                    SELECT count(*) FROM {schema}.jobs_live j
                    WHERE j.queue = v_queue.name AND j.counted AND j.stage = 'queued'
                      AND j.status = 'running'
                      AND j.lease_expires_at > v_now)::integer);
            END IF;
            IF v_ctl.rate_limit IS NOT NULL THEN
                DELETE FROM {schema}.queue_lease_log l
                WHERE l.queue = v_queue.name AND l.leased_at <= v_now - v_ctl.rate_period;
                v_cap := least(v_cap, v_ctl.rate_limit - (
                    SELECT count(*) FROM {schema}.queue_lease_log l
                    WHERE l.queue = v_queue.name)::integer);
            END IF;
            CONTINUE WHEN v_cap <= 0;
        END IF;

        v_got := 0;
        IF v_limited IS NULL THEN
            -- The cursor, or the first job staged above if that is before it.
            v_cursor := p_after -> v_queue.name;
            IF jsonb_typeof(v_cursor) = 'array' AND jsonb_typeof(v_cursor -> 0) = 'number'
               AND jsonb_typeof(v_cursor -> 1) = 'string' AND jsonb_typeof(v_cursor -> 2) = 'number'
               AND (v_cursor ->> 0)::numeric BETWEEN -32768 AND 32767 THEN
                v_cp := (v_cursor ->> 0)::integer;
                v_cr := (v_cursor ->> 1)::timestamptz;
                v_ci := (v_cursor ->> 2)::bigint;
            ELSE
                v_cp := 32768;
                v_cr := NULL;
                v_ci := NULL;
            END IF;
            v_cursor := v_staged_at -> v_queue.name;
            IF v_cursor IS NOT NULL AND v_cp < 32768 AND (
                    -(v_cursor ->> 0)::integer, (v_cursor ->> 1)::timestamptz, (v_cursor ->> 2)::bigint)
                    <= (-v_cp, v_cr, v_ci) THEN
                v_cp := (v_cursor ->> 0)::integer;
                v_cr := (v_cursor ->> 1)::timestamptz;
                v_ci := (v_cursor ->> 2)::bigint - 1;
            END IF;
            RETURN QUERY
            WITH after_cursor AS MATERIALIZED (
                SELECT j.ctid AS tid FROM {schema}.jobs_live j
                WHERE j.queue = v_queue.name AND j.stage = 'queued' AND NOT j.serial_held
                  AND j.priority = v_cp AND (j.run_at, j.id) > (v_cr, v_ci)
                  AND j.status = 'queued' AND j.run_at <= v_now
                  AND (j.serial_key IS NULL OR (
                    coalesce((SELECT s.id FROM {schema}.jobs_live s
                              WHERE s.serial_key = j.serial_key
                                AND s.stage IN ('queued', 'scheduled')
                              ORDER BY s.serial_key, s.id LIMIT 1), j.id) >= j.id
                    AND (SELECT 1 FROM {schema}.jobs_live s
                         WHERE s.serial_key = j.serial_key AND s.stage = 'queued' AND s.status = 'running'
                         LIMIT 1) IS NULL))
                ORDER BY j.run_at, j.id
                LIMIT v_cap
                FOR UPDATE SKIP LOCKED
            ), below AS MATERIALIZED (
                SELECT j.ctid AS tid FROM {schema}.jobs_live j
                WHERE j.queue = v_queue.name AND j.stage = 'queued' AND NOT j.serial_held
                  AND j.priority < v_cp
                  AND j.status = 'queued' AND j.run_at <= v_now
                  AND (j.serial_key IS NULL OR (
                    coalesce((SELECT s.id FROM {schema}.jobs_live s
                              WHERE s.serial_key = j.serial_key
                                AND s.stage IN ('queued', 'scheduled')
                              ORDER BY s.serial_key, s.id LIMIT 1), j.id) >= j.id
                    AND (SELECT 1 FROM {schema}.jobs_live s
                         WHERE s.serial_key = j.serial_key AND s.stage = 'queued' AND s.status = 'running'
                         LIMIT 1) IS NULL))
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT v_cap
                FOR UPDATE SKIP LOCKED
            ), picked AS MATERIALIZED (
                -- MATERIALIZED keeps LIMIT + SKIP LOCKED in one scan; inlined, the
                -- planner may re-run the subquery per joined row.
                -- The row versions this statement locked, by ctid: nobody else can
                -- change them until this transaction ends, so the update below
                -- fetches them directly (a TID scan) instead of descending the
                -- primary key once per job. A version committed after this
                -- statement's snapshot (watch_job's notify_finish, set meanwhile)
                -- is invisible to that scan: its job stays queued for the next lease.
                -- Two ranges of the ready index in lease order, each scanned from
                -- its start key: the rest of the cursor's priority after the
                -- cursor, then the lower priorities (without a cursor: all of it).
                -- A CTE is read on demand: the second only when the first falls short.
                SELECT c.tid FROM (SELECT a.tid FROM after_cursor a UNION ALL SELECT b.tid FROM below b) c
                LIMIT v_cap
            )
            , leased AS (
            UPDATE {schema}.jobs_live j
            SET status = 'running',
                -- Only jobs of limited queues are counted (indexed); the
                -- others keep the flag, so their lease stays a HOT update.
                counted = j.counted OR v_queue.limited,
                attempts = j.attempts + 1,
                attempt_id = nextval('{schema}.attempt_id_seq'),
                worker_id = p_worker_id,
                attempt_started_at = v_now,
                lease_expires_at = v_now + make_interval(secs => coalesce(v_lease,
                    CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END,
                    j.lease_seconds))
            -- = ANY(ARRAY(...)): a TID scan of exactly those versions; a join
            -- lets the planner hash the whole table instead.
            WHERE j.ctid = ANY (ARRAY(SELECT tid FROM picked))
            RETURNING j.id, j.attempt_id, j.attempts, j.task, j.queue, j.payload, j.lease_expires_at,
                      coalesce(v_lease, CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END, j.lease_seconds) AS lease_seconds, j.priority, j.run_at, j.trace_context,
                      j.tags, j.meta, j.group_key
            )
            SELECT l.id, l.attempt_id, l.attempts, l.task, l.queue, l.payload, l.lease_expires_at,
                   l.lease_seconds, l.run_at, l.trace_context, l.tags, l.meta, l.group_key,
                   l.priority, true
            FROM leased l
            ORDER BY l.priority DESC, l.run_at, l.id;  -- the batch in DESIGN order
            GET DIAGNOSTICS v_got = ROW_COUNT;
        ELSE
            -- Each round drops only jobs of tasks that just reached their
            -- limit (and are blocked from then on), so this ends after at
            -- most one round per limited task.
            LOOP
                SELECT array_agg(p.id ORDER BY p.ord), array_agg(p.task ORDER BY p.ord)
                INTO v_ids, v_tasks
                FROM (
                    SELECT j.id, j.task, row_number() OVER () AS ord FROM (
                        SELECT j.id, j.task FROM {schema}.jobs_live j
                        WHERE j.queue = v_queue.name AND j.stage = 'queued' AND j.status = 'queued' AND NOT j.serial_held
                          AND j.run_at <= v_now
                          AND j.task <> ALL (v_blocked)
                          AND (j.serial_key IS NULL OR (
                            coalesce((SELECT s.id FROM {schema}.jobs_live s
                                      WHERE s.serial_key = j.serial_key
                                        AND s.stage IN ('queued', 'scheduled')
                                      ORDER BY s.serial_key, s.id LIMIT 1), j.id) >= j.id
                            AND (SELECT 1 FROM {schema}.jobs_live s
                                 WHERE s.serial_key = j.serial_key AND s.stage = 'queued' AND s.status = 'running'
                                 LIMIT 1) IS NULL))
                        ORDER BY j.priority DESC, j.run_at, j.id
                        LIMIT v_cap
                        FOR UPDATE SKIP LOCKED
                    ) j
                ) p;
                EXIT WHEN v_ids IS NULL;

                -- Count the limited tasks met for the first time in this call.
                FOR v_t IN
                    SELECT DISTINCT t FROM unnest(v_tasks) t
                    WHERE t = ANY (v_limited) AND NOT v_caps ? t
                    ORDER BY t
                LOOP
                    SELECT s.concurrency_limit, s.rate_limit, s.rate_period INTO v_tctl
                    FROM {schema}.task_settings s WHERE s.name = v_t
                    FOR UPDATE SKIP LOCKED;
                    IF NOT FOUND THEN
                        v_blocked := v_blocked || v_t;
                        v_caps := v_caps || jsonb_build_object(v_t, 0);
                        CONTINUE;
                    END IF;
                    IF v_fixed IS NULL THEN
                        v_now := clock_timestamp();
                    END IF;
                    v_n := v_limit;
                    IF v_tctl.concurrency_limit IS NOT NULL THEN
                        v_n := least(v_n, v_tctl.concurrency_limit - (
                            SELECT count(*) FROM {schema}.jobs_live j
                            WHERE j.task = v_t AND j.counted AND j.stage = 'queued'
                              AND j.status = 'running'
                              AND j.lease_expires_at > v_now)::integer);
                    END IF;
                    IF v_tctl.rate_limit IS NOT NULL THEN
                        DELETE FROM {schema}.task_lease_log l
                        WHERE l.task = v_t AND l.leased_at <= v_now - v_tctl.rate_period;
                        v_n := least(v_n, v_tctl.rate_limit - (
                            SELECT count(*) FROM {schema}.task_lease_log l
                            WHERE l.task = v_t)::integer);
                    END IF;
                    v_caps := v_caps || jsonb_build_object(v_t, greatest(v_n, 0));
                END LOOP;

                -- Keep every job of an unlimited task, and the first free-slot
                -- many of each limited one, in lease order.
                SELECT array_agg(x.id ORDER BY x.ord) INTO v_take
                FROM (
                    SELECT u.id, u.ord, u.task,
                           row_number() OVER (PARTITION BY u.task ORDER BY u.ord) AS nth
                    FROM unnest(v_ids, v_tasks) WITH ORDINALITY AS u(id, task, ord)
                ) x
                WHERE NOT v_caps ? x.task OR x.nth <= (v_caps ->> x.task)::integer;

                IF v_take IS NOT NULL THEN
                    RETURN QUERY
                    WITH leased AS (
                    UPDATE {schema}.jobs_live j
                    SET status = 'running',
                        counted = j.counted OR v_queue.limited OR j.task = ANY (v_limited),
                        attempts = j.attempts + 1,
                        attempt_id = nextval('{schema}.attempt_id_seq'),
                        worker_id = p_worker_id,
                        attempt_started_at = v_now,
                        lease_expires_at = v_now + make_interval(secs => coalesce(v_lease,
                            CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END,
                    j.lease_seconds))
                    WHERE j.id = ANY (v_take)
                    RETURNING j.id, j.attempt_id, j.attempts, j.task, j.queue, j.payload,
                              j.lease_expires_at,
                              coalesce(v_lease, CASE WHEN v_tuned THEN (SELECT s.lease_seconds FROM {schema}.task_settings s WHERE s.name = j.task) END, j.lease_seconds) AS lease_seconds,
                              j.priority, j.run_at, j.trace_context, j.tags, j.meta, j.group_key
                    )
                    -- (ordered false: task limits skip jobs, so no cursor may pass them)
                    SELECT l.id, l.attempt_id, l.attempts, l.task, l.queue, l.payload,
                           l.lease_expires_at, l.lease_seconds, l.run_at, l.trace_context,
                           l.tags, l.meta, l.group_key, l.priority, false
                    FROM leased l
                    ORDER BY l.priority DESC, l.run_at, l.id;
                    GET DIAGNOSTICS v_n = ROW_COUNT;
                    v_got := v_got + v_n;
                    v_cap := v_cap - v_n;

                    -- Use up the slots of the limited tasks just leased.
                    FOR v_t, v_n IN
                        SELECT u.task, count(*)::integer FROM unnest(v_ids, v_tasks) AS u(id, task)
                        WHERE u.id = ANY (v_take) AND v_caps ? u.task
                        GROUP BY u.task
                    LOOP
                        v_caps := v_caps || jsonb_build_object(v_t, (v_caps ->> v_t)::integer - v_n);
                        IF EXISTS (SELECT 1 FROM {schema}.task_settings s
                                   WHERE s.name = v_t AND s.rate_limit IS NOT NULL) THEN
                            INSERT INTO {schema}.task_lease_log (task, leased_at)
                            SELECT v_t, v_now FROM generate_series(1, v_n);
                        END IF;
                    END LOOP;
                END IF;
                SELECT coalesce(array_agg(e.key), '{}') INTO v_blocked
                FROM jsonb_each_text(v_caps) e WHERE e.value::integer <= 0;

                -- Done unless jobs were dropped for a limit and room is left.
                EXIT WHEN coalesce(cardinality(v_take), 0) = cardinality(v_ids) OR v_cap <= 0;
            END LOOP;
        END IF;

        IF v_queue.limited AND v_got > 0 THEN
            IF v_ctl.rate_limit IS NOT NULL THEN
                INSERT INTO {schema}.queue_lease_log (queue, leased_at)
                SELECT v_queue.name, v_now FROM generate_series(1, v_got);
            END IF;
        END IF;
        v_left := v_left - v_got;
    END LOOP;
END;
$$;

CREATE FUNCTION {schema}.lease_jobs_observed(p_queues text[], p_worker_id text, p_limit integer, p_lease_seconds integer DEFAULT NULL::integer, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(job_id bigint, attempt_id bigint, attempt integer, task text, queue text, payload jsonb, lease_expires_at timestamp with time zone, lease_seconds integer, wait_seconds double precision, trace_context jsonb)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT l.job_id, l.attempt_id, l.attempt, l.task, l.queue, l.payload, l.lease_expires_at,
           l.lease_seconds,
           extract(epoch FROM l.lease_expires_at - l.run_at)::double precision - l.lease_seconds,
           l.trace_context
    FROM {schema}.lease_jobs(p_queues, p_worker_id, p_limit, p_lease_seconds, p_now) AS l
$$;

CREATE FUNCTION {schema}.lease(queues text[], worker_id text, max integer DEFAULT 1) RETURNS TABLE(job_id bigint, attempt_id bigint, attempt integer, task text, queue text, payload jsonb, lease_expires_at timestamp with time zone, lease_seconds integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF worker_id IS NULL OR btrim(worker_id) = '' OR length(worker_id) > 255
       OR worker_id ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgqueue: worker_id must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF max IS NULL OR max NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgqueue: max must be from 1 to 1000, got %', coalesce(max::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT l.job_id, l.attempt_id, l.attempt, l.task, l.queue, l.payload, l.lease_expires_at,
           l.lease_seconds
    FROM {schema}.lease_jobs(queues, worker_id, max) AS l;
END;
$$;

CREATE FUNCTION {schema}.extend_jobs(p_job_ids bigint[], p_attempt_ids bigint[], p_seconds double precision[], p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_progress jsonb[] DEFAULT NULL::jsonb[]) RETURNS TABLE(job_id bigint, cancel_requested boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    v_n integer;
BEGIN
    -- EXECUTE: planned for the arrays at hand on every call, as the
    -- statement was before; a cached generic plan joins them quadratically.
    -- A NULL seconds with a progress value (context.set_progress) stores the
    -- progress only, fenced by the attempt id alone: the last value of an
    -- attempt is written even when its completion committed first.
    RETURN QUERY EXECUTE $q$
UPDATE {schema}.jobs_live j
SET lease_expires_at = CASE WHEN e.seconds IS NULL THEN j.lease_expires_at
                       ELSE CASE WHEN $4 IS NULL THEN now() ELSE coalesce({schema}.trusted_clock($4), now()) END
                       + make_interval(secs => CASE WHEN e.seconds BETWEEN 1 AND 31536000
                                                    THEN e.seconds
                                                    WHEN e.seconds > 31536000 THEN 31536000
                                                    ELSE 1 END) END,
    progress = CASE WHEN jsonb_typeof(e.progress) = 'number'
                         OR (jsonb_typeof(e.progress) = 'object'
                             AND octet_length(e.progress::text) <= 4096)
                    THEN e.progress ELSE j.progress END
FROM unnest($1, $2, $3, coalesce($5, array_fill(NULL::jsonb, ARRAY[cardinality($1)])))
    AS e(job_id, attempt_id, seconds, progress)
WHERE j.id = ANY ($1)
  AND j.id = e.job_id AND j.attempt_id = e.attempt_id
  AND (e.seconds IS NULL OR j.stage = 'queued' AND j.status = 'running')
RETURNING j.id, j.cancel_requested
$q$ USING p_job_ids, p_attempt_ids, p_seconds, p_now, p_progress;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF p_progress IS NOT NULL AND v_n < cardinality(p_job_ids) THEN
        -- The last progress of attempts whose job finished meanwhile.
        RETURN QUERY EXECUTE $q$
UPDATE {schema}.jobs j
SET progress = e.progress
FROM unnest($1, $2, $3, $4) AS e(job_id, attempt_id, seconds, progress)
WHERE j.status IN ('succeeded', 'dead', 'cancelled') AND j.id = ANY ($1)
  AND j.id = e.job_id AND j.attempt_id = e.attempt_id AND e.seconds IS NULL
  AND (jsonb_typeof(e.progress) = 'number'
       OR (jsonb_typeof(e.progress) = 'object' AND octet_length(e.progress::text) <= 4096))
RETURNING j.id, j.cancel_requested
$q$ USING p_job_ids, p_attempt_ids, p_seconds, p_progress;
    END IF;
END;
$_$;

CREATE FUNCTION {schema}.extend(job_id bigint, attempt_id bigint, seconds integer) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT count(*) > 0 FROM {schema}.extend_jobs(ARRAY[job_id], ARRAY[attempt_id],
                                                 ARRAY[seconds::float8])
$$;

CREATE FUNCTION {schema}.watch_job(p_job_id bigint) RETURNS text
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
UPDATE {schema}.jobs_live SET notify_finish = true
WHERE id = p_job_id AND status IN ('queued', 'scheduled', 'running', 'waiting') AND NOT notify_finish
RETURNING status::text;
$$;

CREATE FUNCTION {schema}.job_status(job_id bigint) RETURNS TABLE(status text, attempts integer, max_attempts integer, cancel_requested boolean, run_at timestamp with time zone, finished_at timestamp with time zone, result jsonb, last_error text)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    (SELECT {schema}.visible_status(j.status, j.run_at), j.attempts, j.max_attempts,
            j.cancel_requested, j.run_at, j.finished_at, j.result, j.last_error
     FROM {schema}.jobs j WHERE j.id = job_status.job_id
     UNION ALL
     SELECT a.status::text, a.attempts, a.max_attempts, a.cancel_requested, a.run_at,
            a.finished_at, a.result, a.last_error
     FROM {schema}.jobs_archive a WHERE a.id = job_status.job_id)
    LIMIT 1
$$;

CREATE FUNCTION {schema}.queue_oldest_ready(p_queue text, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    AS $$
    WITH RECURSIVE levels AS (
        SELECT h.held, (SELECT j.priority FROM {schema}.jobs_live j
                        WHERE j.queue = p_queue AND j.stage = 'queued' AND j.status = 'queued' AND j.serial_held = h.held
                        ORDER BY j.priority DESC LIMIT 1) AS priority
        FROM (VALUES (false), (true)) h(held)
        UNION ALL
        SELECT l.held, (SELECT j.priority FROM {schema}.jobs_live j
                        WHERE j.queue = p_queue AND j.stage = 'queued' AND j.status = 'queued' AND j.serial_held = l.held
                          AND j.priority < l.priority
                        ORDER BY j.priority DESC LIMIT 1)
        FROM levels l WHERE l.priority IS NOT NULL
    )
    SELECT least(
        (SELECT min((SELECT j.run_at FROM {schema}.jobs_live j
                     WHERE j.queue = p_queue AND j.stage = 'queued' AND j.status = 'queued' AND j.serial_held = l.held
                       AND j.priority = l.priority
                     ORDER BY j.run_at LIMIT 1))
         FROM levels l WHERE l.priority IS NOT NULL),
        (SELECT min(j.run_at) FROM {schema}.jobs_live j
         WHERE j.stage = 'scheduled' AND j.run_at <= coalesce(p_now, now()) AND j.queue = p_queue))
$$;

-- =====================================================================================
-- Functions: complete (ack, fail, hand back)
-- =====================================================================================

CREATE FUNCTION {schema}.finish_jobs(p_ids bigint[], p_from {schema}.job_status[], p_to {schema}.job_status[], p_now timestamp with time zone, p_attempt_ids bigint[] DEFAULT NULL::bigint[], p_errors text[] DEFAULT NULL::text[], p_results jsonb[] DEFAULT NULL::jsonb[], p_records boolean DEFAULT false) RETURNS TABLE(id bigint, status {schema}.job_status, queue text, notify_finish boolean, attempt_id bigint, attempts integer, worker_id text, attempt_started_at timestamp with time zone, finished_at timestamp with time zone, priority smallint, run_at timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    SET jit TO 'off'
    AS $$
-- The one move of a finished job: its row leaves jobs_live (DELETE) and is
-- written, once, into its status's partition (INSERT into jobs, routed by
-- status and finish time). Explicitly, not as an UPDATE that changes the
-- partition: a transaction waiting for the row's lock (a late ack, the
-- reaper, a heartbeat, a lease, a cancel) then finds it deleted and skips
-- it, as it always did; after a cross-partition UPDATE it would fail
-- instead ("tuple ... was already moved to another partition").
-- Per job (p_ids, with p_to, p_errors, p_results, p_attempt_ids): only
-- while its status is one of p_from (and its attempt is p_attempt_ids',
-- when given). 'succeeded' ends 'cancelled' for a job whose cancel was
-- requested while it ran (the ack's rule: no result, its last error kept).
-- p_errors: the new last_error (NULL keeps it). p_records: rows elsewhere
-- now belong to these jobs (has_records). Returns what the callers tell
-- (notifications, attempt records) of each moved job.
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH gone AS (
        DELETE FROM {schema}.jobs_live j
        USING unnest(p_ids, p_to,
                     coalesce(p_attempt_ids, array_fill(NULL::bigint, ARRAY[cardinality(p_ids)])),
                     coalesce(p_errors, array_fill(NULL::text, ARRAY[cardinality(p_ids)])),
                     coalesce(p_results, array_fill(NULL::jsonb, ARRAY[cardinality(p_ids)])))
            AS d(id, to_status, attempt_id, error, result)
        -- (Joined on the id alone: each job of the array is one probe of
        -- jobs_live's primary key.)
        WHERE j.id = d.id AND j.status = ANY (p_from)
          AND (d.attempt_id IS NULL OR j.attempt_id = d.attempt_id)
        RETURNING j.*, d.to_status = 'succeeded' AND j.cancel_requested AS cancelled_running,
                  d.to_status, d.error, d.result AS new_result
    )
    INSERT INTO {schema}.jobs AS n (
        id, run_at, created_at, priority, max_attempts, lease_seconds, backoff_base,
        backoff_factor, backoff_max, backoff_jitter, cancel_requested, notify_finish,
        serial_held, queue, task, payload, dedup_key, serial_key, trace_context, tags, meta,
        attempt_id, attempt_started_at, lease_expires_at, finished_at, status, attempts,
        counted, has_dependents, has_records, snoozes, worker_id, last_error, result, progress)
    SELECT g.id, g.run_at, g.created_at, g.priority, g.max_attempts, g.lease_seconds,
           g.backoff_base, g.backoff_factor, g.backoff_max, g.backoff_jitter,
           g.cancel_requested, g.notify_finish, g.serial_held, g.queue, g.task, g.payload,
           g.dedup_key, g.serial_key, g.trace_context, g.tags, g.meta,
           g.attempt_id, g.attempt_started_at, NULL, p_now,
           CASE WHEN g.cancelled_running THEN 'cancelled' ELSE g.to_status END::{schema}.job_status,
           g.attempts, g.counted, g.has_dependents,
           CASE WHEN p_records OR g.cancelled_running THEN true ELSE g.has_records END,
           g.snoozes, g.worker_id,
           CASE WHEN g.cancelled_running THEN g.last_error ELSE coalesce(g.error, g.last_error) END,
           CASE WHEN g.cancelled_running THEN NULL ELSE g.new_result END,
           g.progress
    FROM gone g
    RETURNING n.id, n.status, n.queue, n.notify_finish, n.attempt_id, n.attempts, n.worker_id,
              n.attempt_started_at, n.finished_at, n.priority, n.run_at;
END;
$$;

CREATE FUNCTION {schema}.ack_jobs(p_job_ids bigint[], p_attempt_ids bigint[], p_results jsonb[], p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_result_errors text[] DEFAULT NULL::text[]) RETURNS TABLE(job_id bigint, attempt_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := CASE WHEN p_now IS NULL THEN now()
                                  ELSE coalesce({schema}.trusted_clock(p_now), now()) END;
BEGIN
    RETURN QUERY
    -- finish_jobs' move, written out here: the ack is the hot path, and
    -- one statement saves the copies of a nested function's result
    -- (tests/test_storage_layout.py checks that both keep every column).
    -- A job that is no longer this attempt's (reaped, re-leased) stays.
    WITH gone AS (
        DELETE FROM {schema}.jobs_live j
        USING unnest(p_job_ids, p_attempt_ids, p_result_errors, p_results)
            AS d(id, attempt_id, error, result)
        WHERE j.id = d.id AND j.status = 'running' AND j.attempt_id = d.attempt_id
        RETURNING j.*, j.cancel_requested AS cancelled_running, d.error, d.result AS new_result
    ), finished AS (
    -- Moved to jobs_succeeded (cancelled when a cancel was requested
    -- while it ran) if the attempt still holds its lease. A result that
    -- could not be stored: result NULL, the reason in last_error.
    INSERT INTO {schema}.jobs AS n (
        id, run_at, created_at, priority, max_attempts, lease_seconds, backoff_base,
        backoff_factor, backoff_max, backoff_jitter, cancel_requested, notify_finish,
        serial_held, queue, task, payload, dedup_key, serial_key, trace_context, tags, meta,
        attempt_id, attempt_started_at, lease_expires_at, finished_at, status, attempts,
        counted, has_dependents, has_records, snoozes, worker_id, last_error, result, progress)
    SELECT g.id, g.run_at, g.created_at, g.priority, g.max_attempts, g.lease_seconds,
           g.backoff_base, g.backoff_factor, g.backoff_max, g.backoff_jitter,
           g.cancel_requested, g.notify_finish, g.serial_held, g.queue, g.task, g.payload,
           g.dedup_key, g.serial_key, g.trace_context, g.tags, g.meta,
           g.attempt_id, g.attempt_started_at, NULL, v_now,
           CASE WHEN g.cancelled_running THEN 'cancelled' ELSE 'succeeded' END::{schema}.job_status,
           g.attempts, g.counted, g.has_dependents,
           g.has_records OR g.cancelled_running,
           g.snoozes, g.worker_id,
           CASE WHEN g.cancelled_running THEN g.last_error ELSE coalesce(g.error, g.last_error) END,
           CASE WHEN g.cancelled_running THEN NULL ELSE g.new_result END,
           g.progress
    FROM gone g
    RETURNING n.id, n.status, n.notify_finish, n.attempt_id, n.attempts, n.worker_id,
              n.attempt_started_at, n.finished_at, n.queue
    ), cancelled_attempts AS (
        INSERT INTO {schema}.job_attempts
            (id, job_id, attempt, outcome, started_at, finished_at, worker_id, error_code, error_message)
        SELECT f.attempt_id, f.id, f.attempts, 'cancelled', f.attempt_started_at, f.finished_at,
               f.worker_id, 'cancelled', 'cancelled while running'
        FROM finished f WHERE f.status = 'cancelled'
    ), notified AS (
        -- Finished: tell result() waiters. A freed slot of a queue with a
        -- concurrency limit: its workers recompute when to wake.
        SELECT count(pg_notify({channel}, n.payload)) AS n
        FROM (SELECT {schema}.finished_payload(f.id, f.status, f.queue) AS payload
              FROM finished f WHERE f.notify_finish
              UNION ALL
              SELECT 'w:' || q.queue
              FROM (SELECT DISTINCT f.queue FROM finished f) q
              WHERE EXISTS (SELECT 1 FROM {schema}.queues l WHERE l.concurrency_limit IS NOT NULL)
                AND EXISTS (SELECT 1 FROM {schema}.queues l
                            WHERE l.name = q.queue AND l.concurrency_limit IS NOT NULL)) n
    )
    SELECT f.id, f.attempt_id FROM finished f CROSS JOIN notified;
END;
$$;


CREATE FUNCTION {schema}.ack(job_id bigint, attempt_id bigint, result jsonb DEFAULT NULL::jsonb) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT count(*) > 0 FROM {schema}.ack_jobs(ARRAY[job_id], ARRAY[attempt_id], ARRAY[result])
$$;

CREATE FUNCTION {schema}.ack_many(job_ids bigint[], attempt_ids bigint[]) RETURNS TABLE(job_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF cardinality(job_ids) IS DISTINCT FROM cardinality(attempt_ids) THEN
        RAISE EXCEPTION 'pgqueue: job_ids and attempt_ids must have the same length'
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY SELECT a.job_id FROM {schema}.ack_jobs(job_ids, attempt_ids, NULL) a;
END;
$$;

CREATE FUNCTION {schema}.fail_jobs(p_job_ids bigint[], p_attempt_ids bigint[], p_outcomes text[], p_retry_ats timestamp with time zone[], p_retry_delays double precision[], p_permanent boolean[], p_error_codes text[], p_error_messages text[], p_tracebacks text[], p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_graces double precision[] DEFAULT NULL::double precision[]) RETURNS TABLE(job_id bigint, attempt_id bigint, status text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
    -- EXECUTE: planned for the arrays at hand on every call, as the
    -- statement was before; a cached generic plan joins them quadratically.
    RETURN QUERY EXECUTE $q$
WITH clock AS MATERIALIZED (
    SELECT CASE WHEN $10 IS NULL THEN now() ELSE coalesce({schema}.trusted_clock($10), now()) END AS now
), failed AS (
    SELECT f.job_id, f.attempt_id,
           CASE WHEN f.outcome IN ('failed', 'retry', 'timeout', 'cancelled', 'lease_expired', 'snoozed', 'slept')
                THEN f.outcome ELSE 'failed' END::{schema}.attempt_outcome AS outcome,
           f.retry_at, f.retry_delay, coalesce(f.permanent, false) AS permanent,
           coalesce(f.error_code, 'error') AS error_code, f.error_message, f.traceback,
           -- (bounded: a year at most)
           CASE WHEN f.grace >= 0 THEN least(f.grace, 31536000) END AS grace
    FROM unnest($1, $2, $3, $4, $5, $6,
                $7, $8, $9, $11)
        AS f(job_id, attempt_id, outcome, retry_at, retry_delay, permanent, error_code,
             error_message, traceback, grace)
    WHERE f.job_id IS NOT NULL
), decided AS (
    SELECT f.*, j.attempts, j.attempt_started_at, j.worker_id, j.notify_finish,
           CASE WHEN j.cancel_requested THEN 'cancelled'
                -- Snoozed (or slept, context.sleep): queued again at now +
                -- delay (or retry_at), the attempt not counted.
                WHEN f.outcome IN ('snoozed', 'slept') THEN 'snooze'
                -- A task this worker does not know: handed back (not counted)
                -- within the grace period, or while a live worker knows it.
                WHEN f.grace IS NOT NULL AND (
                    j.created_at > c.now - make_interval(secs => f.grace) OR k.known)
                    THEN 'defer'
                WHEN f.permanent OR (m.max_attempts > 0 AND j.attempts >= m.max_attempts) THEN 'dead'
                ELSE 'retry' END AS next,
           CASE WHEN f.grace IS NOT NULL THEN
               -- Handed back: soon when a live worker knows the task, else
               -- later the longer the job has waited (at most a minute).
               c.now + make_interval(secs => (0.75 + 0.5 * random())
                   * CASE WHEN k.known THEN 0.5
                          ELSE least(60.0, greatest(1.0, extract(epoch FROM
                                   c.now - j.created_at) / 10.0))
                     END)
           ELSE least(greatest(coalesce(f.retry_at, c.now + coalesce(
               CASE WHEN f.retry_delay IS NOT NULL  -- (greatest() would turn NULL into 0)
                    THEN make_interval(secs => CASE WHEN f.retry_delay BETWEEN 0 AND 31536000
                                                    THEN f.retry_delay
                                                    WHEN f.retry_delay > 0 THEN 31536000
                                                    ELSE 0 END) END,
               {schema}.retry_delay(j.attempts, m.backoff_base, m.backoff_factor,
                                    m.backoff_max, m.backoff_jitter))), '1970-01-01 00:00:00+00'),
                 '2499-12-31 00:00:00+00') END AS next_run_at
    FROM failed f
    CROSS JOIN clock c
    JOIN {schema}.jobs_live j ON j.id = f.job_id AND j.attempt_id = f.attempt_id AND j.stage = 'queued' AND j.status = 'running'
    -- An operator's live max_attempts/backoff for the task (pgqueue task set) wins.
    CROSS JOIN LATERAL (
        SELECT coalesce(s.max_attempts, j.max_attempts) AS max_attempts,
               coalesce(s.backoff[1], j.backoff_base) AS backoff_base,
               coalesce(s.backoff[2], j.backoff_factor) AS backoff_factor,
               coalesce(s.backoff[3], j.backoff_max) AS backoff_max,
               coalesce(s.backoff[4], j.backoff_jitter) AS backoff_jitter
        FROM (SELECT 1) one
        LEFT JOIN {schema}.task_settings s ON s.name = j.task
    ) m
    -- Only for unknown tasks: whether a live worker has the task.
    CROSS JOIN LATERAL (
        SELECT f.grace IS NOT NULL AND EXISTS (
                   SELECT 1 FROM {schema}.workers w
                   WHERE j.task = ANY (w.tasks) AND w.lost_at IS NULL
                     AND w.last_heartbeat_at > now() - interval '1 minute') AS known
    ) k
    WHERE j.id = ANY ($1)
    FOR UPDATE OF j
), again AS (
    -- Retried, handed back or snoozed: queued again in place.
    UPDATE {schema}.jobs_live j
    SET status = CASE WHEN d.next_run_at > (SELECT now FROM clock)
                      THEN 'scheduled' ELSE 'queued' END::{schema}.job_status,
        run_at = d.next_run_at,
        attempts = CASE WHEN d.next IN ('defer', 'snooze') THEN j.attempts - 1 ELSE j.attempts END,
        -- NULL until the first snooze, like has_dependents until the first
        -- dependent: a job that uses neither writes no bytes for them.
        snoozes = CASE WHEN d.next = 'snooze' AND d.outcome = 'snoozed'
                       THEN coalesce(j.snoozes, 0) + 1 ELSE j.snoozes END,
        lease_expires_at = NULL,
        last_error = CASE WHEN d.next = 'snooze' THEN j.last_error
                          ELSE left(d.error_code || ': ' || coalesce(d.error_message, ''), 2000) END,
        has_records = true  -- the attempt's row below
    FROM decided d
    WHERE d.next IN ('retry', 'defer', 'snooze') AND j.id = ANY ($1) AND j.id = d.job_id
    RETURNING j.id, j.attempt_id, j.status, j.queue, j.priority, j.run_at
), ended AS (
    -- Dead or cancelled: moved to its partition (the rows decided locked).
    SELECT e.id, e.attempt_id, e.status, e.queue, e.priority, e.run_at
    FROM (SELECT array_agg(d.job_id) AS ids, array_agg(d.next::{schema}.job_status) AS tos,
                 array_agg(left(d.error_code || ': ' || coalesce(d.error_message, ''), 2000)) AS errors
          FROM decided d WHERE d.next IN ('dead', 'cancelled')) x
    CROSS JOIN LATERAL {schema}.finish_jobs(x.ids, '{running}', x.tos, (SELECT now FROM clock),
                                           NULL, x.errors, NULL, true) e
    WHERE x.ids IS NOT NULL
), updated AS (
    SELECT * FROM again UNION ALL SELECT * FROM ended
), announced AS (
    SELECT count({schema}.announce_ready(f.queue, f.priority, f.run_at, f.id)) AS n
    FROM (SELECT DISTINCT ON (u.queue) u.queue, u.priority, u.run_at, u.id
          FROM updated u WHERE u.status = 'queued'
          ORDER BY u.queue, u.priority DESC, u.run_at, u.id) f
), attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id,
         error_code, error_message, traceback)
    SELECT d.attempt_id, d.job_id, d.attempts,
           CASE WHEN d.next = 'cancelled' THEN 'cancelled'
                WHEN d.next = 'defer' THEN 'released' ELSE d.outcome END::{schema}.attempt_outcome,
           d.attempt_started_at, (SELECT now FROM clock), d.worker_id,
           CASE WHEN d.next = 'snooze' THEN NULL ELSE d.error_code END,
           d.error_message,
           CASE WHEN d.next = 'snooze' THEN NULL ELSE d.traceback END
    FROM decided d
), notified AS (
    -- Finished: tell result() waiters. Retried now: new ready work; retried
    -- later or a freed slot: the queue's workers recompute when to wake.
    SELECT count(pg_notify({channel}, n.payload)) AS n
    FROM (SELECT {schema}.finished_payload(u.id, u.status, u.queue) AS payload
          FROM decided d JOIN updated u ON u.id = d.job_id
          WHERE d.notify_finish AND d.next NOT IN ('retry', 'defer', 'snooze')
          UNION
          SELECT DISTINCT 'j:' || u.queue FROM updated u WHERE u.status = 'queued'
          UNION
          SELECT DISTINCT 'w:' || u.queue FROM updated u
          WHERE u.status = 'scheduled'
             OR u.queue IN (SELECT name FROM {schema}.queues WHERE concurrency_limit IS NOT NULL)) n
)
SELECT u.id, u.attempt_id, u.status::text FROM updated u CROSS JOIN notified CROSS JOIN announced
$q$ USING p_job_ids, p_attempt_ids, p_outcomes, p_retry_ats, p_retry_delays, p_permanent, p_error_codes, p_error_messages, p_tracebacks, p_now, p_graces;
END;
$_$;

CREATE FUNCTION {schema}.fail(job_id bigint, attempt_id bigint, error text, retry_at timestamp with time zone DEFAULT NULL::timestamp with time zone, permanent boolean DEFAULT false) RETURNS text
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT f.status FROM {schema}.fail_jobs(
        ARRAY[job_id], ARRAY[attempt_id], ARRAY['failed'], ARRAY[retry_at], ARRAY[NULL::float8],
        ARRAY[coalesce(permanent, false)], ARRAY['error'], ARRAY[left(coalesce(error, ''), 4000)],
        ARRAY[NULL::text]) f
$$;

CREATE FUNCTION {schema}.release_jobs(p_job_ids bigint[], p_attempt_ids bigint[], p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(job_id bigint, attempt_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
    -- EXECUTE: planned for the arrays at hand on every call, as the
    -- statement was before; a cached generic plan joins them quadratically.
    RETURN QUERY EXECUTE $q$
WITH clock AS MATERIALIZED (
    SELECT CASE WHEN $3 IS NULL THEN now() ELSE coalesce({schema}.trusted_clock($3), now()) END AS now
), released AS (
    SELECT * FROM unnest($1, $2) AS r(job_id, attempt_id)
), old AS (
    SELECT j.id, j.attempt_id, j.attempts, j.attempt_started_at, j.worker_id, j.cancel_requested
    FROM {schema}.jobs_live j JOIN released r ON j.id = r.job_id AND j.attempt_id = r.attempt_id
    WHERE j.id = ANY ($1) AND j.stage = 'queued' AND j.status = 'running'
    FOR UPDATE OF j
), again AS (
    -- Back to queued at its place, the attempt not counted.
    UPDATE {schema}.jobs_live j
    SET status = 'queued', attempts = j.attempts - 1, lease_expires_at = NULL,
        has_records = true  -- the attempt's row below
    FROM old o
    WHERE NOT o.cancel_requested AND j.id = ANY ($1) AND j.id = o.id
    RETURNING j.id, j.attempt_id, j.status, j.queue, j.priority, j.run_at
), ended AS (
    -- A cancel was requested: it ends cancelled.
    SELECT e.id, e.attempt_id, e.status, e.queue, e.priority, e.run_at
    FROM (SELECT array_agg(o.id) AS ids FROM old o WHERE o.cancel_requested) x
    CROSS JOIN LATERAL {schema}.finish_jobs(
        x.ids, '{running}', array_fill('cancelled'::{schema}.job_status, ARRAY[cardinality(x.ids)]),
        (SELECT now FROM clock), NULL, NULL, NULL, true) e
    WHERE x.ids IS NOT NULL
), updated AS (
    SELECT * FROM again UNION ALL SELECT * FROM ended
), announced AS (
    SELECT count({schema}.announce_ready(f.queue, f.priority, f.run_at, f.id)) AS n
    FROM (SELECT DISTINCT ON (u.queue) u.queue, u.priority, u.run_at, u.id
          FROM updated u WHERE u.status = 'queued'
          ORDER BY u.queue, u.priority DESC, u.run_at, u.id) f
), attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id)
    SELECT o.attempt_id, o.id, o.attempts,
           CASE WHEN o.cancel_requested THEN 'cancelled' ELSE 'released' END::{schema}.attempt_outcome,
           o.attempt_started_at, (SELECT now FROM clock), o.worker_id
    FROM old o
), notified AS (
    SELECT count(pg_notify({channel}, 'j:' || q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM updated WHERE status = 'queued') q
)
SELECT u.id, u.attempt_id FROM updated u CROSS JOIN notified CROSS JOIN announced
$q$ USING p_job_ids, p_attempt_ids, p_now;
END;
$_$;

CREATE FUNCTION {schema}.nack(job_id bigint, attempt_id bigint) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT count(*) > 0 FROM {schema}.release_jobs(ARRAY[job_id], ARRAY[attempt_id])
$$;

-- =====================================================================================
-- Functions: jobs that wait for others, and serial keys
-- =====================================================================================

CREATE FUNCTION {schema}.note_dependency_end(p_note text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
-- The WHEN of the triggers on jobs with dependents: a job that leaves
-- jobs_live ('d' || id: it ended, its row moved to a finished partition, or
-- it was deleted), arrives in a finished partition ('s' || id: succeeded;
-- 'f' || id: dead or cancelled) or is put back in jobs_live after ending
-- ('u' || id, requeued): appends the note to the transaction-local setting
-- pgqueue.ended_dependencies. True, queuing the trigger, only for the
-- first note since the last flush: the AFTER ROW triggers of a statement
-- fire once all its rows are written, so that one call of
-- jobs_release_dependents counts the whole statement off at once. (A
-- rolled back subtransaction takes its notes and its queued call along.)
-- The triggers pass the id as text (id::text): `text || bigint` is the SQL
-- function textanycat, which PostgreSQL would parse and inline again each
-- time it prepares a WHEN clause, i.e. for every statement that updates or
-- deletes jobs (~30 µs of a one-job lease or ack).
DECLARE
    v_notes text := pg_catalog.current_setting('pgqueue.ended_dependencies', true);
BEGIN
    IF v_notes IS NULL OR v_notes = '' THEN
        PERFORM pg_catalog.set_config('pgqueue.ended_dependencies', p_note, true);
        RETURN true;
    END IF;
    PERFORM pg_catalog.set_config('pgqueue.ended_dependencies', v_notes || ',' || p_note, true);
    RETURN false;
END;
$$;

CREATE FUNCTION {schema}.jobs_release_dependents() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
-- Jobs with dependents ended (or were deleted while live, or were put back
-- after ending) in the statement that queued this call: the triggers' WHEN
-- noted each (note_dependency_end) and queued only the first. Count them
-- all off their dependents in this same transaction: one update per
-- dependent and statement however many of its dependencies the statement
-- ended (an ack of 500 leaves of one callback writes its counter once),
-- O(their dependents), no scan of siblings. Then settle the dependents
-- whose dependencies are all decided.
DECLARE
    v_notes  text := pg_catalog.current_setting('pgqueue.ended_dependencies', true);
    v_settle bigint[];
BEGIN
    IF v_notes IS NULL OR v_notes = '' THEN
        RETURN NULL;
    END IF;
    -- Emptied first: a cancellation this causes notes (and flushes) anew.
    PERFORM pg_catalog.set_config('pgqueue.ended_dependencies', '', true);
    WITH noted AS (
        -- Per job: +1 for each time it left jobs_live (ended), -1 for each
        -- time it was put back; how it ended: 's' when it arrived in
        -- jobs_succeeded, else 'f' (dead, cancelled, or deleted while live).
        SELECT substr(n.note, 2)::bigint AS id,
               count(*) FILTER (WHERE left(n.note, 1) = 'd')
                   - count(*) FILTER (WHERE left(n.note, 1) = 'u') AS delta,
               CASE WHEN bool_or(left(n.note, 1) = 's') THEN 's' ELSE 'f' END AS last
        FROM unnest(string_to_array(v_notes, ',')) WITH ORDINALITY n(note, ord)
        GROUP BY 1
    ), dependents AS (
        SELECT d.job_id, sum(n.delta)::integer AS delta,
               min(n.id) FILTER (WHERE n.delta > 0 AND n.last = 'f') AS failed,
               array_agg(n.id) FILTER (WHERE n.delta < 0) AS reopened
        FROM noted n
        JOIN {schema}.job_dependencies d ON d.depends_on = n.id
        WHERE n.delta <> 0
        GROUP BY d.job_id
        ORDER BY d.job_id
    ), counted AS (
        -- pending: the dependencies that have not ended, whatever the
        -- dependent's own state (a requeued dependency counts again).
        UPDATE {schema}.job_waits w
        SET pending = w.pending - p.delta,
            blocker = CASE WHEN p.failed IS NOT NULL THEN coalesce(w.blocker, p.failed)
                           WHEN w.blocker = ANY (p.reopened) THEN NULL
                           ELSE w.blocker END
        FROM dependents p
        WHERE w.job_id = p.job_id
        RETURNING w.job_id, w.pending, w.blocker, w.allow_failed
    )
    SELECT array_agg(c.job_id) INTO v_settle FROM counted c
    WHERE c.pending = 0 OR (c.blocker IS NOT NULL AND NOT c.allow_failed);
    IF v_settle IS NOT NULL THEN
        PERFORM {schema}.settle_waiting(v_settle);
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION {schema}.settle_waiting(p_job_ids bigint[]) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
-- Waiting jobs whose dependencies decided their fate, in one statement:
-- cancelled when one ended dead or cancelled and allow_failed is false, else
-- queued (or scheduled) once none is pending. Cancelling one releases its
-- own dependents (the trigger), so a failure propagates down the graph; a
-- cancelled job someone waits on is announced as finished.
DECLARE
    v_notified bigint;
BEGIN
    IF p_job_ids IS NULL OR cardinality(p_job_ids) = 0 THEN
        RETURN;
    END IF;
    WITH decided AS MATERIALIZED (
        SELECT j.id, w.blocker IS NOT NULL AND NOT w.allow_failed AS cancel,
               format('dependency %s ended %s', w.blocker,
                      coalesce((SELECT b.status::text FROM {schema}.jobs b WHERE b.id = w.blocker),
                               (SELECT a.status::text FROM {schema}.jobs_archive a
                                WHERE a.id = w.blocker))) AS reason
        FROM {schema}.jobs_live j JOIN {schema}.job_waits w ON w.job_id = j.id
        WHERE j.id = ANY (p_job_ids) AND j.status = 'waiting'
          AND (w.pending = 0 OR w.blocker IS NOT NULL AND NOT w.allow_failed)
        FOR UPDATE OF j
    ), released AS (
        UPDATE {schema}.jobs_live j
        SET status = CASE WHEN j.run_at > now() THEN 'scheduled' ELSE 'queued' END::{schema}.job_status
        FROM decided d
        WHERE NOT d.cancel AND j.id = ANY (p_job_ids) AND j.id = d.id
        RETURNING j.id, j.queue, j.status, j.notify_finish, j.priority, j.run_at
    ), cancelled AS (
        SELECT e.id, e.queue, e.status, e.notify_finish, e.priority, e.run_at
        FROM (SELECT array_agg(d.id) AS ids, array_agg(d.reason) AS reasons
              FROM decided d WHERE d.cancel) x
        CROSS JOIN LATERAL {schema}.finish_jobs(
            x.ids, '{waiting}', array_fill('cancelled'::{schema}.job_status, ARRAY[cardinality(x.ids)]),
            now(), NULL, x.reasons) e
        WHERE x.ids IS NOT NULL
    ), settled AS (
        SELECT * FROM released UNION ALL SELECT * FROM cancelled
    ), announced AS (
        SELECT count({schema}.announce_ready(f.queue, f.priority, f.run_at, f.id)) AS n
        FROM (SELECT DISTINCT ON (s.queue) s.queue, s.priority, s.run_at, s.id
              FROM settled s WHERE s.status = 'queued'
              ORDER BY s.queue, s.priority DESC, s.run_at, s.id) f
    )
    SELECT count(pg_notify({channel}, n.payload)) + (SELECT a.n FROM announced a) INTO v_notified
    FROM (SELECT DISTINCT 'j:' || s.queue AS payload FROM settled s WHERE s.status = 'queued'
          UNION ALL
          SELECT {schema}.finished_payload(s.id, s.status, s.queue)
          FROM settled s WHERE s.status = 'cancelled' AND s.notify_finish) n;
END;
$$;

CREATE FUNCTION {schema}.jobs_serial_hold() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.serial_held := coalesce((
        SELECT s.id FROM {schema}.jobs_live s
        WHERE s.serial_key = NEW.serial_key
          AND s.stage IN ('queued', 'scheduled')
        ORDER BY s.serial_key, s.id LIMIT 1) < NEW.id, false);
    RETURN NEW;
END;
$$;

CREATE FUNCTION {schema}.jobs_serial_hold_requeued() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
-- A serial job queued again (staged, released, requeued) is held while an
-- earlier live job of its key exists. An AFTER trigger on purpose: a BEFORE
-- UPDATE row trigger makes PostgreSQL lock (and WAL-log) the old row version
-- of every UPDATE of jobs, the lease's and the ack's included.
DECLARE
    v_held boolean := coalesce((
        SELECT s.id FROM {schema}.jobs_live s
        WHERE s.serial_key = NEW.serial_key
          AND s.stage IN ('queued', 'scheduled')
        ORDER BY s.serial_key, s.id LIMIT 1) < NEW.id, false);
BEGIN
    UPDATE {schema}.jobs_live j SET serial_held = v_held
    WHERE j.id = NEW.id AND j.serial_held IS DISTINCT FROM v_held;
    RETURN NULL;
END;
$$;

CREATE FUNCTION {schema}.jobs_serial_release() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_id bigint;
BEGIN
    SELECT s.id INTO v_id FROM {schema}.jobs_live s
    WHERE s.serial_key = OLD.serial_key AND s.stage IN ('queued', 'scheduled')
    ORDER BY s.serial_key, s.id LIMIT 1;  -- jobs_serial_key_idx's order: its first entry
    IF v_id IS NOT NULL THEN
        PERFORM 1 FROM {schema}.jobs_live j WHERE j.id = v_id AND j.serial_held
        FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            UPDATE {schema}.jobs_live j SET serial_held = false WHERE j.id = v_id;
        END IF;
        -- Leasable now, maybe behind a worker's lease cursor.
        PERFORM {schema}.announce_ready(j.queue, j.priority, j.run_at, j.id)
        FROM {schema}.jobs_live j WHERE j.id = v_id AND j.status = 'queued';
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION {schema}.serial_unhold_stale(p_limit integer) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    v_limit integer := least(greatest(coalesce(p_limit, 500), 1), 10000);
    v_lo    bigint;
    v_hi    bigint;
    v_start bigint;
    v_n     integer;
BEGIN
    SELECT j.id INTO v_lo FROM {schema}.jobs_live j
    WHERE j.serial_held AND j.stage = 'queued' AND j.status = 'queued' ORDER BY j.id LIMIT 1;
    IF v_lo IS NULL THEN
        RETURN 0;
    END IF;
    SELECT j.id INTO v_hi FROM {schema}.jobs_live j
    WHERE j.serial_held AND j.stage = 'queued' AND j.status = 'queued' ORDER BY j.id DESC LIMIT 1;
    v_start := v_lo + floor(random() * (v_hi - v_lo + 1))::bigint;

    WITH win AS MATERIALIZED (
        (SELECT j.id, 0 AS part FROM {schema}.jobs_live j
         WHERE j.serial_held AND j.stage = 'queued' AND j.status = 'queued' AND j.id >= v_start
         ORDER BY j.id LIMIT v_limit)
        UNION ALL
        (SELECT j.id, 1 AS part FROM {schema}.jobs_live j
         WHERE j.serial_held AND j.stage = 'queued' AND j.status = 'queued' AND j.id < v_start
         ORDER BY j.id LIMIT v_limit)
    ), firsts AS (
        -- = ANY(ARRAY(...)): one primary-key probe per job of the window (a
        -- join may read every held job).
        SELECT DISTINCT ON (j.serial_key) j.id, j.serial_key
        FROM {schema}.jobs_live j
        WHERE j.id = ANY (ARRAY(SELECT w.id FROM win w ORDER BY w.part, w.id LIMIT v_limit))
          AND j.serial_held AND j.stage = 'queued' AND j.status = 'queued'
        ORDER BY j.serial_key, j.id
    ), stale AS (
        SELECT f.id FROM firsts f
        WHERE coalesce((
            SELECT s.id FROM {schema}.jobs_live s
            WHERE s.serial_key = f.serial_key
              AND s.stage IN ('queued', 'scheduled')
            ORDER BY s.serial_key, s.id LIMIT 1), f.id) >= f.id
    ), locked AS (
        SELECT j.id FROM {schema}.jobs_live j
        WHERE j.id = ANY (ARRAY(SELECT id FROM stale)) AND j.serial_held AND j.stage = 'queued' AND j.status = 'queued'
        FOR UPDATE SKIP LOCKED
    )
    , unheld AS (
        UPDATE {schema}.jobs_live j SET serial_held = false
        WHERE j.id = ANY (ARRAY(SELECT id FROM locked))
        RETURNING j.queue, j.priority, j.run_at, j.id
    )
    SELECT (SELECT count(*) FROM unheld),
           (SELECT count({schema}.announce_ready(f.queue, f.priority, f.run_at, f.id))
            FROM (SELECT DISTINCT ON (u.queue) u.queue, u.priority, u.run_at, u.id
                  FROM unheld u ORDER BY u.queue, u.priority DESC, u.run_at, u.id) f)
    INTO v_n, v_lo;
    RETURN v_n;
END;
$$;

-- =====================================================================================
-- Functions: durable tasks (steps, sleeps, events)
-- =====================================================================================

CREATE FUNCTION {schema}.store_step(p_job_id bigint, p_attempt_id bigint, p_name text, p_kind text, p_status text, p_result jsonb, p_started_at timestamp with time zone, p_wake_at timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
-- Store a step's result (or a sleep) of a running job, fenced like a
-- completion: only while the job is running under p_attempt_id. The row
-- lock keeps the reaper (SKIP LOCKED) off the job until this commits.
-- False: the lease was lost, nothing was stored. A name already stored is
-- left as it is (a stored step never changes).
DECLARE
    v_records boolean;
BEGIN
    SELECT j.has_records INTO v_records FROM {schema}.jobs_live j
    WHERE j.id = p_job_id AND j.attempt_id = p_attempt_id AND j.status = 'running'
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_records IS NOT TRUE THEN
        UPDATE {schema}.jobs_live j SET has_records = true WHERE j.id = p_job_id;
    END IF;
    INSERT INTO {schema}.job_steps AS s
        (job_id, name, kind, status, result, started_at, finished_at, wake_at, attempt_id)
    VALUES (p_job_id, p_name, p_kind, p_status, p_result, coalesce(p_started_at, now()),
            CASE WHEN p_kind = 'sleep' THEN p_wake_at ELSE now() END, p_wake_at, p_attempt_id)
    ON CONFLICT ON CONSTRAINT job_steps_pkey DO NOTHING;
    RETURN true;
END;
$$;

CREATE FUNCTION {schema}.release_event_waits(p_job_ids bigint[]) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
-- Jobs that waited for an event (status waiting, a job_steps row decided):
-- queued again now, announced to the workers. Returns how many. A waiting
-- job is outside the dedup index: when another live job took its dedup key
-- meanwhile, it comes back without its key rather than fail the sender.
DECLARE
    v_n bigint;
BEGIN
    IF p_job_ids IS NULL OR cardinality(p_job_ids) = 0 THEN
        RETURN 0;
    END IF;
    WITH released AS (
        UPDATE {schema}.jobs_live j
        SET status = 'queued', run_at = now(),
            dedup_key = CASE WHEN j.dedup_key IS NOT NULL AND EXISTS (
                                 SELECT 1 FROM {schema}.jobs_live o
                                 WHERE o.queue = j.queue AND o.dedup_key = j.dedup_key
                                   AND o.stage IN ('queued', 'scheduled') AND o.id <> j.id)
                             THEN NULL ELSE j.dedup_key END
        WHERE j.id = ANY (p_job_ids) AND j.status = 'waiting'
        RETURNING j.id, j.queue, j.priority, j.run_at
    ), announced AS (
        SELECT count({schema}.announce_ready(f.queue, f.priority, f.run_at, f.id)) AS n
        FROM (SELECT DISTINCT ON (r.queue) r.queue, r.priority, r.run_at, r.id
              FROM released r ORDER BY r.queue, r.priority DESC, r.run_at, r.id) f
    ), notified AS (
        SELECT count(pg_notify({channel}, 'j:' || q.queue)) AS n
        FROM (SELECT DISTINCT r.queue FROM released r) q
    )
    SELECT (SELECT count(*) FROM released) + 0 * ((SELECT a.n FROM announced a) + (SELECT n.n FROM notified n))
    INTO v_n;
    RETURN v_n;
END;
$$;

CREATE FUNCTION {schema}.wait_event(p_job_id bigint, p_attempt_id bigint, p_name text, p_key text, p_timeout double precision, p_started_at timestamp with time zone) RETURNS TABLE(outcome text, payload jsonb)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
-- context.wait_for_event for a running job (fenced by p_attempt_id):
-- 'received' with the payload when the event was sent (now or before),
-- 'timed_out' when the wait's deadline (now + p_timeout seconds at the
-- first wait) passed, else 'waiting': the job is set waiting (no slot, the
-- attempt not counted) until send_event or the reaper releases it.
-- 'cancelled': a cancel was requested (nothing changed), 'lost': the lease
-- was lost. The key's advisory lock orders this against send_event: an
-- event committed before is seen here, one sent after finds the wait.
#variable_conflict use_column
DECLARE
    v_job      record;
    v_payload  jsonb;
    v_deadline timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_key, 7215));
    SELECT j.id, j.attempts, j.attempt_started_at, j.worker_id, j.cancel_requested
    INTO v_job FROM {schema}.jobs_live j
    WHERE j.id = p_job_id AND j.attempt_id = p_attempt_id AND j.status = 'running'
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::jsonb;
        RETURN;
    END IF;
    SELECT e.payload INTO v_payload FROM {schema}.events e WHERE e.key = p_key;
    IF FOUND THEN
        INSERT INTO {schema}.job_steps AS s
            (job_id, name, kind, status, result, started_at, finished_at, event_key, attempt_id)
        VALUES (p_job_id, p_name, 'event', 'received', v_payload, coalesce(p_started_at, now()),
                now(), p_key, p_attempt_id)
        ON CONFLICT ON CONSTRAINT job_steps_pkey DO UPDATE
        SET status = 'received', result = EXCLUDED.result, finished_at = EXCLUDED.finished_at;
        UPDATE {schema}.jobs_live j SET has_records = true
        WHERE j.id = p_job_id AND j.has_records IS NOT TRUE;
        RETURN QUERY SELECT 'received'::text, v_payload;
        RETURN;
    END IF;
    SELECT coalesce(s.wake_at, CASE WHEN p_timeout IS NOT NULL
                                    THEN now() + make_interval(secs => least(greatest(p_timeout, 0), 3153600000)) END)
    INTO v_deadline
    FROM (SELECT 1) one
    LEFT JOIN {schema}.job_steps s ON s.job_id = p_job_id AND s.name = p_name;
    IF v_deadline IS NOT NULL AND v_deadline <= now() THEN
        INSERT INTO {schema}.job_steps AS s
            (job_id, name, kind, status, started_at, finished_at, wake_at, event_key, attempt_id)
        VALUES (p_job_id, p_name, 'event', 'timed_out', coalesce(p_started_at, now()), now(),
                v_deadline, p_key, p_attempt_id)
        ON CONFLICT ON CONSTRAINT job_steps_pkey DO UPDATE
        SET status = 'timed_out', finished_at = EXCLUDED.finished_at;
        UPDATE {schema}.jobs_live j SET has_records = true
        WHERE j.id = p_job_id AND j.has_records IS NOT TRUE;
        RETURN QUERY SELECT 'timed_out'::text, NULL::jsonb;
        RETURN;
    END IF;
    IF v_job.cancel_requested THEN
        RETURN QUERY SELECT 'cancelled'::text, NULL::jsonb;
        RETURN;
    END IF;
    INSERT INTO {schema}.job_steps AS s
        (job_id, name, kind, status, started_at, wake_at, event_key, attempt_id)
    VALUES (p_job_id, p_name, 'event', 'waiting', coalesce(p_started_at, now()), v_deadline,
            p_key, p_attempt_id)
    ON CONFLICT ON CONSTRAINT job_steps_pkey DO UPDATE
    SET status = 'waiting', wake_at = EXCLUDED.wake_at, event_key = EXCLUDED.event_key,
        finished_at = NULL;
    -- Waiting: no lease, no slot; the attempt is given back (as a snooze).
    UPDATE {schema}.jobs_live j
    SET status = 'waiting', attempts = j.attempts - 1, lease_expires_at = NULL, has_records = true
    WHERE j.id = p_job_id;
    INSERT INTO {schema}.job_attempts (id, job_id, attempt, outcome, started_at, finished_at, worker_id)
    VALUES (p_attempt_id, p_job_id, v_job.attempts, 'waited', v_job.attempt_started_at, now(),
            v_job.worker_id);
    RETURN QUERY SELECT 'waiting'::text, NULL::jsonb;
END;
$$;

CREATE FUNCTION {schema}.send_event(key text, payload jsonb DEFAULT NULL::jsonb) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
-- Store an event (a key sent again replaces its payload) and release every
-- job waiting for it, in the caller's transaction: they are queued when it
-- commits, and nothing happens if it rolls back. Returns how many jobs it
-- released. Events are kept as long as cancelled jobs (retention).
#variable_conflict use_column
DECLARE
    v_ids bigint[];
BEGIN
    IF send_event.key IS NULL OR octet_length(send_event.key) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'pgqueue: an event key must be text of 1 to 1000 bytes'
            USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(send_event.key, 7215));
    INSERT INTO {schema}.events AS e (key, payload, sent_at)
    VALUES (send_event.key, send_event.payload, now())
    ON CONFLICT ON CONSTRAINT events_pkey DO UPDATE
    SET payload = EXCLUDED.payload, sent_at = EXCLUDED.sent_at;
    WITH got AS (
        UPDATE {schema}.job_steps s
        SET status = 'received', result = send_event.payload, finished_at = now()
        WHERE s.event_key = send_event.key AND s.status = 'waiting'
        RETURNING s.job_id
    )
    SELECT array_agg(g.job_id) INTO v_ids FROM got g;
    RETURN {schema}.release_event_waits(v_ids);
END;
$$;

CREATE FUNCTION {schema}.expire_event_waits(p_limit integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
-- The reaper's turn for durable tasks: event waits past their deadline end
-- timed_out and their jobs are queued again (the task then raises
-- EventTimeout); events older than the cancelled jobs' retention go. Up
-- to p_limit of each per call.
DECLARE
    v_ids bigint[];
BEGIN
    WITH due AS (
        SELECT s.job_id, s.name FROM {schema}.job_steps s
        WHERE s.status = 'waiting' AND s.wake_at IS NOT NULL AND s.wake_at <= now()
        ORDER BY s.wake_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), ended AS (
        UPDATE {schema}.job_steps s SET status = 'timed_out', finished_at = now()
        FROM due d
        WHERE s.job_id = d.job_id AND s.name = d.name
        RETURNING s.job_id
    )
    SELECT array_agg(e.job_id) INTO v_ids FROM ended e;
    DELETE FROM {schema}.events e
    WHERE e.key = ANY (ARRAY(
        SELECT x.key FROM {schema}.events x
        WHERE x.sent_at < now() - (SELECT r.cancelled FROM {schema}.retention r)
        ORDER BY x.sent_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED));
    RETURN {schema}.release_event_waits(v_ids);
END;
$$;

-- =====================================================================================
-- Functions: maintain (reaper, retention, archive, workers, tasks, schedules)
-- =====================================================================================

CREATE FUNCTION {schema}.reap_jobs(p_limit integer, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(job_id bigint, status text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
    -- Un-hold serial-key jobs left held by a race (0015), a bounded window per call.
    PERFORM {schema}.serial_unhold_stale(least(greatest(p_limit, 1), 10000));
    -- Event waits past their timeout, and events past retention.
    PERFORM {schema}.expire_event_waits(least(greatest(p_limit, 1), 10000));
    -- EXECUTE: planned for the arrays at hand on every call, as the
    -- statement was before; a cached generic plan joins them quadratically.
    RETURN QUERY EXECUTE $q$
WITH clock AS MATERIALIZED (
    SELECT CASE WHEN $2 IS NULL THEN now() ELSE coalesce({schema}.trusted_clock($2), now()) END AS now
), expired AS MATERIALIZED (
    SELECT j.id FROM {schema}.jobs_live j
    WHERE j.stage = 'queued' AND j.status = 'running' AND j.lease_expires_at < (SELECT now FROM clock)
    ORDER BY j.lease_expires_at
    LIMIT least(greatest($1, 1), 10000)
    FOR UPDATE SKIP LOCKED
), decided AS (
    SELECT j.id, j.attempt_id, j.attempts, j.worker_id, j.attempt_started_at, j.notify_finish,
           CASE WHEN j.cancel_requested THEN 'cancelled'
                WHEN m.max_attempts > 0 AND j.attempts >= m.max_attempts THEN 'dead'
                ELSE 'retry' END AS next,
           least((SELECT now FROM clock)
               + {schema}.retry_delay(j.attempts, m.backoff_base, m.backoff_factor,
                                      m.backoff_max, m.backoff_jitter),
                 '2499-12-31 00:00:00+00') AS next_run_at
    FROM {schema}.jobs_live j
    -- An operator's live max_attempts/backoff for the task (pgqueue task set) wins.
    CROSS JOIN LATERAL (
        SELECT coalesce(s.max_attempts, j.max_attempts) AS max_attempts,
               coalesce(s.backoff[1], j.backoff_base) AS backoff_base,
               coalesce(s.backoff[2], j.backoff_factor) AS backoff_factor,
               coalesce(s.backoff[3], j.backoff_max) AS backoff_max,
               coalesce(s.backoff[4], j.backoff_jitter) AS backoff_jitter
        FROM (SELECT 1) one
        LEFT JOIN {schema}.task_settings s ON s.name = j.task
    ) m
    WHERE j.id = ANY (ARRAY(SELECT id FROM expired))
), again AS (
    -- Retried after its backoff, in place.
    UPDATE {schema}.jobs_live j
    SET status = 'scheduled', run_at = d.next_run_at, lease_expires_at = NULL,
        last_error = 'lease_expired: worker ' || coalesce(d.worker_id, '?')
                     || ' did not finish or extend its lease',
        has_records = true  -- the attempt's row below
    FROM decided d
    WHERE d.next = 'retry' AND j.id = ANY (ARRAY(SELECT id FROM decided)) AND j.id = d.id
    RETURNING j.id, j.status, j.queue
), ended AS (
    -- Attempts used up (dead) or a cancel requested: moved to its partition.
    SELECT e.id, e.status, e.queue
    FROM (SELECT array_agg(d.id) AS ids, array_agg(d.next::{schema}.job_status) AS tos,
                 array_agg('lease_expired: worker ' || coalesce(d.worker_id, '?')
                           || ' did not finish or extend its lease') AS errors
          FROM decided d WHERE d.next <> 'retry') x
    CROSS JOIN LATERAL {schema}.finish_jobs(x.ids, '{running}', x.tos, (SELECT now FROM clock),
                                           NULL, x.errors, NULL, true) e
    WHERE x.ids IS NOT NULL
), updated AS (
    SELECT * FROM again UNION ALL SELECT * FROM ended
), attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id, error_code, error_message)
    SELECT d.attempt_id, d.id, d.attempts,
           CASE WHEN d.next = 'cancelled' THEN 'cancelled' ELSE 'lease_expired' END::{schema}.attempt_outcome,
           d.attempt_started_at, (SELECT now FROM clock), d.worker_id,
           'lease_expired', 'lease expired while the job was running on worker '
                            || coalesce(d.worker_id, '?')
    FROM decided d
), notified AS (
    SELECT count(pg_notify({channel}, n.payload)) AS n
    FROM (SELECT {schema}.finished_payload(u.id, u.status, u.queue) AS payload
          FROM decided d JOIN updated u ON u.id = d.id
          WHERE d.notify_finish AND d.next <> 'retry'
          UNION
          SELECT DISTINCT 'w:' || u.queue FROM updated u WHERE u.status = 'scheduled') n
)
SELECT u.id, u.status::text FROM updated u CROSS JOIN notified
$q$ USING p_limit, p_now;
END;
$_$;

-- Retention: finished jobs leave by themselves.
--
-- The elected worker (maintenance_claim) runs, every few seconds:
-- retention_plan, then each of its steps in a transaction of its own:
-- retention_create_leaf (a leaf of a finished partition, created ahead of
-- the finish times it will hold), retention_drop_leaf (a leaf wholly past
-- retention: one DROP, whatever it holds), retention_purge (the rows of a
-- default leaf past retention, which only exist when no worker created
-- leaves for a while, and of jobs_archive). Nothing here writes per kept
-- row; a dropped leaf costs one statement plus one delete per row of its
-- jobs' attempts, dependencies and workflow bookkeeping (has_records).

CREATE FUNCTION {schema}.retention_width(p_retention interval) RETURNS interval
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    -- The time range of a leaf: a quarter of the retention (a finished job
    -- is deleted between its retention and 1.25 times it), in whole
    -- minutes, from one minute to one day.
    SELECT make_interval(mins => least(1440, greatest(1,
               floor(extract(epoch FROM p_retention) / 240)::integer)))
$$;

CREATE FUNCTION {schema}.retention_slot(p_at timestamp with time zone, p_width interval) RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    -- The start of the slot of width p_width that holds p_at (slots are
    -- whole multiples of the width since the epoch).
    SELECT to_timestamp(floor(extract(epoch FROM p_at) / extract(epoch FROM p_width))
                        * extract(epoch FROM p_width))
$$;

CREATE FUNCTION {schema}.retention_leaves() RETURNS TABLE(status {schema}.job_status, leaf text, lower timestamp with time zone, upper timestamp with time zone)
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
    -- The leaves of the finished partitions and their bounds (NULL for the
    -- default leaves), read from the catalog. A leaf another session is
    -- dropping has no bound expression left: it is not listed.
    SELECT p.status, c.relname::text, b.m[1]::timestamptz, b.m[2]::timestamptz
    FROM (VALUES ('succeeded'::{schema}.job_status, '{schema}.jobs_succeeded'::regclass),
                 ('dead', '{schema}.jobs_dead'::regclass),
                 ('cancelled', '{schema}.jobs_cancelled'::regclass)) p(status, parent)
    JOIN pg_inherits i ON i.inhparent = p.parent
    JOIN pg_class c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) e
    CROSS JOIN LATERAL (SELECT regexp_match(e.bound,
                                            $r$FROM \('([^']*)'\) TO \('([^']*)'\)$r$) AS m) b
    WHERE e.bound = 'DEFAULT' OR b.m IS NOT NULL
$_$;

CREATE FUNCTION {schema}.retention_cutoff(p_status {schema}.job_status, p_before timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    -- How far a deletion of p_status jobs finished before p_before may go:
    -- as asked for the schema's owner (and its members), else no further
    -- than the stored retention (a worker's role applies it, nothing more).
    SELECT CASE WHEN {schema}.trusted_clock(now()) IS NOT NULL THEN p_before
                ELSE least(p_before, now() - CASE p_status WHEN 'succeeded' THEN r.succeeded
                                                           WHEN 'cancelled' THEN r.cancelled
                                                           ELSE r.dead END) END
    FROM {schema}.retention r
$$;

CREATE FUNCTION {schema}.retention_plan(p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_cutoffs interval[] DEFAULT NULL::interval[]) RETURNS TABLE(action text, status {schema}.job_status, leaf text, lower timestamp with time zone, upper timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
-- What a pass does now, in order: 'create' a leaf for [lower, upper) of
-- status's partition (every part of the next three widths of the
-- retention, from the current one on, that no leaf covers, so that a
-- finish time always has one while a worker runs maintenance); 'drop' a
-- leaf whose range retention has passed; 'purge' a
-- default leaf that holds rows, or a leaf made for a longer retention
-- than today's (rows before a cutoff go, one by one).
-- p_cutoffs: [succeeded, cancelled, dead] instead of the stored retention
-- (`pgqueue prune --older-than`; it creates no leaves): honoured only for
-- the schema's owner and its members, like a clock (a worker's role applies
-- the stored retention, never a shorter one).
DECLARE
    v_now   timestamptz := coalesce({schema}.trusted_clock(p_now), now());
    v_trusted boolean := {schema}.trusted_clock(now()) IS NOT NULL;
    v_ret   {schema}.retention;
    v_s     {schema}.job_status;
    v_keep  interval;
    v_width interval;
    v_start timestamptz;
    v_end   timestamptz;
    v_next  timestamptz;
    v_leaf  text;
    v_any   boolean;
BEGIN
    SELECT * INTO v_ret FROM {schema}.retention;
    IF p_cutoffs IS NOT NULL AND NOT v_trusted THEN
        p_cutoffs := ARRAY[v_ret.succeeded, v_ret.cancelled, v_ret.dead];
    END IF;
    FOREACH v_s IN ARRAY ARRAY['succeeded', 'cancelled', 'dead']::{schema}.job_status[] LOOP
        v_keep := CASE WHEN p_cutoffs IS NOT NULL
                       THEN p_cutoffs[array_position(ARRAY['succeeded', 'cancelled', 'dead'], v_s::text)]
                       WHEN v_s = 'succeeded' THEN v_ret.succeeded
                       WHEN v_s = 'cancelled' THEN v_ret.cancelled
                       ELSE v_ret.dead END;
        RETURN QUERY
        SELECT 'drop', l.status, l.leaf, l.lower, l.upper
        FROM {schema}.retention_leaves() l
        WHERE l.status = v_s AND l.upper <= v_now - v_keep
        ORDER BY l.upper;
        v_width := {schema}.retention_width(v_keep);
        -- The default leaf, and a leaf made for a longer retention than
        -- today's (wider than two of today's leaves) that retention has
        -- reached into: their rows past it go one by one.
        FOR v_leaf IN SELECT l.leaf FROM {schema}.retention_leaves() l
                      WHERE l.status = v_s
                        AND (l.lower IS NULL
                             OR (l.upper - l.lower > 2 * v_width
                                 AND l.lower < v_now - v_keep AND l.upper > v_now - v_keep)) LOOP
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM {schema}.%I WHERE finished_at < $1'
                           ' OR (finished_at IS NULL AND created_at < $1))',
                           v_leaf)
                INTO v_any USING v_now - v_keep;
            IF v_any THEN
                RETURN QUERY SELECT 'purge', v_s, v_leaf, NULL::timestamptz, v_now - v_keep;
            END IF;
        END LOOP;
        IF EXISTS (SELECT 1 FROM {schema}.jobs_archive a
                   WHERE a.finished_at < v_now - v_keep AND a.status = v_s) THEN
            RETURN QUERY SELECT 'purge', v_s, 'jobs_archive', NULL::timestamptz, v_now - v_keep;
        END IF;
        CONTINUE WHEN p_cutoffs IS NOT NULL;
        v_start := {schema}.retention_slot(v_now, v_width);
        v_end := v_start + 3 * v_width;
        -- From v_start on: past each leaf met, and a new leaf up to the next
        -- slot boundary (or the next leaf) across each gap.
        WHILE v_start < v_end LOOP
            SELECT max(l.upper) INTO v_next FROM {schema}.retention_leaves() l
            WHERE l.status = v_s AND l.lower <= v_start AND l.upper > v_start;
            IF v_next IS NULL THEN
                SELECT least({schema}.retention_slot(v_start, v_width) + v_width, min(l.lower))
                INTO v_next FROM {schema}.retention_leaves() l
                WHERE l.status = v_s AND l.lower > v_start;
                RETURN QUERY SELECT 'create', v_s, NULL::text, v_start, v_next;
            END IF;
            v_start := v_next;
        END LOOP;
    END LOOP;
END;
$$;

CREATE FUNCTION {schema}.retention_create_leaf(p_status {schema}.job_status, p_lower timestamp with time zone, p_upper timestamp with time zone) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET lock_timeout TO '200ms'
    AS $$
-- Create the leaf of p_status's partition for [p_lower, p_upper); NULL when
-- a leaf already covers part of it. Made as a table of its own and then
-- attached: attaching locks the status's partition in SHARE UPDATE
-- EXCLUSIVE mode, so completions (ROW EXCLUSIVE) go on meanwhile; only its
-- default leaf is locked. Rows the default leaf holds in that range
-- (finished while no leaf existed) would make the attach fail: the leaf
-- then starts after the last of them.
DECLARE
    v_parent text := 'jobs_' || p_status::text;
    v_lower  timestamptz := p_lower;
    v_last   timestamptz;
    v_name   text;
BEGIN
    IF p_status NOT IN ('succeeded', 'dead', 'cancelled') OR p_lower IS NULL OR p_upper IS NULL
       OR p_lower >= p_upper THEN
        RAISE EXCEPTION 'pgqueue: no leaf of % for [%, %)', p_status, p_lower, p_upper
            USING ERRCODE = '22023';
    END IF;
    -- The lock the attach takes anyway, first: no row lands in the default
    -- leaf between the look below and the attach, and two passes creating
    -- the same leaf take turns.
    EXECUTE format('LOCK TABLE {schema}.%I IN ACCESS EXCLUSIVE MODE', v_parent || '_default');
    IF EXISTS (SELECT 1 FROM {schema}.retention_leaves() l
               WHERE l.status = p_status AND l.lower < p_upper AND l.upper > p_lower) THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT max(finished_at) FROM {schema}.%I WHERE finished_at >= $1 AND finished_at < $2',
                   v_parent || '_default')
        INTO v_last USING p_lower, p_upper;
    IF v_last IS NOT NULL THEN
        v_lower := v_last + interval '1 microsecond';
        IF v_lower >= p_upper THEN
            RETURN NULL;
        END IF;
    END IF;
    v_name := v_parent || '_' || to_char(v_lower AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS');
    EXECUTE format('CREATE TABLE {schema}.%I (LIKE {schema}.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS'
                   ' INCLUDING GENERATED INCLUDING STORAGE)'
                   ' WITH (autovacuum_vacuum_insert_threshold = -1)',
                   v_name, v_parent);
    EXECUTE format('ALTER TABLE {schema}.%I ATTACH PARTITION {schema}.%I FOR VALUES FROM (%L) TO (%L)',
                   v_parent, v_name, v_lower, p_upper);
    RETURN v_name;
END;
$$;

CREATE FUNCTION {schema}.forget_records(p_ids bigint[]) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    -- What belongs to these jobs outside their rows: attempts, durable
    -- steps, dependency edges (both ways), workflow steps, and their workflows once no step
    -- of them is left. For jobs retention deletes.
    WITH attempts AS (
        DELETE FROM {schema}.job_attempts a WHERE a.job_id = ANY (p_ids)
    ), steps AS (
        DELETE FROM {schema}.job_steps s WHERE s.job_id = ANY (p_ids)
    ), edges_in AS (
        DELETE FROM {schema}.job_dependencies d WHERE d.job_id = ANY (p_ids)
    ), edges_out AS (
        DELETE FROM {schema}.job_dependencies d WHERE d.depends_on = ANY (p_ids)
    ), waits AS (
        DELETE FROM {schema}.job_waits w WHERE w.job_id = ANY (p_ids)
        RETURNING w.workflow_id
    )
    DELETE FROM {schema}.workflows f
    WHERE f.id IN (SELECT w.workflow_id FROM waits w)
      AND NOT EXISTS (SELECT 1 FROM {schema}.job_waits r
                      WHERE r.workflow_id = f.id AND r.job_id <> ALL (p_ids))
$$;

CREATE FUNCTION {schema}.retention_drop_leaf(p_leaf text, p_count boolean DEFAULT false) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET lock_timeout TO '200ms'
    AS $$
-- Drop a leaf of a finished partition, and what belongs to its jobs
-- elsewhere (has_records). Returns how many jobs it held: counted with
-- p_count (`pgqueue prune`), else the statistics' estimate, or for a leaf
-- never analyzed its size times the rows of its first pages. DROP locks
-- the status's partition: completions into it wait until the drop commits,
-- and while it waits for a lock (lock_timeout short, the next pass tries
-- again).
DECLARE
    v_status {schema}.job_status;
    v_ids    bigint[];
    v_rows   bigint;
    v_pages  bigint;
BEGIN
    SELECT l.status INTO v_status FROM {schema}.retention_leaves() l
    WHERE l.leaf = p_leaf AND l.lower IS NOT NULL
      AND l.upper <= {schema}.retention_cutoff(l.status, l.upper);
    IF v_status IS NULL THEN
        RETURN 0;  -- dropped by another pass meanwhile, not past retention, or not a leaf
    END IF;
    -- The locks DROP takes, first: nothing new lands in the leaf meanwhile.
    EXECUTE format('LOCK TABLE {schema}.%I, {schema}.%I IN ACCESS EXCLUSIVE MODE',
                   'jobs_' || v_status::text, p_leaf);
    EXECUTE format('SELECT array_agg(id) FROM {schema}.%I WHERE has_records', p_leaf) INTO v_ids;
    IF v_ids IS NOT NULL THEN
        PERFORM {schema}.forget_records(v_ids);
    END IF;
    IF p_count THEN
        EXECUTE format('SELECT count(*) FROM {schema}.%I', p_leaf) INTO v_rows;
    ELSE
        SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint END,
               pg_relation_size(c.oid) / current_setting('block_size')::bigint
        INTO v_rows, v_pages FROM pg_class c
        WHERE c.oid = format('{schema}.%I', p_leaf)::regclass;
        IF v_rows IS NULL THEN
            EXECUTE format('SELECT count(*) FROM {schema}.%I WHERE ctid < ''(8,0)''::tid', p_leaf)
                INTO v_rows;
            v_rows := CASE WHEN v_pages <= 8 THEN v_rows ELSE v_rows * v_pages / 8 END;
        END IF;
    END IF;
    EXECUTE format('DROP TABLE {schema}.%I', p_leaf);
    RETURN v_rows;
END;
$$;

CREATE FUNCTION {schema}.retention_purge(p_table text, p_status {schema}.job_status, p_before timestamp with time zone, p_limit integer DEFAULT 5000) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
-- Delete up to p_limit jobs finished before p_before, one by one, from a
-- leaf of a finished partition (its default leaf: rows finished while no
-- worker made leaves; a leaf made for a longer retention) or, by status,
-- from jobs_archive; with their records elsewhere.
-- SKIP LOCKED: passes beside each other take disjoint rows.
DECLARE
    v_ids bigint[];
BEGIN
    p_before := {schema}.retention_cutoff(p_status, p_before);
    IF p_table = 'jobs_archive' THEN
        SELECT array_agg(a.id) INTO v_ids FROM (
            SELECT a.id FROM {schema}.jobs_archive a
            WHERE a.status = p_status AND a.finished_at < p_before
            ORDER BY a.finished_at LIMIT greatest(p_limit, 1)
            FOR UPDATE SKIP LOCKED) a;
        IF v_ids IS NULL THEN
            RETURN 0;
        END IF;
        PERFORM {schema}.forget_records(v_ids);
        DELETE FROM {schema}.jobs_archive a WHERE a.id = ANY (v_ids);
        RETURN cardinality(v_ids);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {schema}.retention_leaves() l
                   WHERE l.leaf = p_table AND l.status = p_status) THEN
        RAISE EXCEPTION 'pgqueue: retention purges jobs_archive or a leaf of jobs_%, not %',
            p_status, p_table USING ERRCODE = '22023';
    END IF;
    EXECUTE format('SELECT array_agg(j.id) FROM (SELECT id FROM {schema}.%I'
                   ' WHERE finished_at < $1 OR (finished_at IS NULL AND created_at < $1)'
                   ' LIMIT $2 FOR UPDATE SKIP LOCKED) j',
                   p_table)
        INTO v_ids USING p_before, greatest(p_limit, 1);
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM {schema}.forget_records(v_ids);
    EXECUTE format('DELETE FROM {schema}.%I WHERE id = ANY ($1)', p_table) USING v_ids;
    RETURN cardinality(v_ids);
END;
$$;

CREATE FUNCTION {schema}.jobs_forget() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
-- A finished partition whose retention is 0 ("delete when it ends") carries
-- this trigger (set_retention adds and removes it): the job is deleted in
-- the transaction that finished it, after its dependents were counted off.
BEGIN
    IF NEW.has_records THEN
        PERFORM {schema}.forget_records(ARRAY[NEW.id]);
    END IF;
    EXECUTE format('DELETE FROM %s WHERE id = $1', TG_RELID::regclass) USING NEW.id;
    RETURN NULL;
END;
$$;

CREATE FUNCTION {schema}.set_retention(p_succeeded interval DEFAULT NULL::interval, p_cancelled interval DEFAULT NULL::interval, p_dead interval DEFAULT NULL::interval) RETURNS {schema}.retention
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET lock_timeout TO '10s'
    AS $$
-- Change how long finished jobs are kept (NULL: as it is). Applies to the
-- jobs already finished too, at the next maintenance pass; the leaves of
-- the coming finish times are made for it at once.
DECLARE
    v_row  {schema}.retention;
    v_s    text;
    v_zero boolean;
    v_leaf text;
    v_any  boolean;
BEGIN
    IF least(p_succeeded, p_cancelled, p_dead) < interval '0'
       OR greatest(p_succeeded, p_cancelled, p_dead) > interval '100 years' THEN
        RAISE EXCEPTION 'pgqueue: retention must be from 0 to 100 years' USING ERRCODE = '22023';
    END IF;
    UPDATE {schema}.retention r
    SET succeeded = coalesce(p_succeeded, r.succeeded),
        cancelled = coalesce(p_cancelled, r.cancelled),
        dead = coalesce(p_dead, r.dead),
        updated_at = now()
    RETURNING r.* INTO v_row;
    FOREACH v_s IN ARRAY ARRAY['succeeded', 'cancelled', 'dead'] LOOP
        v_zero := CASE v_s WHEN 'succeeded' THEN v_row.succeeded WHEN 'cancelled' THEN v_row.cancelled
                           ELSE v_row.dead END = interval '0';
        IF v_zero THEN
            EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER INSERT ON {schema}.%I'
                           ' FOR EACH ROW EXECUTE FUNCTION {schema}.jobs_forget()',
                           'jobs_' || v_s || '_forget', 'jobs_' || v_s);
        ELSE
            EXECUTE format('DROP TRIGGER IF EXISTS %I ON {schema}.%I',
                           'jobs_' || v_s || '_forget', 'jobs_' || v_s);
        END IF;
        -- Leaves made ahead for a longer retention would keep the jobs of
        -- their whole range: the empty ones go (the plan below makes
        -- today's); a leaf already holding jobs stays, and passes delete
        -- its rows past retention one by one until it can be dropped.
        FOR v_leaf IN SELECT l.leaf FROM {schema}.retention_leaves() l
                      WHERE l.status::text = v_s AND l.upper > now()
                        AND l.upper - l.lower > {schema}.retention_width(
                            CASE v_s WHEN 'succeeded' THEN v_row.succeeded
                                     WHEN 'cancelled' THEN v_row.cancelled
                                     ELSE v_row.dead END) LOOP
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM {schema}.%I)', v_leaf) INTO v_any;
            IF NOT v_any THEN
                EXECUTE format('DROP TABLE {schema}.%I', v_leaf);
            END IF;
        END LOOP;
    END LOOP;
    PERFORM {schema}.retention_create_leaf(p.status, p.lower, p.upper)
    FROM {schema}.retention_plan() p WHERE p.action = 'create';
    RETURN v_row;
END;
$$;

-- The maintenance election.

CREATE FUNCTION {schema}.maintenance_claim(p_worker_id text, p_seconds double precision) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    -- Take (or keep) the maintenance turn for p_seconds: true when this
    -- worker holds it. A turn not renewed lapses, and any worker takes it.
    WITH taken AS (
        UPDATE {schema}.maintenance m
        SET holder = p_worker_id,
            held_until = now() + make_interval(secs => least(greatest(p_seconds, 1), 3600))
        WHERE m.holder IS NULL OR m.holder = p_worker_id OR m.held_until < now()
        RETURNING 1
    )
    SELECT count(*) > 0 FROM taken
$$;

CREATE FUNCTION {schema}.maintenance_done(p_worker_id text, p_error text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    -- Record a finished pass of the holder (p_error: what went wrong).
    WITH done AS (
        UPDATE {schema}.maintenance m
        SET last_run_at = now(), last_run_by = p_worker_id, last_error = left(p_error, 2000)
        WHERE m.holder = p_worker_id
        RETURNING 1
    )
    SELECT count(*) > 0 FROM done
$$;

CREATE FUNCTION {schema}.maintenance_release(p_worker_id text) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    -- A worker that stops hands its turn on at once.
    UPDATE {schema}.maintenance m SET holder = NULL, held_until = NULL
    WHERE m.holder = p_worker_id
$$;

CREATE FUNCTION {schema}.archive_partition_prepare(p_period text) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET lock_timeout TO '10s'
    AS $$
DECLARE
    v_bound timestamptz;
BEGIN
    IF p_period IS NULL OR p_period NOT IN ('day', 'week', 'month') THEN
        RAISE EXCEPTION 'archive partitions: period must be day, week or month, not %', p_period
            USING ERRCODE = '22023';
    END IF;
    v_bound := (date_trunc(p_period, now() AT TIME ZONE 'UTC')
                + 2 * ('1 ' || p_period)::interval) AT TIME ZONE 'UTC';
    ALTER TABLE {schema}.jobs_archive DROP CONSTRAINT IF EXISTS jobs_archive_legacy_bound;
    EXECUTE format('ALTER TABLE {schema}.jobs_archive ADD CONSTRAINT jobs_archive_legacy_bound'
                   ' CHECK (finished_at IS NOT NULL AND finished_at < %L::timestamptz) NOT VALID',
                   v_bound);
    RETURN v_bound;
END
$$;

CREATE FUNCTION {schema}.archive_partition_switch(p_period text, p_bound timestamp with time zone) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET lock_timeout TO '10s'
    AS $$
DECLARE
    v_grant record;
BEGIN
    ALTER TABLE {schema}.jobs_archive RENAME TO jobs_archive_legacy;
    ALTER INDEX {schema}.jobs_archive_finished_idx RENAME TO jobs_archive_legacy_finished_idx;
    ALTER INDEX {schema}.jobs_archive_dedup_created_idx
        RENAME TO jobs_archive_legacy_dedup_created_idx;
    CREATE TABLE {schema}.jobs_archive (
        LIKE {schema}.jobs_archive_legacy INCLUDING DEFAULTS INCLUDING STORAGE INCLUDING COMMENTS
    ) PARTITION BY RANGE (finished_at);
    CREATE INDEX jobs_archive_finished_idx ON {schema}.jobs_archive (finished_at);
    CREATE INDEX jobs_archive_id_idx ON {schema}.jobs_archive (id);
    -- dedup windows (0007) look archived jobs up by key
    CREATE INDEX jobs_archive_dedup_created_idx ON {schema}.jobs_archive (queue, dedup_key, created_at)
        WHERE dedup_key IS NOT NULL;
    EXECUTE format('ALTER TABLE {schema}.jobs_archive ATTACH PARTITION {schema}.jobs_archive_legacy'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)', p_bound);
    -- The partition constraint now says the same.
    ALTER TABLE {schema}.jobs_archive_legacy DROP CONSTRAINT jobs_archive_legacy_bound;
    -- Whoever could read or write the archive still can.
    FOR v_grant IN
        SELECT a.privilege_type,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
                   AS grantee
        FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
        WHERE c.oid = '{schema}.jobs_archive_legacy'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON {schema}.jobs_archive TO %s',
                       v_grant.privilege_type, v_grant.grantee);
    END LOOP;
    INSERT INTO {schema}.archive_partitioning (period, legacy_upper) VALUES (p_period, p_bound);
    PERFORM {schema}.archive_partitions_ensure(p_bound, now() + 2 * ('1 ' || p_period)::interval);
END
$$;

CREATE FUNCTION {schema}.archive_partitions_ensure(p_from timestamp with time zone, p_to timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET lock_timeout TO '10s'
    AS $$
DECLARE
    v_period  text;
    v_legacy  timestamptz;
    v_start   timestamptz;
    v_end     timestamptz;
    v_name    text;
    v_created integer := 0;
BEGIN
    SELECT period, legacy_upper INTO v_period, v_legacy FROM {schema}.archive_partitioning;
    IF v_period IS NULL OR p_from IS NULL OR p_to IS NULL
       OR NOT isfinite(p_from) OR NOT isfinite(p_to) OR p_from > p_to THEN
        RETURN 0;
    END IF;
    v_start := date_trunc(v_period, p_from AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    IF v_legacy IS NOT NULL AND v_start < v_legacy THEN
        v_start := v_legacy;
    END IF;
    IF p_to - v_start > interval '3700 days' THEN
        RAISE EXCEPTION 'archive partitions: refusing to create partitions over % (from % to %)',
            p_to - v_start, v_start, p_to
            USING ERRCODE = '22023';
    END IF;
    WHILE v_start <= p_to LOOP
        v_end := ((v_start AT TIME ZONE 'UTC') + ('1 ' || v_period)::interval) AT TIME ZONE 'UTC';
        v_name := 'jobs_archive_' || to_char(v_start AT TIME ZONE 'UTC', 'YYYYMMDD');
        IF to_regclass(format('%s.%I', '{schema}', v_name)) IS NULL THEN
            PERFORM pg_advisory_xact_lock(hashtext('pgqueue.archive_partitions'),
                                          '{schema}.jobs_archive'::regclass::oid::integer);
            IF to_regclass(format('%s.%I', '{schema}', v_name)) IS NULL THEN
                EXECUTE format('CREATE TABLE %s.%I PARTITION OF {schema}.jobs_archive'
                               ' FOR VALUES FROM (%L) TO (%L)', '{schema}', v_name, v_start, v_end);
                v_created := v_created + 1;
            END IF;
        END IF;
        v_start := v_end;
    END LOOP;
    RETURN v_created;
END
$$;

CREATE FUNCTION {schema}.archive_partitions_drop(p_cutoff timestamp with time zone, p_max_rows bigint DEFAULT NULL::bigint) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET lock_timeout TO '10s'
    AS $_$
DECLARE
    v_part    record;
    v_rows    bigint;
    v_total   bigint := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {schema}.archive_partitioning) THEN
        RETURN 0;
    END IF;
    FOR v_part IN
        SELECT c.oid::regclass AS part,
               substring(pg_get_expr(c.relpartbound, c.oid) FROM $r$TO \('([^']*)'\)$r$)::timestamptz
                   AS upper_bound,
               pg_get_expr(c.relpartbound, c.oid) LIKE '%MINVALUE%' AS is_legacy
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = '{schema}.jobs_archive'::regclass
        ORDER BY 2
    LOOP
        EXIT WHEN v_part.upper_bound IS NULL OR v_part.upper_bound > p_cutoff;
        EXECUTE format('SELECT count(*) FROM %s', v_part.part) INTO v_rows;
        EXIT WHEN p_max_rows IS NOT NULL AND v_total + v_rows > p_max_rows;
        EXECUTE format('ALTER TABLE {schema}.jobs_archive DETACH PARTITION %s', v_part.part);
        EXECUTE format('DROP TABLE %s', v_part.part);
        IF v_part.is_legacy THEN
            UPDATE {schema}.archive_partitioning SET legacy_upper = NULL;
        END IF;
        v_total := v_total + v_rows;
    END LOOP;
    RETURN v_total;
END
$_$;

CREATE FUNCTION {schema}.check_worker(p_worker_id text, p_token text, p_host text, p_pid integer, p_queues text[], p_concurrency integer, p_tasks text[], p_version text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF p_worker_id IS NULL OR btrim(p_worker_id) = '' OR length(p_worker_id) > 255
       OR p_worker_id ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgqueue: worker_id must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_token IS NULL OR length(p_token) NOT BETWEEN 16 AND 200 THEN
        RAISE EXCEPTION 'pgqueue: a worker secret must be 16 to 200 characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_host IS NULL OR length(p_host) > 255 OR p_host ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgqueue: worker host must be at most 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_pid IS NULL OR p_pid <= 0 THEN
        RAISE EXCEPTION 'pgqueue: worker pid must be a positive integer' USING ERRCODE = '22023';
    END IF;
    IF p_concurrency IS NULL OR p_concurrency NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'pgqueue: worker concurrency must be between 1 and 1000000'
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_queues) > 10000 OR cardinality(p_tasks) > 10000 THEN
        RAISE EXCEPTION 'pgqueue: a worker lists at most 10000 queues and 10000 tasks'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(coalesce(p_queues, '{}') || coalesce(p_tasks, '{}')) n
               WHERE n IS NULL OR n = '' OR length(n) > 255 OR n ~ '[[:cntrl:]]') THEN
        RAISE EXCEPTION 'pgqueue: worker queue and task names must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_version IS NOT NULL AND (length(p_version) > 64 OR p_version ~ '[[:cntrl:]]') THEN
        RAISE EXCEPTION 'pgqueue: worker version must be at most 64 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
END;
$$;

CREATE FUNCTION {schema}.register_worker(p_worker_id text, p_token text, p_host text, p_pid integer, p_queues text[], p_concurrency integer, p_tasks text[], p_version text, p_pool text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_n integer;
BEGIN
    PERFORM {schema}.check_worker(p_worker_id, p_token, p_host, p_pid, p_queues, p_concurrency,
                                  p_tasks, p_version);
    IF p_pool IS NOT NULL AND p_pool NOT IN ('thread', 'process') THEN
        RAISE EXCEPTION 'pgqueue: worker pool must be thread or process, got %', p_pool
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO {schema}.workers AS w
        (id, host, pid, queues, concurrency, tasks, version, token_hash, pool)
    VALUES (p_worker_id, p_host, p_pid, p_queues, p_concurrency, p_tasks, p_version,
            sha256(convert_to(p_token, 'UTF8')), p_pool)
    ON CONFLICT (id) DO UPDATE
    SET host = EXCLUDED.host, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
        concurrency = EXCLUDED.concurrency, tasks = EXCLUDED.tasks, version = EXCLUDED.version,
        pool = EXCLUDED.pool, last_heartbeat_at = now(), lost_at = NULL
    WHERE w.token_hash = EXCLUDED.token_hash;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n = 0 THEN
        -- 22023 like every other refused input: the caller's error names it.
        RAISE EXCEPTION 'pgqueue: worker id % is registered by another worker process: give this worker another worker_id', p_worker_id
            USING ERRCODE = '22023';
    END IF;
END;
$$;

CREATE FUNCTION {schema}.heartbeat_worker(p_worker_id text, p_token text, p_host text, p_pid integer, p_queues text[], p_concurrency integer, p_tasks text[], p_version text, p_pool text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_n integer;
BEGIN
    PERFORM {schema}.check_worker(p_worker_id, p_token, p_host, p_pid, p_queues, p_concurrency,
                                  p_tasks, p_version);
    IF p_pool IS NOT NULL AND p_pool NOT IN ('thread', 'process') THEN
        RAISE EXCEPTION 'pgqueue: worker pool must be thread or process, got %', p_pool
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO {schema}.workers AS w
        (id, host, pid, queues, concurrency, tasks, version, token_hash, pool)
    VALUES (p_worker_id, p_host, p_pid, p_queues, p_concurrency, p_tasks, p_version,
            sha256(convert_to(p_token, 'UTF8')), p_pool)
    ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = now(), lost_at = NULL
    WHERE w.token_hash = EXCLUDED.token_hash;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n > 0;
END;
$$;

CREATE FUNCTION {schema}.deregister_worker(p_worker_id text, p_token text) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    WITH gone AS (
        DELETE FROM {schema}.workers
        WHERE id = p_worker_id AND token_hash = sha256(convert_to(p_token, 'UTF8'))
        RETURNING 1
    )
    SELECT count(*) > 0 FROM gone;
$$;

CREATE FUNCTION {schema}.mark_lost_workers(p_seconds double precision) RETURNS SETOF text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF p_seconds IS NULL OR NOT (p_seconds >= 60 AND p_seconds < 'Infinity'::float8) THEN
        RAISE EXCEPTION 'pgqueue: a worker is declared lost after at least 60 seconds of silence, got %', p_seconds
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    UPDATE {schema}.workers SET lost_at = now()
    WHERE lost_at IS NULL AND last_heartbeat_at < now() - make_interval(secs => p_seconds)
    RETURNING id;
END;
$$;

CREATE FUNCTION {schema}.prune_lost_workers(p_seconds double precision) RETURNS SETOF text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF p_seconds IS NULL OR NOT (p_seconds >= 0 AND p_seconds < 'Infinity'::float8) THEN
        RAISE EXCEPTION 'pgqueue: seconds must be a finite number of 0 or more, got %', p_seconds
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    DELETE FROM {schema}.workers w
    WHERE w.lost_at < now() - make_interval(secs => p_seconds)
      AND NOT EXISTS (SELECT 1 FROM {schema}.jobs_live j
                      WHERE j.stage = 'queued' AND j.status = 'running' AND j.worker_id = w.id)
    RETURNING w.id;
END;
$$;

CREATE FUNCTION {schema}.publish_tasks(p_worker_id text, p_names text[], p_queues text[], p_priorities smallint[], p_max_attempts integer[], p_lease_seconds integer[], p_timeouts double precision[], p_b1 real[], p_b2 real[], p_b3 real[], p_b4 real[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_n integer;
BEGIN
    IF p_worker_id IS NULL OR btrim(p_worker_id) = '' OR length(p_worker_id) > 255
       OR p_worker_id ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgqueue: worker_id must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_names) > 10000 THEN
        RAISE EXCEPTION 'pgqueue: at most 10000 tasks per publish' USING ERRCODE = '22023';
    END IF;
    PERFORM {schema}.check_job(NULL, p.name, '{}'::jsonb, p.queue, p.priority, now(), NULL,
                               p.max_attempts, p.lease_seconds, NULL, NULL,
                               ARRAY[p.b1, p.b2, p.b3, p.b4], 1048576)
    FROM unnest(p_names, p_queues, p_priorities, p_max_attempts, p_lease_seconds,
                p_b1, p_b2, p_b3, p_b4)
        AS p(name, queue, priority, max_attempts, lease_seconds, b1, b2, b3, b4);
    IF EXISTS (SELECT 1 FROM unnest(p_timeouts) t
               WHERE NOT (t > 0 AND t < 'Infinity'::float8)) THEN
        RAISE EXCEPTION 'pgqueue: a task timeout must be a finite number of seconds above 0'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO {schema}.tasks AS t
        (name, queue, priority, max_attempts, lease_seconds, timeout_seconds, backoff, published_by)
    SELECT p.name, p.queue, coalesce(p.priority, 0), coalesce(p.max_attempts, 5),
           coalesce(p.lease_seconds, 60), p.timeout_seconds,
           ARRAY[p.b1, p.b2, p.b3, p.b4]::real[], p_worker_id
    FROM unnest(p_names, p_queues, p_priorities, p_max_attempts, p_lease_seconds,
                p_timeouts, p_b1, p_b2, p_b3, p_b4)
        AS p(name, queue, priority, max_attempts, lease_seconds, timeout_seconds, b1, b2, b3, b4)
    ORDER BY p.name
    ON CONFLICT (name) DO UPDATE
    SET queue = EXCLUDED.queue, priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
        lease_seconds = EXCLUDED.lease_seconds, timeout_seconds = EXCLUDED.timeout_seconds,
        backoff = EXCLUDED.backoff, published_by = EXCLUDED.published_by, last_seen_at = now();
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

CREATE FUNCTION {schema}.register_periodic(p_name text, p_cron text, p_timezone text, p_task text, p_queue text, p_payload jsonb, p_priority smallint, p_max_attempts integer, p_enabled boolean, p_next_fire_at timestamp with time zone) RETURNS SETOF {schema}.schedules
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    -- The schema's owner (and its members) may take over any schedule.
    IF EXISTS (SELECT 1 FROM {schema}.schedules s WHERE s.name = p_name)
       AND NOT EXISTS (SELECT 1 FROM {schema}.periodic_schedules p WHERE p.name = p_name)
       AND {schema}.trusted_clock(now()) IS NULL THEN
        RETURN;
    END IF;
    PERFORM {schema}.check_job(NULL, p_task, p_payload, coalesce(p_queue, 'default'), p_priority,
                               coalesce(p_next_fire_at, now()), NULL, p_max_attempts, NULL,
                               NULL, NULL, NULL,
                               coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576));
    RETURN QUERY
    INSERT INTO {schema}.schedules AS s
        (name, cron, timezone, task, queue, payload, priority, max_attempts, enabled,
         next_fire_at)
    VALUES (p_name, p_cron, p_timezone, p_task, p_queue, p_payload, p_priority, p_max_attempts,
            p_enabled, p_next_fire_at)
    ON CONFLICT (name) DO UPDATE
    SET cron = EXCLUDED.cron,
        timezone = EXCLUDED.timezone,
        task = EXCLUDED.task,
        queue = EXCLUDED.queue,
        payload = EXCLUDED.payload,
        priority = EXCLUDED.priority,
        max_attempts = EXCLUDED.max_attempts,
        next_fire_at = CASE
            WHEN NOT s.enabled THEN NULL
            WHEN s.cron = EXCLUDED.cron AND s.timezone = EXCLUDED.timezone THEN s.next_fire_at
            ELSE EXCLUDED.next_fire_at END,
        revision = s.revision + 1,
        updated_at = now()
    WHERE (s.cron, s.timezone, s.task, s.queue, s.payload, s.priority, s.max_attempts)
          IS DISTINCT FROM
          (EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.task, EXCLUDED.queue, EXCLUDED.payload,
           EXCLUDED.priority, EXCLUDED.max_attempts)
    RETURNING s.*;
    INSERT INTO {schema}.periodic_schedules (name) VALUES (p_name) ON CONFLICT DO NOTHING;
END;
$$;

CREATE FUNCTION {schema}.fire_schedules(p_names text[], p_due_at timestamp with time zone[], p_revisions bigint[], p_created_at timestamp with time zone[], p_next_fire_at timestamp with time zone[], p_last_fire_at timestamp with time zone[], p_jobs jsonb[]) RETURNS TABLE(name text, job_ids bigint[])
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
WITH input AS (
    SELECT * FROM unnest(p_names, p_due_at, p_revisions, p_created_at, p_next_fire_at,
                         p_last_fire_at, p_jobs)
        AS i(name, due_at, revision, created_at, next_fire_at, last_fire_at, jobs)
), claimed AS MATERIALIZED (
    SELECT s.name, i.next_fire_at, i.last_fire_at, i.jobs
    FROM {schema}.schedules s
    JOIN input i ON i.name = s.name
    WHERE s.name = ANY (p_names)
      AND s.enabled AND s.next_fire_at = i.due_at
      AND i.next_fire_at > i.due_at
      AND s.revision = i.revision AND s.created_at = i.created_at
    ORDER BY s.name
    FOR UPDATE OF s SKIP LOCKED
), enqueued AS (
    SELECT c.name, array_agg(e.job_id ORDER BY e.job_id) AS job_ids
    FROM claimed c CROSS JOIN LATERAL {schema}.enqueue_batch(c.jobs) e
    GROUP BY c.name
)
UPDATE {schema}.schedules s
SET next_fire_at = c.next_fire_at,
    last_fire_at = c.last_fire_at,
    last_job_id = e.job_ids[array_upper(e.job_ids, 1)]
FROM claimed c
JOIN enqueued e ON e.name = c.name
WHERE s.name = c.name
RETURNING s.name, e.job_ids;
$$;

CREATE FUNCTION {schema}.schedules_notify() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify({channel}, 's:' || CASE WHEN TG_OP = 'DELETE' THEN OLD.name ELSE NEW.name END);
    RETURN NULL;
END;
$$;

-- =====================================================================================
-- Triggers
-- =====================================================================================

-- Serial keys: a job queued behind a live job of its key is held; when a job
-- leaves jobs_live (finished, or deleted) or stops being live in it, the
-- next one of its key is released.
CREATE TRIGGER jobs_serial_hold_insert BEFORE INSERT ON {schema}.jobs_live FOR EACH ROW WHEN (((new.serial_key IS NOT NULL) AND (new.status = 'queued'::{schema}.job_status))) EXECUTE FUNCTION {schema}.jobs_serial_hold();

CREATE TRIGGER jobs_serial_hold_update AFTER UPDATE OF status ON {schema}.jobs FOR EACH ROW WHEN (((new.serial_key IS NOT NULL) AND (new.status = 'queued'::{schema}.job_status) AND (old.status <> 'queued'::{schema}.job_status))) EXECUTE FUNCTION {schema}.jobs_serial_hold_requeued();

CREATE TRIGGER jobs_serial_release_delete AFTER DELETE ON {schema}.jobs_live FOR EACH ROW WHEN (((old.serial_key IS NOT NULL) AND (old.status = ANY (ARRAY['queued'::{schema}.job_status, 'scheduled'::{schema}.job_status, 'running'::{schema}.job_status])))) EXECUTE FUNCTION {schema}.jobs_serial_release();

-- Jobs other jobs wait for: a completion moves the row out of jobs_live (a
-- DELETE there) into a finished partition (an INSERT there); each notes the
-- job, and one call per statement counts them off their dependents.
CREATE TRIGGER jobs_left_live AFTER DELETE ON {schema}.jobs_live FOR EACH ROW WHEN ((old.has_dependents AND {schema}.note_dependency_end(('d'::text || (old.id)::text)))) EXECUTE FUNCTION {schema}.jobs_release_dependents();

CREATE TRIGGER jobs_arrived AFTER INSERT ON {schema}.jobs FOR EACH ROW WHEN ((new.has_dependents AND {schema}.note_dependency_end((
        CASE
            WHEN (new.stage = 'succeeded'::{schema}.job_status) THEN 's'::text
            WHEN (new.stage = ANY (ARRAY['dead'::{schema}.job_status, 'cancelled'::{schema}.job_status])) THEN 'f'::text
            ELSE 'u'::text
        END || (new.id)::text)))) EXECUTE FUNCTION {schema}.jobs_release_dependents();

CREATE TRIGGER schedules_changed AFTER INSERT OR DELETE OR UPDATE OF revision ON {schema}.schedules FOR EACH ROW EXECUTE FUNCTION {schema}.schedules_notify();

-- =====================================================================================
-- Grants and seed rows
-- =====================================================================================

-- No function is executable by PUBLIC: `pgqueue grant` gives each kind of
-- role the ones it needs (pgqueue/grants.py). Functions added by later
-- revisions are not executable by PUBLIC either.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- The one row of each settings table.
INSERT INTO {schema}.limits DEFAULT VALUES;
INSERT INTO {schema}.retention DEFAULT VALUES;
INSERT INTO {schema}.maintenance DEFAULT VALUES;

-- The first leaves of the finished partitions, so that jobs finishing before
-- a worker's first maintenance pass land in them, not in the default leaves.
-- (The leaves are data, like rows: `pgqueue schema check` leaves them out.)
SELECT {schema}.retention_create_leaf(p.status, p.lower, p.upper)
FROM {schema}.retention_plan() p WHERE p.action = 'create';
