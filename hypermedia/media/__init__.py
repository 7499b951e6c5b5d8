"""Audio and video with PyAV (FFmpeg's libraries in the ``av`` wheel): the engine core of the
``media`` queue (issue 7). So far the ``probe`` operation; the mediaworker service is to come.

| module | responsibility | imports |
|---|---|---|
| :mod:`~hypermedia.media.params` | the media operations' params, checked at job creation and in the worker | pure Python (the gateway imports it) |
| :mod:`~hypermedia.media.probe` | the sandbox entry ``run("probe", params, input_path, out_dir, *, limits)``: container, streams, chapters, exact duration; opening media safely (allowlisted demuxers, local file only) | PyAV |

Importing this package imports nothing heavy; :mod:`~hypermedia.media.probe` demuxes and decodes
untrusted input with FFmpeg and must be called in the sandbox child.
"""
