"""hypermedia.sandbox.landlock on this kernel: a process restricted to one directory reads it and nothing
else, cannot connect over TCP, and (ABI 6+) cannot signal a process outside its domain. Each
restriction runs in a child Python (it is irreversible)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hypermedia.sandbox import landlock

pytestmark = pytest.mark.skipif(landlock.abi_version() == 0, reason="the kernel has no Landlock")

CHILD = """
import ctypes, json, os, signal, socket, sys
from hypermedia.sandbox import landlock
allowed, outside, port, parent = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
abi = landlock.restrict_self([
    landlock.Rule(allowed, landlock.READ_WRITE),
    landlock.Rule(allowed + "/missing", landlock.READ),  # skipped
    landlock.Rule("/dev/null", landlock.READ_WRITE),  # a file: only file rights are kept
])
seen = {"abi": abi}
def attempt(name, action):
    try:
        action()
        seen[name] = "ok"
    except OSError as exc:
        seen[name] = exc.errno
attempt("read_allowed", lambda: open(allowed + "/inside.txt").read())
attempt("write_allowed", lambda: open(allowed + "/new.txt", "w").write("x"))
attempt("read_outside", lambda: open(outside).read())
attempt("list_root", lambda: os.listdir("/"))
attempt("tcp_connect", lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
attempt("signal_parent", lambda: os.kill(parent, 0))
print(json.dumps(seen))
"""


def test_a_restricted_process_opens_its_rules_only(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "inside.txt").write_text("in")
    outside = tmp_path / "outside.txt"
    outside.write_text("out")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                str(allowed),
                str(outside),
                str(server.getsockname()[1]),
                str(os.getpid()),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=Path(__file__).resolve().parents[2],
        )
    finally:
        server.close()
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["abi"] == landlock.abi_version()
    assert seen["read_allowed"] == seen["write_allowed"] == "ok"
    assert (allowed / "new.txt").read_text() == "x"
    assert seen["read_outside"] == seen["list_root"] == 13  # EACCES
    if landlock.abi_version() >= 4:
        assert seen["tcp_connect"] == 13
    if landlock.abi_version() >= 6:
        assert seen["signal_parent"] == 1  # EPERM: the parent is outside the domain
    assert outside.read_text() == "out"  # the parent itself is not restricted
