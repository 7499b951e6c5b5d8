"""The unit socket's messages (hypermedia/worker/unit/peer.py): every one carries the identity, a
stale one is told apart field by field, and execution's link refuses stale messages before
control's evidence (a real Unix socket and a server of this test's)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hypermedia.worker.unit import peer

OWN = peer.UnitIdentity("prod", "images-a", "ab" * 16, 4, 2)


def test_a_message_round_trips_with_its_identity() -> None:
    message = peer.decode(peer.encode("admission", OWN, target=3, reason="grow"))
    assert message["kind"] == "admission" and message["target"] == 3
    assert peer.stale_reason(message, OWN) is None


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("epoch", 3, "epoch 3, the unit's is 4"),
        ("generation", 1, "generation 1, the unit's is 2"),
        ("boot", "cd" * 16, "boot"),
        ("deployment", "staging", "deployment 'staging'"),
        ("unit", "images-b", "unit 'images-b'"),
    ],
)
def test_each_field_of_the_identity_makes_a_message_stale(field: str, value: object, said: str) -> None:
    other = peer.UnitIdentity(**{**OWN.__dict__, field: value})
    reason = peer.stale_reason(peer.decode(peer.encode("status", other)), OWN)
    assert reason is not None and reason.startswith(said)


def test_malformed_lines_are_not_messages() -> None:
    for line in (b"[]", b'{"kind": "hello"}', b'{"unit": {}}', b"not json"):
        with pytest.raises(ValueError):
            peer.decode(line)


def test_identity_comes_from_the_environment_only_whole() -> None:
    env = OWN.env("/run/x.sock")
    assert peer.UnitIdentity.from_env(env) == OWN
    assert peer.UnitIdentity.from_env({}) is None
    del env[peer.ENV_EPOCH]
    with pytest.raises(ValueError, match="incomplete"):
        peer.UnitIdentity.from_env(env)


def test_the_link_refuses_stale_messages_and_waits_for_matching_evidence(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    seen: list[dict[str, object]] = []
    admissions: list[dict[str, object]] = []

    async def control(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(peer.decode(await reader.readline()))
        stale = peer.UnitIdentity(**{**OWN.__dict__, "epoch": 3})
        await peer.send(writer, "evidence", stale)  # an earlier epoch's: refused
        await peer.send(writer, "admission", stale, target=9)
        await peer.send(writer, "evidence", OWN)
        await peer.send(writer, "admission", stale, target=7)
        await peer.send(writer, "admission", OWN, target=2)
        writer.close()

    async def run() -> peer.ControlLink:
        server = await asyncio.start_unix_server(control, path)
        link = peer.ControlLink(OWN, path, admissions.append, lambda: {"busy": 0})
        await asyncio.wait_for(link.connect("w-1"), 5)
        await asyncio.wait_for(link.run(), 5)
        server.close()
        return link

    link = asyncio.run(run())
    assert seen[0]["kind"] == "hello" and seen[0]["worker_id"] == "w-1"
    assert link.evidence_matched and link.lost.is_set()
    assert [a["target"] for a in admissions] == [2]
    assert link.refused == 3


def test_a_line_nested_too_deep_is_not_a_message() -> None:
    with pytest.raises(ValueError, match="nested too deep"):
        peer.decode(b"[" * 100_000)


@pytest.mark.parametrize(("field", "value"), [("epoch", True), ("epoch", 4.0), ("generation", "2")])
def test_an_identity_of_another_json_type_is_stale(field: str, value: object) -> None:
    """``true == 1`` and ``4.0 == 4`` in Python; on the socket they are not the unit's identity."""
    message = peer.decode(peer.encode("status", OWN))
    message["unit"][field] = value
    assert peer.stale_reason(message, OWN) == f"{field} {value!r}, the unit's is {getattr(OWN, field)!r}"
