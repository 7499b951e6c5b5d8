#!/usr/bin/env bash
# `make test`'s second run of tests/security, as an unprivileged user (issue 18 item 6): the same
# probes must pass without root, none skipped for lack of it (tests/security/conftest.py turns such
# a skip into a failure when HM_SECURITY_UNPRIVILEGED=1). Run as root it creates the user
# ($HM_TEST_USER, default hmtest) when missing and runs pytest as that user; run as another user it
# runs pytest as itself. Extra arguments go to pytest (e.g. a single test file).
#
# The interpreter may live under a directory others may not search (pyenv under /root, 0700): then
# the run gets a private mount namespace (unshare --mount, nothing leaks to the host) in which that
# directory is covered by an empty tmpfs (mode 0711) and the interpreter's prefix bound back, as
# the sandbox does for its jobs (hypermedia/sandbox/confine.py: _covered_dirs).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
user="${HM_TEST_USER:-hmtest}"
pytest_cmd=(.venv/bin/python -m pytest -q -p no:cacheprovider -rs --junitxml="${HM_UNPRIVILEGED_JUNIT:-/tmp/hm-security-unprivileged.xml}")
# By default the sandbox's probes and its layer report: the attacks of issue 18 item 6 from inside
# a job. Not here yet (they need root for what they test, see docs/security.md "what still does
# not hold"): tests/security/test_cgroups.py (no cgroup subtree is delegated to hmtest),
# test_office_listener.py and test_office_canary.py (per-listener uids), test_sandbox_unprivileged.py
# (it drops to a uid itself).
if (($# == 0)); then set -- tests/security/test_sandbox_probes.py tests/security/test_sandbox_layers.py; fi
export HM_SECURITY_UNPRIVILEGED=1
if [[ "$(id -u)" -ne 0 ]]; then
  exec "${pytest_cmd[@]}" "$@"
fi
if ! id -u "$user" >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user"
  echo "test_unprivileged.sh: created user $user"
fi
prefix="$(.venv/bin/python -c 'import os, sys; print(os.path.realpath(sys.base_prefix))')"
# The topmost ancestor of the prefix that others may not search, if any.
closed="$(.venv/bin/python - "$prefix" <<'PY'
import os, stat, sys
from pathlib import Path
path = Path(sys.argv[1])
for d in reversed([path, *path.parents]):
    if not os.stat(d).st_mode & stat.S_IXOTH:
        print(d)
        break
PY
)"
home="$(mktemp -d /tmp/hm-unprivileged-home-XXXXXX)"
chown "$user" "$home"
trap 'rm -rf "$home"' EXIT
run=(runuser -u "$user" -- env HOME="$home" PATH="$PATH" "${pytest_cmd[@]}" "$@")
if [[ -z "$closed" ]]; then
  "${run[@]}"
  exit
fi
keep="$(mktemp -d /tmp/hm-unprivileged-prefix-XXXXXX)"
trap 'rm -rf "$home"; rmdir "$keep" 2>/dev/null || true' EXIT
echo "test_unprivileged.sh: $closed is closed to others: covered in a private mount namespace, $prefix bound back"
unshare --mount --propagation private -- bash -euc '
  mount --bind "$1" "$2"
  mount -t tmpfs -o mode=0711,size=64k tmpfs "$3"
  mkdir -p "$1"
  mount --bind "$2" "$1"
  umount "$2"
  shift 3
  exec "$@"
' bash "$prefix" "$keep" "$closed" "${run[@]}"
