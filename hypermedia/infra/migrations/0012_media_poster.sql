-- The `poster` media operation (issue 7): a representative frame of a video (blank frames at the
-- start skipped) or an audio file's cover art, as JPEG, WebP or PNG. Input kinds 'audio' and
-- 'video'; decoding is bounded by the operation itself (the first 30 s / 900 frames).
-- depends: 0011_media

INSERT INTO processing_profiles
    (operation, version, queue, base_cost, per_mb, timeout_seconds, max_attempts, max_input_bytes,
     max_pixels, memory_limit_mb, backoff_base_seconds, input_kinds, max_duration_seconds)
VALUES
    ('poster', 1, 'media', 500, 20, 60, 3, 2147483648, DEFAULT, 2048, 60, ARRAY['audio', 'video'], 14400);
