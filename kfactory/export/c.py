"""`--format c`: the kernel's source with its entry renamed, a header declaring it with its evidence, and a
build.sh that builds it with the flags it was measured with (libNAME.so on the cpu, NAME.cubin on cuda).

Every file this writes is checked before the export returns: the cpu source is built with build.sh's own
command and its shared object must export NAME and nothing else (a global helper of the source is renamed
NAME_<symbol>, so two exported kernels never interpose each other's helpers); the cuda build script is run
where the toolchain is installed and its cubin must hold NAME."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kfactory.export.errors import ExportError
from kfactory.export.evidence import Judged, c_comment, hash_comment, summary_lines
from kfactory.export.rename import rename_entry, rename_signature, rename_symbols
from kfactory.export.templates import fill
from kfactory.platform import scratch
from kfactory.targets.flags import FlagRefused, check_flags

SUFFIX = {"c": ".c", "cpp": ".cpp", "cuda": ".cu", "ptx": ".ptx"}
CC_LANG = {"c": "c", "cpp": "c++"}
#: symbols the linker defines in every shared object (older binutils list them as exported)
LINKER_SYMBOLS = frozenset({"_init", "_fini", "_edata", "_end", "__bss_start"})
BUILD_TIMEOUT_S = 300
#: the line that says which export a directory's build.sh belongs to
OWNER = "# kfactory-export: {name}"
#: build.sh's line that lists the files the export wrote (the only ones a later export of NAME may replace)
WROTE = "# kfactory-export-files: "
#: build_cubin.py's exit status when cuda-bindings/NVRTC/nvJitLink cannot be imported
TOOLCHAIN_MISSING = 3


@dataclass(frozen=True)
class Build:
    """How an export is built: argv (with {out} where the artifact goes, and {cc} for the C compiler) run in
    the export's directory, the artifact it writes, and the C compiler the candidate was measured with."""
    argv: list[str]
    artifact: str
    cc: str = ""

    def config(self) -> dict:
        return {"argv": list(self.argv), "artifact": self.artifact, "cc": self.cc}


def source_name(j: Judged, name: str) -> str:
    if j.candidate.language not in SUFFIX:
        raise ExportError(f"cannot export a kernel in language {j.candidate.language!r}")
    return name + SUFFIX[j.candidate.language]


def cpu_build(j: Judged, name: str) -> Build:
    """The cpu target's compile command (kfactory.targets.cpu.target.CpuTarget.compile), output renamed."""
    try:
        words = check_flags("cpu", j.candidate.compile_flags)
    except FlagRefused as exc:
        raise ExportError(f"the candidate's flags are refused: {exc}") from exc
    compiler = j.compiler().split()
    # the compiler's name goes into build.sh: a name that is not a plain path is not trusted there
    cc = compiler[0] if compiler and re.fullmatch(r"[A-Za-z0-9_./+-]+", compiler[0]) else "cc"
    argv = ["{cc}", "-x", CC_LANG[j.candidate.language], "-shared", "-fPIC", *words, "-o", "{out}",
            source_name(j, name), "-x", "none", "-Wl,-z,defs", "-lm"]
    return Build(argv, f"lib{name}.so", cc)


def cuda_build(name: str) -> Build:
    return Build(["{python}", "build_cubin.py"], f"{name}.cubin")


def build_for(j: Judged, name: str) -> Build:
    return cuda_build(name) if j.target_kind == "cuda" else cpu_build(j, name)


def build_sh(j: Judged, build: Build, name: str) -> str:
    """A POSIX sh script that builds the artifact atomically (a temporary file, then mv)."""
    tmp = f".{build.artifact}.$$.tmp"
    words = []
    for word in build.argv:
        if word == "{cc}":
            words.append(f'"${{CC:-{build.cc}}}"')
        elif word == "{python}":
            words.append('"${PYTHON:-python3}"')
        elif word == "{out}":
            words.append(f'"{tmp}"')
        else:
            words.append(shlex.quote(word))
    lines = ["#!/bin/sh", OWNER.format(name=name),
             f"# Builds {build.artifact} exactly as kfactory compiled the kernel it measured."]
    if j.target_kind == "cuda":
        lines += ["# PYTHON: an interpreter with cuda-bindings, nvidia-cuda-nvrtc, nvidia-nvjitlink installed.",
                  f"# Architecture {j.arch()}: the cubin runs on that GPU generation only.", ""]
        body = ["set -eu", 'cd "$(dirname "$0")"', " ".join(words)]
    else:
        lines += ["# CC: the C compiler (default: the one kfactory used). Flags such as -march=native build for",
                  "# the machine this runs on, which may not be the machine the kernel was measured on.", ""]
        body = ["set -eu", 'cd "$(dirname "$0")"', " ".join(words), f'mv -f "{tmp}" {shlex.quote(build.artifact)}']
    return "\n".join(lines) + "\n" + hash_comment(_sh_lines(j)) + "\n" + "\n".join(body) + "\n"


def _sh_lines(j: Judged) -> list[str]:
    c = j.candidate
    return [f"candidate {c.id} ({c.origin}), flags '{c.compile_flags}'"]


def header(j: Judged, problem, name: str, evidence: list[str]) -> str:
    """NAME.h: the evidence as a comment, then the ABI's declaration with the entry renamed."""
    kind = j.target_kind
    abi = problem.spec.abi.get(kind)
    if abi is None:
        raise ExportError(f"problem {problem.name} has no ABI for target {kind}")
    signature = rename_signature(abi.signature, name)
    guard = f"KF_EXPORT_{name.upper()}_H"
    notes = " ".join(abi.notes.split())
    parts = [c_comment(evidence + ([f"ABI notes: {notes}"] if notes else [])),
             f"#ifndef {guard}\n#define {guard}\n"]
    if problem.spec.params:
        parts.append(params_block(problem, name, abi.args))
    if kind == "cuda":
        parts.append(_cuda_header_body(j, problem, name, signature))
    else:
        parts.append("#include <stdint.h>\n\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n"
                     f"{signature};\n\n#ifdef __cplusplus\n}}\n#endif\n")
    parts.append(f"\n#endif /* {guard} */\n")
    return "\n".join(parts)


def params_block(problem, name: str, args: list[str]) -> str:
    """The problem's params in NAME.h: a macro NAME_DEFAULT_<PARAM> with the problem's value (its problem.yaml's
    at export) for each one the kernel takes as an argument, a comment for each one compiled in."""
    lines = ["The problem's params, as its problem.yaml gives them at export (a campaign verifies and times with the",
             "values it gives when the campaign starts):"]
    macros = []
    for n, p in problem.spec.params.items():
        rng = "" if p.min is None and p.max is None else \
            f", declared range [{'-inf' if p.min is None else p.min}, {'inf' if p.max is None else p.max}]"
        if n in args:
            macro = f"{name.upper()}_DEFAULT_{n.upper()}"
            lines.append(f"  {n}: {p.type} argument, default {p.value!r} ({macro}){rng}")
            # repr of a Python float is a valid C double literal (1e-06, 2.5); ints are plain
            macros.append(f"#define {macro} {p.value!r}")
        else:
            lines.append(f"  {n} = {p.value!r}: compiled into the kernel, not an argument")
    return c_comment(lines) + "".join(m + "\n" for m in macros)


def _cuda_header_body(j: Judged, problem, name: str, signature: str) -> str:
    from kfactory.targets.cuda.launch import evaluate_launch

    rule = j.launch or {}
    lines = [f"Launch rule (Python expressions over the shape symbols {', '.join(problem.spec.symbols)}"
             + (f" and the parameters {rule.get('params')}" if rule.get("params") else "") + "):"]
    lines += [f"  {key} = {rule.get(key, '0')}" for key in ("grid", "block", "smem")]
    lines.append("At the shapes kfactory measured:")
    for shape in problem.shapes("optimize"):
        try:
            launch = evaluate_launch(rule, shape)
            lines.append(f"  {problem.shape_str(shape)}: grid {launch.grid}, block {launch.block}, "
                         f"dynamic shared memory {launch.smem} bytes")
        except ValueError as exc:
            lines.append(f"  {problem.shape_str(shape)}: no launch ({exc})")
    return (c_comment(lines)
            + f'#define {name.upper()}_ENTRY "{name}"    /* cuModuleGetFunction(&fn, module, {name.upper()}_ENTRY) */\n'
            + f'#define {name.upper()}_CUBIN "{name}.cubin"    /* built by build.sh */\n'
            + f'#define {name.upper()}_ARCH "{j.arch()}"\n\n'
            + f"#ifdef __CUDACC__\n{signature};\n#endif\n")


def build_cubin_script(j: Judged, name: str) -> str:
    """build_cubin.py: NVRTC and nvJitLink with the options kfactory's cuda target used."""
    from kfactory.targets.cuda.link import link_options
    from kfactory.targets.cuda.nvrtc import candidate_flags

    arch = j.arch()
    if not arch:
        raise ExportError(f"candidate {j.candidate.id[:12]}: the evidence names no cuda architecture")
    flags = j.candidate.compile_flags
    try:
        config = {"source": source_name(j, name), "language": j.candidate.language, "entry": name,
                  "cubin": f"{name}.cubin", "arch": arch,
                  # NVRTC emits PTX for the virtual architecture (sm_90a -> compute_90a), as the cuda target does
                  "nvrtc_options": [f"-arch=compute_{arch[len('sm_'):]}", "--std=c++17", "-default-device"],
                  "candidate_flags": candidate_flags(flags), "link_options": link_options(arch, flags)}
    except FlagRefused as exc:
        raise ExportError(f"the candidate's flags are refused: {exc}") from exc
    doc = (f"Builds {name}.cubin ({arch}) from {config['source']} with NVRTC and nvJitLink, as kfactory compiled "
           f"candidate {j.candidate.id[:12]}.\nNeeds: pip install cuda-bindings nvidia-cuda-nvrtc nvidia-nvjitlink "
           "nvidia-cuda-runtime (no GPU needed).\nExit status: 0 built, 1 refused, 3 the toolchain is missing.\n")
    return fill("_build_cubin.py", doc, config)


#: what an export of NAME leaves in its directory, written by it or built from it (NAME.cubin, libNAME.so): an
#: export into a directory that holds NAME's earlier export removes them first, so that no file of the earlier
#: kernel (its module, its parameters, its built library) is left beside the new one
PRODUCTS = ("{name}.h", "{name}.py", "{name}_torch.py", "{name}_params.h", "lib{name}.so", "{name}.cubin",
            "build_cubin.py", "build.sh")


def check_owner(out_dir: Path, name: str, writes: list[str]) -> None:
    """Refuse to write into a directory holding another export: its build.sh would be overwritten and its
    module would build this kernel; an engine export (its manifest.json) likewise. Where no export of NAME is
    there yet, refuse too when any of the files it `writes` is: the user's own, which it would write over."""
    existing = out_dir / "build.sh"
    lines = existing.read_text(errors="replace").splitlines() if existing.is_file() else []
    if existing.is_file() and OWNER.format(name=name) not in lines:
        raise ExportError(f"{out_dir} holds a build.sh that no export of {name} wrote (another export's, or your "
                          "own): export each kernel into a directory of its own")
    if _engine_manifest(out_dir / "manifest.json"):
        raise ExportError(f"{out_dir} holds an engine export (manifest.json); choose another --out")
    # (lexists: a dangling symbolic link would have the export write wherever it points)
    ours = _wrote(lines)
    theirs = sorted(f for f in writes if os.path.lexists(out_dir / f) and f not in ours)
    if existing.is_file() and ours is ALL:   # an export made before it listed its files: as it was then
        theirs = []
    if theirs:
        raise ExportError(f"{out_dir} holds {', '.join(theirs)}, which no export of {name} wrote: the export would "
                          "write over it; choose another --out or --name")


#: an engine export's manifest.json says what it is (kfactory/engines/export.py writes it)
ENGINE_MANIFEST_KIND = "kfactory engine export"


def _engine_manifest(path: Path) -> bool:
    """Whether `path` is an engine export's manifest (its "kind"), not some other project's manifest.json."""
    try:
        return json.loads(path.read_text()).get("kind") == ENGINE_MANIFEST_KIND
    except (OSError, ValueError, AttributeError):  # none, unreadable, not JSON, or JSON that is no object
        return False


#: what _wrote answers for an export that did not list its files (made before it did): any of PRODUCTS
ALL: frozenset[str] = frozenset({"*"})


def _wrote(build_sh_lines: list[str]) -> frozenset[str]:
    """The files an earlier export listed in its build.sh (WROTE); ALL when it listed none, empty without one."""
    if not build_sh_lines:
        return frozenset()
    listed = [line[len(WROTE):].split() for line in build_sh_lines if line.startswith(WROTE)]
    # (a name with a slash is none an export writes: never a path out of the directory)
    return frozenset(f for f in listed[0] if "/" not in f) if listed else ALL


def clear_previous(out_dir: Path, name: str) -> None:
    """Remove what an earlier export of NAME left in out_dir, once check_owner has passed: the files its build.sh
    lists, and what its module or build.sh built from them (libNAME.so, NAME.cubin); for an export made before
    exports listed their files, PRODUCTS and its source in any language (a c export after a cuda one leaves no
    NAME.cu). Only where that export's build.sh is there: a directory without one is not an export's, and a
    NAME.py in it is the user's own."""
    build_sh = out_dir / "build.sh"
    if not build_sh.is_file():
        return
    ours = _wrote(build_sh.read_text(errors="replace").splitlines())
    every = PRODUCTS + tuple("{name}" + suffix for suffix in sorted(set(SUFFIX.values())))
    built = ("lib{name}.so", "{name}.cubin")
    for pattern in every if ours is ALL else (*sorted(ours), *built):
        path = out_dir / pattern.format(name=name)
        if path.is_file() or path.is_symlink():
            path.unlink()


def write_c(j: Judged, problem, name: str, out_dir: Path, also: tuple[str, ...] = ()) -> list[Path]:
    """Write NAME.h, the renamed source, build.sh (and build_cubin.py on cuda) into out_dir; checked as the
    module docstring says (`also`: the files the caller writes beside them, for check_owner). Returns the paths
    written."""
    cuda_only = ["build_cubin.py"] if j.target_kind == "cuda" else []
    writes = ["build.sh", f"{name}.h", source_name(j, name), *cuda_only, *also]
    check_owner(out_dir, name, writes)
    source = rename_entry(j.source, j.candidate.entry or "kernel", name, j.candidate.language)
    build = build_for(j, name)
    files = {"build.sh": build_sh(j, build, name)}
    if j.target_kind == "cuda":
        files["build_cubin.py"] = build_cubin_script(j, name)
        files[source_name(j, name)] = source
        _check_cuda(files, build, name)
    else:
        source = _exports_only(j, files["build.sh"], source, name)
        files[source_name(j, name)] = source
    files[f"{name}.h"] = header(j, problem, name, summary_lines(j, problem, name))
    out_dir.mkdir(parents=True, exist_ok=True)
    # again: the build above takes seconds, and a file the user made meanwhile is as much theirs (the first check
    # only spared them the wait)
    check_owner(out_dir, name, writes)
    clear_previous(out_dir, name)
    assert set(files) <= set(writes), "write_c writes a file check_owner did not check"
    files["build.sh"] = files["build.sh"].rstrip("\n") + f"\n{WROTE}{' '.join(sorted(writes))}\n"
    written = []
    for fname, text in files.items():
        path = out_dir / fname
        path.write_text(text)
        if fname == "build.sh":
            path.chmod(0o755)
        written.append(path)
    return written


@dataclass
class _Built:
    returncode: int
    artifact: bytes | None
    log: str


def _run_build(files: dict[str, str], artifact: str) -> _Built:
    """Run build.sh over `files` in a scratch directory (PYTHON: this interpreter, for the cuda script)."""
    with scratch.owned_tempdir("kf-export") as tmp:   # (one a killed export left, the next removes)
        for fname, text in files.items():
            (tmp / fname).write_text(text)
        try:
            proc = subprocess.run(["sh", str(tmp / "build.sh")], capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S, env={**os.environ, "PYTHON": sys.executable})
        except subprocess.TimeoutExpired as exc:
            raise ExportError(f"building {artifact} ran past {BUILD_TIMEOUT_S}s") from exc
        path = tmp / artifact
        ok = proc.returncode == 0 and path.is_file()
        return _Built(proc.returncode, path.read_bytes() if ok else None, (proc.stderr + proc.stdout)[-3000:])


def _exports_only(j: Judged, script: str, source: str, name: str) -> str:
    """The renamed cpu source, such that its shared object exports NAME and nothing else but NAME_<symbol>: any
    other global symbol of the source (a helper or a table not declared static) is renamed so. Unrenamed, two
    exported kernels with a helper of one name would interpose each other's at run time; the flags are the
    measured ones, so the symbols cannot be hidden by a visibility flag instead. Raises ExportError when it does
    not build or cannot be made to."""
    fname = source_name(j, name)
    renamed: set[str] = set()
    for attempt in range(2):
        built = _run_build({"build.sh": script, fname: source}, f"lib{name}.so")
        if built.artifact is None:
            raise ExportError(f"the renamed source does not build with the measured flags (exit "
                              f"{built.returncode}: {_first_line(built.log)})")
        exported = _exported_symbols(built.artifact)
        others = sorted(exported - {name} - {f"{name}_{s}" for s in renamed})
        if name in exported and not others:
            return source
        if attempt or name not in exported:
            raise ExportError(f"lib{name}.so exports {sorted(exported)}: expected {name!r} (and helpers named "
                              f"{name}_*)")
        source = rename_symbols(source, {s: f"{name}_{s}" for s in others}, j.candidate.language)
        renamed.update(others)
    raise AssertionError("unreachable")


def _exported_symbols(lib: bytes) -> set[str]:
    """The global symbols a shared object defines (nm -D --defined-only), less the linker's own."""
    nm = shutil.which("nm")
    if nm is None:
        raise ExportError("nm (binutils) is needed to check what the shared object exports")
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(lib)
        f.flush()
        proc = subprocess.run([nm, "-D", "--defined-only", f.name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExportError(f"nm could not read the shared object: {_first_line(proc.stderr)}")
    names = set()
    for line in proc.stdout.splitlines():
        parts = line.split()
        # "<address> <type> <name>": an uppercase type is a global symbol (lowercase ones are local)
        if len(parts) == 3 and parts[1].isupper() and parts[2] not in LINKER_SYMBOLS:
            names.add(parts[2].split("@", 1)[0])
    return names


def _check_cuda(files: dict[str, str], build: Build, name: str) -> None:
    """Run the build script where the toolchain is installed; its cubin must hold NAME. Without the toolchain
    the check is skipped (the files are still right; only their build is unproven here)."""
    built = _run_build(files, build.artifact)
    if built.returncode == TOOLCHAIN_MISSING:
        print(f"kfactory export: not checked: {build.artifact} cannot be built here (no CUDA toolchain)",
              file=sys.stderr)
        return
    if built.artifact is None:
        raise ExportError(f"the renamed source does not build with the measured options (exit "
                          f"{built.returncode}: {_first_line(built.log)})")
    from kfactory.targets.cuda.report import cubin_functions

    if name not in cubin_functions(built.artifact):
        raise ExportError(f"{build.artifact} does not define {name!r}")


def _first_line(text: str, limit: int = 300) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    flat = " | ".join(lines[-3:]) if lines else "no output"
    return flat if len(flat) <= limit else flat[:limit] + "..."
