-- pgqueue cron schedules, revision 0002.
--
-- Exactly once per fire time, with any number of schedulers: a scheduler
-- reads the due schedules, computes in Python which fire times to enqueue and
-- the next fire time, then runs ONE statement (schedule_fire_many) that
--   1. locks each schedule row only if it still has the next_fire_at and the
--      revision the scheduler read (compare-and-set; FOR UPDATE SKIP LOCKED
--      re-checks the condition on the newest committed row version),
--   2. enqueues its jobs through enqueue_batch, and
--   3. moves next_fire_at past the fired slots,
-- all in one transaction. A second scheduler that read the same row either
-- skips it (locked) or finds next_fire_at already moved and enqueues nothing.
-- Fired slots are always >= the next_fire_at they were checked against and
-- < the new next_fire_at, so the fire times of one schedule strictly increase
-- and no slot can be enqueued twice. A crash rolls back jobs and advance together.

CREATE TABLE {schema}.schedules (
    name         text PRIMARY KEY,           -- unique per schema; no surrogate key, so an
                                             -- upsert that changes nothing writes nothing
    cron         text NOT NULL,              -- 5 fields, or 6 (the sixth is seconds)
    timezone     text NOT NULL DEFAULT 'UTC', -- IANA name; fire times follow its DST
    task         text NOT NULL,
    queue        text,                       -- NULL: the task's default queue
    payload      jsonb NOT NULL DEFAULT '{}',
    priority     smallint,                   -- NULL: the task's default
    max_attempts integer CHECK (max_attempts > 0),  -- NULL: the task's default
    enabled      boolean NOT NULL DEFAULT true,
    -- The earliest slot not yet enqueued; NULL while disabled. Computed by
    -- the scheduler (croniter in Python), compared-and-set by every fire.
    next_fire_at timestamptz,
    last_fire_at timestamptz,                -- fire time of the last enqueued slot
    last_job_id  bigint,                     -- the job it last enqueued (no FK: jobs get archived)
    -- Bumped by every change of the definition (not by fires): a fire built
    -- from an older definition matches nothing and is recomputed.
    revision     bigint NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CHECK (NOT enabled OR next_fire_at IS NOT NULL),
    CHECK (jsonb_typeof(payload) = 'object')
);

-- The scheduler's "what is due" and "when is the next one" lookups.
CREATE INDEX schedules_next_fire_idx ON {schema}.schedules (next_fire_at) WHERE enabled;

-- Wake every scheduler when a definition changes (add, enable, remove, ...),
-- so one sleeping until a later fire time sees an earlier one at once. Fires
-- only move next_fire_at and do not notify.
CREATE FUNCTION {schema}.schedules_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({channel}, 's:' || CASE WHEN TG_OP = 'DELETE' THEN OLD.name ELSE NEW.name END);
    RETURN NULL;
END;
$$;

CREATE TRIGGER schedules_changed
AFTER INSERT OR DELETE OR UPDATE OF revision ON {schema}.schedules
FOR EACH ROW EXECUTE FUNCTION {schema}.schedules_notify();
