"""Image operations on libvips (thumbnail, resize, compress, convert).

:mod:`hypermedia.engines.imaging.ops` (the operations and saving) and
:mod:`hypermedia.engines.imaging.sources` (opening and checking a source) run libvips inside the
per-job sandbox child only: a process that has run a libvips operation must not fork (see
:mod:`hypermedia.sandbox`). Importing them is safe anywhere, and this package imports nothing
heavy on its own.
"""
