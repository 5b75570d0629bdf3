"""The coder's stage for an engine design: the point's design rendered as the engine's one C source."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from kfactory.engines.build import FLAGS
from kfactory.engines.codegen import CodegenError, generate
from kfactory.engines.problem import ENTRY, EngineProblem
from kfactory.models.gguf_model import LlamaConfig
from kfactory.problems import ProblemError


@functools.lru_cache(maxsize=8)
def model_config(model: str, data_dir: str) -> LlamaConfig:
    """The architecture of a model (its weights file opened once per process: the real model's sha256 takes a
    moment)."""
    from kfactory.models import load_model
    return load_model(model).open(Path(data_dir) / "models").config


def render(problem: EngineProblem, params_json: str,
           data_dir: str | Path) -> tuple[str, str, str, str, int, str]:
    """(source, language, flags, entry, threads, launch rule "") of the design a point names, as the coder's
    template path returns them. ProblemError for a point that is not a design of the problem; a design the
    generator cannot serve is a ProblemError saying "codegen failed" (the coder rejects both as INVALID_POINT)."""
    design = problem.family().design(json.loads(params_json))
    try:
        source = generate(design, model_config(problem.model, str(data_dir)))
    except CodegenError as e:
        raise ProblemError(f"codegen failed for {design.design_id()}: {e}") from e
    # the flags are informative (the candidate names how it is built); kfactory.engines.build applies its own
    return source, "c", " ".join(FLAGS), ENTRY, design.threads, ""
