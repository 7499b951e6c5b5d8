-- The `noop` operation (issue 17's P6, ADR 0038): a job that does nothing, so that benchmarks and
-- tests measure the job system alone. The gateway refuses it and workers fail it unless
-- HM_NOOP_OPERATION=1 (hypermedia/jobs/noop.py); its price is zero, and the CHECK below keeps it
-- zero: no later change of the profile can make it billable.
-- depends: 0015_held_holds_index

INSERT INTO processing_profiles
    (operation, version, queue, base_cost, per_mb, timeout_seconds, max_attempts, max_input_bytes,
     max_pixels, memory_limit_mb, input_kinds)
VALUES
    ('noop', 1, 'images', 0, 0, 30, 3, 107374182400, 1, 64,
     ARRAY['image', 'pdf', 'audio', 'video', 'office', 'other']);

ALTER TABLE processing_profiles
    ADD CONSTRAINT noop_is_free CHECK (operation <> 'noop' OR (base_cost = 0 AND per_mb = 0));
