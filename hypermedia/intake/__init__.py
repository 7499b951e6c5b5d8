"""What an upload is, decided before it is stored or a job is created: its type by content
(:mod:`~hypermedia.intake.contenttype`; office packages and flat ODF typed from inside by
:mod:`~hypermedia.intake.officetypes`), archive and compound-file inspection
(:mod:`~hypermedia.intake.archives`, :mod:`~hypermedia.intake.ole`,
:mod:`~hypermedia.intake.nested`) and the virus scan (:mod:`~hypermedia.intake.clamav`).

May import: :mod:`hypermedia.core`.
"""
