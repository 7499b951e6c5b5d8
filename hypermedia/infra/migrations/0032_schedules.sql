-- Schedules (issue 25 items 2 and 3, ADR 0072): a name, a cron expression in a time zone, and what
-- each tick runs: a process request on given objects, a backfill run, or (admin accounts only) a
-- maintenance task of the platform. Every gateway polls the due schedules (FOR UPDATE SKIP
-- LOCKED) and records each tick as a schedule_runs row whose (schedule_id, due_at) is unique, so
-- a tick runs once however many pollers there are (hypermedia/jobs/schedules.py).
-- depends: 0031_delayed_jobs

CREATE TABLE schedules (
    schedule_id     uuid PRIMARY KEY,
    account_id      uuid NOT NULL REFERENCES accounts(account_id),
    name            text NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    cron            text NOT NULL,
    time_zone       text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('process', 'backfill', 'maintenance')),
    spec            jsonb NOT NULL,
    missed          text NOT NULL CHECK (missed IN ('skip', 'catch_up')),
    catch_up_limit  integer NOT NULL CHECK (catch_up_limit BETWEEN 1 AND 100),
    paused          boolean NOT NULL DEFAULT false,
    next_run_at     timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, name)
);
-- The pollers' read: the active schedules due first.
CREATE INDEX schedules_due_idx ON schedules(next_run_at) WHERE NOT paused;

CREATE TABLE schedule_runs (
    run_id       uuid PRIMARY KEY,
    schedule_id  uuid NOT NULL REFERENCES schedules(schedule_id) ON DELETE CASCADE,
    due_at       timestamptz NOT NULL,
    trigger      text NOT NULL CHECK (trigger IN ('tick', 'manual')),
    state        text NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'skipped')),
    runner       text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    finished_at  timestamptz,
    outcome      jsonb,
    error_code   text,
    error        text,
    UNIQUE (schedule_id, due_at)
);
-- One manual run of a schedule pending or running at a time (a trigger while one is: 409).
CREATE UNIQUE INDEX schedule_runs_one_manual_idx ON schedule_runs(schedule_id)
    WHERE trigger = 'manual' AND state IN ('pending', 'running');
CREATE INDEX schedule_runs_history_idx ON schedule_runs(schedule_id, due_at DESC);
-- The runners' read: runs to start, and runs whose runner may be gone.
CREATE INDEX schedule_runs_open_idx ON schedule_runs(created_at) WHERE state IN ('pending', 'running');
