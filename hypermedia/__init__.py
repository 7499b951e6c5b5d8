"""hypermedia: files in, derived files and data out, through queued, sandboxed, billed jobs.

The packages and what each may import: docs/architecture.md, "Code map" (ADR 0033).
"""
