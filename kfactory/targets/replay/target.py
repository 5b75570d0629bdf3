"""The replay target: serves the recorded result of every configuration of a real GPU kernel.

`replay:<path to a Kernel Tuner cache file>`. No kernel runs: the "source" of a candidate is the canonical
params JSON the recorded family rendered; compiling looks the configuration up (a recorded compile failure
is a COMPILE_ERROR, a configuration never recorded or breaking a constraint an INVALID_POINT) and reports the
recorded compile time; a session answers verification with the reference for configurations that ran and
crashes (CRASHED) those the recording says failed at run time; timing returns the recorded samples.
Everything it produces says "replayed": the device model, the compiler, the timing mode, the messages.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from kfactory.targets.replay.cache import RecordedSpace, load_space
from kfactory.sandbox.parent import RunnerCrashed
from kfactory.targets.base import BenchResult, CallResult, CompileResult, Session, Target
from kfactory.v1 import events_pb2 as pb

COMPILER = "replay (replayed from a recorded tuning space)"
MODE = "replayed"


class ReplayTarget(Target):
    name = "replay"
    languages = ("replay",)
    exclusive_verify = False
    screens_first = False

    def __init__(self, path: Path, space: RecordedSpace, settings=None):
        self.path, self.space, self.settings = path, space, settings

    def device(self) -> pb.DeviceInfo:
        return pb.DeviceInfo(target="replay", model=f"{self.space.device_name} (replayed)",
                             device_id="replay-" + self.space.name, threads=1)

    def cache_bytes(self) -> int:
        return 0  # nothing runs: the smallest rotating pool will do

    def params_of(self, source: str) -> dict:
        """The params a candidate's source (the family's canonical JSON) names; ValueError when it is not that."""
        try:
            params = json.loads(source)
        except json.JSONDecodeError as e:
            raise ValueError(f"the replay target's source is a configuration as JSON, not {source[:80]!r}") from e
        if not isinstance(params, dict):
            raise ValueError(f"the replay target's source is a JSON object of parameters, not {source[:80]!r}")
        return params

    def compile(self, source: str, language: str, flags: str, entry: str) -> CompileResult:
        report = pb.CompileReport(compiler=COMPILER)
        if language != "replay":
            return CompileResult(False, report, reason=pb.COMPILE_ERROR,
                                 message=f"replayed: the replay target serves the 'recorded' family (language "
                                         f"'replay'), not {language!r} sources")
        try:
            params = self.params_of(source)
        except ValueError as e:
            return CompileResult(False, report, reason=pb.INVALID_POINT, message=f"replayed: {e}")
        if not self.space.valid(params):
            return CompileResult(False, report, reason=pb.INVALID_POINT,
                                 message=f"replayed: {params} is not a valid configuration of {self.space.name} "
                                         f"(a value outside tune_params, or a constraint is false)")
        rec = self.space.lookup(params)
        if rec is None:
            return CompileResult(False, report, reason=pb.INVALID_POINT,
                                 message=f"replayed: {self.space.name} has no record of {params}")
        report.seconds = rec.compile_ms / 1000.0
        self._pace(report.seconds)
        if rec.failure == "CompilationFailedConfig":
            return CompileResult(False, report, reason=pb.COMPILE_ERROR, message="replayed: CompilationFailedConfig",
                                 log="replayed: the recording says this configuration failed to compile")
        if rec.failure == "InvalidConfig":
            return CompileResult(False, report, reason=pb.INVALID_POINT, message="replayed: InvalidConfig")
        artifact = self.space.canonical(params).encode()
        report.artifact_bytes = len(artifact)
        return CompileResult(True, report, artifact=artifact)

    def _pace(self, recorded_s: float) -> None:
        """Take the recorded time times settings.replay_pace (0: answer at once), so a replayed cluster can
        run in (scaled) real time and work is in flight for as long as it was on the recorded device."""
        pace = getattr(self.settings, "replay_pace", 0.0) if self.settings is not None else 0.0
        if pace > 0 and recorded_s > 0:
            time.sleep(recorded_s * pace)

    def session(self, problem, threads: int) -> "ReplaySession":
        return ReplaySession(self, problem)


class ReplaySession(Session):
    """Answers calls from the recording; runs nothing."""

    def __init__(self, target: ReplayTarget, problem):
        self.target, self.problem = target, problem
        self.loaded: dict[str, dict] = {}

    def load_artifact(self, key: str, artifact: bytes, entry: str, launch: dict | None = None) -> None:
        self.loaded[key] = self.target.params_of(artifact.decode())

    def load_baseline(self, key: str, name: str) -> None:
        raise RunnerCrashed(f"replayed: the replay target has no baselines (asked for {name!r})")

    def _record(self, key: str):
        rec = self.target.space.lookup(self.loaded[key])
        if rec is None:
            raise RunnerCrashed(f"replayed: {self.target.space.name} has no record of {self.loaded[key]}")
        if rec.failure is not None or rec.time_ms is None:
            raise RunnerCrashed(f"replayed: {rec.failure or 'no recorded time'}")
        return rec

    def _outputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ref = self.problem.reference.reference(inputs, **self.problem.params)
        return {t.name: np.asarray(ref[t.name]).astype(t.dtype) for t in self.problem.spec.outputs}

    def call(self, key: str, shape: dict[str, int], inputs: dict[str, np.ndarray]) -> CallResult:
        rec = self._record(key)
        return CallResult(self._outputs(inputs), rec.time_ms / 1000.0)

    def call_sequence(self, key, shape, steps) -> list[CallResult]:
        return [self.call(key, shape, x) for x in steps]

    def bench(self, keys, shape, input_sets, *, min_samples, min_s, max_s, noise, warmup_s,
              precision=0.0) -> BenchResult:
        samples, outputs = {}, {}
        for k in keys:
            rec = self._record(k)
            self.target._pace(rec.benchmark_ms / 1000.0)
            samples[k] = [t / 1000.0 for t in (rec.times_ms or (rec.time_ms,))]
            outputs[k] = [self._outputs(x) for x in input_sets]
        return BenchResult(samples, outputs, mode=MODE)

    def close(self) -> None:
        self.loaded.clear()


def make(option: str, settings) -> ReplayTarget:
    if not option:
        raise ValueError("the replay target needs a recorded space: replay:<path to a Kernel Tuner cache file "
                         "(*.json.gz)>")
    path = Path(option).expanduser()
    try:
        space = load_space(path)
    except ValueError as e:
        raise ValueError(f"replay:{option}: {e}") from e
    return ReplayTarget(path, space, settings)
