"""Audio and video with PyAV (FFmpeg's libraries in the ``av`` wheel): the engine core of the
``media`` queue (issue 7), run by the mediaworker (``services/mediaworker``): the ``probe``,
``waveform``, ``poster``, ``transcode_video`` and ``transcode_audio`` operations.

| module | responsibility | imports |
|---|---|---|
| :mod:`~hypermedia.engines.media.params` | the media operations' params, checked at job creation and in the worker | pure Python (the gateway imports it) |
| :mod:`~hypermedia.engines.media.sources` | opening media safely (allowlisted demuxers, local file only), ``MediaLimits`` and the size and duration checks, the first audio stream, a video stream's first frame, the span of every packet: shared by every operation | PyAV |
| :mod:`~hypermedia.engines.media.probe` | the sandbox entry ``run("probe", params, input_path, out_dir, *, limits)``: container, streams, chapters, exact duration | PyAV |
| :mod:`~hypermedia.engines.media.orientation` | a frame's display matrix read (rotation, mirroring) and applied as FFmpeg's ``autorotate`` does: to RGB arrays (posters, sprites) or as FFmpeg filters (transcodes) | NumPy |
| :mod:`~hypermedia.engines.media.decoding` | ``DecodeErrors``: decoding past packets that do not decode, counted (``decode_errors``), with FFmpeg's ``-max_error_rate`` bound past which a stream is ``CORRUPT_INPUT`` (waveform, both transcodes) | PyAV |
| :mod:`~hypermedia.engines.media.waveform` | the sandbox entry ``run("waveform", …)``: min/max peaks per bucket and channel of the first audio stream, decoded in bounded memory, as JSON and a PNG | PyAV, NumPy, pyvips (when drawing) |
| :mod:`~hypermedia.engines.media.poster` | the sandbox entry ``run("poster", …)``: the first frame that is not blank (or the cover picture of an audio file), upright, scaled to the display aspect and encoded as JPEG, WebP or PNG; the sprite sheet through :mod:`~hypermedia.engines.media.sprite` | PyAV, NumPy, pyvips (when encoding) |
| :mod:`~hypermedia.engines.media.frames` | what every picture taken from a video shares: the decoded frame's pixel bound, one decoding thread, the upright display size | PyAV |
| :mod:`~hypermedia.engines.media.sprite` | ``write_sprite(…)``, called by ``poster`` for its ``sprite`` params: thumbnails at even intervals by bounded keyframe seeks in one JPEG sheet, and a WebVTT index of ``sprite#xywh=`` cues | PyAV, NumPy, pyvips (when encoding) |
| :mod:`~hypermedia.engines.media.transcode` | the sandbox entry ``run("transcode_video", …)``: one decode feeding an encoder per rung of the ladder (H.264/AAC MP4, VP9/Opus WebM or AV1/AAC MP4), HLS (:mod:`~hypermedia.engines.media.hls`); ``plan_ladder``, ``thread_need`` | PyAV |
| :mod:`~hypermedia.engines.media.encoding` | one rendition being written for ``transcode_video``: ``CODECS``, ``Rendition``, the rendition's container, encoders and filter graph (upright, scaled, 8-bit 4:2:0) | PyAV |
| :mod:`~hypermedia.engines.media.hls` | ``transcode_video``'s HLS: each H.264 rendition remuxed into one fragmented MP4 and a byte-range media playlist, their bandwidths and codecs, the master playlist | PyAV |
| :mod:`~hypermedia.engines.media.audio` | the sandbox entry ``run("transcode_audio", …)``: the first audio stream as AAC, MP3 or Opus at 48 kHz, EBU R 128 loudness-normalised on request | PyAV, NumPy |
| :mod:`~hypermedia.engines.media.engine` | the mediaworker's sandbox entry ``run(operation, …)``: forces FFmpeg's CPU count to 1 (``bound_ffmpeg_cpus``) and dispatches to the modules above | PyAV |

Importing this package imports nothing heavy. Every module but :mod:`~hypermedia.engines.media.params`
demuxes, decodes or encodes untrusted input with FFmpeg and must be called in the sandbox child.
"""
