"""The processing pipelines that run inside the per-job sandbox child: images
(:mod:`~hypermedia.engines.imaging`), documents (:mod:`~hypermedia.engines.documents`), OCR
(:mod:`~hypermedia.engines.ocr`) and audio/video (:mod:`~hypermedia.engines.media`).

May import: :mod:`hypermedia.core`, :mod:`hypermedia.intake` (to know a format) and
:mod:`hypermedia.engines.contract` (the engine contract); never a service, the job system or the worker.
"""
