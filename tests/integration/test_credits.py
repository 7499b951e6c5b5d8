"""The credits service against a real Postgres: holds are all or nothing, settlements happen once per
job, grants once per grant id. Methods are called directly (context None) unless the wire matters."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from hypermedia.api.credits.v1 import credits_pb2
from hypermedia.core.errors import InsufficientCredits, InvalidArgument, NotFound
from hypermedia.infra.rpc import call
from services.credits.service import CreditsService
from tests.integration.conftest import Credits, Seeder, Tenant

MIB = 1024 * 1024
THUMBNAIL_BASE, THUMBNAIL_PER_MB = 1000, 200
"""Prices of the seeded ``thumbnail`` v1 profile (millicredits)."""


def _hold_request(tenant: Tenant, *holds: tuple[uuid.UUID, int]) -> credits_pb2.HoldRequest:
    request = credits_pb2.HoldRequest(account_id=str(tenant.account_id))
    for job_id, amount in holds:
        request.holds.add(job_id=str(job_id), millicredits=amount)
    return request


async def _account(pool: asyncpg.Pool, tenant: Tenant) -> tuple[int, int]:
    row = await pool.fetchrow(
        "SELECT balance, held FROM credit_accounts WHERE account_id = $1", tenant.account_id
    )
    return row["balance"], row["held"]


async def _ledger(pool: asyncpg.Pool, tenant: Tenant) -> list[tuple[str, int]]:
    rows = await pool.fetch(
        "SELECT kind, amount FROM credit_ledger WHERE account_id = $1 ORDER BY entry_id", tenant.account_id
    )
    return [(r["kind"], r["amount"]) for r in rows]


async def _held_job(credits: Credits, tenant: Tenant, amount: int) -> uuid.UUID:
    job_id = uuid.uuid4()
    await credits.service.Hold(_hold_request(tenant, (job_id, amount)), None)
    return job_id


# -- estimate -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size_bytes", "expected"),
    [
        (0, THUMBNAIL_BASE),
        (1, THUMBNAIL_BASE + 1),  # any part of a MiB costs at least one millicredit
        (MIB, THUMBNAIL_BASE + THUMBNAIL_PER_MB),
        (MIB + 1, THUMBNAIL_BASE + THUMBNAIL_PER_MB + 1),
        (MIB // 2, THUMBNAIL_BASE + THUMBNAIL_PER_MB // 2),
        (50 * MIB, THUMBNAIL_BASE + 50 * THUMBNAIL_PER_MB),
        (3 * MIB + 12345, THUMBNAIL_BASE + 600 + -(-THUMBNAIL_PER_MB * 12345 // MIB)),
    ],
)
async def test_estimate_is_base_cost_plus_per_mb_rounded_up(
    fresh_pool: asyncpg.Pool, size_bytes: int, expected: int
) -> None:
    response = await CreditsService(fresh_pool).Estimate(
        credits_pb2.EstimateRequest(operations=["thumbnail"], size_bytes=size_bytes), None
    )

    assert [(e.operation, e.millicredits, e.profile_version) for e in response.estimates] == [
        ("thumbnail", expected, 1)
    ]
    assert response.total_millicredits == expected


async def test_estimate_of_several_operations_sums_them(fresh_pool: asyncpg.Pool) -> None:
    response = await CreditsService(fresh_pool).Estimate(
        credits_pb2.EstimateRequest(operations=["thumbnail", "compress"], size_bytes=2 * MIB), None
    )

    # compress v1: base 1500, 300 per MiB.
    assert [e.millicredits for e in response.estimates] == [1400, 2100]
    assert response.total_millicredits == 3500


async def test_estimate_rejects_unknown_operations_and_negative_sizes(fresh_pool: asyncpg.Pool) -> None:
    service = CreditsService(fresh_pool)
    with pytest.raises(NotFound) as unknown:
        await service.Estimate(credits_pb2.EstimateRequest(operations=["teleport"], size_bytes=1), None)
    assert unknown.value.error_code == "UNKNOWN_OPERATION"
    with pytest.raises(InvalidArgument):
        await service.Estimate(credits_pb2.EstimateRequest(operations=["thumbnail"], size_bytes=-1), None)


# -- hold -----------------------------------------------------------------------------------------


async def test_hold_is_all_or_nothing(fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits) -> None:
    tenant = await seed.tenant(balance=2000)
    first, second = uuid.uuid4(), uuid.uuid4()

    with pytest.raises(InsufficientCredits) as short:
        await credits.service.Hold(_hold_request(tenant, (first, 1200), (second, 1200)), None)

    assert short.value.error_code == "INSUFFICIENT_CREDITS"
    assert await fresh_pool.fetchval("SELECT count(*) FROM credit_holds") == 0
    assert await _ledger(fresh_pool, tenant) == []
    assert await _account(fresh_pool, tenant) == (2000, 0)
    # What does fit is held.
    response = await credits.service.Hold(_hold_request(tenant, (first, 1200)), None)
    assert (response.balance_millicredits, response.held_millicredits) == (2000, 1200)


async def test_insufficient_credits_crosses_the_wire_with_its_error_code(
    seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=500)

    with pytest.raises(InsufficientCredits) as short:
        await call(credits.stub.Hold, _hold_request(tenant, (uuid.uuid4(), 1000)))

    assert short.value.error_code == "INSUFFICIENT_CREDITS"


async def test_hold_counts_what_is_already_held(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=2000)
    await _held_job(credits, tenant, 1500)

    with pytest.raises(InsufficientCredits):
        await credits.service.Hold(_hold_request(tenant, (uuid.uuid4(), 600)), None)

    assert await _account(fresh_pool, tenant) == (2000, 1500)


async def test_concurrent_holds_cannot_overspend(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=3000)

    results = await asyncio.gather(
        *(credits.service.Hold(_hold_request(tenant, (uuid.uuid4(), 1000)), None) for _ in range(5)),
        return_exceptions=True,
    )

    assert sum(isinstance(r, credits_pb2.HoldResponse) for r in results) == 3
    assert sum(isinstance(r, InsufficientCredits) for r in results) == 2
    assert await _account(fresh_pool, tenant) == (3000, 3000)
    assert await fresh_pool.fetchval("SELECT count(*) FROM credit_holds") == 3


async def test_hold_is_idempotent_per_job(fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits) -> None:
    tenant = await seed.tenant(balance=2000)
    job_id = await _held_job(credits, tenant, 1500)

    response = await credits.service.Hold(_hold_request(tenant, (job_id, 1500)), None)

    assert (response.balance_millicredits, response.held_millicredits) == (2000, 1500)
    assert await _ledger(fresh_pool, tenant) == [("hold", 1500)]


async def test_hold_of_an_unknown_account_is_not_found(credits: Credits) -> None:
    stranger = Tenant(uuid.uuid4(), uuid.uuid4(), uuid.uuid4())
    with pytest.raises(NotFound):
        await credits.service.Hold(_hold_request(stranger, (uuid.uuid4(), 1)), None)


# -- estimate and hold (the gateway's one call) ---------------------------------------------------


def _estimate_and_hold(
    tenant: Tenant, size_bytes: int, *jobs: tuple[uuid.UUID, str, int]
) -> credits_pb2.EstimateAndHoldRequest:
    return credits_pb2.EstimateAndHoldRequest(
        account_id=str(tenant.account_id),
        size_bytes=size_bytes,
        jobs=[
            credits_pb2.JobToHold(job_id=str(j), operation=op, extra_millicredits=extra)
            for j, op, extra in jobs
        ],
    )


async def test_estimate_and_hold_prices_each_job_as_estimate_and_holds_price_plus_extra(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=10_000)
    first, second = uuid.uuid4(), uuid.uuid4()
    estimate = await credits.service.Estimate(
        credits_pb2.EstimateRequest(operations=["thumbnail", "compress"], size_bytes=2 * MIB), None
    )

    response = await call(
        credits.stub.EstimateAndHold,
        _estimate_and_hold(tenant, 2 * MIB, (first, "thumbnail", 0), (second, "compress", 300)),
    )

    assert list(response.estimates) == list(estimate.estimates)  # [1400, 2100], as Estimate
    assert response.total_millicredits == estimate.total_millicredits == 3500
    assert (response.balance_millicredits, response.held_millicredits) == (10_000, 3800)
    holds = await fresh_pool.fetch("SELECT job_id, amount FROM credit_holds ORDER BY amount")
    assert [(r["job_id"], r["amount"]) for r in holds] == [(first, 1400), (second, 2400)]
    assert await _ledger(fresh_pool, tenant) == [("hold", 1400), ("hold", 2400)]
    # Idempotent per job, as Hold: the same call again holds nothing more.
    again = await credits.service.EstimateAndHold(
        _estimate_and_hold(tenant, 2 * MIB, (first, "thumbnail", 0), (second, "compress", 300)), None
    )
    assert (again.total_millicredits, again.held_millicredits) == (3500, 3800)
    assert await _account(fresh_pool, tenant) == (10_000, 3800)


async def test_estimate_and_hold_is_all_or_nothing_and_says_what_is_short_over_the_wire(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=2000)

    with pytest.raises(InsufficientCredits) as short:
        await call(
            credits.stub.EstimateAndHold,
            _estimate_and_hold(tenant, 0, (uuid.uuid4(), "thumbnail", 0), (uuid.uuid4(), "thumbnail", 1)),
        )

    assert short.value.error_code == "INSUFFICIENT_CREDITS"
    assert short.value.public_message == "this request needs 2.001 credits; 2.000 are available"
    assert await fresh_pool.fetchval("SELECT count(*) FROM credit_holds") == 0
    assert await _ledger(fresh_pool, tenant) == []


async def test_estimate_and_hold_refuses_unknown_operations_bad_amounts_and_strangers(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=5000)
    with pytest.raises(NotFound) as unknown:
        await call(
            credits.stub.EstimateAndHold,
            _estimate_and_hold(tenant, 1, (uuid.uuid4(), "thumbnail", 0), (uuid.uuid4(), "teleport", 0)),
        )
    assert unknown.value.error_code == "UNKNOWN_OPERATION"
    for request in (
        _estimate_and_hold(tenant, -1, (uuid.uuid4(), "thumbnail", 0)),
        _estimate_and_hold(tenant, 1, (uuid.uuid4(), "thumbnail", -1)),
    ):
        with pytest.raises(InvalidArgument):
            await credits.service.EstimateAndHold(request, None)
    malformed = _estimate_and_hold(tenant, 1, (uuid.uuid4(), "thumbnail", 0))
    malformed.jobs[0].job_id = "not-a-uuid"
    with pytest.raises(InvalidArgument):
        await credits.service.EstimateAndHold(malformed, None)
    stranger = Tenant(uuid.uuid4(), uuid.uuid4(), uuid.uuid4())
    with pytest.raises(NotFound) as missing:
        await credits.service.EstimateAndHold(
            _estimate_and_hold(stranger, 1, (uuid.uuid4(), "thumbnail", 0)), None
        )
    assert missing.value.error_code == "ACCOUNT_NOT_FOUND"
    assert await fresh_pool.fetchval("SELECT count(*) FROM credit_holds") == 0


# -- commit / release -----------------------------------------------------------------------------


async def test_commit_is_idempotent(fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits) -> None:
    tenant = await seed.tenant(balance=5000)
    job_id = await _held_job(credits, tenant, 1200)
    request = credits_pb2.CommitRequest(job_id=str(job_id), actual_millicredits=1000)

    first = await credits.service.Commit(request, None)
    second = await credits.service.Commit(request, None)

    assert (first.charged_millicredits, first.already_settled) == (1000, False)
    assert (second.charged_millicredits, second.already_settled) == (1000, True)
    assert await _ledger(fresh_pool, tenant) == [("hold", 1200), ("commit", -1000)]
    assert await _account(fresh_pool, tenant) == (4000, 0)
    hold = await fresh_pool.fetchrow("SELECT status, charged FROM credit_holds WHERE job_id = $1", job_id)
    assert (hold["status"], hold["charged"]) == ("committed", 1000)


async def test_concurrent_commits_charge_once(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=5000)
    job_id = await _held_job(credits, tenant, 1200)
    request = credits_pb2.CommitRequest(job_id=str(job_id), actual_millicredits=1200)

    responses = await asyncio.gather(*(credits.service.Commit(request, None) for _ in range(4)))

    assert sorted(r.already_settled for r in responses) == [False, True, True, True]
    assert await _ledger(fresh_pool, tenant) == [("hold", 1200), ("commit", -1200)]
    assert await _account(fresh_pool, tenant) == (3800, 0)


async def test_commit_charges_at_most_the_hold(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=5000)
    job_id = await _held_job(credits, tenant, 1200)

    response = await credits.service.Commit(
        credits_pb2.CommitRequest(job_id=str(job_id), actual_millicredits=4000), None
    )

    assert response.charged_millicredits == 1200
    assert await _account(fresh_pool, tenant) == (3800, 0)


async def _lines(pool: asyncpg.Pool, job_id: uuid.UUID) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT line, amount FROM credit_ledger WHERE job_id = $1 AND kind = 'commit'", job_id
    )
    return {r["line"]: r["amount"] for r in rows}


def _commit(job_id: uuid.UUID, actual: int, **lines: int) -> credits_pb2.CommitRequest:
    return credits_pb2.CommitRequest(
        job_id=str(job_id),
        actual_millicredits=actual,
        lines=[credits_pb2.ChargeLine(line=name, millicredits=amount) for name, amount in lines.items()],
    )


async def test_commit_with_a_line_writes_one_ledger_row_per_line(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """An OCR job that escalated two pages: its price and the escalation line, two rows; the
    account pays their sum and its hold is freed whole."""
    tenant = await seed.tenant(balance=10_000)
    job_id = await _held_job(credits, tenant, 1500 + 20 * 300)

    response = await credits.service.Commit(_commit(job_id, 1500 + 600, ocr_escalation=600), None)

    assert (response.charged_millicredits, response.already_settled) == (2100, False)
    assert await _lines(fresh_pool, job_id) == {"base": -1500, "ocr_escalation": -600}
    assert await _account(fresh_pool, tenant) == (10_000 - 2100, 0)
    again = await credits.service.Commit(_commit(job_id, 2100, ocr_escalation=600), None)
    assert (again.charged_millicredits, again.already_settled) == (2100, True)
    assert len(await _lines(fresh_pool, job_id)) == 2


async def test_a_short_hold_cuts_the_lines_after_the_base(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=10_000)
    cut = await _held_job(credits, tenant, 1800)
    dropped = await _held_job(credits, tenant, 1000)

    assert (
        await credits.service.Commit(_commit(cut, 2100, ocr_escalation=600), None)
    ).charged_millicredits == 1800
    assert (
        await credits.service.Commit(_commit(dropped, 2100, ocr_escalation=600), None)
    ).charged_millicredits == 1000

    assert await _lines(fresh_pool, cut) == {"base": -1500, "ocr_escalation": -300}
    assert await _lines(fresh_pool, dropped) == {"base": -1000}
    assert await _account(fresh_pool, tenant) == (10_000 - 2800, 0)


@pytest.mark.parametrize(
    "lines",
    [{"base": 100}, {"Escalation": 100}, {"ocr_escalation": -1}, {"ocr_escalation": 3000}, {"": 1}],
)
async def test_bad_charge_lines_are_invalid_and_charge_nothing(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits, lines: dict[str, int]
) -> None:
    tenant = await seed.tenant(balance=10_000)
    job_id = await _held_job(credits, tenant, 5000)

    with pytest.raises(InvalidArgument):
        await credits.service.Commit(_commit(job_id, 2000, **lines), None)

    assert await _account(fresh_pool, tenant) == (10_000, 5000)
    assert await _lines(fresh_pool, job_id) == {}


async def test_commit_without_a_hold_is_not_found(credits: Credits) -> None:
    with pytest.raises(NotFound) as missing:
        await credits.service.Commit(
            credits_pb2.CommitRequest(job_id=str(uuid.uuid4()), actual_millicredits=1), None
        )
    assert missing.value.error_code == "HOLD_NOT_FOUND"


async def test_release_after_commit_does_nothing(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=5000)
    job_id = await _held_job(credits, tenant, 1200)
    await credits.service.Commit(
        credits_pb2.CommitRequest(job_id=str(job_id), actual_millicredits=1200), None
    )

    response = await credits.service.Release(credits_pb2.ReleaseRequest(job_id=str(job_id)), None)

    assert (response.released_millicredits, response.already_settled) == (0, True)
    assert await _ledger(fresh_pool, tenant) == [("hold", 1200), ("commit", -1200)]
    assert await _account(fresh_pool, tenant) == (3800, 0)
    assert (
        await fresh_pool.fetchval("SELECT status FROM credit_holds WHERE job_id = $1", job_id) == "committed"
    )


async def test_release_is_idempotent_and_commit_after_release_charges_nothing(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=5000)
    job_id = await _held_job(credits, tenant, 1200)
    release = credits_pb2.ReleaseRequest(job_id=str(job_id))

    first = await credits.service.Release(release, None)
    second = await credits.service.Release(release, None)
    commit = await credits.service.Commit(
        credits_pb2.CommitRequest(job_id=str(job_id), actual_millicredits=1200), None
    )

    assert (first.released_millicredits, first.already_settled) == (1200, False)
    assert (second.released_millicredits, second.already_settled) == (0, True)
    assert (commit.charged_millicredits, commit.already_settled) == (0, True)
    assert await _ledger(fresh_pool, tenant) == [("hold", 1200), ("release", 1200)]
    assert await _account(fresh_pool, tenant) == (5000, 0)


async def test_release_of_an_unknown_job_is_already_settled(credits: Credits) -> None:
    response = await credits.service.Release(credits_pb2.ReleaseRequest(job_id=str(uuid.uuid4())), None)
    assert (response.released_millicredits, response.already_settled) == (0, True)


# -- settle: many jobs in one call ----------------------------------------------------------------

SETTLED, ALREADY, NO_HOLD, REFUSED = (
    credits_pb2.SettledJob.OUTCOME_SETTLED,
    credits_pb2.SettledJob.OUTCOME_ALREADY_SETTLED,
    credits_pb2.SettledJob.OUTCOME_NO_HOLD,
    credits_pb2.SettledJob.OUTCOME_REFUSED,
)


def _settle(
    *commits: credits_pb2.CommitRequest, releases: tuple[uuid.UUID, ...] = ()
) -> credits_pb2.SettleRequest:
    return credits_pb2.SettleRequest(
        commits=commits, releases=[credits_pb2.ReleaseRequest(job_id=str(j)) for j in releases]
    )


async def test_settle_commits_and_releases_jobs_of_two_accounts_in_one_call(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """A worker's batch: two accounts' commits (one with a line, one cut to its hold) and a
    release, a commit of a job that holds nothing, a release named twice, a job settled before.
    Each job is settled as Commit or Release would settle it, once."""
    a, b = await seed.tenant(balance=10_000), await seed.tenant(balance=5000)
    ocr, released, earlier = [await _held_job(credits, a, amount) for amount in (3000, 1200, 800)]
    cut = await _held_job(credits, b, 1000)
    await credits.service.Commit(_commit(earlier, 700), None)
    unknown = uuid.uuid4()

    response = await credits.stub.Settle(
        _settle(
            _commit(ocr, 2100, ocr_escalation=600),
            _commit(cut, 1500),
            _commit(unknown, 10),
            _commit(earlier, 800),
            releases=(released, released),
        )
    )

    assert [(r.job_id, r.outcome, r.millicredits) for r in response.results] == [
        (str(ocr), SETTLED, 2100),
        (str(cut), SETTLED, 1000),
        (str(unknown), NO_HOLD, 0),
        (str(earlier), ALREADY, 700),
        (str(released), SETTLED, 1200),
        (str(released), ALREADY, 0),
    ]
    assert await _lines(fresh_pool, ocr) == {"base": -1500, "ocr_escalation": -600}
    assert await _lines(fresh_pool, cut) == {"base": -1000}
    assert await _ledger(fresh_pool, a) == [
        ("hold", 3000), ("hold", 1200), ("hold", 800), ("commit", -700),
        ("commit", -1500), ("commit", -600), ("release", 1200),
    ]  # fmt: skip
    assert await _account(fresh_pool, a) == (10_000 - 700 - 2100, 0)
    assert await _account(fresh_pool, b) == (5000 - 1000, 0)


async def test_settle_refuses_a_bad_entry_alone_and_settles_the_others(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """What Commit or Release would refuse is its entry's result, and the rest of the call is
    settled: one bad job in a reaper's page must not hold up the other 499 (a hostile review
    found a page that was refused whole on every sweep). Only more than 1000 jobs refuse the call."""
    tenant = await seed.tenant(balance=10_000)
    good, bad, released = [await _held_job(credits, tenant, 1000) for _ in range(3)]

    response = await credits.stub.Settle(
        credits_pb2.SettleRequest(
            commits=[_commit(good, 500), _commit(bad, 500, base=100), _commit(bad, 900, pages=950)],
            releases=[
                credits_pb2.ReleaseRequest(job_id="nope"),
                credits_pb2.ReleaseRequest(job_id=str(released)),
            ],
        )
    )

    assert [(r.job_id, r.outcome, r.millicredits) for r in response.results] == [
        (str(good), SETTLED, 500),
        (str(bad), REFUSED, 0),
        (str(bad), REFUSED, 0),
        ("nope", REFUSED, 0),
        (str(released), SETTLED, 1000),
    ]
    assert [r.refusal for r in response.results if r.outcome == REFUSED] == [
        "charge lines need distinct lowercase names other than base",
        "charge lines exceed actual_millicredits",
        "job_id is not a valid id",
    ]
    assert await _account(fresh_pool, tenant) == (10_000 - 500, 1000), "bad stays held, for the reaper"
    with pytest.raises(InvalidArgument, match="at most 1000 jobs"):
        await credits.service.Settle(_settle(releases=(bad,) * 1001), None)
    with pytest.raises(InvalidArgument, match="not a valid id"):
        await credits.service.Release(credits_pb2.ReleaseRequest(job_id="nope"), None)
    assert await fresh_pool.fetchval("SELECT status FROM credit_holds WHERE job_id = $1", bad) == "held"


async def test_concurrent_settles_of_overlapping_jobs_charge_each_once_and_never_deadlock(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """Eight calls at once over the wire, each naming the same twelve jobs of two accounts in its
    own order (a worker's batch racing the reaper's sweep and other workers): every job is
    settled by exactly one of them, and the accounts add up."""
    a, b = await seed.tenant(balance=100_000), await seed.tenant(balance=100_000)
    jobs = [await _held_job(credits, tenant, 1000) for tenant in (a, b) for _ in range(6)]

    async def one(k: int) -> list[credits_pb2.SettledJob]:
        order = jobs[k:] + jobs[:k] if k % 2 else list(reversed(jobs))
        request = _settle(*(_commit(j, 400) for j in order[:8]), releases=tuple(order[8:]))
        return list((await call(credits.stub.Settle, request)).results)

    results = await asyncio.wait_for(asyncio.gather(*(one(k) for k in range(8))), 30)

    settled = [r.job_id for rs in results for r in rs if r.outcome == SETTLED]
    assert sorted(settled) == sorted(str(j) for j in jobs), "each job settled by one call"
    holds = await fresh_pool.fetch("SELECT status FROM credit_holds WHERE job_id = ANY($1)", jobs)
    assert {h["status"] for h in holds} <= {"committed", "released"}
    for tenant in (a, b):
        charged = await fresh_pool.fetchval(
            "SELECT sum(charged) FROM credit_holds WHERE account_id = $1", tenant.account_id
        )
        ledger = await fresh_pool.fetchval(
            "SELECT -sum(amount) FROM credit_ledger WHERE kind = 'commit' AND account_id = $1",
            tenant.account_id,
        )
        assert charged == ledger > 0
        assert await _account(fresh_pool, tenant) == (100_000 - charged, 0)


# -- grant, balance -------------------------------------------------------------------------------


async def test_grant_is_idempotent_per_grant_id(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=0)
    grant = credits_pb2.GrantRequest(account_id=str(tenant.account_id), millicredits=5000, grant_id="topup-1")

    first = await credits.service.Grant(grant, None)
    again = await credits.service.Grant(grant, None)
    other = await credits.service.Grant(
        credits_pb2.GrantRequest(account_id=str(tenant.account_id), millicredits=700, grant_id="topup-2"),
        None,
    )

    assert (first.balance_millicredits, again.balance_millicredits, other.balance_millicredits) == (
        5000,
        5000,
        5700,
    )
    assert await _ledger(fresh_pool, tenant) == [("grant", 5000), ("grant", 700)]
    balance = await credits.service.GetBalance(
        credits_pb2.GetBalanceRequest(account_id=str(tenant.account_id)), None
    )
    assert (balance.balance_millicredits, balance.held_millicredits) == (5700, 0)


async def test_grant_opens_the_credit_account_of_an_account_without_one(
    fresh_pool: asyncpg.Pool, credits: Credits
) -> None:
    account_id = uuid.uuid4()
    await fresh_pool.execute("INSERT INTO accounts (account_id, name) VALUES ($1, 'new')", account_id)

    response = await credits.service.Grant(
        credits_pb2.GrantRequest(account_id=str(account_id), millicredits=1000, grant_id="welcome"), None
    )

    assert response.balance_millicredits == 1000


async def test_grant_rejects_unknown_accounts_and_non_positive_amounts(
    seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant()
    with pytest.raises(NotFound):
        await credits.service.Grant(
            credits_pb2.GrantRequest(account_id=str(uuid.uuid4()), millicredits=1, grant_id="g"), None
        )
    with pytest.raises(InvalidArgument):
        await credits.service.Grant(
            credits_pb2.GrantRequest(account_id=str(tenant.account_id), millicredits=0, grant_id="g"), None
        )


# -- list holds (the reaper's settlement sweep) ---------------------------------------------------


async def test_list_holds_pages_through_the_held_ones_oldest_first(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=100_000)
    jobs = [await _held_job(credits, tenant, 10) for _ in range(5)]
    # made one minute apart, the first oldest (10 minutes ago)
    for age, job_id in enumerate(jobs):
        await fresh_pool.execute(
            "UPDATE credit_holds SET created_at = now() - make_interval(mins => $2) WHERE job_id = $1",
            job_id,
            10 - age,
        )
    await credits.service.Release(credits_pb2.ReleaseRequest(job_id=str(jobs[1])), None)
    seen, token, pages = [], "", 0
    while True:
        page = await credits.service.ListHolds(
            credits_pb2.ListHoldsRequest(older_than_seconds=0, page_size=2, page_token=token), None
        )
        seen += [uuid.UUID(hold.job_id) for hold in page.holds if uuid.UUID(hold.job_id) in jobs]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == [jobs[0], jobs[2], jobs[3], jobs[4]]  # oldest first; the released one is gone
    assert pages >= 2
    recent = await credits.service.ListHolds(
        credits_pb2.ListHoldsRequest(older_than_seconds=7.5 * 60, page_size=1000), None
    )
    assert {uuid.UUID(h.job_id) for h in recent.holds} & set(jobs) == {jobs[0], jobs[2]}  # 10, 8 min old


async def test_list_holds_refuses_bad_pages_and_tokens(credits: Credits) -> None:
    for request in (
        credits_pb2.ListHoldsRequest(page_size=1001),
        credits_pb2.ListHoldsRequest(page_size=-1),
        credits_pb2.ListHoldsRequest(older_than_seconds=float("nan")),
        credits_pb2.ListHoldsRequest(page_token="not a token"),
        credits_pb2.ListHoldsRequest(page_token="2026-01-01T00:00:00|not-a-uuid"),
    ):
        with pytest.raises(InvalidArgument):
            await credits.service.ListHolds(request, None)


async def test_list_ledger_pages_through_an_accounts_entries_newest_first_line_by_line(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """The grant that opened the account, then a job held and committed with two lines, and a
    job held and released: seven entries, newest first, two a page; another account's entries
    are never listed."""
    tenant = await seed.tenant(balance=10_000)
    other = await seed.tenant(balance=10_000)
    await credits.service.Grant(
        credits_pb2.GrantRequest(
            account_id=str(tenant.account_id), millicredits=500, grant_id=str(uuid.uuid4())
        ),
        None,
    )
    charged = await _held_job(credits, tenant, 2000)
    await credits.service.Commit(_commit(charged, 1050, pages=50), None)
    released = await _held_job(credits, tenant, 1200)
    await credits.service.Release(credits_pb2.ReleaseRequest(job_id=str(released)), None)
    await _held_job(credits, other, 900)

    entries, token = [], ""
    while True:
        page = await credits.service.ListLedger(
            credits_pb2.ListLedgerRequest(account_id=str(tenant.account_id), page_size=2, page_token=token),
            None,
        )
        entries += [(e.kind, e.line, e.millicredits, e.job_id) for e in page.entries]
        assert len(page.entries) <= 2
        token = page.next_page_token
        if not token:
            break
    grants = [e for e in entries if e[0] == "grant"]
    assert entries[: len(entries) - len(grants)] == [
        ("release", "base", 1200, str(released)),
        ("hold", "base", 1200, str(released)),
        ("commit", "pages", -50, str(charged)),
        ("commit", "base", -1000, str(charged)),
        ("hold", "base", 2000, str(charged)),
    ]
    assert grants[0][:3] == ("grant", "base", 500)
    assert all(job_id == "" for *_, job_id in grants)


async def test_list_ledger_refuses_bad_pages_tokens_and_ids(credits: Credits) -> None:
    account = str(uuid.uuid4())
    for request in (
        credits_pb2.ListLedgerRequest(account_id=account, page_size=1001),
        credits_pb2.ListLedgerRequest(account_id=account, page_size=-1),
        credits_pb2.ListLedgerRequest(account_id=account, page_token="12a"),
        credits_pb2.ListLedgerRequest(account_id=account, page_token="9" * 20),
        credits_pb2.ListLedgerRequest(account_id="not-an-id"),
    ):
        with pytest.raises(InvalidArgument):
            await credits.service.ListLedger(request, None)
