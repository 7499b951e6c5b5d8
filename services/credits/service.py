"""The credits service: estimates, holds (EstimateAndHold: both in one call, the gateway's),
commits, releases and balances.

Amounts are integer millicredits. Every movement is a ``credit_ledger`` row; ``credit_holds`` has
one row per job, and its status (held → committed | released) makes Commit and Release idempotent
per job: the first one settles the hold, later ones report ``already_settled`` and change nothing.
Price of one operation (the seed's formula): ``base_cost + per_mb × size_mb``, with
``size_mb = size_bytes / 2^20`` rounded up to the next millicredit. A commit may split the amount
into charge lines (``ocr_escalation`` beside ``base``), one ledger row each.
"""

from __future__ import annotations

import datetime
import math
import re
import uuid
from collections.abc import Sequence

import asyncpg
import grpc

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from hypermedia.core import metrics, pgtext
from hypermedia.core.errors import InsufficientCredits, InvalidArgument, NotFound
from hypermedia.infra import db
from hypermedia.jobs import quotas
from hypermedia.jobs.pricing import price

SettledJob = credits_pb2.SettledJob

LINE_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
"""A charge line's name (``ocr_escalation``)."""
MAX_GRANT_ID_LENGTH = 200
"""Longest ``grant_id`` of a Grant (characters); ``hypermedia admin`` sends a UUID."""
DEFAULT_HOLDS_PAGE = 500
"""Holds in a ListHolds page when the request names no size (the reaper's batch)."""
MAX_SETTLE = 1000
"""Most jobs (commits and releases) one Settle may name."""
MAX_HOLDS_PAGE = 1000
"""Largest ListHolds (and ListLedger) page."""
DEFAULT_LEDGER_PAGE = 50
"""Entries in a ListLedger page when the request names no size."""
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(f"{what} is not a valid id", "INVALID_ARGUMENT") from None


def _charge_lines(request: credits_pb2.CommitRequest) -> list[tuple[str, int]]:
    """``[("base", …), (line, …), …]`` of a Commit: its lines, and what is left of its amount as
    ``base`` (first). Raises InvalidArgument (see the RPC)."""
    if request.actual_millicredits < 0:
        raise InvalidArgument("actual_millicredits must not be negative")
    names = [line.line for line in request.lines]
    if "base" in names or len(set(names)) != len(names) or not all(LINE_NAME.fullmatch(n) for n in names):
        raise InvalidArgument("charge lines need distinct lowercase names other than base")
    if any(line.millicredits < 0 for line in request.lines):
        raise InvalidArgument("charge lines must not be negative")
    extra = sum(line.millicredits for line in request.lines)
    if extra > request.actual_millicredits:
        raise InvalidArgument("charge lines exceed actual_millicredits")
    return [("base", request.actual_millicredits - extra)] + [
        (line.line, line.millicredits) for line in request.lines
    ]


def _cut_to_hold(lines: list[tuple[str, int]], hold: int) -> list[tuple[str, int]]:
    """The lines as charged against a hold of ``hold`` millicredits: in order, each cut to what the
    hold has left (a job is never charged more than it held). The base line is always kept."""
    rows = []
    left = hold
    for line, amount in lines:
        charged = min(amount, left)
        left -= charged
        if charged or line == "base":
            rows.append((line, charged))
    return rows


async def _estimates(
    reader: asyncpg.Pool | db.Connection, operations: list[str], size_bytes: int
) -> list[credits_pb2.OperationEstimate]:
    """The price of each of ``operations`` on ``size_bytes`` of input (:func:`price` of its active
    profile), in their order. Raises InvalidArgument for a negative size, NotFound
    (``UNKNOWN_OPERATION``) for an operation without an active profile."""
    if size_bytes < 0:
        raise InvalidArgument("size_bytes must not be negative")
    rows = await reader.fetch(
        "SELECT operation, version, base_cost, per_mb FROM processing_profiles "
        "WHERE active AND operation = ANY($1::text[])",
        operations,
    )
    by_op = {r["operation"]: r for r in rows}
    estimates = []
    for operation in operations:
        row = by_op.get(operation)
        if row is None:
            raise NotFound(f"unknown operation {operation!r}", "UNKNOWN_OPERATION")
        estimates.append(
            credits_pb2.OperationEstimate(
                operation=operation,
                millicredits=price(row["base_cost"], row["per_mb"], size_bytes),
                profile_version=row["version"],
            )
        )
    return estimates


async def _hold(
    conn: db.Connection, account_id: uuid.UUID, holds: list[tuple[uuid.UUID, int]]
) -> tuple[int, int, int]:
    """In the caller's transaction: hold ``(job_id, millicredits)`` each, all or nothing, skipping
    jobs that hold already (idempotent per job). Returns the account's ``(balance, held)``
    afterwards and the millicredits newly held (counted in :data:`metrics.CREDITS` once the
    transaction commits). Raises NotFound (``ACCOUNT_NOT_FOUND``), InsufficientCredits when the
    new holds exceed what is available (nothing is held then)."""
    account = await conn.fetchrow(
        "SELECT balance, held FROM credit_accounts WHERE account_id = $1 FOR UPDATE", account_id
    )
    if account is None:
        raise NotFound("no credit account", "ACCOUNT_NOT_FOUND")
    existing = {
        r["job_id"]
        for r in await conn.fetch(
            "SELECT job_id FROM credit_holds WHERE job_id = ANY($1::uuid[])", [j for j, _ in holds]
        )
    }
    new = [(j, a) for j, a in holds if j not in existing]
    total = sum(a for _, a in new)
    available = account["balance"] - account["held"]
    if total > available:
        raise InsufficientCredits(
            f"this request needs {total / 1000:.3f} credits; {available / 1000:.3f} are available",
            "INSUFFICIENT_CREDITS",
        )
    await conn.executemany(
        "INSERT INTO credit_holds (job_id, account_id, amount, status) VALUES ($1, $2, $3, 'held')",
        [(j, account_id, a) for j, a in new],
    )
    await conn.executemany(
        "INSERT INTO credit_ledger (account_id, job_id, kind, amount) VALUES ($1, $2, 'hold', $3)",
        [(account_id, j, a) for j, a in new],
    )
    await conn.execute(
        "UPDATE credit_accounts SET held = held + $2, updated_at = now() WHERE account_id = $1",
        account_id,
        total,
    )
    # The row was locked FOR UPDATE above: its new values are known.
    return account["balance"], account["held"] + total, total


class CreditsService(credits_pb2_grpc.CreditsServiceServicer):
    """gRPC servicer over the ``credit_*`` tables and the job quotas (``account_quotas``,
    :mod:`hypermedia.jobs.quotas`) with ``quota_defaults`` where an account has no limit of its own."""

    def __init__(self, pool: asyncpg.Pool, quota_defaults: quotas.QuotaDefaults = quotas.DEFAULTS) -> None:
        self._pool = pool
        self._quota_defaults = quota_defaults

    async def Estimate(
        self, request: credits_pb2.EstimateRequest, context: grpc.aio.ServicerContext
    ) -> credits_pb2.EstimateResponse:
        estimates = await _estimates(self._pool, list(request.operations), request.size_bytes)
        return credits_pb2.EstimateResponse(
            estimates=estimates, total_millicredits=sum(e.millicredits for e in estimates)
        )

    async def Hold(
        self, request: credits_pb2.HoldRequest, context: grpc.aio.ServicerContext
    ) -> credits_pb2.HoldResponse:
        account_id = _uuid(request.account_id, "account_id")
        holds = [(_uuid(h.job_id, "job_id"), h.millicredits) for h in request.holds]
        if any(amount < 0 for _, amount in holds):
            raise InvalidArgument("hold amounts must not be negative")
        async with self._pool.acquire() as conn, conn.transaction():
            balance, held, placed = await _hold(conn, account_id, holds)
        metrics.CREDITS.labels("held").inc(placed)
        return credits_pb2.HoldResponse(balance_millicredits=balance, held_millicredits=held)

    async def EstimateAndHold(
        self, request: credits_pb2.EstimateAndHoldRequest, context: grpc.aio.ServicerContext
    ) -> credits_pb2.EstimateAndHoldResponse:
        account_id = _uuid(request.account_id, "account_id")
        job_ids = [_uuid(j.job_id, "job_id") for j in request.jobs]
        if any(j.extra_millicredits < 0 for j in request.jobs):
            raise InvalidArgument("extra_millicredits must not be negative")
        if request.priority and request.priority not in range(1, 11):
            raise InvalidArgument("priority must be 1 (highest) to 10, or 0 when not given")
        async with self._pool.acquire() as conn, conn.transaction():
            estimates = await _estimates(conn, [j.operation for j in request.jobs], request.size_bytes)
            # A retried call (every job holds for this account already) is not counted twice.
            held_before = await conn.fetchval(
                "SELECT count(*) FROM credit_holds WHERE job_id = ANY($1::uuid[]) AND account_id = $2",
                job_ids,
                account_id,
            )
            if held_before < len(set(job_ids)):
                await quotas.check(
                    conn,
                    account_id,
                    request.priority,
                    len(job_ids),
                    self._quota_defaults,
                    take_token=not request.paced,
                )
            holds = [
                (job_id, e.millicredits + j.extra_millicredits)
                for job_id, e, j in zip(job_ids, estimates, request.jobs, strict=True)
            ]
            balance, held, placed = await _hold(conn, account_id, holds)
        metrics.CREDITS.labels("held").inc(placed)
        return credits_pb2.EstimateAndHoldResponse(
            estimates=estimates,
            total_millicredits=sum(e.millicredits for e in estimates),
            balance_millicredits=balance,
            held_millicredits=held,
        )

    async def Commit(
        self, request: credits_pb2.CommitRequest, context: grpc.aio.ServicerContext
    ) -> credits_pb2.CommitResponse:
        (result,) = await self._settle([request], [])
        if result.outcome == SettledJob.OUTCOME_REFUSED:
            raise InvalidArgument(result.refusal)
        if result.outcome == SettledJob.OUTCOME_NO_HOLD:
            raise NotFound("no hold for this job", "HOLD_NOT_FOUND")
        return credits_pb2.CommitResponse(
            charged_millicredits=result.millicredits,
            already_settled=result.outcome == SettledJob.OUTCOME_ALREADY_SETTLED,
        )

    async def Release(
        self, request: credits_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> credits_pb2.ReleaseResponse:
        (result,) = await self._settle([], [request])
        if result.outcome == SettledJob.OUTCOME_REFUSED:
            raise InvalidArgument(result.refusal)
        settled = result.outcome == SettledJob.OUTCOME_SETTLED
        return credits_pb2.ReleaseResponse(
            released_millicredits=result.millicredits if settled else 0, already_settled=not settled
        )

    async def Settle(
        self, request: credits_pb2.SettleRequest, context: grpc.aio.ServicerContext
    ) -> credits_pb2.SettleResponse:
        if len(request.commits) + len(request.releases) > MAX_SETTLE:
            raise InvalidArgument(f"at most {MAX_SETTLE} jobs in one Settle")
        return credits_pb2.SettleResponse(results=await self._settle(request.commits, request.releases))

    async def _settle(
        self,
        commits: Sequence[credits_pb2.CommitRequest],
        releases: Sequence[credits_pb2.ReleaseRequest],
    ) -> list[credits_pb2.SettledJob]:
        """Commits and releases in one transaction (see the Settle RPC): the holds locked in job id
        order and the accounts updated in account id order, so that concurrent calls (workers,
        the reaper) wait for each other rather than deadlock. One ledger row per charge line of a
        commit, one per release. Returns a result per job, commits first, in the request's order;
        a malformed id or commit is its job's ``OUTCOME_REFUSED``, the rest settled all the same."""
        entries: list[credits_pb2.CommitRequest | credits_pb2.ReleaseRequest] = [*commits, *releases]
        # Per entry: its job and charge lines (None: a release), or why it is refused.
        wanted: list[tuple[uuid.UUID, list[tuple[str, int]] | None] | str] = []
        for entry in entries:
            try:
                job_id = _uuid(entry.job_id, "job_id")
                lines = _charge_lines(entry) if isinstance(entry, credits_pb2.CommitRequest) else None
                wanted.append((job_id, lines))
            except InvalidArgument as exc:
                wanted.append(exc.public_message)
        results = []
        async with self._pool.acquire() as conn, conn.transaction():
            holds = {
                row["job_id"]: row
                for row in await conn.fetch(
                    "SELECT * FROM credit_holds WHERE job_id = ANY($1::uuid[]) ORDER BY job_id FOR UPDATE",
                    sorted({item[0] for item in wanted if not isinstance(item, str)}),
                )
            }
            settled: dict[uuid.UUID, tuple[str, int]] = {}  # job -> (new status, charged)
            ledger: list[tuple[uuid.UUID, uuid.UUID, str, str, int]] = []
            accounts: dict[uuid.UUID, list[int]] = {}  # account -> [charged, freed from held]
            for entry, item in zip(entries, wanted, strict=True):
                if isinstance(item, str):
                    results.append(
                        SettledJob(job_id=entry.job_id[:64], outcome=SettledJob.OUTCOME_REFUSED, refusal=item)
                    )
                    continue
                job_id, lines = item
                hold = holds.get(job_id)
                if hold is None:
                    outcome = (
                        SettledJob.OUTCOME_NO_HOLD
                        if lines is not None
                        else SettledJob.OUTCOME_ALREADY_SETTLED
                    )
                    results.append(SettledJob(job_id=str(job_id), outcome=outcome))
                    continue
                if hold["status"] != "held" or job_id in settled:
                    earlier = settled[job_id][1] if job_id in settled else hold["charged"] or 0
                    results.append(
                        SettledJob(
                            job_id=str(job_id),
                            outcome=SettledJob.OUTCOME_ALREADY_SETTLED,
                            millicredits=earlier if lines is not None else 0,
                        )
                    )
                    continue
                account = accounts.setdefault(hold["account_id"], [0, 0])
                account[1] += hold["amount"]
                if lines is None:
                    settled[job_id] = ("released", 0)
                    ledger.append((hold["account_id"], job_id, "release", "base", hold["amount"]))
                    amount = hold["amount"]
                else:
                    rows = _cut_to_hold(lines, hold["amount"])
                    amount = sum(charged for _, charged in rows)
                    settled[job_id] = ("committed", amount)
                    ledger.extend(
                        (hold["account_id"], job_id, "commit", line, -charged) for line, charged in rows
                    )
                    account[0] += amount
                results.append(
                    SettledJob(job_id=str(job_id), outcome=SettledJob.OUTCOME_SETTLED, millicredits=amount)
                )
            if settled:
                await conn.execute(
                    "UPDATE credit_holds h SET status = s.status, charged = s.charged, settled_at = now() "
                    "FROM unnest($1::uuid[], $2::text[], $3::bigint[]) AS s(job_id, status, charged) "
                    "WHERE h.job_id = s.job_id",
                    list(settled),
                    [status for status, _ in settled.values()],
                    [charged for _, charged in settled.values()],
                )
                await conn.executemany(
                    "INSERT INTO credit_ledger (account_id, job_id, kind, line, amount) VALUES ($1, $2, $3, $4, $5)",
                    ledger,
                )
                await conn.executemany(
                    "UPDATE credit_accounts SET balance = balance - $2, held = held - $3, updated_at = now() "
                    "WHERE account_id = $1",
                    [
                        (account_id, charged, freed)
                        for account_id, (charged, freed) in sorted(accounts.items())
                    ],
                )
        committed = sum(charged for status, charged in settled.values() if status == "committed")
        freed = sum(freed for _, freed in accounts.values())
        metrics.CREDITS.labels("committed").inc(committed)
        metrics.CREDITS.labels("released").inc(freed - committed)
        return results

    async def GetBalance(
        self, request: credits_pb2.GetBalanceRequest, context: grpc.aio.ServicerContext
    ) -> credits_pb2.GetBalanceResponse:
        account_id = _uuid(request.account_id, "account_id")
        row = await self._pool.fetchrow(
            "SELECT balance, held FROM credit_accounts WHERE account_id = $1", account_id
        )
        if row is None:
            raise NotFound("no credit account", "ACCOUNT_NOT_FOUND")
        return credits_pb2.GetBalanceResponse(
            balance_millicredits=row["balance"], held_millicredits=row["held"]
        )

    async def Grant(
        self, request: credits_pb2.GrantRequest, context: grpc.aio.ServicerContext
    ) -> credits_pb2.GrantResponse:
        account_id = _uuid(request.account_id, "account_id")
        if request.millicredits <= 0:
            raise InvalidArgument("a grant must be positive")
        pgtext.check(request.grant_id, "grant_id", MAX_GRANT_ID_LENGTH)  # a unique index: bounded
        grant_id = request.grant_id or str(uuid.uuid4())
        async with self._pool.acquire() as conn, conn.transaction():
            exists = await conn.fetchval("SELECT 1 FROM accounts WHERE account_id = $1", account_id)
            if not exists:
                raise NotFound("no such account", "ACCOUNT_NOT_FOUND")
            await conn.execute(
                "INSERT INTO credit_accounts (account_id) VALUES ($1) ON CONFLICT DO NOTHING", account_id
            )
            inserted = await conn.fetchval(
                "INSERT INTO credit_ledger (account_id, grant_id, kind, amount) VALUES ($1, $2, 'grant', $3) "
                "ON CONFLICT (grant_id) DO NOTHING RETURNING entry_id",
                account_id,
                grant_id,
                request.millicredits,
            )
            if inserted is not None:
                await conn.execute(
                    "UPDATE credit_accounts SET balance = balance + $2, updated_at = now() WHERE account_id = $1",
                    account_id,
                    request.millicredits,
                )
            balance = await conn.fetchval(
                "SELECT balance FROM credit_accounts WHERE account_id = $1", account_id
            )
        return credits_pb2.GrantResponse(balance_millicredits=balance)

    async def ListHolds(
        self, request: credits_pb2.ListHoldsRequest, context: grpc.aio.ServicerContext
    ) -> credits_pb2.ListHoldsResponse:
        page_size = request.page_size or DEFAULT_HOLDS_PAGE
        if not 1 <= page_size <= MAX_HOLDS_PAGE:
            raise InvalidArgument(f"page_size must be 1–{MAX_HOLDS_PAGE}")
        if not math.isfinite(request.older_than_seconds) or request.older_than_seconds < 0:
            raise InvalidArgument("older_than_seconds must be a finite number ≥ 0")
        after_at, after_id = _holds_cursor(request.page_token)
        rows = await self._pool.fetch(
            """
            SELECT job_id, created_at FROM credit_holds
            WHERE status = 'held' AND created_at < now() - make_interval(secs => $1)
              AND (created_at, job_id) > ($2, $3)
            ORDER BY created_at, job_id LIMIT $4
            """,
            request.older_than_seconds,
            after_at,
            after_id,
            page_size,
        )
        holds = []
        for row in rows:
            hold = credits_pb2.HeldHold(job_id=str(row["job_id"]))
            hold.created_at.FromDatetime(row["created_at"])
            holds.append(hold)
        token = ""
        if len(rows) == page_size:
            token = f"{rows[-1]['created_at'].isoformat()}|{rows[-1]['job_id']}"
        return credits_pb2.ListHoldsResponse(holds=holds, next_page_token=token)

    async def ListLedger(
        self, request: credits_pb2.ListLedgerRequest, context: grpc.aio.ServicerContext
    ) -> credits_pb2.ListLedgerResponse:
        account_id = _uuid(request.account_id, "account_id")
        page_size = request.page_size or DEFAULT_LEDGER_PAGE
        if not 1 <= page_size <= MAX_HOLDS_PAGE:
            raise InvalidArgument(f"page_size must be 1–{MAX_HOLDS_PAGE}")
        rows = await self._pool.fetch(
            "SELECT entry_id, kind, line, amount, job_id, created_at FROM credit_ledger "
            "WHERE account_id = $1 AND entry_id < $2 ORDER BY entry_id DESC LIMIT $3",
            account_id,
            _ledger_cursor(request.page_token),
            page_size,
        )
        entries = []
        for row in rows:
            entry = credits_pb2.LedgerEntry(
                entry_id=row["entry_id"],
                kind=row["kind"],
                line=row["line"],
                millicredits=row["amount"],
                job_id=str(row["job_id"] or ""),
            )
            entry.created_at.FromDatetime(row["created_at"])
            entries.append(entry)
        token = str(rows[-1]["entry_id"]) if len(rows) == page_size else ""
        return credits_pb2.ListLedgerResponse(entries=entries, next_page_token=token)


def _ledger_cursor(token: str) -> int:
    """The ``entry_id`` a ListLedger page starts below; above any for an empty token. Raises
    InvalidArgument for a token ListLedger did not make."""
    if not token:
        return 2**63 - 1
    if not token.isascii() or not token.isdigit() or len(token) > 18:
        raise InvalidArgument("malformed page_token", "INVALID_ARGUMENT")
    return int(token)


def _holds_cursor(token: str) -> tuple[datetime.datetime, uuid.UUID]:
    """``(created_at, job_id)`` after which a ListHolds page starts; the start for an empty token.
    Raises InvalidArgument for a token ListHolds did not make."""
    if not token:
        return _EPOCH, uuid.UUID(int=0)
    at, _, job_id = token.partition("|")
    try:
        created = datetime.datetime.fromisoformat(at)
        if created.tzinfo is None:
            raise ValueError("naive")
        return created, uuid.UUID(job_id)
    except ValueError:
        raise InvalidArgument("malformed page_token", "INVALID_ARGUMENT") from None
