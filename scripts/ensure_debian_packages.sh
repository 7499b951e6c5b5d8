#!/usr/bin/env bash
# Install the Debian packages named as arguments that are not installed yet.
#
#   scripts/ensure_debian_packages.sh clamav-daemon [PACKAGE ...]
#
# - Already installed (dpkg says "install ok installed"): nothing happens.
# - Missing and running as root: `apt-get install -y --no-install-recommends`, after an
#   `apt-get update` when the package lists do not know a package yet. While it installs, a
#   temporary /usr/sbin/policy-rc.d (unless one exists) keeps the packages' own services, such as
#   clamd and freshclam, from being started: tests start the daemons they need themselves.
# - Missing and not root: a message naming the packages and the command to run, and exit 0, so a
#   build on a machine without root goes on (the tests that need a package say so themselves).
#
# Exit codes: 0 installed or nothing to do (or not root), 1 apt-get failed, 2 usage.
set -euo pipefail

if (($# == 0)); then
  echo "usage: $0 PACKAGE [PACKAGE ...]" >&2
  exit 2
fi

missing=()
for package in "$@"; do
  status="$(dpkg-query --show --showformat='${Status}' "$package" 2>/dev/null || true)"
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

if ((EUID != 0)); then
  echo "ensure_debian_packages: not installed: ${missing[*]}." >&2
  echo "ensure_debian_packages: not root, so not installing them; run: sudo $0 ${missing[*]}" >&2
  exit 0
fi

policy=/usr/sbin/policy-rc.d
if [[ ! -e "$policy" ]]; then
  printf '#!/bin/sh\n# written by %s while it installs packages\nexit 101\n' "$0" >"$policy"
  chmod 0755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
echo "ensure_debian_packages: installing ${missing[*]}" >&2
# A fresh machine may have empty package lists: update first when apt does not know a package.
if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then
  apt-get update -qq
fi
apt_install() { apt-get install -y -qq --no-install-recommends "${missing[@]}"; }
# Stale lists name versions the mirror no longer has: update and try once more.
if ! apt_install && ! { apt-get update -qq && apt_install; }; then
  echo "ensure_debian_packages: apt-get install ${missing[*]} failed" >&2
  exit 1
fi
