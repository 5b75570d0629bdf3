"""Compile ahead, anywhere: a problem's cuda design points compiled on a machine without a GPU (NVRTC and nvJitLink
need none) into a bundle of cubins with their resource reports, which a campaign's compiler serves instead of
compiling (a lent GPU's minutes go to measuring, not to NVRTC).

A bundle is a directory:

    manifest.json       {"format": "kfactory-precompiled", "version": 1, "problem", "target", "arch", "toolchain",
                         "points": [{"key", "family", "params", "language", "entry", "flags", "source_sha256",
                                     "launch", "cubin", "cubin_sha256", "report", "log"}],
                         "pruned": [{"family", "params", "reason", "message", "report"}]}
                        (each point's "launch" is its launch rule, for pruning it again at other shapes)
    cubins/<key>.cubin  one per kept point

`key` is the sha256 of what decides the cubin (language, source, flags, entry, architecture), not of the toolchain:
the machine that serves it may have another NVRTC, or none. Points the resource report rules out (compile
failures, spills, a block that cannot launch: kfactory.judge.screening.prune) are listed under "pruned" with the reason
and ship no cubin. The compiler serves a bundled cubin only after checking its digest, and names the bundle in the
compile report (`compiler`), so evidence says where a cubin came from.

Settings.precompiled (KFACTORY_PRECOMPILED, `kfactory run --precompiled DIR`) names bundle directories, or
directories holding bundles, separated by ':'.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

FORMAT = "kfactory-precompiled"
VERSION = 1
MANIFEST = "manifest.json"
#: ELF e_machine of a cubin
EM_CUDA = 190


def bundle_key(source: str, language: str, flags: str, entry: str, arch: str) -> str:
    """sha256 over what decides a cubin (length-prefixed parts, so no two part lists collide)."""
    h = hashlib.sha256()
    for part in (FORMAT, language, source, flags, entry, arch):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def cubin_header(cubin: bytes) -> dict:
    """{"machine": e_machine, "sm": the SM number in e_flags, "abi": EI_ABIVERSION} of a 64-bit little-endian ELF
    (every cubin is one); {} for anything else. The SM number sits in bits 8-15 of e_flags from ELF ABI version 8
    (CUDA 12.8 on: 0x6005a04 for sm_90a), in bits 0-7 before."""
    if len(cubin) < 0x34 or cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        return {}
    flags = int.from_bytes(cubin[0x30:0x34], "little")
    abi = cubin[8]
    return {"machine": int.from_bytes(cubin[0x12:0x14], "little"), "abi": abi,
            "sm": (flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF}


def arch_sm(arch: str) -> int:
    """'sm_90a' -> 90."""
    return int("".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit()))


# ---------------------------------------------------------------------------------------------------------------
# building a bundle


@dataclass
class Point:
    """One thing a campaign may ask the compiler for: a family's design point, or the reference kernel."""
    family: str
    params: dict
    source: str
    language: str
    flags: str
    entry: str
    launch: dict | None


def points_of(problem, limit: int | None = None, families: tuple[str, ...] = (), first: list[tuple] | tuple = (),
              seed: int = 0) -> list[Point]:
    """The reference kernel, then `first` ((family, params) pairs: the best points evidence knows, which a warm
    start proposes first), then the families' other points in a random order (fixed seed), one family after
    another in turn so that a --limit samples every family; at most `limit` in all (None: every point). Then,
    unless `families` picks some, the device judge's kernels (judge_points)."""
    out: list[Point] = []
    if "cuda" in problem.spec.reference_kernel and not families:
        source, flags, language, rule = problem.reference_kernel("cuda")
        out.append(Point("reference", {}, source, language, flags, "kernel", rule))
    fams = [f for f in problem.families_for("cuda") if not families or f.name in families]
    by_name = {f.name: f for f in fams}
    ordered = [(by_name[family], params) for family, params in first
               if family in by_name and by_name[family].valid(params)]
    # as many as the limit from the spread: some may repeat the first ones, and points_of stops at the limit
    ordered += _spread(fams, limit, random.Random(seed))
    seen: set[tuple[str, str]] = set()
    for fam, params in ordered:
        key = (fam.name, json.dumps(params, sort_keys=True))
        if (limit is not None and len(out) >= limit) or key in seen:
            continue
        seen.add(key)
        source, flags, _ = fam.render(params)
        out.append(Point(fam.name, params, source, fam.spec.language, flags, fam.spec.entry, fam.launch_rule(params)))
    return out + judge_points(problem) if not families else out


#: the bundle's families of the device judge's own kernels (judge_points), beside the problem's
JUDGE_FAMILIES = ("reference_f64", "judge")


def judge_points(problem) -> list[Point]:
    """The device judge's kernels (kfactory.targets.cuda.judge_device), which a session compiles once: the
    problem's float64 reference kernel and the judge's draw and compare kernels; none without a reference_f64.
    Outside a --limit, which samples the problem's own kernels."""
    f64 = problem.reference_f64("cuda")
    if f64 is None:
        return []
    from kfactory.targets.cuda import judge_kernels
    return [Point("reference_f64", {}, f64[0], "cuda", f64[1], "reference_f64", {**f64[2], "params": {}}),
            Point("judge", {}, judge_kernels.source(), "cuda", judge_kernels.FLAGS, judge_kernels.DRAW, None)]


#: a family with at most this many parameter combinations is enumerated (its constraints evaluated on each, which
#: takes seconds for softmax's cuda_cu with ~60000), a larger one sampled by random draws
ENUMERATE_UP_TO = 20000


def _spread(fams: list, n: int | None, rng: random.Random) -> list[tuple]:
    """Distinct (family, point) pairs taken from each family in turn, each family's in a random order (fixed
    seed): every point when n is None, else about n. A small family is enumerated and shuffled; a large one is
    drawn from at random (enumerating it would cost more than a small --limit's compiles), and drops out of the
    turn when its draws keep repeating."""
    turns = [_order(fam, rng, n is None) for fam in fams]
    out: list[tuple] = []
    while turns and (n is None or len(out) < n):
        for it in list(turns):
            pair = next(it, None)
            if pair is None:
                turns.remove(it)
            elif n is None or len(out) < n:
                out.append(pair)
    return out


def _order(fam, rng: random.Random, every: bool):
    """A family's points in a random order: shuffled when it is small or every point is asked for, else drawn."""
    if every or math.prod(len(v) for v in fam.spec.params.values()) <= ENUMERATE_UP_TO:
        pts = fam.points()
        rng.shuffle(pts)
        yield from ((fam, p) for p in pts)
        return
    seen: set[str] = set()
    misses = 0
    while misses < 50:
        try:
            params = fam.random_point(rng)
        except ValueError:  # no valid point in its random draws
            return
        key = json.dumps(params, sort_keys=True)
        if key in seen:
            misses += 1
            continue
        seen.add(key)
        misses = 0
        yield fam, params


def build(problem, arch: str, out_dir: Path | str, points: list[Point], jobs: int | None = None,
          target: str = "") -> dict:
    """Compile `points` for `arch` (NVRTC + nvJitLink, in threads: NVRTC releases the GIL), prune what the
    resource report rules out, write the bundle to `out_dir` and return its manifest. Raises
    kfactory.targets.cuda.toolchain.CudaToolchainMissing when NVRTC or nvJitLink cannot be loaded."""
    from google.protobuf import json_format

    from kfactory.judge.screening import prune
    from kfactory.targets.cuda.compile import compile_cuda
    from kfactory.targets.cuda.toolchain import toolchain_description
    from kfactory.v1 import events_pb2 as pb

    toolchain = toolchain_description()  # raises here, before any file is written, when there is none
    out_dir = Path(out_dir)
    cubins = out_dir / "cubins"
    cubins.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def one(p: Point):
        return p, compile_cuda(p.source, p.language, p.flags, p.entry, arch, None)

    kept, pruned = [], []
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        for p, r in pool.map(one, points):
            report = json_format.MessageToDict(r.report, preserving_proto_field_name=True)
            why = "" if not r.ok else prune(r.report, p.launch, problem)
            if not r.ok or why:
                pruned.append({"family": p.family, "params": p.params, "report": report,
                               "reason": pb.RejectReason.Name(r.reason if not r.ok else pb.RESOURCE_LIMIT),
                               "message": r.message if not r.ok else f"pruned: {why}"})
                continue
            key = bundle_key(p.source, p.language, p.flags, p.entry, arch)
            (cubins / f"{key}.cubin").write_bytes(r.artifact)
            kept.append({"key": key, "family": p.family, "params": p.params, "language": p.language,
                         "entry": p.entry, "flags": p.flags,
                         "source_sha256": hashlib.sha256(p.source.encode()).hexdigest(),
                         "launch": p.launch, "cubin": f"cubins/{key}.cubin",
                         "cubin_sha256": hashlib.sha256(r.artifact).hexdigest(),
                         "report": report, "log": r.log})
    manifest = {"format": FORMAT, "version": VERSION, "problem": problem.name, "target": target or f"cuda:{arch}",
                "arch": arch, "toolchain": toolchain, "seconds": round(time.time() - t0, 3),
                "points": kept, "pruned": pruned}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


# ---------------------------------------------------------------------------------------------------------------
# serving from bundles


class BundleError(ValueError):
    """A directory named as a bundle that holds none this kfactory can read."""


class Bundles:
    """The bundles under some directories, indexed by key; `lookup` serves a cubin as the compiler's result."""

    def __init__(self, dirs: list[Path]):
        self.entries: dict[str, tuple[Path, dict, str]] = {}   # key -> (bundle dir, point, toolchain)
        self.arches: dict[Path, str] = {}                        # bundle dir -> its architecture
        for d in dirs:
            for bundle in ([d] if (d / MANIFEST).is_file() else sorted(p.parent for p in d.glob(f"*/{MANIFEST}"))):
                manifest = read_manifest(bundle)
                self.arches[bundle] = manifest.get("arch", "")
                for point in manifest["points"]:
                    self.entries.setdefault(point["key"], (bundle, point, manifest.get("toolchain", "?")))
        self.served = 0

    def lookup(self, source: str, language: str, flags: str, entry: str, arch: str):
        """The bundled compile result (a targets.base.CompileResult) of this candidate for `arch`, or None (not
        bundled, or its cubin is missing or damaged: then the caller compiles, as without a bundle)."""
        from google.protobuf import json_format

        from kfactory.targets.base import CompileResult
        from kfactory.v1 import events_pb2 as pb

        found = self.entries.get(bundle_key(source, language, flags, entry, arch))
        if found is None:
            return None
        bundle, point, toolchain = found
        try:
            cubin = (bundle / point["cubin"]).read_bytes()
        except OSError:
            return None
        if hashlib.sha256(cubin).hexdigest() != point["cubin_sha256"]:
            return None
        report = json_format.ParseDict(point["report"], pb.CompileReport())
        # where the cubin came from, in the evidence; seconds stays the original compile's
        report.compiler = f"{toolchain} -arch={arch} (precompiled: {bundle.name})"
        self.served += 1
        return CompileResult(True, report, artifact=cubin, log=point.get("log", ""))


def read_manifest(bundle: Path) -> dict:
    """A bundle's manifest; BundleError when it is missing, malformed or of a newer version."""
    try:
        manifest = json.loads((Path(bundle) / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise BundleError(f"{bundle}: no readable {MANIFEST}: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{bundle}: not a precompiled bundle (format is not {FORMAT!r})")
    if not isinstance(manifest.get("version"), int) or manifest["version"] > VERSION:
        raise BundleError(f"{bundle}: version {manifest.get('version')!r} is not one this kfactory reads "
                          f"(up to {VERSION})")
    return manifest


@lru_cache(maxsize=8)
def bundles(setting: str) -> Bundles | None:
    """The bundles a Settings.precompiled value names (None when it names none, or a manifest there cannot be
    read: a bad setting costs compiles, never a candidate, and the log says why); read once per process."""
    from kfactory.observability.log import get_logger

    dirs = [Path(d).expanduser() for d in setting.split(os.pathsep) if d.strip()]
    if not dirs:
        return None
    try:
        found = Bundles(dirs)
    except BundleError as e:
        get_logger("precompile").warning("precompiled bundles not used", error=str(e))
        return None
    if not found.entries:
        get_logger("precompile").warning("no precompiled cubin under KFACTORY_PRECOMPILED", dirs=setting)
    return found


def serve(settings, source: str, language: str, flags: str, entry: str, arch: str):
    """The compile result a configured bundle holds for this candidate (None: compile it)."""
    setting = getattr(settings, "precompiled", "") or ""
    found = bundles(setting) if setting else None
    return found.lookup(source, language, flags, entry, arch) if found else None


def load_check(setting: str, arch: str) -> str:
    """Load one bundled cubin of `arch` through this machine's CUDA driver: "" when it loads, else why not (a
    driver older than the toolchain that built the bundle may refuse its cubins: then compile on the device)."""
    found = bundles(setting)
    point = None if found is None else next(
        ((b, p) for b, p, _ in found.entries.values() if found.arches[b] == arch), None)
    if point is None:
        return f"no bundled cubin for {arch}"
    from cuda.bindings import driver

    (err,) = driver.cuInit(0)
    if err == driver.CUresult.CUDA_SUCCESS:
        err, dev = driver.cuDeviceGet(0)
    if err == driver.CUresult.CUDA_SUCCESS:
        err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"no GPU to load it on: {err!r}"
    driver.cuCtxSetCurrent(ctx)
    err, module = driver.cuModuleLoadData((point[0] / point[1]["cubin"]).read_bytes())
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"the driver refuses {point[0].name}/{point[1]['cubin']}: {err!r}"
    driver.cuModuleUnload(module)
    return ""


# ---------------------------------------------------------------------------------------------------------------
# the command (the CLI builds its parser for every command: this module's top stays cheap to import)


def add_parser(sub) -> None:
    """Register `kfactory precompile` on the CLI's subparsers."""
    p = sub.add_parser("precompile", help="compile a problem's cuda design points ahead, on any machine, into a "
                                          "bundle of cubins a campaign's compiler serves (kfactory run --precompiled)")
    p.add_argument("problem", help="a built-in problem name or a problem package directory")
    p.add_argument("--target", required=True, help="cuda:sm_90a, cuda:sm_100a or cuda:sm_80 (named: no GPU is asked)")
    p.add_argument("--limit", type=int, default=None, help="at most this many points (default: every point); the "
                   "reference kernel and the best points of the workspace's evidence (its priors) come first")
    p.add_argument("--family", action="append", default=[], help="only these families (repeatable)")
    p.add_argument("--jobs", type=int, default=None, help="compiles at once (default: every core)")
    p.add_argument("--out", type=Path, required=True, help="the bundle's directory")


def run(args, settings) -> int:
    """Exit 0 when the bundle was written, 1 when the toolchain is missing, 2 for a usage error."""
    import sys

    from kfactory.problems import ProblemError, load_problem
    from kfactory.targets.cuda.arch import ARCH_RE
    from kfactory.targets.cuda.toolchain import CudaToolchainMissing

    name, _, arch = args.target.partition(":")
    if name != "cuda" or not ARCH_RE.fullmatch(arch) or (args.limit is not None and args.limit < 1):
        print(f"kfactory precompile: --target {args.target!r}: name a cuda architecture (cuda:sm_90a, cuda:sm_100a, "
              "cuda:sm_80), and --limit 1 or more", file=sys.stderr)
        return 2
    try:
        problem = load_problem(args.problem)
        points = points_of(problem, args.limit, tuple(args.family), _priors(settings, problem, args.family))
        manifest = build(problem, arch, args.out, points, args.jobs, args.target)
    except ProblemError as e:
        print(f"kfactory precompile: {e}", file=sys.stderr)
        return 2
    except CudaToolchainMissing as e:
        print(f"kfactory precompile: {e}", file=sys.stderr)
        return 1
    reasons: dict[str, int] = {}
    for p in manifest["pruned"]:
        reasons[p["reason"]] = reasons.get(p["reason"], 0) + 1
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"{args.out}: {problem.name} for {arch} ({manifest['toolchain']}): {len(points)} points in "
          f"{manifest['seconds']:.1f} s, {len(manifest['points'])} kept, {len(manifest['pruned'])} pruned"
          + (f" ({', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))})" if reasons else "") + f", {size} bytes")
    return 0


def _priors(settings, problem, families: list[str]) -> list[tuple[str, dict]]:
    """The best points the local workspace's evidence knows for the problem (imported evidence included)."""
    from kfactory.services.memory.archive import Archive
    from kfactory.services.memory.queries import problem_name
    from kfactory.evidence.workspace import Workspace

    try:
        archive = Archive.reader(Workspace.of(settings).archive_path, problem_name)
    except FileNotFoundError:
        return []
    try:
        return [(p.family, json.loads(p.params_json)) for p in archive.priors(problem.name, families, limit=256)]
    finally:
        archive.close()
