#!/usr/bin/env bash
# Everything a GPU run needs, made on the CPU machine so that the device's minutes go to measuring:
#   1. the wheels the device image lacks, into .whl/ (scripts/gpu_wheels.sh; --dry-run checks them first)
#   2. the cuda cubins of the problems gpu_check.sh runs, for the GPU's architecture (KF_ARCH, default sm_90a:
#      the H200), into .precompiled/<problem>-<arch>/ (kfactory precompile; the best points of the committed
#      evidence/ first, then a spread over each family, at most KF_PRECOMPILE_LIMIT per problem, default 150:
#      every point of KDA's two cuda families, a sample of softmax's 6237 and RMSNorm's 732; about 15 minutes on
#      2 cores, KDA's chunked kernels taking 15-25 s each).
# Then one device call runs the whole check: command `bash scripts/gpu_check.sh`, carry [".whl", ".precompiled"]
# (both ignored by git, about 25 and 25 MB; the device takes 64 MiB with the working tree).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/gpu_wheels.sh "$@"
ARCH=${KF_ARCH:-sm_90a}
LIMIT=${KF_PRECOMPILE_LIMIT:-150}
WS=$(mktemp -d /tmp/kf-prepare.XXXXXX)
trap 'rm -rf "$WS"' EXIT
for f in evidence/*.json.gz; do
  [ -f "$f" ] && KFACTORY_DATA_DIR=$WS python3 -m kfactory.cli.main evidence import "$f"
done
rm -rf .precompiled
for p in ${KF_PRECOMPILE_PROBLEMS:-softmax rmsnorm kda_bf16}; do
  KFACTORY_DATA_DIR=$WS python3 -m kfactory.cli.main precompile "$p" --target "cuda:$ARCH" --limit "$LIMIT" \
    --out ".precompiled/$p-$ARCH"
done
du -sh .whl .precompiled
