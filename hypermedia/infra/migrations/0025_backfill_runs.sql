-- Backfill runs (issue 21 item 2, ADR 0058): an account's regeneration of an operation's or a
-- preset's outputs on the bulk queue, paced by a token bucket at the run's rate and braked while
-- an interactive queue is behind. A run's items are the (object, params) pairs its selector
-- matched when it was created; the gateway's runner enqueues them one at a time through job
-- creation, each under the idempotency key (object, operation, params hash, target version), so
-- a restarted or repeated run never makes a job twice (hypermedia/jobs/backfill.py).
-- depends: 0024_presets

CREATE TABLE backfill_runs (
    run_id           uuid PRIMARY KEY,
    account_id       uuid NOT NULL REFERENCES accounts(account_id),
    operation        text NOT NULL,
    params           jsonb,
    preset_name      text,
    preset_version   integer,
    target_version   integer NOT NULL CHECK (target_version >= 1),
    outdated_only    boolean NOT NULL,
    object_ids       uuid[],
    created_after    timestamptz,
    created_before   timestamptz,
    priority         integer NOT NULL CHECK (priority BETWEEN 7 AND 10),
    rate_per_second  double precision NOT NULL CHECK (rate_per_second > 0),
    deadline         timestamptz,
    state            text NOT NULL CHECK (state IN
                         ('running', 'paused', 'dispatched', 'completed', 'cancelled', 'expired')),
    reason_code      text,
    reason           text,
    waiting_reason   text,
    braked_seconds   double precision NOT NULL DEFAULT 0,
    planned_millicredits bigint NOT NULL DEFAULT 0,
    tokens           double precision NOT NULL DEFAULT 0,
    refilled_at      timestamptz NOT NULL DEFAULT now(),
    lease_until      timestamptz,
    leased_by        text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    ended_at         timestamptz
);
CREATE INDEX backfill_runs_account_idx ON backfill_runs(account_id, created_at DESC);
-- The runner's housekeeping and lease read these every tick in every gateway: never the ended runs.
CREATE INDEX backfill_runs_active_idx ON backfill_runs(state) WHERE state IN ('running', 'paused', 'dispatched');

CREATE TABLE backfill_items (
    run_id         uuid NOT NULL REFERENCES backfill_runs(run_id),
    item_no        integer NOT NULL,
    object_id      uuid NOT NULL,
    params         jsonb NOT NULL,
    size_bytes     bigint NOT NULL,
    state          text NOT NULL DEFAULT 'pending'
                       CHECK (state IN ('pending', 'enqueued', 'existing', 'skipped')),
    job_id         uuid,
    replays        integer NOT NULL DEFAULT 0,
    error_code     text,
    error_message  text,
    PRIMARY KEY (run_id, item_no)
);
CREATE INDEX backfill_items_pending_idx ON backfill_items(run_id, item_no) WHERE state = 'pending';
CREATE INDEX backfill_items_job_idx ON backfill_items(job_id) WHERE job_id IS NOT NULL;
