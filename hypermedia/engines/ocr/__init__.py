"""OCR of scanned images and PDFs with tesseract: the engine core of the ``ocr`` queue (issue 6).

| module | responsibility | imports |
|---|---|---|
| :mod:`~hypermedia.engines.ocr.params` | the ``ocr`` operation's params, checked at job creation and in the worker | pure Python (the gateway imports it) |
| :mod:`~hypermedia.engines.ocr.metrics` | character error rate, for tests and the benchmark | pure Python |
| :mod:`~hypermedia.engines.ocr.recognition` | what an OCR engine returns (:class:`~hypermedia.engines.ocr.recognition.Word`, :class:`~hypermedia.engines.ocr.recognition.PageText`) and the :class:`~hypermedia.engines.ocr.recognition.OcrEngine` protocol | pure Python |
| :mod:`~hypermedia.engines.ocr.tesseract` | the tesseract CLI: one process per call, ``OMP_THREAD_LIMIT=1``, timeouts; TSV and OSD parsing; installed languages | subprocess |
| :mod:`~hypermedia.engines.ocr.rapid_ocr` | RapidOCR (ONNX models from its wheel, one thread) behind the same protocol, for escalation; imported on first use | numpy, OpenCV, onnxruntime (deferred) |
| :mod:`~hypermedia.engines.ocr.escalation` | when a page goes to the second engine and which reading is kept (threshold and calibration, measured) | pure Python |
| :mod:`~hypermedia.engines.ocr.preprocess` | grey conversion, upscaling, orientation, deskew and background normalisation of one page, each step recorded | pyvips |
| :mod:`~hypermedia.engines.ocr.assemble` | per-page results merged into the outputs: text, words JSON, hOCR, searchable PDF | pypdfium2 |
| :mod:`~hypermedia.engines.ocr.pages` | where the pages come from: image frames, HEVC and Pillow TIFF pages, PDF pages rendered or their text layer, each checked from its header | pyvips, pypdfium2 |
| :mod:`~hypermedia.engines.ocr.outputs` | the outputs written from the page records (text, words, hOCR, searchable PDF, tables) | pypdfium2 |
| :mod:`~hypermedia.engines.ocr.engine` | the sandbox entry ``run(operation, params, input_path, out_dir, *, limits)`` | all of the above |

Importing this package imports nothing heavy; :mod:`~hypermedia.engines.ocr.engine` runs libvips and must
be called in the sandbox child (a process that will not fork again after it ran libvips).
"""
