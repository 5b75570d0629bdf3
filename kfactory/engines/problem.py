"""An engine campaign's problem: `load_problem("engine:<model>")`, so the planner, the strategies, memory and the
CLI treat an engine of a model as they treat a kernel problem.

The kernel pipeline's unit of work is a problem with families of design points. An engine campaign searches
`kfactory.engines.design.space()` for one model, so its problem has one family, `engine`, whose points are the
designs (their fields as params, the default design first: `campaign.order`), and `kind = "engine"`: the coder,
compiler, verifier and benchmarker hand such a candidate to `kfactory.engines.stages` instead of the kernel
judge. Its spec describes the engine for the parts of the platform that read one (names, the ABI, the
optimisation shape: decode at context 128); nothing draws inputs from it or runs a kernel reference on it.
"""
from __future__ import annotations

import random
import re
from functools import cached_property
from pathlib import Path
from typing import Any

from kfactory.engines.design import DesignError, EngineDesign, space
from kfactory.engines.order import order
from kfactory.problems.package import Family, Problem, ProblemError
from kfactory.problems.spec import FamilySpec, ProblemSpec

PREFIX = "engine:"
FAMILY = "engine"
#: the benchmark's context (the campaign's CONTEXT): the optimisation shape every engine is scored at
CONTEXT = 128
#: the ABI's entry point a candidate names (docs/engines.md, "The ABI")
ENTRY = "kf_prefill"


class EngineFamily(Family):
    """The designs of `space()` (this host's cores at most), in campaign order: params are the design's fields."""

    def __init__(self, spec: FamilySpec, directory: Path, designs: list[EngineDesign]):
        super().__init__(spec, directory)
        self.designs = designs
        self._keys = {self._key(d.as_dict()) for d in designs}

    @staticmethod
    def _key(params: dict) -> tuple:
        return tuple(sorted(params.items()))

    def valid(self, params: dict) -> bool:
        return set(params) == set(self.spec.params) and self._key(params) in self._keys

    def points(self) -> list[dict]:
        return [d.as_dict() for d in self.designs]

    def first_point(self) -> dict | None:
        return self.designs[0].as_dict() if self.designs else None

    def _valid_points(self):
        return iter(self.points())

    def random_point(self, rng: random.Random, tries: int = 1000) -> dict:
        return rng.choice(self.designs).as_dict()

    def render(self, params: dict) -> tuple[str, str, int]:
        # an engine's source needs the model's config: the coder renders it (kfactory.engines.stages.coder)
        raise ProblemError("an engine design is rendered by kfactory.engines.stages.coder, not by a template")

    def threads_at(self, params: dict) -> int:
        return int(params["threads"])

    def launch_rule(self, params: dict) -> dict | None:
        return None

    def design(self, params: dict) -> EngineDesign:
        """The design a point names; ProblemError when it is not one of this family's."""
        if not isinstance(params, dict):
            raise ProblemError(f"family {FAMILY}: a design is a JSON object of its fields, not {params!r:.80}")
        try:
            design = EngineDesign.from_dict(params)
        except (DesignError, TypeError) as e:
            raise ProblemError(f"family {FAMILY}: {e}") from e
        if not self.valid(design.as_dict()):
            raise ProblemError(f"family {FAMILY}: {design.design_id()} is not a point of this host's design space")
        return design


class EngineProblem(Problem):
    """The engine of one model as a problem (see the module docstring); `model` is the locator after the prefix."""
    kind = "engine"

    def __init__(self, spec: ProblemSpec, directory: Path, model: str, family: EngineFamily):
        super().__init__(spec, directory, {FAMILY: family})
        self.model = model

    @cached_property
    def reference(self) -> Any:
        raise ProblemError(f"{self.name}: an engine is verified against the model's float64 reference by "
                           "kfactory.engines.verify, not by a kernel reference")

    def checks_itself(self) -> list[str] | None:
        """An engine problem is fit to run when its model package loads (done when it was made): no kernel
        reference to run, no template to render."""
        return []

    def family(self) -> EngineFamily:
        fam = self.families[FAMILY]
        assert isinstance(fam, EngineFamily)
        return fam


def problem_name(model_name: str) -> str:
    """smollm2-135m -> engine_smollm2_135m (a problem name is lower case, digits and '_')."""
    return "engine_" + re.sub(r"[^a-z0-9_]", "_", model_name.lower())


def _spec(name: str, model_name: str, params: dict[str, list]) -> ProblemSpec:
    return ProblemSpec.model_validate({
        "name": name,
        "description": f"the inference engine of {model_name}: one generated C library (prefill and decode_step) "
                       "per design; verified token for token against the float64 reference, scored by the "
                       f"seconds per decoded token at context {CONTEXT}",
        "symbols": ["context"],
        "inputs": [{"name": "tokens", "dtype": "int32", "shape": ["context"]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["context"]}],
        "shapes": {"optimize": [{"context": CONTEXT}]},
        "distributions": {"prompts": {"tokens": {"kind": "constant"}}},
        "tolerance": {"float32": {"atol": 0.0, "rtol": 0.0, "norm_rel": 1e-4}},
        "cost": {"bytes": "0", "flops": "0"},
        "abi": {"cpu": {"signature": "kf_engine_new, kf_prefill, kf_decode_step, ... (ABI v1, docs/engines.md)",
                        "args": ["tokens", "logits", "context"]}},
        "families": [FAMILY]})


def load_engine_problem(locator: str) -> EngineProblem:
    """`engine:<model>` (a built-in model name or a model package directory) -> its engine problem; ProblemError
    naming what to fix when the model does not load."""
    from kfactory.models import ModelError, load_model

    model = locator[len(PREFIX):] if locator.startswith(PREFIX) else locator
    if not model:
        raise ProblemError("engine: name a model, as engine:smollm2-135m (or engine:<model package directory>)")
    try:
        package = load_model(model)
    except ModelError as e:
        raise ProblemError(f"engine: {e}") from e
    designs = order(space())
    params: dict[str, list] = {}
    for d in designs:
        for k, v in d.as_dict().items():
            if v not in params.setdefault(k, []):
                params[k].append(v)
    fspec = FamilySpec(name=FAMILY, target="cpu", language="c", template="(generated: kfactory.engines.codegen)",
                       entry=ENTRY, params=params)
    name = problem_name(package.name)
    return EngineProblem(_spec(name, package.name, params), Path(package.directory), model,
                         EngineFamily(fspec, Path(package.directory), designs))
