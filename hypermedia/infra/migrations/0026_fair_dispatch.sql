-- Fairness within a band (issue 21 item 4, ADR 0059): an account has at most a window of jobs
-- published and not yet claimed per (queue, priority) subject; the outbox rows of its other jobs
-- there wait in Postgres (`deferred`), released one for one as its jobs are claimed, so another
-- account's job queued behind a flood waits behind at most the window (hypermedia/jobs/lifecycle/rules.py).
-- depends: 0025_backfill_runs

ALTER TABLE outbox ADD COLUMN job_id uuid;
ALTER TABLE outbox ADD COLUMN account_id uuid;
ALTER TABLE outbox ADD COLUMN job_queue text;
ALTER TABLE outbox ADD COLUMN priority integer;
ALTER TABLE outbox ADD COLUMN deferred boolean NOT NULL DEFAULT false;

CREATE INDEX outbox_ready_idx ON outbox(outbox_id) WHERE published_at IS NULL AND NOT deferred;
CREATE INDEX outbox_deferred_idx ON outbox(account_id, job_queue, priority, outbox_id)
    WHERE published_at IS NULL AND deferred;
CREATE INDEX outbox_pending_job_idx ON outbox(job_id) WHERE published_at IS NULL;
CREATE INDEX processing_jobs_account_queued_idx ON processing_jobs(account_id, queue, priority)
    WHERE status = 'queued';
