"""`kfactory check`: judge one kernel exactly as a campaign judges a candidate, without the services.

Compile (with the target's static checks), verify on every shape and distribution plus the regression
inputs this machine's memory archive holds for the problem, and if it passes, time it interleaved with the
problem's reference kernel and baselines.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from google.protobuf.json_format import MessageToDict

from kfactory.bus import events as ev
from kfactory.judge import objective
from kfactory.judge.checks import InputPool, RegressionInput
from kfactory.judge.measure import available_baselines
from kfactory.judge.rotated import measure_rotated
from kfactory.judge.verify import verify
from kfactory.problems import load_problem
from kfactory.sandbox.parent import HarnessError
from kfactory.targets import get_target
from kfactory.targets.flags import FLAG_TARGETS, check_flags
from kfactory.v1 import events_pb2 as pb

EXIT_USAGE = 2


def _dict(msg) -> dict:
    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def launch_rule(source: str, grid: str = "", block: str = "", smem: str = "") -> dict | None:
    """The launch rule of a user's cuda kernel: --grid/--block/--smem flags win over the source's
    `// kfactory: grid=... block=... smem=...` header; None when neither gives one."""
    from kfactory.targets.cuda.launch import parse_header

    rule = dict(parse_header(source) or {})
    for key, value in (("grid", grid), ("block", block), ("smem", smem)):
        if value:
            rule[key] = value
    if not rule:
        return None
    if "grid" not in rule or "block" not in rule:
        raise ValueError(f"a launch rule needs grid and block (got {sorted(rule)}): give --grid and --block "
                         "or a `// kfactory: grid=... block=...` line in the source")
    rule.setdefault("params", {})
    return rule


def local_regressions(settings, problem: str) -> list[RegressionInput]:
    """Regression inputs from this machine's memory archive (none when there is no archive yet)."""
    path = Path(settings.archive())
    if not path.exists():
        return []
    from kfactory.services.memory.archive import Archive

    archive = Archive(path)
    try:
        return [RegressionInput.of(r) for r in archive.regressions(problem)]
    finally:
        archive.close()


def check(problem_name: str, target_spec: str, source: str, flags: str, settings,
          compile_only: bool = False, language: str = "c", launch: dict | None = None) -> dict:
    """The verdict on one kernel as a JSON-ready dict (see the README for its fields)."""
    problem = load_problem(problem_name)
    target = get_target(target_spec, settings)
    if target.name == "replay":   # its candidates are recorded points, not sources
        raise ValueError("the replay target judges a recorded tuning space's points, not a source: check a kernel on "
                         "cpu or cuda")
    if language not in target.languages:   # a usage error, not a rejected kernel
        raise ValueError(f"the {target.name} target compiles {' or '.join(target.languages)}, not {language!r}: "
                         "give --language or --target to match the source")
    if target.name in FLAG_TARGETS:
        check_flags(target.name, flags)  # FlagRefused is a ValueError: `kfactory check` prints it and exits 2
    threads = settings.threads
    entry = "kernel"
    launch_json = json.dumps(launch, sort_keys=True) if launch else ""
    out = {"candidate_id": ev.candidate_id(source, language, flags, entry, threads, target_spec, launch_json),
           "problem": problem.name, "target": target_spec, "language": language, "launch": launch,
           "compiled": False, "compile": None, "verdict": None, "measurement": None, "speedup_vs_reference": None}
    res = target.compile(source, language, flags, entry)
    out["compiled"] = res.ok
    out["compile"] = _dict(res.report) if res.ok else {"reason": pb.RejectReason.Name(res.reason),
                                                       "message": res.message, "log": res.log[-4000:]}
    if not res.ok:
        out["verdict"] = {"passed": False, "reason": pb.RejectReason.Name(res.reason), "message": res.message,
                          "checks": []}
        return out
    if compile_only:
        return out
    if target.name == "cuda" and launch is None:
        raise ValueError("a cuda kernel needs a launch rule to run: give --grid and --block (expressions over "
                         f"{problem.spec.symbols}) or a `// kfactory: grid=... block=...` line in the source")
    session = target.session(problem, threads)
    try:
        session.load_artifact("candidate", res.artifact, entry, launch)
        pool = InputPool(problem, 1, local_regressions(settings, problem.name))
        v = verify(session, "candidate", problem, pool)
        out["verdict"] = {"passed": v.passed, "reason": pb.RejectReason.Name(v.reason) if not v.passed else None,
                          "message": v.message, "checks": [_dict(c) for c in v.checks]}
        if v.passed:
            _measure(out, session, target, problem, settings)
    finally:
        session.close()
    return out


def _measure(out: dict, session, target, problem, settings) -> None:
    keys = {"candidate": "candidate"}
    if target.name in problem.spec.reference_kernel:
        ref_source, ref_flags, language, rule = problem.reference_kernel(target.name)
        ref = target.compile(ref_source, language, ref_flags, "kernel")
        if ref.ok:
            session.load_artifact("reference", ref.artifact, "kernel", rule)
            keys["reference"] = "reference"
    for b in available_baselines(problem, target.name):
        session.load_baseline(f"baseline:{b}", b)
        keys[b] = f"baseline:{b}"
    dev = target.device()
    pool = InputPool(problem, 1)
    shapes, speedups = {}, {}
    for shape in problem.shapes("optimize"):
        name = problem.shape_str(shape)
        # rotated (judge/rotated.py): the candidate, first in keys, would otherwise have the first buffers
        t = measure_rotated(session, list(keys.values()), problem, shape, pool, target.cache_bytes(), settings,
                            settings.compare_max_s, dev)
        if t.reason:
            out["verdict"].update(passed=False, reason=pb.RejectReason.Name(t.reason), message=t.message)
            return
        cand = t.timings["candidate"]
        shapes[name] = {n: _dict(t.timings[k]) for n, k in keys.items()}
        speedups[name] = {n: t.timings[k].median_s / cand.median_s for n, k in keys.items() if n != "candidate"}
    out["measurement"] = {"device": _dict(dev), "shapes": shapes, "speedups": speedups}
    # the objective's (kfactory/judge/objective.py): the first shape's alone unless the problem weighs its shapes
    medians = {s: {n: t["median_s"] for n, t in timed.items()} for s, timed in shapes.items()}
    out["speedup_vs_reference"] = objective.speedup(problem, medians, "reference")


#: where the cpu target compiles a copy of a source (kfactory.targets.cpu.target: a kf-cc-* scratch directory)
COPY_PATH = re.compile(r"/\S*kf-cc-[^/\s]+/k\.(?:c|cpp)\b")


def command(args, settings) -> int:
    """`kfactory check`: exit 0 when the kernel passed, 1 when it was rejected, 2 on a usage error."""
    from kfactory.platform.fsutil import output_misfit
    from kfactory.problems.loader import LANGUAGES, language_of

    try:
        source = args.source.read_text(encoding="utf-8")   # (whatever the locale: the compiler reads UTF-8)
    except OSError as e:
        print(f"kfactory check: cannot read --source {args.source}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    except UnicodeDecodeError as e:
        print(f"kfactory check: cannot read --source {args.source}: not UTF-8 text (byte {e.start}: {e.reason}); "
              "save it as UTF-8", file=sys.stderr)
        return EXIT_USAGE
    if why := settings.oversized(source):   # a campaign refuses it too (the coder, a spec)
        print(f"kfactory check: --source {args.source}: {why}", file=sys.stderr)
        return EXIT_USAGE
    if args.json_out != "-" and (why := output_misfit(args.json_out)):   # before the judging, not after it
        print(f"kfactory check: {why}", file=sys.stderr)
        return EXIT_USAGE

    if args.language is None and args.source.suffix.lower() not in LANGUAGES:   # not guessed: .cxx was read as C
        print(f"kfactory check: cannot tell the language of --source {args.source} from its suffix (known: "
              f"{', '.join(LANGUAGES)}): give --language", file=sys.stderr)
        return EXIT_USAGE
    cuda = args.target.startswith("cuda")
    flags = args.flags if args.flags is not None else ("" if cuda else "-O3 -fopenmp")
    try:
        launch = launch_rule(source, args.grid, args.block, args.smem) if cuda else None
        out = check(args.problem, args.target, source, flags, settings, args.compile_only,
                    args.language or language_of(args.source, args.target), launch)
    except ValueError as e:  # ProblemError, UnknownTarget, a bad target option: the message says what to fix
        print(f"kfactory check: {e}", file=sys.stderr)
        return EXIT_USAGE
    except HarnessError as e:   # the judge could not work here (a tool missing): no verdict on the kernel
        print(f"kfactory check: no verdict: {e}", file=sys.stderr)
        return 1
    if not out["compiled"] and (out["compile"] or {}).get("log"):
        out["compile"]["log"] = COPY_PATH.sub(str(args.source), out["compile"]["log"])
    text = json.dumps(out, indent=2)
    if args.json_out == "-":
        print(text)
    elif args.json_out:
        Path(args.json_out).write_text(text)
    verdict = out["verdict"]
    if not out["compiled"] and (out["compile"] or {}).get("log"):   # the compiler's own words, about the file
        print(out["compile"]["log"].rstrip(), file=sys.stderr)
    if verdict is None:
        print(f"{out['candidate_id'][:12]}: compiled" if out["compiled"] else "did not compile", file=sys.stderr)
        return 0 if out["compiled"] else 1
    sp = out["speedup_vs_reference"]
    print(f"{out['candidate_id'][:12]}: " + ("passed" + (f", {sp:.2f}x the reference" if sp else "")
                                             if verdict["passed"] else f"rejected: {verdict['reason']}: "
                                             f"{verdict['message']}"), file=sys.stderr)
    if verdict["passed"]:   # its id names nothing best or export can find: say how to make it so
        print(f"(check archives nothing; to keep it for best and export: {keep_command(args, flags)})",
              file=sys.stderr)
    return 0 if verdict["passed"] else 1


def keep_command(args, flags: str) -> str:
    """The `kfactory run` that judges the checked kernel as a campaign's hand-written candidate, archived."""
    import shlex

    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", args.source.stem)[:64] or "mine"
    manual = f"{name}={args.source}" + (f":{flags}" if flags else "")
    target = f" --target {args.target}" if args.target != "cpu" else ""
    return f"kfactory run {shlex.quote(args.problem)}{target} --manual {shlex.quote(manual)} --budget 1"
