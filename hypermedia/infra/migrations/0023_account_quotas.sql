-- Job quotas per account (issue 21 item 4, ADR 0055): the credits service checks them in
-- EstimateAndHold, in the transaction that holds the request's credits. `interactive` lets the
-- account use priorities 1-3 (others are refused 403 PRIORITY_NOT_ALLOWED); `max_queued_jobs` is
-- the most jobs it may have queued or waiting for a retry at once (429 TOO_MANY_QUEUED_JOBS);
-- `rate_per_second` and `burst` are a token bucket on its job-creating requests (429 RATE_LIMITED
-- with Retry-After), whose state is `tokens` at `refilled_at`. A NULL limit means the credits
-- service's default (HM_QUOTA_MAX_QUEUED_JOBS, HM_QUOTA_RATE_PER_SECOND, HM_QUOTA_BURST). Set by
-- `hypermedia admin set-quota`; a row is made at an account's first request.
-- depends: 0022_admin_accounts

CREATE TABLE account_quotas (
    account_id       uuid PRIMARY KEY REFERENCES accounts(account_id),
    interactive      boolean NOT NULL DEFAULT false,
    max_queued_jobs  integer CHECK (max_queued_jobs >= 0),
    rate_per_second  double precision CHECK (rate_per_second > 0),
    burst            integer CHECK (burst >= 1),
    tokens           double precision,
    refilled_at      timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- The count of an account's waiting jobs, read at every job-creating request.
CREATE INDEX processing_jobs_waiting_idx ON processing_jobs(account_id)
    WHERE status IN ('queued', 'retry_wait');

-- Accounts made before quotas keep what they could do: every priority. New accounts get the
-- interactive band only from an operator (`hypermedia admin set-quota ACCOUNT --interactive`).
INSERT INTO account_quotas (account_id, interactive) SELECT account_id, true FROM accounts;
