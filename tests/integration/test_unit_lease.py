"""The deployment lease of a worker unit on real Postgres (hypermedia/worker/unit/lease.py): one
live holder per name, the epoch up by one at every taking, a renewal that fails once the lease was
taken or ran out, and two units starting at once of which exactly one wins."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from hypermedia.worker.unit import lease


async def test_one_live_unit_per_name_and_the_epoch_goes_up_at_every_taking(fresh_pool: asyncpg.Pool) -> None:
    first = await lease.acquire(fresh_pool, "prod", "images-a", boot_id="b1", holder="h/1", ttl_seconds=30)
    assert first.epoch == 1
    with pytest.raises(lease.LeaseHeld) as held:
        await lease.acquire(fresh_pool, "prod", "images-a", boot_id="b2", holder="h/2", ttl_seconds=30)
    assert held.value.holder == "h/1" and held.value.epoch == 1 and 25 < held.value.seconds_left <= 30
    assert "held by h/1 (epoch 1)" in str(held.value)
    # Another name, or the same name in another deployment, is another lease.
    assert (
        await lease.acquire(fresh_pool, "prod", "images-b", boot_id="b3", holder="h/3", ttl_seconds=30)
    ).epoch == 1
    assert (
        await lease.acquire(fresh_pool, "staging", "images-a", boot_id="b4", holder="h/4", ttl_seconds=30)
    ).epoch == 1
    assert await lease.current_epoch(fresh_pool, "prod", "images-a") == 1

    assert await lease.release(fresh_pool, first)
    assert await lease.current_epoch(fresh_pool, "prod", "images-a") is None
    second = await lease.acquire(fresh_pool, "prod", "images-a", boot_id="b5", holder="h/5", ttl_seconds=30)
    assert second.epoch == 2
    assert await lease.renew(fresh_pool, first, 30) is None, "an earlier epoch cannot renew"
    renewed = await lease.renew(fresh_pool, second, 60)
    assert renewed is not None and renewed.expires_at > second.expires_at
    assert not await lease.release(fresh_pool, first)


async def test_an_expired_lease_is_lost_to_its_holder_and_taken_at_the_next_epoch(
    fresh_pool: asyncpg.Pool,
) -> None:
    gone = await lease.acquire(fresh_pool, "prod", "ocr-a", boot_id="b1", holder="h/1", ttl_seconds=3)
    await fresh_pool.execute("UPDATE worker_unit_leases SET expires_at = now() - interval '1 second'")
    assert await lease.renew(fresh_pool, gone, 3) is None
    assert await lease.current_epoch(fresh_pool, "prod", "ocr-a") is None
    taken = await lease.acquire(fresh_pool, "prod", "ocr-a", boot_id="b2", holder="h/2", ttl_seconds=3)
    assert taken.epoch == 2


async def test_of_units_starting_at_once_exactly_one_takes_the_lease(fresh_pool: asyncpg.Pool) -> None:
    results = await asyncio.gather(
        *(
            lease.acquire(fresh_pool, "prod", "media-a", boot_id=f"b{i}", holder=f"h/{i}", ttl_seconds=30)
            for i in range(8)
        ),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, lease.Lease)]
    assert len(won) == 1 and won[0].epoch == 1
    assert all(isinstance(r, lease.LeaseHeld) for r in results if r not in won)
