"""The sandbox probes (tests/security/test_sandbox_probes.py) once more, with the worker — here
pytest — running as an unprivileged uid (420090, no passwd entry, no groups, no capabilities):
the layers must hold without root (docs/adr/0041), and none of the probes may skip.

This machine's Python lives under ``/root`` (mode 0700), which an unprivileged user cannot
search; the run gets a private mount namespace (``unshare -m``, made by root before the drop)
in which ``/root`` is an empty tmpfs with ``.pyenv`` bound back read-only. Nothing else differs
from a worker started by an ordinary user."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
UNPRIVILEGED_UID = 420090
"""In this helper's uid range (HM_SANDBOX_UID_BASE=420000)."""

pytestmark = pytest.mark.skipif(
    os.environ.get("HM_PROBES_UNPRIVILEGED") == "1", reason="already the unprivileged run"
)


def _command(basetemp: Path) -> list[str]:
    pytest_args = [
        sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--basetemp={basetemp}",
        str(CHECKOUT / "tests/security/test_sandbox_probes.py"),
    ]  # fmt: skip
    drop = [
        "setpriv", f"--reuid={UNPRIVILEGED_UID}", f"--regid={UNPRIVILEGED_UID}",
        "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--",
    ]  # fmt: skip
    setup = []
    python_home = os.path.realpath(sys.base_prefix)
    if python_home.startswith("/root/") and not os.stat("/root").st_mode & 0o001:
        top = "/root/" + Path(python_home).relative_to("/root").parts[0]
        setup = [
            "mkdir -p /run/hm-probes-python",
            f"mount --bind {shlex.quote(top)} /run/hm-probes-python",
            "mount -t tmpfs -o size=16k,mode=0755 tmpfs /root",
            f"mkdir -p {shlex.quote(top)}",
            f"mount --bind -o ro /run/hm-probes-python {shlex.quote(top)}",
        ]
    script = " && ".join([*setup, "exec " + shlex.join(drop + pytest_args)])
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script]


@pytest.mark.skipif(os.geteuid() != 0, reason="starts the unprivileged run from root")
def test_every_sandbox_probe_passes_unprivileged_with_none_skipped(tmp_root: Path) -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "HM_PROBES_UNPRIVILEGED": "1",
        "HM_SANDBOX_UID_BASE": os.environ.get("HM_SANDBOX_UID_BASE", "420000"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    own = tmp_root / "unprivileged"  # pytest's own /tmp/pytest-of-* may be another uid's
    own.mkdir()
    os.chown(own, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    basetemp = own / "pytest"  # pytest removes and remakes it: its parent must be the uid's
    run = subprocess.run(
        _command(basetemp), cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    summary = output.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed is not None and int(passed.group(1)) >= 18, summary
    assert not re.search(r"skipped|failed|error", summary), summary
