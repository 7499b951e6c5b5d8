-- Document passwords (issue 5, password part): the `password` a request gives a document operation
-- is kept here, beside the job, never in processing_jobs.params (which GET /v1/jobs returns and
-- which are stored for ever). One row per job that was given one, inserted by the gateway in the
-- transaction that inserts the job; read by the docworker just before it runs the job. A trigger
-- deletes the row in the transaction that makes the job terminal, whichever path ends it (worker,
-- reaper, gateway cancel), as processing_jobs_webhook records webhooks; deleting the job deletes
-- it too. ADR 0019.
-- depends: 0008_office_profiles

CREATE TABLE job_secrets (
    job_id      uuid PRIMARY KEY REFERENCES processing_jobs(job_id) ON DELETE CASCADE,
    password    text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION delete_job_secrets() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_secrets WHERE job_id = NEW.job_id;
    RETURN NEW;
END;
$$;

CREATE TRIGGER processing_jobs_secrets
    AFTER UPDATE OF status ON processing_jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION delete_job_secrets();
