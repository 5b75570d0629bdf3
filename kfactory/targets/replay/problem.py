"""A problem synthesized from a recorded space: `load_problem("replay:<cache path>")`.

The pipeline needs a problem to verify and time against; a replayed kernel has no real outputs, so the
synthesized problem is trivially verifiable: one tiny input x, one output y whose reference is x itself.
The replay session answers with the reference for recorded-good configurations and fails the ones the
recording says failed. Its only family is the space's "recorded" family.
"""
from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path

import numpy as np

from kfactory.problems.package import NoSuchProblem, Problem, ProblemError
from kfactory.problems.spec import ProblemSpec
from kfactory.targets.replay.cache import FAMILY_NAME, RecordedSpace, load_space

PREFIX = "replay:"


class _Reference:
    """What reference.py gives a real problem: reference(inputs) in float64, and no baselines."""

    @staticmethod
    def reference(inputs: dict) -> dict:
        return {"y": np.asarray(inputs["x"]).astype(np.float64)}

    @staticmethod
    def baselines() -> dict:
        return {}


class ReplayProblem(Problem):
    """A Problem whose reference module is in memory (no reference.py) and which knows its recorded space."""

    @property
    def reference_in_package(self) -> bool:
        """Never: the reference is kfactory's own (the recorded space's), checked in process."""
        return False

    def __init__(self, spec: ProblemSpec, directory: Path, space: RecordedSpace):
        super().__init__(spec, directory, {FAMILY_NAME: space.family()})
        self.space = space

    @cached_property
    def reference(self):
        return _Reference()


def problem_name(stem: str) -> str:
    """convolution_milo-A100 -> convolution_milo: the kernel, not the device, names the problem, so evidence
    from one device's campaigns is found (as priors) by campaigns of the same kernel on another."""
    kernel = stem.rsplit("-", 1)[0] if "-" in stem else stem
    name = re.sub(r"[^a-z0-9_]", "_", kernel.replace("-", "_").lower())
    return name if re.match(r"^[a-z]", name) else "replay_" + name


def spec_for(space: RecordedSpace) -> ProblemSpec:
    return ProblemSpec(
        name=problem_name(space.name),
        description=f"replayed: {space.kernel_name or 'a kernel'} on {space.device_name}, from the recorded tuning "
                    f"space {space.name} ({len(space.records)} configurations); times are the recorded ones",
        symbols=["n"],
        inputs=[{"name": "x", "dtype": "float32", "shape": ["n"]}],
        outputs=[{"name": "y", "dtype": "float32", "shape": ["n"]}],
        shapes={"optimize": [{"n": 8}]},
        distributions={"normal": {"x": {"kind": "normal"}}},
        tolerance={"float32": {"atol": 1e-6, "rtol": 1e-6, "norm_rel": 1e-6}},
        cost={"bytes": "0", "flops": "0"},
        baselines=[],
        abi={"replay": {"signature": "recorded configuration (no kernel runs)", "args": ["x", "y", "n"],
                        "notes": "replayed from a Kernel Tuner cache file"}},
    )


def load_replay_problem(locator: str) -> ReplayProblem:
    """`replay:<path to a Kernel Tuner cache file>` -> the synthesized problem (ProblemError on a bad path or
    file; the message says what is wrong)."""
    path = locator[len(PREFIX):] if locator.startswith(PREFIX) else locator
    if not path:
        raise ProblemError("replay: give the path of a Kernel Tuner cache file, as replay:<path>.json.gz")
    if not Path(path).expanduser().exists():   # a mistyped path, as a problem's mistyped name
        raise NoSuchProblem(f"replay: no such file {path!r}: give the path of a Kernel Tuner cache file, as "
                            "replay:<path>.json.gz")
    try:
        space = load_space(path)
    except ValueError as e:
        raise ProblemError(f"replay: {e}") from e
    return ReplayProblem(spec_for(space), Path(space.path or path).parent, space)  # loaded from `path`: set
