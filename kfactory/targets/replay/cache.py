"""Reading Kernel Tuner cache files (*.json.gz / *.json) into a RecordedSpace.

Top-level keys of a cache file: device_name, kernel_name, tune_params_keys, tune_params, cache (and others we
ignore). `cache` maps a comma-joined parameter tuple to a record with the parameters, `time` (ms; a string such
as "CompilationFailedConfig" where the configuration failed), `times`, `compile_time`, `benchmark_time`, ...

The constraints come from the hub's T1 file beside the cache: convolution_milo-A100.json.gz ->
convolution_milo.json, ConfigurationSpace.Conditions[*].Expression.
"""
from __future__ import annotations

import functools
import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from kfactory.problems.package import Family, ProblemError, safe_eval
from kfactory.problems.spec import FamilySpec

FAMILY_NAME = "recorded"


@dataclass(frozen=True)
class Record:
    """One recorded configuration."""
    params: dict            # parameter name -> value
    time_ms: float | None   # the objective; None when the configuration failed
    #: "CompilationFailedConfig" | "RuntimeFailedConfig" | "InvalidConfig" | ...; None when it ran
    failure: str | None
    compile_ms: float       # recorded compile_time (0 when absent)
    benchmark_ms: float     # recorded benchmark_time (0 when absent)
    times_ms: tuple = ()    # the individual recorded samples (ms); () when absent

    def __hash__(self) -> int:  # params is a dict; hash what identifies the record
        return hash((tuple(sorted(self.params.items(), key=lambda kv: kv[0])), self.time_ms, self.failure))


class RecordedFamily(Family):
    """The family of a recorded space: no template file; rendering gives the canonical params JSON."""

    def __init__(self, spec: FamilySpec, directory: Path, space: "RecordedSpace"):
        super().__init__(spec, directory)
        self.space = space

    def render(self, params: dict) -> tuple[str, str, int]:
        return self.space.canonical(params), "", 1

    def launch_rule(self, params: dict) -> dict | None:
        return None


@dataclass
class RecordedSpace:
    """A fully measured tuning space."""
    name: str                   # file stem, e.g. "convolution_milo-A100"
    kernel_name: str
    device_name: str
    params: dict[str, list]     # tune_params, in tune_params_keys order
    constraints: list[str]      # Python expressions (T1 Conditions; [] without a T1 file)
    records: dict[tuple, Record]  # key: tuple of values in params order
    path: Path | None = None
    _family: Family | None = field(default=None, repr=False, compare=False)

    def key(self, params: dict) -> tuple:
        return tuple(params.get(k) for k in self.params)

    def canonical(self, params: dict) -> str:
        """The params as JSON in the space's parameter order: what the family renders and the target reads."""
        return json.dumps({k: params[k] for k in self.params}, separators=(",", ":"))

    def lookup(self, params: dict) -> Record | None:
        """The record of a configuration; None when it was never recorded (treat it as invalid)."""
        if set(params) != set(self.params):
            return None
        return self.records.get(self.key(params))

    def valid(self, params: dict) -> bool:
        """True when params gives every parameter one of its values and every constraint holds."""
        if set(params) != set(self.params):
            return False
        if any(params[k] not in vals for k, vals in self.params.items()):
            return False
        return all(bool(safe_eval(c, params)) for c in self.constraints)

    def optimum_ms(self) -> float:
        """The best recorded time (ms)."""
        times = [r.time_ms for r in self.records.values() if r.time_ms is not None]
        if not times:
            raise ValueError(f"recorded space {self.name}: no configuration has a recorded time")
        return min(times)

    def counts(self) -> dict[str, int]:
        """{"ok": n, <failure string>: n, ...}."""
        out: dict[str, int] = {}
        for r in self.records.values():
            k = r.failure or "ok"
            out[k] = out.get(k, 0) + 1
        return out

    def family(self) -> Family:
        """A synthesized family named "recorded" whose params and constraints are the space's."""
        if self._family is None:
            spec = FamilySpec(name=FAMILY_NAME, target="replay", language="replay", template="<recorded>",
                              entry=self.kernel_name or "kernel", params=self.params, constraints=self.constraints)
            directory = self.path.parent if self.path is not None else Path(".")
            self._family = RecordedFamily(spec, directory, self)
        return self._family


def _bad(path: Path, what: str, fix: str) -> ValueError:
    return ValueError(f"{path}: {what}; {fix}")


def _read_json(path: Path) -> object:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt") as f:
                return json.load(f)
        return json.loads(path.read_text())
    except FileNotFoundError as e:
        raise _bad(path, "no such file", "give the path of a Kernel Tuner cache file (*.json.gz or *.json)") from e
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise _bad(path, f"cannot read it ({e})", "give an intact (gzipped) Kernel Tuner cache file") from e
    except json.JSONDecodeError as e:
        raise _bad(path, f"not valid JSON ({e})", "give an intact Kernel Tuner cache file") from e


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _t1_constraints(path: Path, stem: str) -> list[str]:
    """Conditions of the T1 file beside the cache (stem without its "-<device>" suffix); [] when absent."""
    if "-" not in stem:
        return []
    t1 = path.parent / (stem.rsplit("-", 1)[0] + ".json")
    if not t1.exists():
        return []
    data = _read_json(t1)
    try:
        conds = data["ConfigurationSpace"].get("Conditions", []) if isinstance(data, dict) else None
        if not isinstance(conds, list):
            raise TypeError
        out = [c["Expression"] for c in conds]
    except (KeyError, TypeError, AttributeError) as e:
        raise _bad(t1, "ConfigurationSpace.Conditions is not a list of {Expression: ...} objects",
                   "fix the T1 file or remove it (the space then has no constraints)") from e
    if not all(isinstance(e, str) and e.strip() for e in out):
        raise _bad(t1, "a Condition's Expression is not a non-empty string", "fix the T1 file")
    return out


def _num(v, what: str, path: Path) -> float:
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(path, f"{what} is {v!r}, not a finite number", "fix or regenerate the cache file")
    return float(v)


def _parse(path: Path) -> RecordedSpace:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise _bad(path, f"the top level is a {type(data).__name__}, not an object",
                   "give a Kernel Tuner cache file (keys tune_params_keys, tune_params, cache)")
    missing = [k for k in ("tune_params_keys", "tune_params", "cache") if k not in data]
    if missing:
        raise _bad(path, f"missing top-level keys {missing}",
                   "give a Kernel Tuner cache file (keys device_name, kernel_name, tune_params_keys, tune_params, "
                   "cache)")
    keys, tp, cache = data["tune_params_keys"], data["tune_params"], data["cache"]
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise _bad(path, "tune_params_keys is not a non-empty list of names", "fix the cache file")
    if not isinstance(tp, dict) or set(tp) != set(keys):
        raise _bad(path, f"tune_params names {sorted(tp) if isinstance(tp, dict) else tp!r} differ from "
                   f"tune_params_keys {keys}", "make them name the same parameters")
    for k in keys:
        if not isinstance(tp[k], list) or not tp[k]:
            raise _bad(path, f"tune_params[{k!r}] is not a non-empty list of values", "fix the cache file")
    if not isinstance(cache, dict) or not cache:
        raise _bad(path, "cache is empty or not an object", "give a cache file with recorded configurations")
    params = {k: list(tp[k]) for k in keys}
    records: dict[tuple, Record] = {}
    for ckey, rec in cache.items():
        if not isinstance(rec, dict):
            raise _bad(path, f"cache[{ckey!r}] is not an object", "fix or regenerate the cache file")
        absent = [k for k in keys if k not in rec]
        if absent:
            raise _bad(path, f"cache[{ckey!r}] lacks parameters {absent}", "fix or regenerate the cache file")
        p = {k: rec[k] for k in keys}
        off = [k for k in keys if p[k] not in params[k]]
        if off:
            raise _bad(path, f"cache[{ckey!r}]: {off} take values outside tune_params",
                       "fix or regenerate the cache file")
        if "time" not in rec:
            raise _bad(path, f"cache[{ckey!r}] has no 'time'", "fix or regenerate the cache file")
        t = rec["time"]
        if isinstance(t, str):
            time_ms, failure = None, t
        else:
            time_ms, failure = _num(t, f"cache[{ckey!r}].time", path), None
        times = rec.get("times") or ()
        if not isinstance(times, (list, tuple)):
            raise _bad(path, f"cache[{ckey!r}].times is not a list", "fix or regenerate the cache file")
        times_ms = tuple(_num(x, f"cache[{ckey!r}].times", path) for x in times) if failure is None else ()
        records[tuple(p[k] for k in keys)] = Record(
            params=p, time_ms=time_ms, failure=failure,
            compile_ms=_num(rec.get("compile_time"), f"cache[{ckey!r}].compile_time", path),
            benchmark_ms=_num(rec.get("benchmark_time"), f"cache[{ckey!r}].benchmark_time", path),
            times_ms=times_ms)
    stem = _stem(path)
    device = data.get("device_name") or (stem.rsplit("-", 1)[1] if "-" in stem else "unknown device")
    space = RecordedSpace(name=stem, kernel_name=str(data.get("kernel_name") or ""), device_name=str(device),
                          params=params, constraints=_t1_constraints(path, stem), records=records, path=path)
    for c in space.constraints:  # every constraint must evaluate over the space's parameters
        try:
            safe_eval(c, {k: v[0] for k, v in params.items()})
        except ProblemError as e:
            raise _bad(path, f"constraint {c!r} does not evaluate over the parameters {keys}: {e}",
                       "fix the T1 file's Conditions") from e
    return space


@functools.lru_cache(maxsize=16)
def _load(resolved: str) -> RecordedSpace:
    return _parse(Path(resolved))


def load_space(path: str | Path) -> RecordedSpace:
    """Load a Kernel Tuner cache file (cached per path; files are MBs). ValueError says what is wrong."""
    return _load(str(Path(path).expanduser().resolve()))
