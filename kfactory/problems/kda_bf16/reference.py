"""kda_bf16: the kda problem with bf16 activations (q, k, v, beta in, o out), fp32 gate, initial and final
state. The float64 reference and the GPU baselines are kda's (reference.py beside the kda package), loaded
from the built-in kda package (also when this package is copied elsewhere) so that the two cannot drift apart:
bf16 values are exact in float64, and FLA's kernels and the torch fallback write o in its bf16 dtype through
copy_."""
from __future__ import annotations

from kfactory.problems import BUILTIN_DIR
from kfactory.problems.package import import_file

_kda = import_file("kfactory_problem_kda_shared", BUILTIN_DIR / "kda" / "reference.py")

EPS = _kda.EPS
recurrence = _kda.recurrence
reference = _kda.reference
cuda_baselines = _kda.cuda_baselines


def baselines() -> dict:
    """No cpu baselines: kda_bf16 is a cuda problem (the cpu kernels are kda's, in fp32)."""
    return {}
