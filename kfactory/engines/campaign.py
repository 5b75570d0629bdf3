"""An engine campaign on the cpu: design points generated, built, verified and measured, every result kept.

`Campaign(model, budget).run()` takes up to `budget` points of `space()` as the descent strategy asks for them
(kfactory/strategies/descent.py, the services' campaign uses it too): the default design first, then every
design one field away from it (the closest valid one for a field that needs another: 2 spinning threads from
the default's 1), then the same around the fastest design measured so far, and so on down the ranking. So a
small budget tries each field's values early, the early points pair with the default (what the effects below
need), and later points combine the changes that won (2 spinning threads with an op on one thread). Each point is

    generated   codegen.generate (a CodegenError is the result `codegen_failed`)
    built       build.build (a compile failure is the result `build_failed`, with the compiler's log)
    verified    verify.Verifier (a failed check rejects the design: `rejected`, the first failing check named)
    measured    EngineRunner.bench in the engine's child: decode tok/s at context 128, prefill tok/s of those
                128 tokens (a fault while timing is `bench_failed`)

Then the showdown (kfactory/engines/showdown.py): the few designs within reach of the fastest are timed
alternately in `showdown` more rounds, and the winner is decided by their per-round ratios, not by figures
taken minutes apart.

The record (every result, the showdown, the winner, the effects) is written to
<data_dir>/engines/<model>/campaign-<timestamp>.json, and <data_dir>/engines/<model>/best.json names the winner
(the showdown's, else the highest decode tok/s, a spinning design only by more than SPIN_MARGIN) of the latest
campaign that verified a design: `kfactory generate` runs it.

The effect of a field's value is the median, over pairs of verified designs that differ only in that field
(one with the default's value, one with this value), of the ratio of their tok/s: the evidence that a choice
won on its own, not because of the other choices it came with. No such pair: "not measured". Against it the
record sets the noise: the first verified design timed again after all the others, as a ratio to its first
timing (on a shared host a figure moves with the load; an effect within the noise is not evidence).
"""
from __future__ import annotations

import json
import statistics
from operator import attrgetter
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from kfactory.engines.build import build
from kfactory.engines.codegen import CodegenError, generate
from kfactory.engines.design import SPIN_MARGIN, DesignError, EngineDesign, prefer_calm, space
from kfactory.engines.ops import OpKernel, OpKernelError, units_for
from kfactory.engines.order import JUMP, STRATEGY, order, with_kernels
from kfactory.engines.order import distance  # noqa: F401 (re-exported, its old home)
from kfactory.engines.problem import engine_family
from kfactory.engines.runner import EngineFault, EngineRunner
from kfactory.engines.showdown import Rule, Showdown, report_lines, schedule, spins_of
from kfactory.engines.verify import Verdict, Verifier
from kfactory.models.gguf_model import LlamaConfig
from kfactory.platform.fsutil import atomic_write
from kfactory.strategies import Space, make_strategy

#: the bench of every design: decode steps after a prefill of CONTEXT tokens (the issue's context 128)
CONTEXT, DECODE_TOKENS, REPEATS = 128, 32, 3
#: verdicts of a result; only VERIFIED designs are measured and can win
VERIFIED = "verified"
NOT_MEASURED = "not measured"

SourceFn = Callable[[EngineDesign, LlamaConfig], str]


class CampaignError(RuntimeError):
    """The campaign cannot run at all (an empty budget, a model that cannot be opened)."""


@dataclass
class DesignResult:
    """One design point's outcome: `verdict` is verified, codegen_failed, build_failed, rejected (verification
    failed: `failed_check` names the first failing check) or bench_failed; `reason` says why in words."""
    design: dict[str, Any]
    design_id: str
    verdict: str
    decode_tok_s: float | None = None
    prefill_tok_s: float | None = None
    failed_check: str | None = None
    reason: str = ""
    build_s: float = 0.0
    verify_s: float = 0.0
    bench_s: float = 0.0
    library: str | None = None
    #: [decode tok/s, prefill tok/s] of each timing round (the figures above are their medians)
    timings: list[list[float]] = field(default_factory=list)

    @property
    def rate(self) -> tuple[float, float]:
        """(decode tok/s, prefill tok/s), 0 where not measured: how designs rank (decode first)."""
        return (self.decode_tok_s or 0.0, self.prefill_tok_s or 0.0)

    @property
    def spins(self) -> bool:
        """Whether the design's threads spin (hold their cores between regions and calls)."""
        return bool(self.design.get("spin"))

    @property
    def verified(self) -> bool:
        return self.verdict == VERIFIED and self.decode_tok_s is not None

    def add_timing(self, decode_tok_s: float, prefill_tok_s: float) -> None:
        """One more timing round: its figures join the rounds, and the design's figures become their medians."""
        self.timings.append([decode_tok_s, prefill_tok_s])
        self.decode_tok_s = statistics.median(t[0] for t in self.timings)
        self.prefill_tok_s = statistics.median(t[1] for t in self.timings)

    def noise(self, decode_tok_s: float, prefill_tok_s: float) -> dict[str, Any]:
        """The noise record of this design timed again at `decode_tok_s`, `prefill_tok_s`: ratios to its first
        timing."""
        return {"design_id": self.design_id, "decode_ratio": decode_tok_s / self.timings[0][0],
                "prefill_ratio": prefill_tok_s / self.timings[0][1]}

    def line(self) -> str:
        """One progress line: id, verdict, figures or reason."""
        if self.verified:
            return (f"{self.design_id}: verified, decode {self.decode_tok_s:.1f} tok/s at context {CONTEXT}, "
                    f"prefill {self.prefill_tok_s:.1f} tok/s")
        check = f" ({self.failed_check})" if self.failed_check else ""
        return f"{self.design_id}: {self.verdict}{check}: {self.reason.splitlines()[0] if self.reason else ''}"


def field_effects(results: list[DesignResult], default: EngineDesign | None = None) -> dict[str, Any]:
    """Per field: the default's value and, for each other value tried, the median decode and prefill tok/s
    ratio (value / default's value) over verified pairs that differ only in that field, or NOT_MEASURED."""
    default = default or EngineDesign()
    verified = [r for r in results if r.verified]
    out: dict[str, Any] = {}
    for f in fields(EngineDesign):
        base = getattr(default, f.name)
        values = sorted({r.design[f.name] for r in results} | {base}, key=str)
        effects: dict[str, Any] = {}
        for value in values:
            if value == base:
                continue
            pairs = [(a, b) for a in verified for b in verified
                     if a.design[f.name] == base and b.design[f.name] == value
                     and all(a.design[k] == b.design[k] for k in a.design if k != f.name)]
            if not pairs:
                effects[json.dumps(value)] = NOT_MEASURED
                continue
            effects[json.dumps(value)] = {
                "decode_ratio": statistics.median(r for a, b in pairs for r in _ratios(a, b, 0)),
                "prefill_ratio": statistics.median(r for a, b in pairs for r in _ratios(a, b, 1)),
                "pairs": len(pairs)}
        out[f.name] = {"baseline": base, "values": effects or NOT_MEASURED}
    return out


def _ratios(a: DesignResult, b: DesignResult, k: int) -> list[float]:
    """b's figure k (0 decode, 1 prefill) over a's: per timing round when both have the same rounds (the two
    timed close together, under the same load), else of their medians."""
    if a.timings and len(a.timings) == len(b.timings):
        return [tb[k] / ta[k] for ta, tb in zip(a.timings, b.timings)]
    fa, fb = (a.decode_tok_s, b.decode_tok_s) if k == 0 else (a.prefill_tok_s, b.prefill_tok_s)
    return [fb / fa] if fa and fb else []


def rejection_reason(verdict: Verdict) -> str:
    """Why a failed verification rejects a design, in one line: the first failing check, its step and error,
    its detail and the engine's fault."""
    first = verdict.first_failure
    name = first.name if first else None
    step = f" at step {first.first_failing_step}" if first and first.first_failing_step is not None else ""
    err = f", max err {first.max_err:.2e} > tolerance {verdict.tolerance:g}" if first else ""
    return (f"verification failed: {name}{step}{err}"
            + (f"; {first.detail}" if first and first.detail else "")
            + (f"; engine fault ({verdict.fault_kind}): {verdict.fault}" if verdict.fault else ""))


_RATE, _SPINS = attrgetter("rate"), attrgetter("spins")


def fastest_of(results: list[DesignResult], showdown: dict[str, Any] | None = None) -> DesignResult | None:
    """The verified design with the highest decode tok/s (prefill breaks a tie); after a showdown, its fastest
    (the highest median per-round ratio)."""
    return _decided(results, showdown, "fastest") or max((r for r in results if r.verified), key=_RATE,
                                                         default=None)


def best_of(results: list[DesignResult], showdown: dict[str, Any] | None = None) -> DesignResult | None:
    """The campaign's winner among the verified designs (prefer_calm: the fastest, unless it spins and one that
    does not decodes within SPIN_MARGIN of it); after a showdown, its winner (the same rule on its ratios)."""
    verified = [r for r in results if r.verified]
    return _decided(results, showdown, "winner") or (prefer_calm(verified, _RATE, _SPINS) if verified else None)


def _decided(results: list[DesignResult], showdown: dict[str, Any] | None, key: str) -> DesignResult | None:
    """The verified design the showdown named under `key` (winner, fastest), or None (no showdown, or it
    named none)."""
    name = (showdown or {}).get(key)
    return next((r for r in results if r.verified and r.design_id == name), None)


def report_text(record: dict[str, Any]) -> str:
    """The campaign's report for a person: the winner with its figures, then each field's measured effects."""
    best = record["best"]
    n_ok = sum(r["verdict"] == VERIFIED for r in record["results"])
    lines = [f"engine campaign {record['model']} on {record['target']}: {len(record['results'])} designs, "
             f"{n_ok} verified"]
    if best is None:
        lines.append("no design verified: no winner")
    else:
        lines.append(f"winner: {best['design_id']}  decode {best['decode_tok_s']:.1f} tok/s at context "
                     f"{CONTEXT}, prefill {best['prefill_tok_s']:.1f} tok/s")
        lines.append(f"  design: {json.dumps(best['design'], sort_keys=True)}")
        if (fast := record.get("fastest")) and fast["design_id"] != best["design_id"]:
            sd = record.get("showdown")
            ratio = (sd["ratios"][fast["design_id"]]["decode_ratio"] / sd["ratios"][best["design_id"]]["decode_ratio"]
                     if sd and sd.get("winner") else fast["decode_tok_s"] / best["decode_tok_s"])
            lines.append(f"  passed over: {fast['design_id']} decodes x{ratio:.3f} faster but spins, holding its "
                         f"cores while the engine is idle; a spinning design wins only by more than "
                         f"x{SPIN_MARGIN:.2f}")
    lines.append("effect of each choice (median tok/s ratio against the default's value, over verified pairs "
                 "that differ only in that field):")
    for name, eff in record["effects"].items():
        if eff["values"] == NOT_MEASURED:
            lines.append(f"  {name:<13} (only {json.dumps(eff['baseline'])} tried): not measured")
            continue
        for value, e in eff["values"].items():
            what = f"{name} {value} vs {json.dumps(eff['baseline'])}"
            lines.append(f"  {what:<36} " + (NOT_MEASURED if e == NOT_MEASURED else
                         f"decode x{e['decode_ratio']:.3f}, prefill x{e['prefill_ratio']:.3f} "
                         f"({e['pairs']} pair{'s' if e['pairs'] != 1 else ''})"))
    if record.get("showdown"):
        lines.extend(report_lines(record["showdown"]))
    noise = record.get("noise")
    if noise:
        lines.append(f"noise: {noise['design_id']} timed again at the end measured decode "
                     f"x{noise['decode_ratio']:.3f}, prefill x{noise['prefill_ratio']:.3f} of its first timing: "
                     "an effect within that much of x1 is not told apart from the host's load")
    else:
        lines.append("noise: not measured (fewer than two designs were timed)")
    return "\n".join(lines)


@dataclass
class Campaign:
    """A campaign over `space(max_threads)` for one model; `source_for` makes a design's C source (codegen's
    generate; a test hands a broken one in). `verifier` may be shared between campaigns of the same model."""
    model: str
    budget: int
    max_threads: int = 1
    data_dir: Path | None = None
    target: str = "cpu"
    source_for: SourceFn = generate
    verifier: Verifier | None = None
    #: timing rounds: round 1 right after each design's verification, later rounds over the verified designs
    #: in turn (so each pair is also timed close together: on a shared host the load drifts within minutes)
    rounds: int = 1
    #: the showdown among the designs that can still be the fastest, after the timing rounds (default: none;
    #: `kfactory engine run` asks for defaults.ROUNDS rounds)
    showdown: Rule = field(default_factory=Rule)
    #: kernels searched for the engine's ops (kfactory/engines/ops.py), by problem: every q4_1 design may link
    #: each set of them (order.with_kernels); the search tries each alone on the default right after it
    kernels: dict[str, OpKernel] = field(default_factory=dict)
    #: the descent's jump, in percent (order.JUMP; 0 keeps best-improvement's order)
    jump: float = JUMP
    results: list[DesignResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.target != "cpu":
            raise CampaignError(f"engine campaigns run on the cpu target only, not {self.target!r}")
        if self.rounds < 1:
            raise CampaignError(f"timing rounds must be at least 1, not {self.rounds}")
        if self.budget < 1:
            raise CampaignError(f"the budget must be at least 1 design, not {self.budget}")
        if self.data_dir is None:
            from kfactory.platform.config import Settings
            self.data_dir = Path(Settings().data_dir)
        self.data_dir = Path(self.data_dir)
        if self.verifier is None:
            self.verifier = Verifier(self.model, cache_dir=self.data_dir / "models",
                                     reference_dir=self.data_dir / "engines" / "reference")

    @property
    def out_dir(self) -> Path:
        assert self.data_dir is not None and self.verifier is not None
        return self.data_dir / "engines" / self.verifier.package.name

    def designs(self) -> list[EngineDesign]:
        """Every design the campaign may take, in campaign order (`order()`, the default first): `space()` and,
        with searched kernels, every q4_1 design with each set of them (`with_kernels`). The search (`run`)
        takes `budget` of them, each searched kernel alone on the default right after it."""
        points = order(space(self.max_threads))
        return with_kernels(points, {p: k.candidate_id for p, k in self.kernels.items()})

    def run(self, progress: Callable[[int, int, DesignResult], None] | None = None) -> dict[str, Any]:
        """Evaluate `budget` designs in the order the search asks for them, each told its seconds per token
        (a design that fails is told a failure); write the record (and best.json); return the record."""
        assert self.verifier is not None
        started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        designs = self.designs()
        search = make_strategy(STRATEGY, Space([engine_family(designs, Path(self.verifier.package.directory))]), 0,
                               jump=self.jump)
        n = min(self.budget, len(designs))
        for i in range(n):
            point = search.ask()
            if point is None:
                break
            result = self.evaluate(EngineDesign.from_dict(point.params))
            self.results.append(result)
            search.tell(point, 1.0 / result.decode_tok_s if result.verified and result.decode_tok_s else None)
            if progress is not None:
                progress(i + 1, n, result)
        for _ in range(1, self.rounds):
            for result in [r for r in self.results if r.verified]:
                self.retime(result)
        noise = self.noise()
        return self.write(started, noise, self.run_showdown(noise))

    def evaluate(self, design: EngineDesign) -> DesignResult:
        """Generate, build, verify and measure one design; every failure is a result, never an exception
        (only the harness's own failures raise)."""
        v = self.verifier
        assert v is not None and self.data_dir is not None
        res = DesignResult(design.as_dict(), design.design_id(), VERIFIED)
        try:
            source = self.source_for(design, v.model.config)
        except CodegenError as e:
            res.verdict, res.reason = "codegen_failed", str(e)
            return res
        try:
            units = units_for(design, self.kernels)
        except OpKernelError as e:
            res.verdict, res.reason = "codegen_failed", str(e)
            return res
        lib = build(source, self.data_dir / "engines", units=units)
        res.build_s = lib.seconds
        if not lib.ok or lib.path is None:
            res.verdict, res.reason = "build_failed", f"compile failed: {lib.log.strip()[-2000:]}"
            return res
        t0 = time.perf_counter()
        verdict = v.verify(design, lib.path)
        res.verify_s = time.perf_counter() - t0
        if not verdict.passed:
            first = verdict.first_failure
            res.verdict, res.failed_check = "rejected", first.name if first else None
            res.reason = rejection_reason(verdict)
            return res
        res.library = str(lib.path)
        self.retime(res)
        return res

    def run_showdown(self, noise: dict[str, Any] | None) -> dict[str, Any] | None:
        """Time the showdown rule's contenders alternately in its rounds, each timing a round of its design too;
        the showdown's record, or None when there is none (fewer than two contenders, or no rounds asked for)."""
        near = self.showdown.contenders(self.results, noise)
        if not near:
            return None
        by_id = {r.design_id: r for r in near}
        sd = Showdown([r.design_id for r in near], self.showdown.rounds)
        for k, design_id in schedule(sd.ids, sd.rounds):
            res = by_id[design_id]
            if design_id in sd.faulted:
                continue
            self.retime(res)
            if res.verified:
                sd.add(design_id, k, *res.timings[-1])
            else:
                sd.fault(design_id)
        return sd.as_dict(spins_of(self.results))

    def retime(self, res: DesignResult) -> None:
        """One more timing round of a verified design: its figures become the medians of its rounds; a fault
        makes it bench_failed."""
        assert res.library is not None
        t0 = time.perf_counter()
        try:
            decode, prefill = self.bench(EngineDesign.from_dict(res.design), res.library)
        except EngineFault as e:
            res.verdict, res.reason = "bench_failed", f"engine fault while timing ({e.kind}): {e}"
            res.decode_tok_s = res.prefill_tok_s = None
            return
        res.bench_s += time.perf_counter() - t0
        res.add_timing(decode, prefill)

    def bench(self, design: EngineDesign, so_path: Path | str) -> tuple[float, float]:
        """(decode tok/s at CONTEXT from the median step, prefill tok/s from the median repeat), timed in the
        engine's child, as the services' benchmarker takes them (kfactory/engines/stages/benchmarker.py)."""
        assert self.verifier is not None and self.data_dir is not None
        with EngineRunner(str(self.verifier.package.directory), design, so_path, CONTEXT + DECODE_TOKENS + 8,
                          cache_dir=self.data_dir / "models") as runner:
            fig = runner.bench(CONTEXT, DECODE_TOKENS, REPEATS)
        return fig.decode_tok_s, fig.prefill_median_tok_s

    def noise(self) -> dict[str, Any] | None:
        """The first verified design timed again after the others, as a ratio to its first timing: how far a
        figure moves with the host's load alone, so an effect within it is not evidence (None: nothing to
        re-time, or only one design was measured)."""
        first = next((r for r in self.results if r.verified and r.library), None)
        if first is None or first.library is None or sum(r.verified for r in self.results) < 2:
            return None
        try:
            decode, prefill = self.bench(EngineDesign.from_dict(first.design), first.library)
        except EngineFault:   # it passed before: a fault now is recorded as no estimate, not a verdict
            return None
        return first.noise(decode, prefill)

    def write(self, started: str, noise: dict[str, Any] | None = None,
              showdown: dict[str, Any] | None = None) -> dict[str, Any]:
        """The record as JSON under out_dir, and best.json when a design verified."""
        assert self.verifier is not None
        return write_record(self.out_dir, {
            "model": self.verifier.package.name, "target": self.target, "started": started,
            "budget": self.budget, "max_threads": self.max_threads, "rounds": self.rounds,
            "showdown_rule": self.showdown.as_dict(),
            "bench": {"context": CONTEXT, "decode_tokens": DECODE_TOKENS, "repeats": REPEATS},
            "tolerance": self.verifier.tolerance}, self.results, self.kernels, noise, showdown)


def write_record(out: Path, head: dict[str, Any], results: list[DesignResult], kernels: dict[str, OpKernel],
                 noise: dict[str, Any] | None = None, showdown: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write a campaign's record (`head`: model, target, started, budget, ...; then the kernels, every result,
    the best, the effects, the noise, the showdown) as out/campaign-<started>.json, and out/best.json when a
    design verified; return the record. Shared by the local campaign and the one through the services."""
    best = best_of(results, showdown)
    out.mkdir(parents=True, exist_ok=True)
    started = head["started"]
    path = out / f"campaign-{started}.json"
    for n in range(2, 1000):   # two campaigns started in the same second keep both records
        if not path.exists():
            break
        path = out / f"campaign-{started}-{n}.json"
    record: dict[str, Any] = {
        **head,
        "kernels": {p: k.as_dict() for p, k in sorted(kernels.items())},
        "results": [asdict(r) for r in results],
        "best": asdict(best) if best else None,
        "fastest": asdict(fastest) if (fastest := fastest_of(results, showdown)) else None,
        "effects": field_effects(results),
        "noise": noise,
        "showdown": showdown,
        "path": str(path)}
    atomic_write(path, json.dumps(record, indent=1).encode())
    if best is not None:
        atomic_write(out / "best.json", json.dumps(
            {"model": record["model"], "design": best.design, "design_id": best.design_id,
             # the record by its name beside best.json: a workspace moved or copied keeps it
             "decode_tok_s": best.decode_tok_s, "prefill_tok_s": best.prefill_tok_s, "campaign": path.name,
             # only the kernels the winner links in: enough to rebuild it (ops.build_engine)
             "kernels": {p: kernels[p].as_dict()
                         for p in EngineDesign.from_dict(best.design).searched_kernels()}},
            indent=1).encode())
    return record


class BestFileError(ValueError):
    """best.json is there but does not hold a design (damaged, hand-edited, of another version): the message
    names the file and what to run."""


def load_best(model_name: str, data_dir: Path | None = None) -> dict[str, Any] | None:
    """best.json of a model (its package name), or None when no campaign verified a design; BestFileError when
    it cannot be read as one (its design must parse, and be the design its id names)."""
    if data_dir is None:
        from kfactory.platform.config import Settings
        data_dir = Path(Settings().data_dir)
    path = Path(data_dir) / "engines" / model_name / "best.json"
    if not path.is_file():
        return None
    again = f"run `kfactory engine run {model_name}` again to write it afresh"
    try:
        best = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BestFileError(f"{path} cannot be read ({e}): {again}") from e
    if not isinstance(best, dict) or not isinstance(best.get("design"), dict) \
            or not isinstance(best.get("design_id"), str) or not isinstance(best.get("kernels", {}), dict) \
            or not isinstance(best.get("campaign"), str):
        raise BestFileError(f"{path} is not a best-design record (a design, its design_id, its campaign record "
                            f"and kernels): {again}")
    try:
        design = EngineDesign.from_dict(best["design"])
    except (DesignError, TypeError) as e:
        raise BestFileError(f"{path}: its design cannot be read ({e}): {again}") from e
    if design.design_id() != best["design_id"]:
        raise BestFileError(f"{path}: its design is {design.design_id()}, not the {best['design_id']} it names: "
                            f"{again}")
    # the record's path: beside best.json (an absolute path, as written before, where the record is still there)
    named = Path(best["campaign"])
    best["campaign"] = str(named if named.is_absolute() and named.is_file() else path.parent / named.name)
    return best
