-- Delayed jobs (issue 25 item 1, ADR 0071): a process request may name `not_before` (or
-- `delay_seconds`); its jobs are created `scheduled`, hold their credits at once, and have no
-- outbox row until the reaper's poller finds them due (hypermedia/jobs/lifecycle/recovery.py,
-- promote_scheduled) and moves them to `queued` with their outbox rows in one transaction.
-- depends: 0030_retention

ALTER TABLE processing_jobs DROP CONSTRAINT processing_jobs_status_check,
    ADD CONSTRAINT processing_jobs_status_check
        CHECK (status IN ('created', 'scheduled', 'queued', 'claimed', 'processing', 'completed',
                          'retry_wait', 'failed', 'cancelled', 'cancel_requested'));

ALTER TABLE processing_jobs ADD COLUMN not_before timestamptz;

-- The poller's due jobs, oldest first, without a scan.
CREATE INDEX processing_jobs_scheduled_due_idx ON processing_jobs(not_before) WHERE status = 'scheduled';
