-- Initial schema of the system of record. Names follow the seed (processing_jobs, job_attempts,
-- job_outputs, processing_profiles, visibility_timeout, workers, worker_metrics).
-- Money is integer millicredits (1 credit = 1000).

CREATE TABLE accounts (
    account_id   uuid PRIMARY KEY,
    name         text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored as SHA-256 of the secret part; the key itself is shown once at creation.
CREATE TABLE api_keys (
    key_id       text PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES accounts(account_id),
    secret_hash  bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);

CREATE TABLE pools (
    pool_id      uuid PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES accounts(account_id),
    name         text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pools_account_idx ON pools(account_id);

CREATE TABLE objects (
    object_id         uuid PRIMARY KEY,
    pool_id           uuid NOT NULL REFERENCES pools(pool_id),
    key               text NOT NULL UNIQUE,
    size_bytes        bigint NOT NULL CHECK (size_bytes >= 0),
    mime_type         text NOT NULL,
    sha256            text NOT NULL,
    state             text NOT NULL CHECK (state IN ('pending', 'available')),
    filename          text,
    source_object_id  uuid REFERENCES objects(object_id),
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX objects_source_idx ON objects(source_object_id);

CREATE TABLE object_ownership (
    object_id    uuid NOT NULL REFERENCES objects(object_id) ON DELETE CASCADE,
    account_id   uuid NOT NULL REFERENCES accounts(account_id),
    role         text NOT NULL DEFAULT 'owner',
    PRIMARY KEY (object_id, account_id)
);

CREATE TABLE processing_profiles (
    operation        text NOT NULL,
    version          integer NOT NULL,
    queue            text NOT NULL CHECK (queue IN ('images', 'documents', 'ocr', 'media', 'bulk')),
    base_cost        bigint NOT NULL CHECK (base_cost >= 0),
    per_mb           bigint NOT NULL CHECK (per_mb >= 0),
    timeout_seconds  integer NOT NULL CHECK (timeout_seconds > 0),
    max_attempts     integer NOT NULL CHECK (max_attempts > 0),
    max_input_bytes  bigint NOT NULL CHECK (max_input_bytes > 0),
    max_pixels       bigint NOT NULL DEFAULT 100000000,
    memory_limit_mb  integer NOT NULL DEFAULT 2048,
    backoff_base_seconds integer NOT NULL DEFAULT 60,
    input_kinds      text[] NOT NULL,
    active           boolean NOT NULL DEFAULT true,
    PRIMARY KEY (operation, version)
);
CREATE UNIQUE INDEX processing_profiles_active_idx ON processing_profiles(operation) WHERE active;

INSERT INTO processing_profiles
    (operation, version, queue, base_cost, per_mb, timeout_seconds, max_attempts, max_input_bytes,
     max_pixels, memory_limit_mb, input_kinds)
VALUES
    ('thumbnail', 1, 'images', 1000, 200, 30, 3, 52428800, 100000000, 2048, ARRAY['image']),
    ('resize',    1, 'images', 1000, 200, 30, 3, 52428800, 100000000, 2048, ARRAY['image']),
    ('compress',  1, 'images', 1500, 300, 60, 3, 52428800, 100000000, 2048, ARRAY['image']),
    ('convert',   1, 'images', 1500, 300, 60, 3, 52428800, 100000000, 2048, ARRAY['image']);

CREATE TABLE processing_jobs (
    job_id             uuid PRIMARY KEY,
    account_id         uuid NOT NULL REFERENCES accounts(account_id),
    object_id          uuid NOT NULL REFERENCES objects(object_id),
    request_id         uuid NOT NULL,
    operation          text NOT NULL,
    profile_version    integer NOT NULL,
    queue              text NOT NULL,
    params             jsonb NOT NULL DEFAULT '{}',
    priority           smallint NOT NULL CHECK (priority BETWEEN 1 AND 10),
    status             text NOT NULL CHECK (status IN ('created', 'queued', 'claimed', 'processing',
                           'completed', 'retry_wait', 'failed', 'cancelled', 'cancel_requested')),
    attempt_count      integer NOT NULL DEFAULT 0,
    max_attempts       integer NOT NULL,
    claimed_by         text,
    claimed_at         timestamptz,
    visibility_timeout timestamptz,
    next_attempt_at    timestamptz,
    estimated_credits  bigint NOT NULL,
    actual_credits     bigint,
    error_code         text,
    error_message      text,
    webhook_url        text,
    idempotency_key    text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    queued_at          timestamptz,
    started_at         timestamptz,
    completed_at       timestamptz,
    updated_at         timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (operation, profile_version) REFERENCES processing_profiles(operation, version)
);
CREATE INDEX processing_jobs_status_idx ON processing_jobs(status, queue, priority, created_at);
CREATE INDEX processing_jobs_visibility_idx ON processing_jobs(visibility_timeout)
    WHERE status IN ('claimed', 'processing', 'cancel_requested');
CREATE INDEX processing_jobs_request_idx ON processing_jobs(request_id);
CREATE INDEX processing_jobs_account_idx ON processing_jobs(account_id, created_at);

-- Idempotency-Key of POST /v1/hypermedia/process: same key and body → same jobs.
CREATE TABLE process_requests (
    account_id       uuid NOT NULL REFERENCES accounts(account_id),
    idempotency_key  text NOT NULL,
    request_hash     text NOT NULL,
    request_id       uuid NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, idempotency_key)
);

CREATE TABLE job_attempts (
    job_id          uuid NOT NULL REFERENCES processing_jobs(job_id) ON DELETE CASCADE,
    attempt_number  integer NOT NULL,
    worker_id       text NOT NULL,
    status          text NOT NULL CHECK (status IN ('processing', 'completed', 'failed', 'lost', 'cancelled')),
    error_code      text,
    error_message   text,
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    duration_ms     integer,
    peak_memory_mb  integer,
    PRIMARY KEY (job_id, attempt_number)
);

CREATE TABLE job_outputs (
    output_id        bigserial PRIMARY KEY,
    job_id           uuid NOT NULL REFERENCES processing_jobs(job_id) ON DELETE CASCADE,
    output_type      text NOT NULL,
    profile_version  integer NOT NULL,
    object_id        uuid NOT NULL REFERENCES objects(object_id),
    key              text NOT NULL,
    mime_type        text NOT NULL,
    size_bytes       bigint NOT NULL,
    metadata         jsonb NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT uk_job_type_profile UNIQUE (job_id, output_type, profile_version)
);

CREATE TABLE workers (
    worker_id       text PRIMARY KEY,
    deployment      text NOT NULL,
    boot_id         text NOT NULL,
    role            text NOT NULL,
    generation      integer NOT NULL,
    queue           text NOT NULL,
    slots           integer NOT NULL,
    hostname        text NOT NULL,
    pid             integer NOT NULL,
    status          text NOT NULL CHECK (status IN ('running', 'draining', 'stopped', 'dead')),
    started_at      timestamptz NOT NULL DEFAULT now(),
    last_heartbeat  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE worker_metrics (
    worker_id        text NOT NULL REFERENCES workers(worker_id) ON DELETE CASCADE,
    recorded_at      timestamptz NOT NULL DEFAULT now(),
    cpu_percent      real NOT NULL,
    memory_mb        integer NOT NULL,
    memory_available_mb integer NOT NULL,
    disk_free_mb     integer NOT NULL,
    slots_busy       integer NOT NULL,
    jobs_completed   bigint NOT NULL,
    jobs_failed      bigint NOT NULL,
    PRIMARY KEY (worker_id, recorded_at)
);

CREATE TABLE credit_accounts (
    account_id   uuid PRIMARY KEY REFERENCES accounts(account_id),
    balance      bigint NOT NULL DEFAULT 0,
    held         bigint NOT NULL DEFAULT 0 CHECK (held >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE credit_holds (
    job_id       uuid PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES credit_accounts(account_id),
    amount       bigint NOT NULL CHECK (amount >= 0),
    status       text NOT NULL CHECK (status IN ('held', 'committed', 'released')),
    charged      bigint,
    created_at   timestamptz NOT NULL DEFAULT now(),
    settled_at   timestamptz
);

-- Every movement of credits, append-only. One row per (job, kind): commits and releases are
-- idempotent per job by this key.
CREATE TABLE credit_ledger (
    entry_id     bigserial PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES credit_accounts(account_id),
    job_id       uuid,
    grant_id     text,
    kind         text NOT NULL CHECK (kind IN ('grant', 'hold', 'commit', 'release')),
    amount       bigint NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT credit_ledger_job_kind UNIQUE (job_id, kind),
    CONSTRAINT credit_ledger_grant UNIQUE (grant_id)
);

-- Transactional outbox: rows written in the same transaction as the job state they announce,
-- published to JetStream by the relay with Nats-Msg-Id = msg_id.
CREATE TABLE outbox (
    outbox_id     bigserial PRIMARY KEY,
    subject       text NOT NULL,
    msg_id        text NOT NULL,
    payload       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);
CREATE INDEX outbox_unpublished_idx ON outbox(outbox_id) WHERE published_at IS NULL;
