"""The baselines by name, and the line a child prints its result on (shared by the child and its parent, so
that importing the package never imports the child module it runs with `python -m`)."""
from __future__ import annotations

#: prefix of the one stdout line that carries a child's JSON result (an engine may print lines of its own)
MARKER = "KFACTORY_BASELINE "
#: baseline name -> module (each has NAME, DEFAULT_STEPS and load(model_name, threads) -> Engine)
MODULES = {"numpy-ref": "kfactory.engines.baselines.numpy_ref",
           "torch-eager": "kfactory.engines.baselines.torch_eager",
           "llama-cpp": "kfactory.engines.baselines.llamacpp"}
