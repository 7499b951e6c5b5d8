-- The scheduler (issue 20, services/scheduler, ADR 0047): the burst workers it launched and every
-- decision it took. A burst worker goes requested -> booting -> registered -> draining ->
-- terminated (or failed: it never registered within its boot grace); its cost follows from
-- requested_at .. terminated_at and cost_per_hour (per-second billing). A worker process of a
-- burst worker names it in workers.burst_worker_id (HM_BURST_WORKER_ID), which is how the
-- scheduler tells its own workers from the standing ones (it only ever stops its own).
-- depends: 0020_worker_metrics_admission

CREATE TABLE burst_workers (
    burst_worker_id  uuid PRIMARY KEY,
    pool             text NOT NULL,
    provider         text NOT NULL,
    capacity_type    text NOT NULL CHECK (capacity_type IN ('on-demand', 'spot')),
    provider_ref     text,
    state            text NOT NULL CHECK (state IN ('requested', 'booting', 'registered', 'draining',
                                                    'terminated', 'failed')),
    slots            integer NOT NULL CHECK (slots >= 1),
    cost_per_hour    numeric(12, 6) NOT NULL CHECK (cost_per_hour >= 0),
    leader           text NOT NULL,
    requested_at     timestamptz NOT NULL DEFAULT now(),
    launched_at      timestamptz,
    registered_at    timestamptz,
    draining_at      timestamptz,
    terminated_at    timestamptz,
    last_busy_at     timestamptz,
    reason           text
);
CREATE INDEX burst_workers_live_idx ON burst_workers(pool) WHERE state NOT IN ('terminated', 'failed');

CREATE TABLE scaling_decisions (
    decision_id  bigserial PRIMARY KEY,
    pool         text NOT NULL,
    decided_at   timestamptz NOT NULL DEFAULT now(),
    leader       text NOT NULL,
    inputs       jsonb NOT NULL,
    target       integer NOT NULL,
    action       text NOT NULL CHECK (action IN ('start', 'drain', 'hold')),
    count        integer NOT NULL DEFAULT 0,
    reason       text NOT NULL
);
CREATE INDEX scaling_decisions_pool_idx ON scaling_decisions(pool, decided_at);

ALTER TABLE workers ADD COLUMN burst_worker_id uuid;
CREATE INDEX workers_burst_idx ON workers(burst_worker_id) WHERE burst_worker_id IS NOT NULL;

-- The scheduler's reads each cycle (services/scheduler/demand.py): attempts completed since the
-- last cycle (the EWMA of duration_ms per operation) and the jobs created within the arrival
-- window (the arrival rate), without a scan of either table.
CREATE INDEX job_attempts_completed_idx ON job_attempts(finished_at) WHERE status = 'completed';
CREATE INDEX processing_jobs_created_idx ON processing_jobs(created_at);

-- A spot worker's hand-back when its instance is being reclaimed (issue 20 item 5): the attempt is
-- 'preempted' (error PREEMPTED), counted, like a drain's hand-back, as lost to the infrastructure
-- (lost_attempts, never against max_attempts).
ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_status_check,
    ADD CONSTRAINT job_attempts_status_check
        CHECK (status IN ('processing', 'completed', 'failed', 'lost', 'cancelled', 'preempted'));
