"""The client side of the platform's REST API: :mod:`~hypermedia.client.session` (settings and
calls) and :mod:`~hypermedia.client.commands` (``hypermedia submit``, ``jobs``, ``objects``,
``operations``)."""
