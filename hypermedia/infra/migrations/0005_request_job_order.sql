-- The job ids of a process request in the order of its operations, so that a replay of an
-- Idempotency-Key returns them in that order (jobs of one request share created_at = now()).
ALTER TABLE process_requests ADD COLUMN job_ids uuid[];
