-- The media transcodes (issue 7): `transcode_video` (an H.264/AAC MP4, VP9/Opus WebM or AV1 ladder
-- of renditions, optionally packaged as HLS) and `transcode_audio` (AAC, MP3 or Opus, EBU R128
-- loudness on request). Prices are millicredits (base + per MiB of the input). timeout_seconds is
-- the job's CPU time (the seed's media queue: jobs of 30 s to 30 min); memory_limit_mb its
-- RLIMIT_AS: 8 GiB for video (encoder lookahead and reference frames at 1080p, with every
-- thread's stack counted), 2 GiB for audio.
-- depends: 0012_media_poster

INSERT INTO processing_profiles
    (operation, version, queue, base_cost, per_mb, timeout_seconds, max_attempts, max_input_bytes,
     max_pixels, memory_limit_mb, backoff_base_seconds, input_kinds, max_duration_seconds)
VALUES
    ('transcode_video', 1, 'media', 5000, 200, 1800, 3, 2147483648, DEFAULT, 8192, 60, ARRAY['video'], 14400),
    ('transcode_audio', 1, 'media', 1000,  50,  600, 3, 2147483648, DEFAULT, 2048, 60, ARRAY['audio', 'video'], 14400);
