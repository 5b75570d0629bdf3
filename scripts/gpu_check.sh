#!/usr/bin/env bash
# The single prepared GPU-side check (see scripts/gpu_check.py): installs what the GPU host lacks from the
# wheels in .whl/ (nothing can be downloaded there; scripts/gpu_wheels.sh fetches them), runs the GPU tests
# when KF_GPU_TESTS=1, then softmax and RMSNorm campaigns on the cuda target through the real services
# (KF_GPU_BUDGET candidates each, default 12) and prints the table. Results go to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SITE=${KF_SITE:-/tmp/kf-site}
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
fi
# kfactory itself, so that kfactory.services resolves (package-dir mapping), without touching the network
$PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" . >/dev/null || exit 1
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
cd /tmp  # import kfactory from $SITE, not from the checkout
df -h /dev/shm /tmp | tail -2
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
OUTDIR=${OUT:-/tmp/kf-out}; mkdir -p "$OUTDIR"
[ "${KF_GPU_TESTS:-0}" = 1 ] && timeout "${KF_GPU_TEST_S:-150}" $PY -m pytest -q -p no:cacheprovider -x --timeout 120 -m gpu \
  "$OLDPWD/tests/test_cuda_runtime.py" 2>&1 | tail -25 | tee "$OUTDIR/gpu_tests.log"
# the defaults keep the whole script under one 10-minute device command: 330 s here, 220 s for KDA below
timeout "${KF_GPU_CHECK_S:-330}" $PY "$OLDPWD/scripts/gpu_check.py"; rc=$?
# KDA (KF_GPU_KDA=0 skips it, e.g. when the device time left does not cover both): a campaign of the recurrent
# family on GPU-sized shapes and one of the chunked family on a prefill, the chunked point verified against
# float64, then both against FLA at the public shapes (gpu_check_kda.py keeps inside KF_GPU_KDA_S itself)
if [ "${KF_GPU_KDA:-1}" = 1 ]; then
  timeout "${KF_GPU_KDA_S:-220}" $PY "$OLDPWD/scripts/gpu_check_kda.py" || rc=1
fi
exit $rc
