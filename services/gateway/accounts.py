"""The caller's account (``GET /v1/account``), credits (``GET /v1/credits``, gRPC ``GetBalance``)
and ledger (``GET /v1/account/ledger``, gRPC ``ListLedger``)."""

from __future__ import annotations

import datetime

import asyncpg

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from hypermedia.core.errors import InvalidArgument
from hypermedia.infra.rpc import call
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.webhooks import account_secret
from services.gateway.results import Account, Balance, LedgerEntry, LedgerPage
from services.gateway.status import INVALID_CURSOR_MESSAGE

MAX_LEDGER_PAGE = 1000
"""Largest ledger page (the credits service's bound)."""


class Accounts:
    """The account use cases. Dependencies come in through the constructor.

    Args:
        pool: the system of record (``accounts``: the webhook secret).
        credits: the credits service (balances).
    """

    def __init__(self, pool: asyncpg.Pool, credits: credits_pb2_grpc.CreditsServiceStub) -> None:
        self._pool = pool
        self._credits = credits

    async def account(self, caller: Caller) -> Account:
        """The caller's account and pool and the secret that signs its webhooks (created on
        first use); None for a read-only key, whose holder must not be able to sign webhooks
        as the platform."""
        if caller.read_only:
            return Account(account_id=caller.account_id, pool_id=caller.pool_id, webhook_secret=None)
        secret = await account_secret(self._pool, caller.account_id)
        return Account(account_id=caller.account_id, pool_id=caller.pool_id, webhook_secret=secret)

    async def balance(self, caller: Caller) -> Balance:
        """The caller's balance and what unfinished jobs hold, from the credits service."""
        response = await call(
            self._credits.GetBalance, credits_pb2.GetBalanceRequest(account_id=caller.account_id)
        )
        return Balance(
            balance_millicredits=response.balance_millicredits, held_millicredits=response.held_millicredits
        )

    async def ledger(self, caller: Caller, limit: int, cursor: str | None) -> LedgerPage:
        """The caller's ledger from the credits service, newest first, ``limit`` (1–1000)
        entries a page from ``cursor`` (the previous page's ``next_cursor``; None or empty: the
        newest, as for jobs and objects),
        each with its job's operation, status and error code read from the jobs. Raises
        InvalidArgument: ``INVALID_PAGE_SIZE``, ``INVALID_CURSOR``."""
        if not 1 <= limit <= MAX_LEDGER_PAGE:
            raise InvalidArgument(f"page size must be 1–{MAX_LEDGER_PAGE}", "INVALID_PAGE_SIZE")
        if cursor and not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 18):
            raise InvalidArgument(INVALID_CURSOR_MESSAGE, "INVALID_CURSOR")
        response = await call(
            self._credits.ListLedger,
            credits_pb2.ListLedgerRequest(
                account_id=caller.account_id, page_size=limit, page_token=cursor or ""
            ),
        )
        job_ids = sorted({e.job_id for e in response.entries if e.job_id})
        jobs = {
            r["job_id"]: r
            for r in await self._pool.fetch(
                "SELECT job_id::text, operation, status, error_code FROM processing_jobs "
                "WHERE job_id = ANY($1::uuid[]) AND account_id = $2",
                job_ids,
                caller.account_id,
            )
        }
        entries = []
        for e in response.entries:
            job = jobs.get(e.job_id)
            entries.append(
                LedgerEntry(
                    entry_id=e.entry_id,
                    kind=e.kind,
                    line=e.line,
                    millicredits=e.millicredits,
                    job_id=e.job_id or None,
                    operation=job["operation"] if job else None,
                    job_status=job["status"] if job else None,
                    error_code=job["error_code"] if job else None,
                    created_at=e.created_at.ToDatetime(datetime.UTC),
                )
            )
        return LedgerPage(tuple(entries), response.next_page_token or None)
