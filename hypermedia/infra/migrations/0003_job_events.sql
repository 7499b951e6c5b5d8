-- Job events: the one source of GET /v1/jobs/{id}/events (SSE) and gRPC WatchJob. Status events
-- are written by a trigger in the transaction of each status change; progress events by workers.
-- Every insert notifies channel 'job_events' with the job id, so watchers wake at once.
-- depends: 0002_webhooks

CREATE TABLE job_events (
    event_id     bigserial PRIMARY KEY,
    job_id       uuid NOT NULL REFERENCES processing_jobs(job_id) ON DELETE CASCADE,
    kind         text NOT NULL CHECK (kind IN ('status', 'progress')),
    status       text NOT NULL,
    progress     double precision,
    detail       jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_events_job_idx ON job_events(job_id, event_id);

CREATE FUNCTION record_job_status_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_events (job_id, kind, status, detail)
    VALUES (NEW.job_id, 'status', NEW.status, jsonb_strip_nulls(jsonb_build_object(
        'attempt_count', NEW.attempt_count,
        'error_code', NEW.error_code,
        'error_message', NEW.error_message)));
    RETURN NEW;
END;
$$;

CREATE FUNCTION notify_job_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('job_events', NEW.job_id::text);
    RETURN NEW;
END;
$$;

CREATE TRIGGER processing_jobs_status_event_insert
    AFTER INSERT ON processing_jobs
    FOR EACH ROW EXECUTE FUNCTION record_job_status_event();

CREATE TRIGGER processing_jobs_status_event_update
    AFTER UPDATE OF status ON processing_jobs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION record_job_status_event();

CREATE TRIGGER job_events_notify
    AFTER INSERT ON job_events
    FOR EACH ROW EXECUTE FUNCTION notify_job_event();
