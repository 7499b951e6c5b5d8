-- Audio and video on queue `media` (issue 7, first operations; the mediaworker): `probe` (container,
-- streams, chapters, exact duration) and `waveform` (peaks JSON and a PNG) accept input kinds
-- 'audio' and 'video'. Prices are millicredits (base + per MiB of the input).
-- max_duration_seconds is the longest media a job takes (MEDIA_TOO_LONG at probe time, before
-- anything is decoded at length): 4 hours. memory_limit_mb is the job's RLIMIT_AS; decoding stays
-- single-threaded here. The transcodes (8 GiB of address space for video) are to come.
-- depends: 0010_ocr

ALTER TABLE processing_profiles
    ADD COLUMN max_duration_seconds integer NOT NULL DEFAULT 14400 CHECK (max_duration_seconds > 0);

INSERT INTO processing_profiles
    (operation, version, queue, base_cost, per_mb, timeout_seconds, max_attempts, max_input_bytes,
     max_pixels, memory_limit_mb, backoff_base_seconds, input_kinds, max_duration_seconds)
VALUES
    ('probe',    1, 'media',  200, 10,  60, 3, 2147483648, DEFAULT, 2048, 60, ARRAY['audio', 'video'], 14400),
    ('waveform', 1, 'media', 1000, 50, 600, 3, 2147483648, DEFAULT, 2048, 60, ARRAY['audio', 'video'], 14400);
