"""The caller's account (``GET /v1/account``) and credits (``GET /v1/credits``, gRPC ``GetBalance``)."""

from __future__ import annotations

import asyncpg

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from hypermedia.infra.rpc import call
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.webhooks import account_secret
from services.gateway.results import Account, Balance


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
        first use)."""
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
