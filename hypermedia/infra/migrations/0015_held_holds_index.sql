-- The holds still held, oldest first: what CreditsService.ListHolds pages through for the
-- reaper's settlement sweep (issue 16: the reaper no longer reads credit_holds itself).
-- depends: 0014_storage_quota

CREATE INDEX credit_holds_held ON credit_holds (created_at, job_id) WHERE status = 'held';
