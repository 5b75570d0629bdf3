"""The compile-flag whitelist (kfactory.targets.flags): every form that can run a program, load code, read or write
files in the compiler service is refused, at the root of the cpu and cuda compiles, with the rule named; every
built-in family, reference kernel and agent-allowed flag passes. The cuda checks need no GPU and no cuda-bindings."""
from __future__ import annotations

import random
import subprocess
import types

import pytest

from kfactory.platform.config import Settings
from kfactory.problems import list_problems, load_problem
from kfactory.targets.cpu import target as cpu_mod
from kfactory.targets.cuda import arch as cuda_arch
from kfactory.targets.cuda import compile as cc
from kfactory.targets.cuda import cubin_cache, link, nvrtc, toolchain
from kfactory.targets.flags import FLAG_TARGETS, FlagRefused, check_flags
from kfactory.v1 import events_pb2 as pb

#: the reproduction of issue 22 defect 3: -wrapper runs `sh -c 'touch PWNED; exec "$0" "$@"'` around cc1
EXPLOIT = '-O2 -wrapper /bin/sh,-c,touch${IFS}PWNED;exec${IFS}"$0"${IFS}"$@"'

KERNEL = """void kernel(float *y, long n) {
    for (long i = 0; i < n; i++) y[i] = (float)(BLOCK * VEC) + (float)i;
}
"""
TINY_CUDA = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }'
MACRO_CUDA = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = (float)(BLOCK * VEC); }'

# (flags, the rule the refusal names): every form the issue lists, and a few more
CPU_REFUSED = [
    ("-wrapper /bin/sh,-c,true", "-wrapper"),
    ("-fplugin=/tmp/evil.so", "-fplugin"),
    ("-fplugin-arg-evil-x=y", "-fplugin"),
    ("-fdump-tree-all", "files written"),
    ("-fdump-rtl-expand=/tmp/x", "files written"),
    ("-fprofile-generate=/tmp/p", "files written"),
    ("-fprofile-use=/tmp/p", "files read"),
    ("-fdebug-prefix-map=/a=/b", "path maps"),
    ("-ffile-prefix-map=/a=/b", "path maps"),
    ("-frecord-gcc-switches", "path maps"),
    ("-fstack-usage", "files written"),
    ("-fcallgraph-info=su", "files written"),
    ("-save-temps", "files written"),
    ("-save-temps=obj", "files written"),
    ("-fsave-optimization-record", "files written"),
    ("-fopt-info-vec=/tmp/x", "files written"),
    ("-fdiagnostics-format=sarif-file", "files written"),
    ("-gsplit-dwarf", "files written"),
    ("-specs=/tmp/evil.specs", "-specs"),
    ("--specs=/tmp/evil.specs", "-specs"),
    ("-B/tmp/evil", "-B"),
    ("-B /tmp/evil", "-B"),
    ("-fuse-ld=/tmp/ld", "-fuse-ld"),
    ("@/tmp/flags.rsp", "@file"),
    ("-x c", "driver modes"),
    ("-o /tmp/out.so", "files written"),
    ("-Wl,-rpath,/tmp", "-Wl,"),
    ("-Wa,-alh=/tmp/x", "-Wl,"),
    ("-Wp,-MD,/tmp/x", "-Wl,"),
    ("-Wl", "-Wl,"),
    ("-Xlinker -rpath", "-Xlinker"),
    ("-Xassembler --version", "-Xassembler"),
    ("-Xpreprocessor -MD", "-Wl,"),
    ("-Xclang -load", "-fplugin"),
    ("-mllvm -stats", "-mllvm"),
    ("--param max-inline-insns-auto=/tmp/x", "--param"),
    ("--param=lto-partition=/tmp", "--param"),
    ("-include /etc/passwd", "files read"),
    ("-imacros /etc/passwd", "files read"),
    ("-I/etc", "files read"),
    ("-I /etc", "files read"),
    ("-isystem /etc", "files read"),
    ("-iquote /etc", "files read"),
    ("-idirafter /etc", "files read"),
    ("-iprefix /tmp/", "files read"),
    ("--sysroot=/tmp", "files read"),
    ("-L/tmp", "-L/-l"),
    ("-lfoo", "-L/-l"),
    ("-dumpdir /tmp/", "files written"),
    ("-dumpbase x", "files written"),
    ("-MD", "files written"),
    ("-MMD", "files written"),
    ("-MF /tmp/deps", "files written"),
    ("-M", "files written"),
    ("-print-prog-name=cc1", "driver modes"),
    ("-print-search-dirs", "driver modes"),
    ("--help", "driver modes"),
    ("-v", "driver modes"),
    ("-###", "driver modes"),
    ("-m32", "architecture"),
    ("-fsanitize=address", "instrumentation"),
    ("-finstrument-functions", "instrumentation"),
    ("-DA=__asm__", "-D"),                      # a macro value may not re-spell what the source rules refuse
    ("-D 'A=system'", "-D"),
    ('-DP="/etc/passwd"', "-D"),
    ("-D", "-D"),
    ("/etc/passwd", "input files"),
    ("-O2 -fno-such-thing", "-fno-such-thing"),
    ("'-O2", "unparsable"),
]

CUDA_REFUSED = [
    ("-I/etc", "files read"),
    ("-I /etc", "files read"),
    ("--include-path=/etc", "files read"),
    ("-include /etc/passwd", "files read"),
    ("--pre-include=/etc/passwd", "files read"),
    ("-arch=sm_80", "architecture"),
    ("--gpu-architecture=compute_80", "architecture"),
    ("-rdc=true", "output kind"),
    ("-dc", "output kind"),
    ("-dlto", "output kind"),
    ("--dlink-time-opt", "output kind"),
    ("--time=/tmp/t.csv", "files written"),
    ("--fdevice-time-trace=/tmp/t.json", "files written"),
    ("--create-pch=/tmp/x.pch", "files written"),
    ("--use-pch=/tmp/x.pch", "files read"),
    ("--pch-dir=/tmp", "files read"),
    ("-Xptxas --output-file=/tmp/x", "-Xptxas"),
    ("-Xptxas=--options-file=/etc/passwd", "-Xptxas"),
    ("-Xptxas -v,--input-as-string=x", "-Xptxas"),
    ("-DA=asm", "-D"),
    ("-maxrregcount", "-maxrregcount"),
    ("-maxrregcount many", "-maxrregcount"),
    ("--no-such-flag", "--no-such-flag"),
    ("-wrapper /bin/sh", "-wrapper"),
    ("@/tmp/opts", "@file"),
    ("-Ofast", "-Ofast"),
    ("'-O3", "unparsable"),
]

CPU_ALLOWED = [
    "-O2 -fopenmp",
    "-O3 -march=native -ffast-math -fopenmp",
    "-D BLOCK=16 -DVEC=8 -std=c11 -Wall -Wextra -Wno-unused-parameter -Werror=vla",
    "-Ofast -mtune=generic -mavx2 -mfma -mno-avx512f -msse4.2 -mprefer-vector-width=256",
    "-O3 --param max-unroll-times=4 --param=max-completely-peel-times=8 -funroll-loops -fno-tree-slp-vectorize",
    "-O2 -ffp-contract=fast -fno-math-errno -fno-trapping-math -fexcess-precision=fast -falign-loops=32 -g",
    "-Os -fopenmp-simd -fno-semantic-interposition -fomit-frame-pointer -w",
]

CUDA_ALLOWED = [
    "-O3", "--use_fast_math", "-use_fast_math", "--ftz=true --prec-div=false --prec-sqrt=false --fmad=true",
    "-maxrregcount=64", "--maxrregcount 64", "-Xptxas -v", "-Xptxas=-v", "-Xptxas -O3", "--ptxas-options=-O2",
    "-Xptxas -v,-O3", "-Xptxas -warn-spills,-dlcm=ca", "--std=c++17", "-std=c++17", "-D BLOCK=16",
    "-DVEC=4 -DEPS=1e-5f", "-lineinfo", "--extra-device-vectorization", "-default-device", "--restrict", "-w",
    "--diag-suppress=177",
]


@pytest.fixture
def target(tmp_path):
    """The real cpu target (no device measurement: compile alone never asks for one)."""
    return cpu_mod.make("", Settings(data_dir=tmp_path / "data", threads=1))


@pytest.fixture
def no_cc(monkeypatch):
    """The cpu target's subprocess module, replaced so that running anything fails the test."""
    def run(*args, **kwargs):
        raise AssertionError(f"the compiler was run: {args[0] if args else kwargs}")
    monkeypatch.setattr(cpu_mod, "subprocess", types.SimpleNamespace(run=run, TimeoutExpired=subprocess.TimeoutExpired))


@pytest.fixture
def no_toolchain(monkeypatch):
    """NVRTC/nvJitLink made untouchable: a refusal must come before the toolchain is asked anything."""
    def touched():
        raise AssertionError("the cuda toolchain was touched")
    for module in (toolchain, nvrtc, link, cubin_cache, cuda_arch):   # every module that looks _toolchain up
        monkeypatch.setattr(module, "_toolchain", touched)


# ------------------------------------------------------------------------------------------------------ cpu


@pytest.mark.parametrize("flags,rule", CPU_REFUSED)
def test_cpu_refuses(flags, rule):
    with pytest.raises(FlagRefused) as info:
        check_flags("cpu", flags)
    text = str(info.value)
    assert f"refused: {info.value.rule}" in text and rule in info.value.rule
    assert text.startswith(f"flag {info.value.flag!r}: ") and "allowed: optimisation" in text


@pytest.mark.parametrize("flags,rule", CPU_REFUSED)
def test_cpu_compile_refuses_without_running_cc(target, no_cc, flags, rule):
    res = target.compile(KERNEL, "c", flags, "kernel")
    assert not res.ok and res.reason == pb.STATIC_CHECK and res.artifact == b""
    assert "breaks a sandbox rule" in res.message and rule in res.message


def test_the_wrapper_exploit_creates_no_file(target, tmp_path, monkeypatch):
    """Issue 22 defect 3 through the real cpu compile: no PWNED, a typed failure naming -wrapper."""
    monkeypatch.chdir(tmp_path)
    res = target.compile(KERNEL.replace("BLOCK * VEC", "1"), "c", EXPLOIT, "kernel")
    assert not (tmp_path / "PWNED").exists()
    assert not res.ok and res.reason == pb.STATIC_CHECK
    assert "'-wrapper'" in res.message and "runs a program in the compiler" in res.message


def test_the_check_command_runs_no_program(tmp_path, monkeypatch):
    """`kfactory check ... --flags EXPLOIT`, the reported reproduction: it fails and creates nothing."""
    from kfactory.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "k.c").write_text(load_problem("softmax").reference_source("cpu")[0])
    code = main(["check", "softmax", "--target", "cpu", "--source", "k.c", "--flags", EXPLOIT, "--compile-only"])
    assert code != 0
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("flags", CPU_ALLOWED)
def test_allowed_flags_compile_a_real_kernel(target, flags):
    words = check_flags("cpu", flags)
    assert words and all(isinstance(w, str) for w in words)
    defines = "" if "BLOCK" in flags else " -DBLOCK=2 -DVEC=3"
    res = target.compile(KERNEL, "c", flags + defines, "kernel")
    assert res.ok, res.message + res.log
    assert res.artifact[:4] == b"\x7fELF"


# ------------------------------------------------------------------------------------------------------ cuda


@pytest.mark.parametrize("flags,rule", CUDA_REFUSED)
def test_cuda_refuses(flags, rule):
    with pytest.raises(FlagRefused) as info:
        check_flags("cuda", flags)
    assert rule in info.value.rule and f"refused: {info.value.rule}" in str(info.value)
    assert "allowed: optimisation (-O0..-O3)" in str(info.value)


@pytest.mark.parametrize("flags,rule", CUDA_REFUSED)
def test_cuda_option_builders_refuse(no_toolchain, flags, rule):
    for build in (nvrtc.candidate_flags, lambda f: link.link_options("sm_90a", f),
                  lambda f: nvrtc.nvrtc_options("sm_90a", f)):
        with pytest.raises(FlagRefused):
            build(flags)


@pytest.mark.parametrize("flags,rule", CUDA_REFUSED)
def test_compile_cuda_refuses_before_the_cache_and_the_toolchain(no_toolchain, tmp_path, flags, rule):
    res = cc.compile_cuda(TINY_CUDA, "cuda", flags, "k", "sm_90a", tmp_path / "cache")
    assert not res.ok and res.reason == pb.STATIC_CHECK and rule in res.message
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("language", ["cuda", "ptx"])
def test_the_compile_step_refuses_on_its_own(monkeypatch, language):
    """_compile builds every NVRTC and nvJitLink option list through candidate_flags, so a flag that reached it
    some other way than compile_cuda is refused there too, and neither library is called."""
    monkeypatch.setattr(cc, "_arch_problem", lambda arch: "")
    for name in ("_nvrtc_ptx", "_nvjitlink"):
        monkeypatch.setattr(cc, name, lambda *a, name=name: pytest.fail(f"{name} was called"))
    res = cc._compile(TINY_CUDA, language, "--include-path=/etc", "k", "sm_90a", "nvrtc")
    assert not res.ok and res.reason == pb.STATIC_CHECK and "'--include-path=/etc'" in res.message


@pytest.mark.parametrize("flags", CUDA_ALLOWED)
def test_cuda_allows(flags):
    assert check_flags("cuda", flags)
    assert check_flags("cuda:sm_90a", flags)


@pytest.mark.parametrize("flags", CUDA_ALLOWED)
def test_allowed_cuda_flags_compile_a_real_kernel(flags):
    """Each allowed form is one NVRTC and nvJitLink take (the toolchain wheels, no GPU needed)."""
    pytest.importorskip("cuda.bindings")
    defines = "".join(f" -D{name}=2" for name in ("BLOCK", "VEC") if name not in flags)
    res = cc.compile_cuda(MACRO_CUDA, "cuda", flags + defines, "k", "sm_90a", None)
    assert res.ok, res.message + res.log


def test_cuda_options_are_normalised(monkeypatch):
    flags = "-O3 -D BLOCK=16 -Xptxas -O3,-warn-spills --maxrregcount 64 --use_fast_math -lineinfo"
    assert nvrtc.candidate_flags(flags) == ["-DBLOCK=16", "-Xptxas=-O3", "-Xptxas=-warn-spills", "--maxrregcount=64",
                                            "--use_fast_math", "-lineinfo"]
    assert link.link_options("sm_90a", flags) == ["-arch=sm_90a", "-verbose", "-Xptxas=-v", "-no-cache",
                                                  "-Xptxas=-O3", "-Xptxas=-warn-spills", "-maxrregcount=64"]
    monkeypatch.setattr(nvrtc, "_toolchain", lambda: types.SimpleNamespace(header_dir="/opt/cuda/include"))
    opts = nvrtc.nvrtc_options("sm_90a", flags)
    assert opts == ["-arch=compute_90a", "--std=c++17", "-default-device", "--include-path=/opt/cuda/include",
                    "-DBLOCK=16", "-Xptxas=-O3", "-Xptxas=-warn-spills", "--maxrregcount=64", "--use_fast_math",
                    "-lineinfo"]


# ----------------------------------------------------------------------------------- what the factory emits


def _point_with(family, rng: random.Random, name: str, value, tries: int = 2000) -> dict | None:
    """A valid point of the family with params[name] == value, or None when random draws find none."""
    for _ in range(tries):
        point = {k: rng.choice(v) for k, v in family.spec.params.items()}
        point[name] = value
        if family.valid(point):
            return point
    return None


def _covering_points(family, rng: random.Random) -> list[dict]:
    """A few random valid points, and one for every value of every parameter (every flag-valued one included)."""
    points = [family.random_point(rng) for _ in range(4)]
    for name, values in family.spec.params.items():
        for value in values:
            point = _point_with(family, rng, name, value)
            assert point is not None or "flag" not in name, f"{family.name}: no valid point with {name}={value!r}"
            if point is not None:
                points.append(point)
    return points


@pytest.mark.parametrize("problem_name", list_problems())
def test_every_builtin_family_and_reference_kernel_passes(problem_name):
    problem = load_problem(problem_name)
    rng = random.Random(22)
    for family in problem.families.values():
        assert family.spec.target.split(":")[0] in FLAG_TARGETS
        for point in _covering_points(family, rng):
            _source, flags, _threads = family.render(point)
            check_flags(family.spec.target, flags)
    for target, ref in problem.spec.reference_kernel.items():
        check_flags(target, ref.flags)


def test_every_flag_the_agents_may_ask_for_passes():
    """The agents' own whitelist (kfactory.agents.extract) must sit inside this one, or a kernel the agent check
    accepted would be refused by the compiler."""
    from kfactory.agents.extract import _FLAGS

    examples = {
        "cpu": "-O0 -O1 -O2 -O3 -Os -Ofast -march=native -mtune=native -ffast-math -fno-math-errno -funroll-loops "
               "-fno-trapping-math -ffp-contract=fast -ffp-contract=on -ffp-contract=off -fopenmp -fopenmp-simd "
               "-ftree-vectorize -fno-finite-math-only -std=c99 -std=c11 -std=c17 -std=gnu99 -std=gnu11 -std=gnu17 "
               "-std=c++17 -std=c++20 -mavx -mavx2 -mfma -mavx512f -mavx512bw -mavx512vl -mavx512dq -mf16c -mbmi2 "
               "-mprefer-vector-width=256 -mprefer-vector-width=512",
        "cuda": "-use_fast_math --use_fast_math -maxrregcount=64 --maxrregcount=128 -std=c++14 -std=c++17 "
                "-std=c++20 -ftz=true --ftz=false -prec-div=false --prec-div=true -prec-sqrt=false "
                "--prec-sqrt=true -fmad=true --fmad=false -extra-device-vectorization --extra-device-vectorization "
                "-restrict --restrict -lineinfo -O0 -O1 -O2 -O3",
    }
    for target, words in examples.items():
        for word in words.split():
            assert _FLAGS[target].fullmatch(word), f"{word} is no longer an agent flag: update this list"
            check_flags(target, word)
    check_flags("cpu", "-O3 -march=native -fopenmp")   # the example the system prompt gives


def test_a_target_without_a_compiler_has_no_whitelist():
    with pytest.raises(ValueError, match="no compile-flag whitelist") as info:
        check_flags("replay", "-O2")
    assert not isinstance(info.value, FlagRefused)
