"""``hypermedia admin create-key`` and ``admin revoke-key``: another API key of an account, a
read-only one for an observer or a wall-screen dashboard (``--read-only``: it reads the account
and changes nothing, 403 ``READ_ONLY_KEY``), and the revocation of a key by its id. Each prints
JSON; exit 1 with the reason on a refusal or an unreachable database."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hypermedia.core.errors import NotFound
from hypermedia.devtools.schedule_admin import WithConn, run_json
from hypermedia.jobs import accounts


def register(admin: typer.Typer, with_conn: WithConn) -> None:
    """Adds the two commands to ``admin``; ``with_conn`` runs a function on a connection to the
    platform's database."""

    @admin.command("create-key")
    def create_key_cmd(
        account: Annotated[str, typer.Argument(help="the account's id")],
        read_only: Annotated[
            bool,
            typer.Option("--read-only", help="it reads the account (API, dashboard) and changes nothing"),
        ] = False,
    ) -> None:
        """Another API key of ACCOUNT; prints JSON {account_id, api_key, key_id, read_only}. The
        key is shown once: only its hash is kept."""

        async def work(conn: Any) -> dict[str, Any]:
            key, key_id = await accounts.create_key(conn, account, read_only=read_only)
            return {"account_id": account, "api_key": key, "key_id": key_id, "read_only": read_only}

        run_json("create-key", with_conn, work)

    @admin.command("revoke-key")
    def revoke_key_cmd(
        key_id: Annotated[str, typer.Argument(help="the key's id: the part after hm_")],
    ) -> None:
        """Revoke a key: its requests are 401 from now on (a dashboard session it opened lasts until
        it expires, 8 h at most). Prints JSON {key_id, revoked}; exit 1 when no live key has the id."""

        async def work(conn: Any) -> dict[str, Any]:
            if not await accounts.revoke_key(conn, key_id):
                raise NotFound(f"no live key {key_id[:40]!r}", "NOT_FOUND")
            return {"key_id": key_id, "revoked": True}

        run_json("revoke-key", with_conn, work)
