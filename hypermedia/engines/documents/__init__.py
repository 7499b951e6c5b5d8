"""Document operations of queue ``documents`` (the docworker).

- :mod:`hypermedia.engines.documents.params`: the operations' params, validated at job creation (by the
  gateway, pure Python) and again in the worker.
- :mod:`hypermedia.engines.documents.pdf`: ``pdf_info``, ``pdf_preview``, ``text_extract`` and the PDF
  step of ``office_to_pdf`` with PDFium (pypdfium2); the sandbox entry point
  :func:`hypermedia.engines.documents.pdf.run`.
- :mod:`hypermedia.engines.documents.engine_process`: runs the PDFium work in a process of its own inside
  the sandboxed job, so that a native abort (PDFium ends the process when an allocation fails) is
  told apart from a crash and reported with a specific code.
- :mod:`hypermedia.engines.documents.office`: office documents → PDF with warm LibreOffice listeners (one
  per slot, confined, restarted after N conversions or a hang), driven through
  :mod:`hypermedia.engines.documents.office_host` (a script run under the system Python with ``uno``).
- :mod:`hypermedia.engines.documents.links`: the linked-content check run before a listener sees a
  document, reading with :mod:`~hypermedia.engines.documents.xmlparts` (XML parts, OOXML
  relationships), :mod:`~hypermedia.engines.documents.rtf` (RTF) and
  :mod:`~hypermedia.engines.documents.fields` (Word fields); its errors in
  :mod:`~hypermedia.engines.documents.linkerrors`.
- :mod:`hypermedia.engines.documents.filters`: the LibreOffice import filter each upload is opened
  with (by its identified type, and for legacy Word, Excel and PowerPoint by its header's version).
"""
