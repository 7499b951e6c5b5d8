-- Webhooks: each terminal state of a job that has a webhook_url becomes one delivery row, written
-- by a trigger in the same transaction as the state change, so no path that ends a job (worker,
-- reaper, cancel) can forget it. The reaper's dispatcher sends them (Standard Webhooks format).
-- depends: 0001_initial

ALTER TABLE accounts ADD COLUMN webhook_secret text;

CREATE TABLE webhook_deliveries (
    delivery_id       uuid PRIMARY KEY,
    job_id            uuid NOT NULL REFERENCES processing_jobs(job_id) ON DELETE CASCADE,
    account_id        uuid NOT NULL REFERENCES accounts(account_id),
    url               text NOT NULL,
    event_type        text NOT NULL,
    payload           jsonb NOT NULL,
    status            text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts          integer NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    last_status_code  integer,
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    delivered_at      timestamptz,
    CONSTRAINT webhook_deliveries_job_event UNIQUE (job_id, event_type)
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries(next_attempt_at) WHERE status = 'pending';

CREATE FUNCTION enqueue_job_webhook() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (delivery_id, job_id, account_id, url, event_type, payload)
    VALUES (
        gen_random_uuid(), NEW.job_id, NEW.account_id, NEW.webhook_url, 'job.' || NEW.status,
        jsonb_build_object(
            'type', 'job.' || NEW.status,
            'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'data', jsonb_build_object(
                'job_id', NEW.job_id,
                'object_id', NEW.object_id,
                'operation', NEW.operation,
                'status', NEW.status,
                'attempt_count', NEW.attempt_count,
                'error_code', NEW.error_code,
                'error_message', NEW.error_message,
                'actual_credits', NEW.actual_credits / 1000.0
            )
        )
    )
    ON CONFLICT ON CONSTRAINT webhook_deliveries_job_event DO NOTHING;
    RETURN NEW;
END;
$$;

CREATE TRIGGER processing_jobs_webhook
    AFTER UPDATE OF status ON processing_jobs
    FOR EACH ROW
    WHEN (NEW.webhook_url IS NOT NULL AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION enqueue_job_webhook();
