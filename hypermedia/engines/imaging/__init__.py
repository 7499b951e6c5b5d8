"""Image operations on libvips (thumbnail, resize, compress, convert).

:mod:`hypermedia.engines.imaging.ops` runs inside the per-job sandbox child only: a process that has run a
libvips operation must not fork (see :mod:`hypermedia.sandbox`). Importing it is safe anywhere, and
this package imports nothing heavy on its own.
"""
