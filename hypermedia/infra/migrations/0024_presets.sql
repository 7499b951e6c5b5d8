-- Named presets per account (issue 21 item 1): a name an app asks for ({"preset": "avatar"})
-- instead of spelling an operation and its params every time, versioned like the processing
-- profiles. A PUT that changes the operation or params makes the next version the one active
-- version; DELETE leaves none active. A job made from a preset records its name and version, so
-- the outputs of an older version are outdated (hypermedia/jobs/presets.py).
-- depends: 0023_account_quotas

CREATE TABLE presets (
    account_id  uuid NOT NULL REFERENCES accounts(account_id),
    name        text NOT NULL CHECK (name ~ '^[a-z][a-z0-9_-]{0,63}$'),
    version     integer NOT NULL CHECK (version >= 1),
    operation   text NOT NULL,
    params      jsonb NOT NULL DEFAULT '{}',
    active      boolean NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, name, version)
);
CREATE UNIQUE INDEX presets_one_active_idx ON presets(account_id, name) WHERE active;

ALTER TABLE processing_jobs ADD COLUMN preset_name text;
ALTER TABLE processing_jobs ADD COLUMN preset_version integer;
CREATE INDEX processing_jobs_preset_idx ON processing_jobs(account_id, preset_name, object_id)
    WHERE preset_name IS NOT NULL;
