-- Child jobs (issue 23 item 2, ADR 0081): a long transcode fans out. Its attempt creates one
-- child job per chunk but the last (hypermedia/jobs/lifecycle/children.py), each of the same
-- operation, profile and object, unbilled (estimated_credits 0, no hold), queued on the same
-- queue for any media unit; the child encodes its chunk and keeps it as a checkpoint part of
-- the parent (job_checkpoints.made_by_job), and the parent's attempt, parked meanwhile without
-- a slot, takes every kept chunk, encodes the last and joins them.
-- depends: 0036_megapixel_charges

ALTER TABLE processing_jobs
    ADD COLUMN parent_job_id uuid REFERENCES processing_jobs(job_id) ON DELETE CASCADE,
    ADD COLUMN chunk_index integer CHECK (chunk_index >= 0),
    -- When the job created its children; a job fans out once, whatever its attempts.
    ADD COLUMN fanned_out_at timestamptz,
    ADD CONSTRAINT processing_jobs_child_chunk CHECK ((parent_job_id IS NULL) = (chunk_index IS NULL));

-- A parent's children, without a scan.
CREATE INDEX processing_jobs_parent_idx ON processing_jobs(parent_job_id) WHERE parent_job_id IS NOT NULL;

-- The child job that made a part of its parent; NULL: an attempt of the job itself.
ALTER TABLE job_checkpoints ADD COLUMN made_by_job uuid;

-- A job that ends, or whose cancellation is requested, takes its children with it, whatever
-- ended it (a caller's cancel, a permanent failure, its lost attempts, the reaper): the children
-- not yet held by a worker are cancelled, the others asked to stop. A trigger, so that no path
-- is missed, and one whose UPDATE reads a fresh snapshot: a child created by a fan-out that
-- committed while the cancel waited on the parent's row is seen.
CREATE FUNCTION end_children() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE processing_jobs SET
        status = CASE WHEN status IN ('created', 'scheduled', 'queued', 'retry_wait') THEN 'cancelled'
                      ELSE 'cancel_requested' END,
        completed_at = CASE WHEN status IN ('created', 'scheduled', 'queued', 'retry_wait') THEN now() END,
        updated_at = now()
    WHERE parent_job_id = NEW.job_id
      AND status IN ('created', 'scheduled', 'queued', 'retry_wait', 'claimed', 'processing');
    RETURN NULL;
END
$$;

CREATE TRIGGER processing_jobs_end_children AFTER UPDATE OF status ON processing_jobs
    FOR EACH ROW
    WHEN (NEW.fanned_out_at IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled', 'cancel_requested'))
    EXECUTE FUNCTION end_children();
