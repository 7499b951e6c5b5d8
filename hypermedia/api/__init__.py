"""Generated gRPC stubs (``make proto``; do not edit). The wire packages stay ``hypermedia.<area>.v1``;
the Python modules are ``hypermedia.api.<area>.v1``.
"""
