#!/usr/bin/env bash
# Generates the Python stubs of every proto under proto/ into the hypermedia package
# (hypermedia/<area>/v1/*_pb2.py, *_pb2_grpc.py, *.pyi). Pinned: grpcio-tools and mypy-protobuf
# from uv.lock. `make proto` runs it; `make lint` runs it into a temporary tree and fails on drift.
set -euo pipefail
out="${1:-.}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
mapfile -t files < <(cd proto && find hypermedia -name '*.proto' | sort)
PATH="$root/.venv/bin:$PATH" .venv/bin/python -m grpc_tools.protoc -Iproto \
  --python_out="$out" --grpc_python_out="$out" --mypy_out="$out" \
  "${files[@]}"
for d in $(cd proto && find hypermedia -mindepth 1 -type d); do
  touch "$out/$d/__init__.py"
done
