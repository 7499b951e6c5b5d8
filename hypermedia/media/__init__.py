"""Audio and video with PyAV (FFmpeg's libraries in the ``av`` wheel): the engine core of the
``media`` queue (issue 7). So far the ``probe``, ``waveform`` and ``poster`` operations; the
mediaworker service is to come.

| module | responsibility | imports |
|---|---|---|
| :mod:`~hypermedia.media.params` | the media operations' params, checked at job creation and in the worker | pure Python (the gateway imports it) |
| :mod:`~hypermedia.media.probe` | the sandbox entry ``run("probe", params, input_path, out_dir, *, limits)``: container, streams, chapters, exact duration; opening media safely (allowlisted demuxers, local file only) | PyAV |
| :mod:`~hypermedia.media.waveform` | the sandbox entry ``run("waveform", …)``: min/max peaks per bucket and channel of the first audio stream, decoded in bounded memory, as JSON and a PNG | PyAV, NumPy, pyvips (when drawing) |
| :mod:`~hypermedia.media.poster` | the sandbox entry ``run("poster", …)``: the first frame that is not blank (or the cover picture of an audio file), upright, scaled to the display aspect and encoded as JPEG, WebP or PNG | PyAV, NumPy, pyvips (when encoding) |
| :mod:`~hypermedia.media.engine` | the mediaworker's sandbox entry ``run(operation, …)``: dispatches to the modules above | PyAV |

Importing this package imports nothing heavy; :mod:`~hypermedia.media.probe`,
:mod:`~hypermedia.media.waveform` and :mod:`~hypermedia.media.poster` demux and decode untrusted
input with FFmpeg and must be called in the sandbox child.
"""
