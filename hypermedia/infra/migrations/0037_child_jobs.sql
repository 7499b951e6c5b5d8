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
