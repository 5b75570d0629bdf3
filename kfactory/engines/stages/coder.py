"""The coder's stage for an engine design: the point's design rendered as the engine's C source, with the
searched kernels it links (taken from memory by the candidate ids the design names), as one source bundle
(kfactory/engines/stages/bundle.py)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from kfactory.engines.build import FLAGS
from kfactory.engines.codegen import CodegenError, generate
from kfactory.engines.ops import OpKernelError, by_id, units_for
from kfactory.engines.stages.bundle import EngineSource
from kfactory.engines.problem import ENTRY, EngineProblem
from kfactory.models.gguf_model import LlamaConfig
from kfactory.problems import ProblemError


@functools.lru_cache(maxsize=8)
def model_config(model: str, data_dir: str) -> LlamaConfig:
    """The architecture of a model (its weights file opened once per process: the real model's sha256 takes a
    moment)."""
    from kfactory.models import load_model
    return load_model(model).open(Path(data_dir) / "models").config


def render(problem: EngineProblem, params_json: str, settings) -> tuple[str, str, str, str, int, str]:
    """(source bundle, language, flags, entry, threads, launch rule "") of the design a point names, as the
    coder's template path returns them. ProblemError for a point that is not a design of the problem; a design
    the generator cannot serve, or whose searched kernel memory cannot give (not there, not verified, flags or
    source refused by the cpu target's rules), is a ProblemError saying "codegen failed" (the coder rejects both
    as INVALID_POINT), as the local campaign records such a design. It reads memory: call it off the event loop."""
    design = problem.family().design(json.loads(params_json))
    try:
        source = generate(design, model_config(problem.model, str(settings.data_dir)))
        kernels = {op: by_id(settings, op, cid) for op, cid in design.searched_kernels().items()}
        units_for(design, kernels)   # checked here too: a kernel the compiler would refuse never gets a candidate
    except (CodegenError, OpKernelError) as e:
        raise ProblemError(f"codegen failed for {design.design_id()}: {e}") from e
    # the flags are informative (the candidate names how it is built); kfactory.engines.build applies its own
    return EngineSource(source, kernels).pack(), "c", " ".join(FLAGS), ENTRY, design.threads, ""
