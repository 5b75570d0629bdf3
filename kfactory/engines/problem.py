"""An engine campaign's problem: `load_problem("engine:<model>")`, so the planner, the strategies, memory and the
CLI treat an engine of a model as they treat a kernel problem.

The kernel pipeline's unit of work is a problem with families of design points. An engine campaign searches
`kfactory.engines.design.space()` for one model, so its problem has one family, `engine`, whose points are the
designs (their fields as params, the default design first: `campaign.order`), and `kind = "engine"`: the coder,
compiler, verifier and benchmarker hand such a candidate to `kfactory.engines.stages` instead of the kernel
judge. Its spec describes the engine for the parts of the platform that read one (names, the ABI, the
optimisation shape: decode at context 128); nothing draws inputs from it or runs a kernel reference on it.

Searched op kernels (kfactory/engines/ops.py) join through the locator: `engine:<model>?matvec_q4_1=<candidate
id>&matvec_q8_0=<candidate id>` adds every design that can link them with each set of them, as the local
campaign does (`order.with_kernels`). The problem's name stays `engine_<model>` (memory ranks every engine
of a model together); the coder takes each kernel's verified source from memory by its candidate id.
"""
from __future__ import annotations

import json
import math
import random
import re
from functools import cached_property
from pathlib import Path
from typing import Any

from kfactory.engines.design import KERNEL_FIELDS, DesignError, EngineDesign, prefer_calm, space
from kfactory.engines.order import order, with_kernels
from kfactory.problems.package import Family, NoSuchProblem, Problem, ProblemError
from kfactory.problems.spec import FamilySpec, ProblemSpec

PREFIX = "engine:"
FAMILY = "engine"
#: the design fields a search walks first after the searched kernels (engine_family): the threads and how they
#: wait, then the Q4_1 decode kernel (x1.22 decode on a Zen 4; last in the field order, a budget of 16 did not
#: reach it behind op_threads' 7 choices)
SEARCH_FIRST = ("threads", "wait", "spin", "q4_decode")
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

    def __init__(self, spec: ProblemSpec, directory: Path, model: str, family: EngineFamily,
                 kernel_ids: dict[str, str] | None = None):
        super().__init__(spec, directory, {FAMILY: family})
        self.model = model
        #: {op problem: candidate id} of the searched kernels the locator names (their designs are in the family)
        self.kernel_ids = dict(kernel_ids or {})

    @cached_property
    def reference(self) -> Any:
        raise ProblemError(f"{self.name}: an engine is verified against the model's float64 reference by "
                           "kfactory.engines.verify, not by a kernel reference")

    def checks_itself(self) -> list[str] | None:
        """An engine problem is fit to run when its model package loads (done when it was made): no kernel
        reference to run, no template to render."""
        return []

    def winner(self, measured: list) -> Any:
        """The local campaign's rule (prefer_calm, as its best_of), on tok/s from the scores (seconds a decoded
        token), so the services name the winner best.json names."""
        return prefer_calm(measured, _rate, _spins)

    def family(self) -> EngineFamily:
        fam = self.families[FAMILY]
        assert isinstance(fam, EngineFamily)
        return fam


def _rate(measured: Any) -> tuple[float]:
    """A Measured event's decode tok/s (its score is seconds a token; a zero score ranks first, as the lowest
    score does everywhere else)."""
    return (1.0 / measured.score_s if measured.score_s > 0 else math.inf,)


def _spins(measured: Any) -> bool:
    """Whether a Measured event's candidate is a design whose idle threads spin (params_json's `spin`)."""
    try:
        return bool(json.loads(measured.candidate.params_json or "{}").get("spin"))
    except (ValueError, AttributeError):   # not a JSON object: no design, so nothing that spins
        return False


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


def locator(model: str, kernel_ids: dict[str, str] | None = None) -> str:
    """The problem locator of a model's engine, with the searched kernels ({op problem: candidate id}) its
    campaign links in: `engine:tiny-llama`, `engine:tiny-llama?matvec_q4_1=<id>`."""
    query = "&".join(f"{p}={cid}" for p, cid in sorted((kernel_ids or {}).items()))
    return PREFIX + model + (f"?{query}" if query else "")


def parse_locator(text: str) -> tuple[str, dict[str, str]]:
    """(model, {op problem: candidate id}) of a locator made by `locator`; ProblemError naming the fault."""
    body = text[len(PREFIX):] if text.startswith(PREFIX) else text
    model, _, query = body.partition("?")
    if not model:
        raise ProblemError("engine: name a model, as engine:smollm2-135m (or engine:<model package directory>)")
    kernel_ids: dict[str, str] = {}
    for item in filter(None, query.split("&")):
        name, eq, cid = item.partition("=")
        if not eq or name not in KERNEL_FIELDS or name in kernel_ids:
            raise ProblemError(f"engine: {item!r} in {text!r} is not one searched kernel as <op>=<candidate id>; "
                               f"ops: {', '.join(KERNEL_FIELDS)}")
        kernel_ids[name] = cid
    return model, kernel_ids


def load_engine_problem(text: str) -> EngineProblem:
    """`engine:<model>[?<op>=<candidate id>&...]` (a built-in model name or a model package directory, and the
    searched kernels its designs may link) -> its engine problem; ProblemError naming what to fix when the model
    does not load or a kernel id is no candidate id."""
    from kfactory.models import ModelError, load_model
    from kfactory.models.errors import NoSuchModel

    model, kernel_ids = parse_locator(text)
    try:
        package = load_model(model)
    except NoSuchModel as e:   # a mistyped name, as a problem's
        raise NoSuchProblem(f"engine: {e}") from e
    except ModelError as e:
        raise ProblemError(f"engine: {e}") from e
    try:
        designs = with_kernels(order(space()), kernel_ids)
    except DesignError as e:
        raise ProblemError(f"engine: {e}") from e
    family = engine_family(designs, Path(package.directory))
    name = problem_name(package.name)
    return EngineProblem(_spec(name, package.name, family.spec.params), Path(package.directory), model, family,
                         kernel_ids)


def engine_family(designs: list[EngineDesign], directory: Path) -> EngineFamily:
    """The family whose points are `designs` (in that order), for the services' problem and the local campaign
    alike. Its params list the searched-kernel fields first, then SEARCH_FIRST: a strategy that walks the params
    in order (descent) then tries each searched kernel against the engine's own right after the default, then
    more threads, sleeping, spinning a while and spinning (on a multi-core host the largest change: 2 threads
    with a bounded wait measured decode x1.8 and prefill x1.8 against the default's one thread on smollm2, while
    with the field order a budget under 10 never tried a waiting policy other than sleeping, which measured x0.76
    of one thread there), then the other Q4_1 decode kernel where the host has AVX-512."""
    params: dict[str, list] = {k: [] for k in (*KERNEL_FIELDS, *SEARCH_FIRST)}
    for d in designs:
        for k, v in d.as_dict().items():
            if v not in params.setdefault(k, []):
                params[k].append(v)
    fspec = FamilySpec(name=FAMILY, target="cpu", language="c", template="(generated: kfactory.engines.codegen)",
                       entry=ENTRY, params=params)
    return EngineFamily(fspec, directory, designs)
