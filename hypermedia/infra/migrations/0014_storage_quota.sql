-- Per-account storage quota (issue 14, ADR 0029). `storage_usage` counts what an account stores
-- against its quota: its originals (objects without a source, owned by the account) in state
-- `pending` or `available`, by their size. Derived outputs are not counted (the job that made
-- them was paid in credits). The storage service updates the counters in the transaction that
-- inserts or deletes an original, with a conditional UPDATE that never takes them past the limits;
-- `max_bytes`/`max_objects` NULL mean the service's defaults (HM_STORAGE_QUOTA_BYTES,
-- HM_STORAGE_QUOTA_OBJECTS), set per account by `hypermedia admin set-storage-quota`.
-- A deleted original keeps its row as `deleted` (jobs and outputs refer to it); its bytes are gone.
-- depends: 0013_media_transcode

CREATE TABLE storage_usage (
    account_id    uuid PRIMARY KEY REFERENCES accounts(account_id),
    used_bytes    bigint NOT NULL DEFAULT 0 CHECK (used_bytes >= 0),
    used_objects  bigint NOT NULL DEFAULT 0 CHECK (used_objects >= 0),
    max_bytes     bigint CHECK (max_bytes >= 0),
    max_objects   bigint CHECK (max_objects >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

INSERT INTO storage_usage (account_id, used_bytes, used_objects)
SELECT w.account_id, sum(o.size_bytes), count(*)
FROM objects o JOIN object_ownership w ON w.object_id = o.object_id AND w.role = 'owner'
WHERE o.source_object_id IS NULL
GROUP BY w.account_id;

ALTER TABLE objects DROP CONSTRAINT objects_state_check;
ALTER TABLE objects ADD CONSTRAINT objects_state_check CHECK (state IN ('pending', 'available', 'deleted'));
ALTER TABLE objects ADD COLUMN deleted_at timestamptz;
