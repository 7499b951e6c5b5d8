-- Checkpoints (issue 23 item 1, ADR 0069): the finished parts of a job that survive its attempt.
-- A worker records each part (an OCR page) once its bytes are in the store under the job's
-- prefix, fenced by the attempt that made it (hypermedia/jobs/checkpoints.py); the next attempt
-- gets GET URLs of them with its grant (storage GrantJob) and resumes after them. Storage's sweep
-- deletes the bytes and rows of jobs that ended (completed, failed, cancelled).
-- depends: 0028_charges_for_work

CREATE TABLE job_checkpoints (
    job_id      uuid NOT NULL REFERENCES processing_jobs(job_id) ON DELETE CASCADE,
    part        text NOT NULL CHECK (part ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
    key         text NOT NULL,
    size_bytes  bigint NOT NULL CHECK (size_bytes >= 0),
    sha256      text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    attempt     integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, part)
);
