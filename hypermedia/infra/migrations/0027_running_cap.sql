-- A cap on an account's running jobs per queue (issue 21 item 4, ADR 0060): at most
-- `max_running_jobs` of its jobs claimed, processing or cancel_requested in each queue at once.
-- The claim checks it (hypermedia/jobs/lifecycle/attempts.py): a job over the cap stays queued
-- and its message comes back after a short delay. NULL: no cap (the default). Set by
-- `hypermedia admin set-quota --max-running-jobs`.
-- depends: 0026_fair_dispatch

ALTER TABLE account_quotas ADD COLUMN max_running_jobs integer CHECK (max_running_jobs >= 1);

-- The count of an account's running jobs in a queue, read at each claim of a capped account's jobs.
CREATE INDEX processing_jobs_account_running_idx ON processing_jobs(account_id, queue)
    WHERE status IN ('claimed', 'processing', 'cancel_requested');
