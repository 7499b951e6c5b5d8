"""The price of one job, seed 000's formula: ``base_cost + per_mb × size_mb`` of the operation's
active processing profile, in integer millicredits (1 credit = 1000). The credits service prices
every hold with it; a backfill run's dry run estimates with it, so its estimate is what the run's
holds then are."""

from __future__ import annotations

import math

MIB = 1024 * 1024


def as_credits(millicredits: int | None) -> float | None:
    """Millicredits as the API's credits (1 credit = 1000 millicredits): a number rounded to
    three decimals (1234 → 1.234); None stays None (JSON ``null``)."""
    return None if millicredits is None else round(millicredits / 1000, 3)


def price(base_cost: int, per_mb: int, size_bytes: int) -> int:
    """Millicredits for one operation on ``size_bytes`` of input: ``base_cost`` plus ``per_mb``
    per MiB, the part of a MiB rounded up to the next millicredit."""
    return base_cost + math.ceil(per_mb * size_bytes / MIB)
