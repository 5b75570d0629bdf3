"""`kfactory export MODEL --format c|python --name NAME --out DIR`: a model's best verified engine as files usable
without kfactory (docs/engines.md, "Exporting an engine").

The engine is the winner of the model's latest campaign that verified one (best.json, kfactory/engines/campaign.py);
its campaign record must call it verified, or the export is refused (`NoVerifiedEngine`, exit 1). What is written:

    NAME.c            the exact source the campaign built and verified (the build cache keeps it beside the object),
                      with the ABI's nine functions and two types renamed NAME_* (identifier tokens only)
    NAME.h            the ABI v1 under NAME_, the weights file's layout, the design's constants, the evidence
    Makefile          libNAME.so with the campaign's compiler flags (kfactory.engines.build), NAME_example
    NAME_example.c    maps the weights, prefills token ids, greedy-decodes N tokens, prints their ids
    NAME.weights      the tensors prepare.py hands the engine for this design, byte for byte, with a table of them
    tokenizer.json    the model's tokenizer as the `tokenizers` package serialises it
    manifest.json     model, design, ABI version, build command, the verification (re-run at export: every check's
                      figures) and the campaign's figures, the tokenizer's special ids and chat template split
                      around the message, and the sha256 of every other file
    NAME.py           (--format python) kfactory/engines/export_runtime.py: ctypes + numpy + tokenizers

Before anything is written to DIR the renamed source is built with the Makefile's command and must export the
NAME_ functions and nothing else; the files are staged beside DIR and moved in at the end, so a failed export
leaves DIR as it was. The engine's code only runs in its child process (the re-verification), never here.
"""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kfactory.engines import export_c
from kfactory.engines.build import FLAGS, LINK, Unit, build, compiler
from kfactory.engines.campaign import VERIFIED, BestFileError, load_best
from kfactory.engines.design import BOUNDED_SPINS, DesignError, EngineDesign
from kfactory.engines.ops import OpKernelError, kernels_of, units_for
from kfactory.engines.prepare import FORMATS as TENSOR_FORMATS, LAYOUTS, Prepared, prepare
from kfactory.engines.verify import Verdict, Verifier
from kfactory.export import ExportError, check_name
from kfactory.export.c import ENGINE_MANIFEST_KIND, LINKER_SYMBOLS
from kfactory.export.rename import rename_symbols
from kfactory.models import ModelPackage, load_model
from kfactory.models.loader import list_models, sha256_of
from kfactory.models.tokenizer import Tokenizer
from kfactory.platform import scratch

FORMATS = ("c", "python")
ABI_VERSION = 1
#: the ABI's functions and types (kfactory/engines/codegen.py), each renamed kf_X -> NAME_X in the exported source
ABI_FUNCTIONS = ("engine_new", "prefill", "decode_step", "reset", "position", "engine_free", "abi_version",
                 "design_id", "last_error")
ABI_TYPES = ("tensor", "config")
#: the weights file (kfactory/engines/export_runtime.py documents it; NAME.h declares it for C)
MAGIC, FILE_VERSION, ALIGN = b"KFENGW01", 1, 64
HEADER = struct.Struct("<8s4I64s7i2f4x")
ENTRY = struct.Struct("<64s4iQQ")
RUNTIME = Path(__file__).with_name("export_runtime.py")
NM_TIMEOUT_S, BUILD_TIMEOUT_S = 60, 600


class NoVerifiedEngine(ExportError):
    """The model has no engine whose record shows it verified (or it no longer verifies): exit 1."""


class EngineUsageError(ExportError):
    """The command asks for something an engine export does not offer (a format, a target): exit 2."""


def is_model(text: str) -> bool:
    """Whether `text` names a model package (a built-in model or a directory with model.yaml), not a kernel."""
    return bool(text) and (text in list_models() or (Path(text) / "model.yaml").is_file())


@dataclass(frozen=True)
class Chosen:
    """The engine to export: its design, the campaign's result for it and the record it came from, and the
    verified source (the build cache's copy of what was compiled)."""
    design: EngineDesign
    result: dict[str, Any]
    record: dict[str, Any]
    source: str
    #: the searched op kernels it links in (kfactory/engines/ops.py), from the campaign record
    units: tuple[Unit, ...] = ()


def chosen_engine(package: ModelPackage, data_dir: Path) -> Chosen:
    """The best verified engine of `package`; NoVerifiedEngine when there is none, or its record does not show
    it verified, or its source is gone."""
    name = package.name
    run_first = f"run `kfactory engine run {name}` first"
    try:
        best = load_best(name, data_dir)
    except BestFileError as e:
        raise NoVerifiedEngine(str(e)) from e
    if best is None:
        raise NoVerifiedEngine(f"no verified engine for {name} (no {data_dir / 'engines' / name / 'best.json'}): "
                               f"{run_first}")
    record_path = Path(best.get("campaign", ""))
    if not record_path.is_file():
        raise NoVerifiedEngine(f"best.json of {name} names the campaign record {record_path}, which is gone: "
                               f"{run_first}")
    try:
        record = json.loads(record_path.read_text())
        result = record.get("best") or {}
        if not isinstance(result, dict):
            raise ValueError(f"its best is {type(result).__name__}, not a design's result")
    except (OSError, ValueError, AttributeError) as e:
        raise NoVerifiedEngine(f"the campaign record {record_path} that best.json of {name} names cannot be read "
                               f"({e}): {run_first}") from e
    if result.get("verdict") != VERIFIED or result.get("design_id") != best.get("design_id"):
        raise NoVerifiedEngine(f"the engine {best.get('design_id')} of {name} is not verified in its campaign "
                               f"record {record_path} (verdict {result.get('verdict')!r}): {run_first}")
    try:
        design = EngineDesign.from_dict(result["design"])
    except (DesignError, KeyError, TypeError) as e:
        raise NoVerifiedEngine(f"{record_path}: the best design cannot be read ({e}): {run_first}") from e
    source_path = _verified_source(Path(result.get("library") or "").with_suffix(".c"), data_dir)
    if design.design_id() != result["design_id"] or not source_path.is_file():
        raise NoVerifiedEngine(f"the verified source of {result['design_id']} ({source_path}) is not in the build "
                               f"cache any more: {run_first}")
    source = source_path.read_text()
    if f'#define KF_DESIGN_ID "{design.design_id()}"' not in source:
        raise NoVerifiedEngine(f"{source_path} was not generated for design {design.design_id()}: {run_first}")
    try:
        units = units_for(design, kernels_of(record))
    except OpKernelError as e:
        raise NoVerifiedEngine(f"{record_path}: {e}: {run_first}") from e
    return Chosen(design, result, record, source, units)


def _verified_source(recorded: Path, data_dir: Path) -> Path:
    """The verified source the record names, by its absolute path; in a workspace moved or copied since, the file
    of that name in this data directory's build cache (engines/, or the services' engines/artifacts/)."""
    if recorded.is_file():
        return recorded
    for where in (data_dir / "engines", data_dir / "engines" / "artifacts"):
        if (here := where / recorded.name).is_file():
            return here
    return recorded


def reverify(verifier: Verifier, chosen: Chosen, data_dir: Path) -> tuple[Verdict, bool]:
    """Build the verified source (a lookup in the build cache) and verify it again, in its child: the figures
    of every check go into the manifest. (verdict, whether the object is the very one the campaign verified)."""
    lib = build(chosen.source, data_dir / "engines", units=chosen.units)
    if not lib.ok or lib.path is None:
        raise NoVerifiedEngine(f"the verified source of {chosen.design.design_id()} no longer builds here:\n"
                               f"{lib.log.strip()[-2000:]}")
    verdict = verifier.verify(chosen.design, lib.path)
    if not verdict.passed:
        first = verdict.first_failure
        raise NoVerifiedEngine(f"the engine {chosen.design.design_id()} fails verification now "
                               f"({first.name if first else verdict.fault}): run `kfactory engine run "
                               f"{verifier.package.name}` again")
    return verdict, str(lib.path) == chosen.result.get("library")


def renamed_source(source: str, name: str) -> str:
    """The source with the ABI's functions and types renamed NAME_*; RenameError (an ExportError) when the
    source lacks one or already uses a new name."""
    renames = {f"kf_{x}": f"{name}_{x}" for x in (*ABI_FUNCTIONS, *ABI_TYPES)}
    return rename_symbols(source, renames)


def write_weights(path: Path, tensors: list[Prepared], design_id: str, config_fields: tuple) -> int:
    """NAME.weights: header, table, the tensors' bytes at ALIGN-aligned offsets. Returns its size in bytes."""
    offset = HEADER.size + ENTRY.size * len(tensors)
    entries = []
    for t in tensors:
        if len(t.name.encode()) >= 64:
            raise ExportError(f"tensor name {t.name!r} is longer than the weights file's 63 bytes")
        offset += -offset % ALIGN
        entries.append(ENTRY.pack(t.name.encode(), TENSOR_FORMATS[t.format], LAYOUTS[t.layout], t.rows, t.cols,
                                  offset, t.data.nbytes))
        offset += t.data.nbytes
    with path.open("wb") as f:
        f.write(HEADER.pack(MAGIC, FILE_VERSION, ABI_VERSION, len(tensors), 0, design_id.encode(), *config_fields))
        f.write(b"".join(entries))
        for t in tensors:
            f.write(bytes(-f.tell() % ALIGN))
            f.write(np.ascontiguousarray(t.data).view(np.uint8).reshape(-1).data)
        return f.tell()


def chat_split(tok: Tokenizer) -> dict[str, str] | None:
    """The chat template's text before and after a single user message, or None when the model has none.
    Rendered around two different messages: a template that changes the message (trims it, escapes it) cannot
    be applied by concatenation, and is refused rather than applied differently from `kfactory generate`."""
    if not tok.chat_template:
        return None
    probe = "kfactory probe \u00e9 1"
    text = tok.chat([{"role": "user", "content": probe}])
    if text.count(probe) != 1:
        raise ExportError("the model's chat template does not copy the message once; the exported module could "
                          "not apply it without Jinja2")
    prefix, suffix = text.split(probe)
    other = "  Another\nmessage, with spaces. "
    if tok.chat([{"role": "user", "content": other}]) != prefix + other + suffix:
        raise ExportError("the model's chat template changes the message text; the exported module could not "
                          "apply it without Jinja2")
    return {"prefix": prefix, "suffix": suffix}


def build_steps(name: str, units: tuple[Unit, ...]) -> list[list[str]]:
    """The commands that build libNAME.so ("{cc}": the compiler, "{out}": the library): each linked op kernel
    compiled with its own flags and every global but its entry made local (as kfactory.engines.build does),
    then the engine with those objects."""
    steps, objects = [], []
    for i, unit in enumerate(units):
        obj = f"{name}_op{i}.o"
        steps.append(["{cc}", "-x", "c", "-c", "-fPIC", *unit.flags, "-o", obj, f"{name}_op{i}.c"])
        steps.append(["objcopy", *(f"--keep-global-symbol={s}" for s in unit.exports), obj])
        objects.append(obj)
    steps.append(["{cc}", "-x", "c", *FLAGS, "-o", "{out}", f"{name}.c", "-x", "none", *objects, *LINK])
    return steps


def check_library(stage: Path, steps: list[list[str]], name: str) -> None:
    """Build libNAME.so in `stage` with the Makefile's commands and check that it exports exactly the ABI's
    functions under NAME_ (then remove it and the objects: the export ships the sources, built where it runs)."""
    stage = stage.resolve()   # the compiler runs in `stage`: a relative path would be read from there
    out = stage / f"lib{name}.so"
    try:
        for argv in steps:
            cmd = [compiler() if w == "{cc}" else str(out) if w == "{out}" else w for w in argv]
            proc = subprocess.run(cmd, cwd=stage, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            if proc.returncode != 0:
                raise ExportError(f"the renamed source does not build ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
        nm = subprocess.run(["nm", "-D", "--defined-only", str(out)], capture_output=True, text=True,
                            timeout=NM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ExportError(f"cannot build and inspect the engine library (a C compiler and nm are needed): {e}") \
            from e
    # every defined symbol, data too: a global the source forgot to make static would interpose another engine's
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()} - LINKER_SYMBOLS
    want = {f"{name}_{f}" for f in ABI_FUNCTIONS}
    if nm.returncode != 0 or exported != want:
        raise ExportError(f"lib{name}.so exports {sorted(exported)}, not exactly {sorted(want)}")
    out.unlink()
    for obj in stage.glob(f"{name}_op*.o"):
        obj.unlink()


def _claim_out(out: Path, name: str) -> None:
    """Refuse a directory that holds another export (one export per directory)."""
    manifest = out / "manifest.json"
    if (out / "build.sh").is_file():
        raise ExportError(f"{out} holds a kernel export (build.sh); choose another --out")
    if manifest.is_file():
        try:
            owner = json.loads(manifest.read_text()).get("name")
        except ValueError:
            owner = None
        if owner != name:
            raise ExportError(f"{out} holds another export ({owner or 'unreadable manifest.json'}); choose another "
                              "--out")


def _clear_earlier(out: Path, name: str, files: list[str]) -> None:
    """Remove what an earlier export under the same name left in `out` that this one does not replace: the files
    its manifest lists, and the library its Python module or Makefile built there (libNAME.so: of the earlier
    design, it would refuse the new weights), with that build's temporary files. Other files are the user's."""
    try:
        earlier = json.loads((out / "manifest.json").read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        earlier = {}   # none, or unreadable: _claim_out let it through only under this name
    stale = {f for f in earlier if isinstance(f, str) and "/" not in f and f not in files}
    stale |= {p.name for p in out.glob(f".lib{name}.so.*.tmp")}
    stale |= {f"lib{name}.so", f"lib{name}.so.sources", "manifest.json"}
    stale |= {p.name for p in out.glob(f"{name}_op*.o")}
    for fname in stale:
        (out / fname).unlink(missing_ok=True)


def spin_note(design: EngineDesign) -> str:
    """What a user of an exported spinning design should know: its idle threads hold their cores between calls
    too, and how to make them wait instead (the Python module sets the manifest's OpenMP variables only where
    they are unset; a C program sets them itself, NAME.h)."""
    return (f"note: {design.design_id()} spins (OMP_WAIT_POLICY=active): its {design.threads} threads hold their "
            "cores between calls too, not only within a step; where the engine waits for requests beside other "
            f"work, set GOMP_SPINCOUNT={BOUNDED_SPINS} (libgomp's bounded spin, which then sleeps) or "
            "OMP_WAIT_POLICY=passive in its environment before it loads, at some cost in tokens/s")


def export_engine(model: str, fmt: str, name: str, out_dir: Path | str, data_dir: Path | str,
                  verifier: Verifier | None = None, progress: Callable[[str], None] | None = None) -> list[Path]:
    """Export `model`'s best verified engine into out_dir (see the module docstring); the paths written.
    EngineUsageError for a format an engine has not, NoVerifiedEngine when there is no verified engine,
    ExportError when the export cannot be made (nothing is written then). `progress` hears what takes long."""
    if fmt not in FORMATS:
        raise EngineUsageError(f"--format {fmt!r}: an engine exports as {' or '.join(FORMATS)}")
    check_name(name)
    # absolute: the export's library is built with the compiler running inside the staging directory
    out, data_dir = Path(out_dir).resolve(), Path(data_dir)
    # before the verification (a minute on a real model), not after it
    if blocker := next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None):
        raise ExportError(f"--out {out_dir}: {blocker} is a file, not a directory; name a directory")
    _claim_out(out, name)
    package = load_model(model)
    chosen = chosen_engine(package, data_dir)
    if progress is not None:
        if chosen.design.spin:
            progress(spin_note(chosen.design))
        progress(f"verifying {chosen.design.design_id()} of {package.name} again (the manifest records every "
                 "check's figures)")
    verifier = verifier or Verifier(model, cache_dir=data_dir / "models",
                                    reference_dir=data_dir / "engines" / "reference")
    verdict, same_object = reverify(verifier, chosen, data_dir)
    source = renamed_source(chosen.source, name)
    out.parent.mkdir(parents=True, exist_ok=True)
    # an export killed midway leaves its hidden stage beside the user's directory: the next export there removes it
    with scratch.owned_tempdir(f".{out.name}.kf-export", out.parent) as stage:
        files = _stage_files(stage, name, fmt, package, chosen, verifier, verdict, same_object, source)
        out.mkdir(parents=True, exist_ok=True)
        _clear_earlier(out, name, files)
        written = []
        for fname in files:
            (stage / fname).replace(out / fname)
            written.append(out / fname)
        return written


def _stage_files(stage: Path, name: str, fmt: str, package: ModelPackage, chosen: Chosen, verifier: Verifier,
                 verdict: Verdict, same_object: bool, source: str) -> list[str]:
    """Write every file into `stage`, manifest.json last; their names."""
    model, design = verifier.model, chosen.design
    c = model.config
    tok = model.tokenizer
    chat = chat_split(tok)
    steps = build_steps(name, chosen.units)
    argv = steps[-1]
    prompt = package.spec.prompts[0] if package.spec.prompts else "Hello"
    ids = tok.encode(chat["prefix"] + prompt + chat["suffix"] if chat else prompt)
    omp = design.omp_env()
    omp_set = {k: v for k, v in omp.items() if v is not None}
    values = {"NAME": name, "MODEL": package.name, "DESIGN_ID": design.design_id(),
              "DESIGN": export_c.c_comment(design.as_dict()), "THREADS": str(design.threads),
              "WAIT": omp["OMP_WAIT_POLICY"] or "", "SPINS": omp["GOMP_SPINCOUNT"] or "",
              "OMPENV": " ".join(f"{k}={v}" for k, v in omp_set.items()),
              "VOCAB": str(c.vocab),
              "CONTEXT": str(c.context_length), "EOS": str(tok.eos_id if tok.eos_id is not None else -1),
              "VERDICT": export_c.c_comment(verdict.summary().splitlines()[0]),
              "BUILD": export_c.c_comment(" && ".join(" ".join(s) for s in steps))}
    (stage / f"{name}.c").write_text(source)
    for i, unit in enumerate(chosen.units):
        (stage / f"{name}_op{i}.c").write_text(unit.source)
    (stage / f"{name}.h").write_text(export_c.header_text(values))
    (stage / f"{name}_example.c").write_text(export_c.example_text(values))
    (stage / "Makefile").write_text(export_c.makefile_text(values, FLAGS, LINK, ids, steps[:-1]))
    (stage / "tokenizer.json").write_text(tok.hf.to_str())
    check_library(stage, steps, name)
    config_fields = (c.blocks, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab, c.rope_base, c.rms_eps)
    tensors = prepare(model, design)
    weights_bytes = write_weights(stage / f"{name}.weights", tensors, design.design_id(), config_fields)
    if fmt == "python":
        shutil.copyfile(RUNTIME, stage / f"{name}.py")
    files = sorted(p.name for p in stage.iterdir())
    res, record = chosen.result, chosen.record
    manifest = {
        "kind": ENGINE_MANIFEST_KIND, "name": name, "format": fmt, "model": package.name,
        "model_file": {"path": str(model.path), "sha256": sha256_of(model.path)},
        "design_id": design.design_id(), "design": design.as_dict(), "abi_version": ABI_VERSION,
        "config": c.as_dict(), "threads": design.threads, "omp_wait_policy": values["WAIT"],
        "omp_env": omp_set,
        "build": {"cc": compiler(), "flags": list(FLAGS), "link": list(LINK), "argv": argv, "steps": steps,
                  "artifact": f"lib{name}.so"},
        "weights": {"file": f"{name}.weights", "bytes": weights_bytes, "tensors": len(tensors),
                    "file_version": FILE_VERSION},
        "tokenizer": {"file": "tokenizer.json", "bos_id": tok.bos_id, "eos_id": tok.eos_id, "add_bos": tok.add_bos,
                      "chat": chat},
        "verification": {**verdict.as_dict(), "summary": verdict.summary(), "same_object_as_campaign": same_object},
        "campaign": {"record": record.get("path"), "verdict": res["verdict"], "tolerance": record.get("tolerance"),
                     "decode_tok_s": res.get("decode_tok_s"), "prefill_tok_s": res.get("prefill_tok_s"),
                     "timings": res.get("timings"), "verify_s": res.get("verify_s"), "bench": record.get("bench")},
        "example_ids": ids,
        "files": {f: sha256_of(stage / f) for f in files},
    }
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return [*files, "manifest.json"]


def command(args: Any, data_dir: Path | str) -> int:
    """`kfactory export MODEL ...` (kfactory.export.command dispatches here when the first argument names a
    model): the paths written, or one line and exit 1 (no verified engine, an export that cannot be made) or 2
    (a format or flag an engine export does not take)."""
    from kfactory.models import ModelError

    def say(text: str) -> None:
        print(f"kfactory export: {text}", file=sys.stderr)

    try:
        if args.shape:
            raise EngineUsageError("--shape chooses a problem's kernel; an engine export takes none")
        if args.target not in ("", "cpu"):
            raise EngineUsageError(f"--target {args.target}: engines run on the cpu target only")
        paths = export_engine(args.kernel, args.fmt, args.name, args.out, data_dir, progress=say)
    except EngineUsageError as exc:
        say(str(exc))
        return 2
    except (ExportError, ModelError) as exc:
        say(str(exc))
        return 1
    if getattr(args, "as_json", False):
        print(json.dumps({"model": args.kernel, "format": args.fmt, "files": [str(p) for p in paths]}, indent=2))
    else:
        print("\n".join(str(p) for p in paths))
    return 0
