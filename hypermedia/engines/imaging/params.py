"""The imaging operations' names, importable without libvips (a unit's control checks the
profiles routed to it against them, and runs no native library: ADR 0046)."""

from __future__ import annotations

from typing import Final

OPERATIONS: Final = ("thumbnail", "resize", "compress", "convert")
