"""The storage service (``core.storage``): objects, ownership, presigned URLs, derived outputs.

Run with ``python -m services.storage``; see :mod:`services.storage.__main__` for the environment.
"""
