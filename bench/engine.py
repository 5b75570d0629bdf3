"""kfactory's best engine beside the baselines (issue 26, deliverable 6): decode tokens/s at batch 1 after
prefilling 128 and 1024 tokens, prefill tokens/s of a 512-token prompt, peak RSS of each engine's child and the
fraction of its roofline on this host (kfactory.engines.baselines.roofline, with the weight format each engine
reads), plus kfactory's greedy 64 tokens against the float64 reference on the model's prompts.

    python bench/engine.py [--threads 1,2] [--baseline-python PY] [--python NAME=PY] [--model smollm2-135m]
        [--only numpy-ref,torch-eager,llama-cpp] [--design JSON] [--no-greedy] [--fresh-ceilings]
        [--paired-rounds N] [--paired-bursts B] [--json OUT]

kfactory's engine is the design in <data_dir>/engines/<model>/best.json (the engine campaign's best verified
design) when there is one, else the default EngineDesign (--design overrides both); its thread count is set to
each --threads value. It runs in its own child (kfactory.engines.runner) and is timed there by the runner's
`bench` request. The baselines run as in bench/engine_baselines.py (same arguments).

The roofline's memory side rests on the read probe, and this host's read bandwidth moves by half within a
second (31-60 GB/s at 2 threads on the project's host), so a fraction taken against a probe run once before the
engine says as much about the moment as about the engine. --paired-rounds N (default 3) also times the engine's
decode from the first context in N rounds of --paired-bursts bursts of its decode steps (--steps, 32 by default)
each, with the cpu target's read probe run in the engine's own child (kfactory.engines.runner.EngineRunner.paired)
before the first burst and after each, one pass at 1 and one at the engine's thread count (the counts the
ceilings take the best of; they take each count's median of 10 or more passes): the engine and the bandwidth
measured at the same moments, a burst and its probes some 0.1 s apart. A burst's fraction takes the largest of the
passes on either side of it (up to four), the bound that favours the engine least, and its cost the positions its
steps attend; a round's fraction is its bursts' median. Both lean against the engine: single passes scatter, and
the largest of four is the high end of it; each burst's first step starts with the caches full of the probe's
lines. (A spinning design's idle thread spins through the 1-thread pass; it reads no memory.) A round that fails
(the engine faults, the harness fails) is kept with its error and no fraction. The JSON keeps every round and burst
("roofline_paired") and the rounds' median ("roofline_fraction_paired" under "kfactory").

The JSON holds the baselines' run (model, host, ceilings, results: kfactory's engine is one of the results, named
"kfactory") and, under "kfactory", kfactory's figures at the first thread count: decode_tokens_per_s,
prefill_tokens_per_s, peak_rss_mb, roofline_fraction, greedy_identical and speedup_vs {baseline: kfactory's decode
tokens/s at the first context over the baseline's}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_baselines as eb  # noqa: E402  (bench/ is not a package)

from kfactory.engines.baselines.report import table  # noqa: E402
from kfactory.engines.baselines.result import FAILED, OK, add_roofline, decode_step_cost, empty  # noqa: E402
from kfactory.engines.baselines.roofline import READ_GBPS, Formats, host_ceilings, token_roofline  # noqa: E402
from kfactory.platform.config import Settings  # noqa: E402

NAME = "kfactory"
#: decode steps timed per context when --steps is 0, and timing repeats (decode: median step of all repeats;
#: prefill: the best repeat)
DEFAULT_STEPS = 32
REPEATS = 3
#: rounds of decode bursts interleaved with the read probe (--paired-rounds), and bursts a round (--paired-bursts)
PAIRED_ROUNDS = 3
PAIRED_BURSTS = 8


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """bench/engine_baselines.py's flags (its defaults but one thread), plus kfactory's own."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    eb.add_arguments(ap, "1", "baselines to run, comma-separated ('' for none)",
                     f"decode steps per context (0: each baseline's default; kfactory's {DEFAULT_STEPS})")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="kfactory's timing repeats per figure")
    ap.add_argument("--design", help="kfactory's design as JSON (default: best.json's, else the default design)")
    ap.add_argument("--no-greedy", action="store_true", help="skip the greedy check against the reference")
    ap.add_argument("--paired-rounds", type=int, default=PAIRED_ROUNDS,
                    help="rounds of decode bursts at the first context interleaved with the read probe (0: none)")
    ap.add_argument("--paired-bursts", type=int, default=None,
                    help=f"decode bursts (of --steps steps) a paired round, each between two read probes (default "
                         f"{PAIRED_BURSTS}, fewer where the model's context ends sooner)")
    args = ap.parse_args(argv)
    check(ap, args)
    return args


def check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A user's mistake (a --json folder that is not there, a --design that is not JSON or names unknown fields, an
    unknown model, contexts or paired bursts past the model's context, numbers that cannot be) exits through
    ap.error before anything is timed; sets the default --paired-bursts that fits the model's context."""
    try:
        contexts = eb._ints(args.contexts)
        eb._ints(args.threads)
    except ValueError:
        ap.error(f"--contexts {args.contexts!r} and --threads {args.threads!r}: comma-separated whole numbers")
    if args.paired_rounds < 0 or (args.paired_bursts is not None and args.paired_bursts < 1):
        ap.error(f"--paired-rounds {args.paired_rounds} and --paired-bursts {args.paired_bursts}: rounds are 0 "
                 "(none) or more, bursts 1 or more")
    _, _, _, model = checked_fields(ap, args)
    limit, steps = model.config.context_length, args.steps or DEFAULT_STEPS
    if contexts and max(contexts) + steps > limit:
        ap.error(f"--contexts up to {max(contexts)} + {steps} decode steps exceed {args.model}'s context ({limit} "
                 "tokens)")
    room = (limit - contexts[0]) // steps if contexts else PAIRED_BURSTS
    if args.paired_bursts is None:
        args.paired_bursts = max(1, min(PAIRED_BURSTS, room))
    elif args.paired_rounds and args.paired_bursts > room:
        ap.error(f"--paired-bursts {args.paired_bursts} of {steps} steps after {contexts[0]} tokens exceed "
                 f"{args.model}'s context ({limit} tokens): {room} at most")


def chosen_design(model: str, text: str | None) -> tuple[dict, str, dict]:
    """(design fields, where they came from, the searched op kernels it links in by problem): --design, else
    best.json, else the default design. A --design naming searched kernels takes them from best.json."""
    from kfactory.engines.campaign import load_best
    from kfactory.engines.ops import kernels_of
    from kfactory.models import load_model
    best = load_best(load_model(model).name)
    kernels = kernels_of(best) if best is not None else {}
    if text:
        return json.loads(text), "--design", kernels
    if best is not None:
        return dict(best["design"]), f"best.json ({best['design_id']}, campaign {best.get('campaign')})", kernels
    return {}, "default design (no best.json: no campaign verified a design of this model)", {}


def build_design(design, config, kernels: dict, extra_flags: tuple[str, ...] = ()):
    """The design's library (a lookup in the build cache after its campaign); a design whose searched kernels
    are not at hand is a failed BuildResult saying so."""
    from kfactory.engines.build import BuildResult
    from kfactory.engines.ops import OpKernelError, build_engine
    try:
        return build_engine(design, config, kernels, extra_flags=extra_flags)
    except OpKernelError as e:
        return BuildResult(False, None, str(e), 0.0, False, "")


def checked_design(ap: argparse.ArgumentParser, args: argparse.Namespace):
    """(design fields, where they came from, searched kernels, the opened model) for a bench's --design, --model,
    --context, --steps, --threads and --json: a user's mistake (not JSON, unknown fields, an unknown model, a
    context past the model's, a --json folder that is not there) exits through ap.error before anything runs;
    more threads than cpus only warns."""
    fields, source, kernels, model = checked_fields(ap, args)
    if args.context + args.steps > model.config.context_length:
        ap.error(f"--context {args.context} + --steps {args.steps} exceeds {args.model}'s context "
                 f"({model.config.context_length} tokens)")
    if args.threads > (os.cpu_count() or 1):
        print(f"warning: --threads {args.threads} is more than this host's {os.cpu_count()} CPUs: the threads "
              "share cores and the figures say little", file=sys.stderr)
    return fields, source, kernels, model


def checked_fields(ap: argparse.ArgumentParser, args: argparse.Namespace):
    """checked_design's part common to every bench: --json's folder, --design (JSON of known fields) and
    --model (it opens), each a user's mistake through ap.error."""
    from kfactory.engines.design import EngineDesign
    from kfactory.models import load_model
    if args.json and not Path(args.json).resolve().parent.is_dir():
        ap.error(f"--json {args.json}: its directory does not exist")
    try:
        fields, source, kernels = chosen_design(args.model, args.design)
        if not isinstance(fields, dict):
            raise ValueError(f"--design must be a JSON object of EngineDesign fields, not {type(fields).__name__}")
        EngineDesign.from_dict(fields)
        model = load_model(args.model).open(Path(Settings().data_dir) / "models")
    except json.JSONDecodeError as e:
        ap.error(f"--design is not JSON: {e}")
    except ValueError as e:   # DesignError, ModelError
        ap.error(str(e))
    return fields, source, kernels, model


def with_threads(fields: dict, threads: int):
    from kfactory.engines.design import EngineDesign
    return EngineDesign.from_dict(fields).at_threads(threads)


def engine_formats(design, model) -> Formats:
    """The formats kfactory's engine reads (kfactory/engines/prepare.py): "q4_1" keeps the file's blocks (the
    embedding, which is the tied LM head, in its own format), "f32" dequantises every tensor at load; norms and
    the KV cache are float32 either way. An integer decode (`q4_decode: vnni`) takes the blocks' products in int8
    against x's byte digits, which the roofline sets against the host's int8 peak."""
    if design.weights == "f32":
        return Formats.uniform("f32")
    return Formats.from_gguf(model.formats(), model.config, kv_cache="f32",
                             decode_int8=design.decode_int8())


def _vm(pid: int, key: str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_peak(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure_kfactory(verifier, design, threads: int, contexts: list[int], prefill: int, steps: int,
                     repeats: int, kernels: dict | None = None) -> dict:
    """kfactory's engine in the baselines' result shape (roofline not yet filled), timed in its runner child;
    peak RSS is the child's VmHWM while measuring (reset after it opened the model, like the baselines)."""
    from kfactory.engines.runner import EngineFault, EngineRunner
    lib = build_design(design, verifier.model.config, kernels or {})
    if not lib.ok or lib.path is None:
        return empty(NAME, threads, FAILED, f"build failed: {lib.log.strip()[-800:]}")
    steps = steps or DEFAULT_STEPS
    capacity = max(max(contexts, default=0) + steps, prefill + 1) + 8
    t0 = time.perf_counter()
    try:
        with EngineRunner(str(verifier.package.directory), design, lib.path, capacity,
                          cache_dir=verifier.cache_dir, timeout_s=120.0) as runner:
            proc = runner.proc
            if proc is None:  # the context manager started it; None would be a runner bug
                raise RuntimeError("the engine runner has no child process after starting")
            pid = proc.pid
            load_peak = _vm(pid, "VmHWM")
            scope = "run" if _reset_peak(pid) else "process"
            decode = {str(c): runner.bench(c, steps, repeats).decode_tok_s for c in contexts}
            pre = runner.bench(prefill, 1, repeats).prefill_tok_s if prefill else None
            peak = _vm(pid, "VmHWM")
    except EngineFault as e:
        return empty(NAME, threads, FAILED, f"engine fault ({e.kind}): {e}")
    model = verifier.model
    return {"name": NAME, "available": True, "status": OK, "reason": "", "threads": threads,
            "decode_tokens_per_s": decode, "prefill_tokens_per_s": pre, "peak_rss_mb": peak,
            "load_peak_rss_mb": load_peak, "peak_rss_scope": scope, "weights_format": design.weights,
            "roofline_fraction": {}, "formats": engine_formats(design, model).as_dict(),
            "config": model.config.as_dict(), "decode_steps": steps, "prefill_tokens": prefill,
            "seconds": time.perf_counter() - t0, "design": design.as_dict(), "design_id": design.design_id(),
            "library": str(lib.path), "timing": {"decode": f"median step of {repeats} x {steps} steps",
                                                 "prefill": f"best of {repeats}"}}


def cpu_target(threads: int, settings: Settings | None = None):
    """The cpu target at `threads` threads, on `settings` (default: the environment's), as the probes run on it."""
    from kfactory.targets import get_target
    base = settings if settings is not None else Settings()
    return get_target("cpu", base.model_copy(update={"threads": threads}))


def paired_fraction(result: dict, ceilings: dict[str, float], context: int, read_gbps: float, step_s: float,
                    steps: int | None = None) -> float | None:
    """The roofline fraction of decode steps of `step_s` seconds each after `context` tokens (`steps` of them,
    default the result's timed steps, costed at the mean positions they attend: decode_step_cost), against the
    ceilings with the read bandwidth `read_gbps`."""
    return token_roofline(decode_step_cost(result, context, steps), {**ceilings, READ_GBPS: read_gbps},
                          step_s)["fraction"]


def paired_round(result: dict, ceilings: dict[str, float], figures) -> dict:
    """One round of EngineRunner.paired's figures as the JSON keeps it: each burst's read bandwidth (the larger
    of its two probes), decode tok/s (its median step) and fraction, and the round's fraction (the bursts'
    median; None where a ceiling is unknown)."""
    bursts = []
    for b in range(len(figures.step_s)):
        read, rate = figures.read_around(b), figures.burst_tok_s(b)
        bursts.append({"context": figures.burst_context(b), "read_gbps": read, "decode_tokens_per_s": rate,
                       "fraction": paired_fraction(result, ceilings, figures.burst_context(b), read, 1.0 / rate,
                                                   figures.burst_steps)})
    known = [r["fraction"] for r in bursts if r["fraction"] is not None]
    return {"reads_gbps": figures.reads_gbps, "bursts": bursts,
            "fraction": float(np.median(known)) if known else None}


def measure_paired(verifier, design, result: dict, ceilings: dict[str, float], rounds: int,
                   settings: Settings | None = None, kernels: dict | None = None,
                   bursts: int = PAIRED_BURSTS) -> dict:
    """`rounds` rounds of kfactory's engine from the result's first context, each in a child of its own: `bursts`
    bursts of the result's decode steps, the read probe in the same child before the first and after each
    (EngineRunner.paired): {"context", "burst_steps", "rounds": [paired_round's, or {"error", "fraction": None}
    for a round that failed], "fraction_median", "fraction_min", "fraction_max"} over the rounds' fractions."""
    from kfactory.engines.runner import EngineFault, EngineRunner, HarnessError
    from kfactory.targets.cpu.ceiling import ELEMENTS, probe_library
    context = int(next(iter(result["decode_tokens_per_s"])))
    steps, threads = result["decode_steps"], result["threads"]
    lib = build_design(design, verifier.model.config, kernels or {})
    probe = probe_library(cpu_target(threads, settings))
    out: list[dict] = []
    for _ in range(rounds):
        try:
            with EngineRunner(str(verifier.package.directory), design, lib.path, context + bursts * steps + 8,
                              cache_dir=verifier.cache_dir, timeout_s=120.0) as runner:
                figures = runner.paired(context, bursts, steps, probe, ELEMENTS, sorted({1, threads}))
        except (EngineFault, HarnessError) as e:   # kept with the round: the other rounds and the bench go on
            out.append({"error": f"{type(e).__name__}: {e}", "fraction": None})
            continue
        out.append(paired_round(result, ceilings, figures))
    known = [r["fraction"] for r in out if r["fraction"] is not None]
    return {"context": str(context), "burst_steps": steps, "rounds": out,
            "fraction_median": float(np.median(known)) if known else None,
            "fraction_min": min(known, default=None), "fraction_max": max(known, default=None)}


def paired_line(result: dict) -> str | None:
    """The paired rounds in one line, or None where none ran."""
    p = result.get("roofline_paired")
    if not p or not p["rounds"]:
        return None
    bursts = [b for r in p["rounds"] for b in r.get("bursts", [])]
    fracs = ", ".join(eb._pct(r["fraction"]) if "error" not in r else "failed" for r in p["rounds"])
    spans = (f"; read {min(b['read_gbps'] for b in bursts):.1f}-{max(b['read_gbps'] for b in bursts):.1f} GB/s, "
             f"{min(b['decode_tokens_per_s'] for b in bursts):.1f}-"
             f"{max(b['decode_tokens_per_s'] for b in bursts):.1f} tok/s") if bursts else ""
    errors = "".join(f"\n  a round failed: {r['error']}" for r in p["rounds"] if "error" in r)
    return (f"{NAME} ({result['threads']} threads): decode from {p['context']} tokens in bursts of "
            f"{p['burst_steps']} steps between read probes: roof (read) {fracs} a round (median "
            f"{eb._pct(p['fraction_median'])}{spans}){errors}")


def greedy_check(verifier, design, kernels: dict | None = None) -> dict:
    """Greedy generation of the plan's tokens (64) from each of the model's prompts, kfactory's engine against
    the float64 reference (kfactory.engines.verify; the reference's answers come from its on-disk cache)."""
    from kfactory.engines.verify import Plan
    full = verifier.plan
    verifier.plan = Plan((1,), 1, full.greedy_tokens, full.greedy_prompts)
    verifier.stream = verifier.stream[:2]
    lib = build_design(design, verifier.model.config, kernels or {})
    if not lib.ok or lib.path is None:
        return {"identical": None, "reason": "build failed"}
    t0 = time.perf_counter()
    verdict = verifier.verify(design, lib.path)
    greedy = [c for c in verdict.checks if c.name.startswith("greedy_")]
    identical = verdict.fault is None and len(greedy) == len(full.greedy_prompts) and all(c.passed for c in greedy)
    return {"identical": identical, "tokens": full.greedy_tokens, "prompts": len(full.greedy_prompts),
            "design_id": design.design_id(), "seconds": time.perf_counter() - t0,
            "reference_answers": {"cached": verifier.refs.hits, "computed": verifier.refs.misses},
            "checks": [{"name": c.name, "passed": c.passed, "max_err": c.max_err, "detail": c.detail}
                       for c in verdict.checks], "fault": verdict.fault}


def speedups(ours: dict, results: list[dict], context: str) -> dict[str, float]:
    """kfactory's decode tokens/s at `context` over each baseline's (same thread count) that ran."""
    mine = ours.get("decode_tokens_per_s", {}).get(context)
    out = {}
    for r in results:
        theirs = r.get("decode_tokens_per_s", {}).get(context)
        if r["name"] != NAME and r.get("available") and r["threads"] == ours["threads"] and mine and theirs:
            out[r["name"]] = mine / theirs
    return out


def run(args) -> dict:
    from kfactory.engines.verify import Verifier
    names = [n for n in args.only.split(",") if n]
    pythons = eb.interpreters(args)
    contexts = eb._ints(args.contexts)
    fields, source, kernels = chosen_design(args.model, args.design)
    print(f"kfactory's engine: {source}", file=sys.stderr, flush=True)
    verifier = Verifier(args.model)
    load_before = os.getloadavg()
    results, ceilings, ours_by_threads = [], {}, {}
    fresh = Settings(data_dir=Path(tempfile.mkdtemp(prefix="kf-ceilings-"))) if args.fresh_ceilings else None
    for threads in eb._ints(args.threads):
        ceilings[str(threads)] = host_ceilings(threads, fresh)
        design = with_threads(fields, threads)
        t0 = time.perf_counter()
        ours = measure_kfactory(verifier, design, threads, contexts, args.prefill, args.steps, args.repeats,
                                kernels)
        ours = add_roofline(ours, ceilings[str(threads)])
        if args.paired_rounds > 0 and ours["status"] == OK and contexts:
            ours["roofline_paired"] = measure_paired(verifier, design, ours, ceilings[str(threads)],
                                                     args.paired_rounds, fresh, kernels, args.paired_bursts)
        ours["python"] = sys.executable
        print(f"  {NAME} {design.design_id()} ({threads} threads): {ours['status']} in "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        results.append(ours)
        ours_by_threads[threads] = ours
        results.extend(eb.run_named(args, names, pythons, threads, ceilings[str(threads)]))
    if fresh is not None:
        shutil.rmtree(fresh.data_dir, ignore_errors=True)
    first_threads = eb._ints(args.threads)[0]
    ours = ours_by_threads[first_threads]
    greedy = None
    if not args.no_greedy:
        t0 = time.perf_counter()
        greedy = greedy_check(verifier, with_threads(fields, first_threads), kernels)
        print(f"  greedy check: {greedy['identical']} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    first = str(contexts[0]) if contexts else None
    summary = {
        "design_source": source, "design": ours.get("design"), "design_id": ours.get("design_id"),
        "threads": first_threads, "status": ours["status"], "reason": ours["reason"],
        "weights_format": ours.get("weights_format"),
        "decode_tokens_per_s": ours["decode_tokens_per_s"], "prefill_tokens_per_s": ours["prefill_tokens_per_s"],
        "peak_rss_mb": ours["peak_rss_mb"], "roofline_fraction": ours["roofline_fraction"],
        "roofline_fraction_paired": ours.get("roofline_paired", {}).get("fraction_median"),
        "greedy_identical": None if greedy is None else greedy["identical"], "greedy": greedy,
        "speedup_context": first,
        "speedup_vs": speedups(ours, results, first) if first else {},
        "speedup_vs_by_threads": {str(t): speedups(o, results, first) for t, o in ours_by_threads.items()}
        if first else {}}
    return {"model": args.model, "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                                          "load_average": {"before": load_before, "after": os.getloadavg()}},
            "ceilings": ceilings, "kfactory": summary, "results": results}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = run(args)
    k = out["kfactory"]
    print(table(out["results"]))
    for r in out["results"]:
        if r.get("roofline", {}).get("warning"):
            print(f"{r['name']} ({r['threads']} threads): {r['roofline']['warning']}")
    print("\n".join(eb.roofline_lines(out["results"], out["ceilings"])))
    for r in out["results"]:
        line = paired_line(r) if r["name"] == NAME else None
        if line:
            print(line)
    print(f"kfactory's engine: {k['design_id']} from {k['design_source']}")
    g = k["greedy"]
    if g is not None:
        print(f"greedy {g.get('tokens')} tokens on {g.get('prompts')} prompts vs the float64 reference: "
              f"{'identical' if g['identical'] else 'NOT identical'}")
    for name, ratio in k["speedup_vs"].items():
        print(f"speedup vs {name} (decode at context {k['speedup_context']}, {k['threads']} threads): "
              f"{ratio:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
