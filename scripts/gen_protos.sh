#!/usr/bin/env bash
# Generates the Python stubs of every proto under proto/ into hypermedia/api/ (the wire packages
# stay hypermedia.<area>.v1; the Python modules are hypermedia.api.<area>.v1.*_pb2*.py and .pyi).
# protoc writes hypermedia/<area>/v1/ into a scratch tree; this moves it under api/ and rewrites the
# stubs' imports of each other. Pinned: grpcio-tools and mypy-protobuf from uv.lock. `make proto`
# runs it; `make lint` runs it into a temporary tree and fails on drift.
set -euo pipefail
out="${1:-.}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mapfile -t files < <(cd proto && find hypermedia -name '*.proto' | sort)
PATH="$root/.venv/bin:$PATH" .venv/bin/python -m grpc_tools.protoc -Iproto \
  --python_out="$scratch" --grpc_python_out="$scratch" --mypy_out="$scratch" \
  "${files[@]}"
mkdir -p "$out/hypermedia/api"
test -e "$out/hypermedia/api/__init__.py" || touch "$out/hypermedia/api/__init__.py"
# KEDA's External Scaler contract (proto/externalscaler, its own package) goes to hypermedia/api/keda.
PATH="$root/.venv/bin:$PATH" .venv/bin/python -m grpc_tools.protoc -Iproto \
  --python_out="$scratch" --grpc_python_out="$scratch" --mypy_out="$scratch" \
  externalscaler/externalscaler.proto
mkdir -p "$out/hypermedia/api/keda"
touch "$out/hypermedia/api/keda/__init__.py"
for f in "$scratch/externalscaler/"*; do
  sed -E 's/^from externalscaler import/from hypermedia.api.keda import/' "$f" > "$out/hypermedia/api/keda/$(basename "$f")"
done
for area in $(cd "$scratch/hypermedia" && find . -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort); do
  mkdir -p "$out/hypermedia/api/$area/v1"
  touch "$out/hypermedia/api/$area/__init__.py" "$out/hypermedia/api/$area/v1/__init__.py"
  for f in "$scratch/hypermedia/$area/v1/"*; do
    sed -E 's/^(from|import) hypermedia\.([a-z_]+)\.v1/\1 hypermedia.api.\2.v1/' "$f" \
      > "$out/hypermedia/api/$area/v1/$(basename "$f")"
  done
done
