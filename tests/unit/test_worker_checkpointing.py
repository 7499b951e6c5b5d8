"""The worker's listing of a job's checkpoint directory (ADR 0069), which the job's child writes:
names sorted, only ``*.zip``, at most ``MAX_LISTED`` entries looked at, nothing for a directory
that is not there or not a directory."""

from __future__ import annotations

from pathlib import Path

from hypermedia.worker import checkpointing


def test_the_listing_is_bounded_and_takes_zips_only(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("p002-003.zip", "p001-001.zip", "notes.txt", ".p004-004.tmp"):
        (folder / name).write_bytes(b"x")
    assert checkpointing._finished_parts(folder) == ["p001-001.zip", "p002-003.zip"]
    for n in range(3 * checkpointing.MAX_LISTED):
        (folder / f"junk-{n}.zip").write_bytes(b"")
    assert len(checkpointing._finished_parts(folder)) <= checkpointing.MAX_LISTED
    assert checkpointing._finished_parts(tmp_path / "missing") == []
    (tmp_path / "file").write_bytes(b"")
    assert checkpointing._finished_parts(tmp_path / "file") == []
