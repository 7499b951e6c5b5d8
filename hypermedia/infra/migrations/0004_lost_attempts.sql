-- Attempts lost to the infrastructure (worker killed, lease expired, handed back at drain) are
-- counted apart from attempts that failed on the job's own account: max_attempts bounds the
-- latter; the former have their own, larger budget (lifecycle.MAX_LOST_ATTEMPTS). See ADR 0014.
ALTER TABLE processing_jobs ADD COLUMN lost_attempts integer NOT NULL DEFAULT 0 CHECK (lost_attempts >= 0);
