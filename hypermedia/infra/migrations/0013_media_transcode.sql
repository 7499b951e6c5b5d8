-- The media transcodes (issue 7): `transcode_video` (an H.264/AAC MP4, VP9/Opus WebM or AV1 ladder
-- of renditions, optionally packaged as HLS) and `transcode_audio` (AAC, MP3 or Opus, EBU R128
-- loudness on request). Prices are millicredits (base + per MiB of the input). timeout_seconds is
-- the job's CPU time; memory_limit_mb its RLIMIT_AS: 8 GiB for video (encoder lookahead and
-- reference frames at 1080p, with every thread's stack counted), 2 GiB for audio.
-- transcode_video takes at most 30 min of media (max_duration_seconds 1800; the seed's media
-- jobs run 30 s – 30 min): the default four-rung ladder from 1080p encodes at about 1.25× realtime on 2
-- threads, ≈ 1.4 CPU s per media second (bench/media.py), so 30 min need ≈ 2,500 CPU s of the
-- 3,600. Audio keeps 4 h: AAC with loudness runs at ≈ 65× realtime, MP3 at ≈ 33× (≈ 440 s).
-- depends: 0012_media_poster

INSERT INTO processing_profiles
    (operation, version, queue, base_cost, per_mb, timeout_seconds, max_attempts, max_input_bytes,
     max_pixels, memory_limit_mb, backoff_base_seconds, input_kinds, max_duration_seconds)
VALUES
    ('transcode_video', 1, 'media', 5000, 200, 3600, 3, 2147483648, DEFAULT, 8192, 60, ARRAY['video'],  1800),
    ('transcode_audio', 1, 'media', 1000,  50,  600, 3, 2147483648, DEFAULT, 2048, 60, ARRAY['audio', 'video'], 14400);
