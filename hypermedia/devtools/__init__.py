"""For people at a terminal: the ``hypermedia`` command (:mod:`~hypermedia.devtools.cli`), the whole platform
on one machine (``hypermedia up``, :mod:`~hypermedia.devtools.platform`) and its embedded Postgres and
NATS (:mod:`~hypermedia.devtools.embedded`).

May import: anything in the library; nothing imports it but the command.
"""
