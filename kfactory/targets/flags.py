"""The one whitelist of compile flags a candidate may carry, per target (cpu: the system `cc`; cuda: NVRTC and
nvJitLink).

Why a whitelist: a candidate's flags come from anyone who can reach the API (a campaign's manual sources), from
a model's reply, or from a problem package; they end up on the compiler's command line inside the compiler
service. A C compiler driver is a program launcher with a file system at hand: `-wrapper` runs any program,
`-B`/`-specs`/`-fplugin` make it run or load code of the caller's choosing, `-I`/`-include`/`@file`/`--sysroot`
read the pod's files into a kernel (and so into its outputs), `-o`/`-save-temps`/`-fdump-*`/`-M*`/
`-fprofile-generate`/`-fstack-usage` write files, `-Wl,`/`-Xlinker`/`-Xassembler`/`-mllvm` hand arbitrary options
to other tools. New GCC and Clang releases add such options every year, so a list of what is forbidden would always
be one release behind; instead every word must match a rule below, and anything else is refused.

The cpu rules (each rule a category, each category explicit regexes):

- optimisation: -O, -O0..-O3, -Os, -Og, -Oz, -Ofast
- target ISA: -march=, -mtune=, -mcpu= (and -mfpu=, -mfpmath=, -mprefer-vector-width=, -msve-vector-bits=,
  -mcmodel=) with a plain value (letters, digits, `_.+-`: no `/`, so never a path); -mNAME / -mno-NAME feature
  switches (-mavx2, -mfma, -mno-avx512f, -msse4.2), except -mllvm (its next word is any LLVM option, some of
  which write files) and -m32/-m64/-mx32 (ABI switches, not features: the runner loads 64-bit objects; a
  feature name starts with a letter)
- math: -ffast-math, -fno-math-errno, -ffinite-math-only, -fno-trapping-math, ... (and their -fno- forms),
  -ffp-contract=fast|on|off, -fexcess-precision=, -ffp-model=
- OpenMP: -fopenmp, -fopenmp-simd
- codegen: an explicit list of -f switches that only change the code generated (-funroll-loops,
  -ftree-vectorize, -fomit-frame-pointer, -fno-semantic-interposition, ...), each also as -fno-; a few with a
  number (-falign-loops=32, -finline-limit=N) or a keyword (-fvect-cost-model=unlimited). Not listed, because
  they load code, read or write files, or record paths: -fplugin*, -fpass-plugin, -fdump-*, -fprofile-*,
  -fauto-profile, -fdebug/file/macro-prefix-map, -frecord-*, -fstack-usage, -fcallgraph-info,
  -fsave-optimization-record, -fopt-info, -fdiagnostics-format (sarif-file writes one), -fsanitize*, -fuse-ld,
  -finstrument-functions, -fcoverage*, -ftime-trace
- --param NAME=INTEGER (also --param=NAME=INTEGER): GCC's tuning knobs, numbers only
- warnings: -W..., -Wno-..., -W...=VALUE, -w, -pedantic; a comma is never allowed, so -Wl,/-Wa,/-Wp, cannot
  match, and bare -Wl/-Wa/-Wp are refused
- macros: -DNAME or -DNAME=NUMBER (also as `-D NAME=NUMBER`). The value must be a number: an identifier value
  would let a flag re-spell what the cpu source rules refuse (-DA=__asm__ and then `A volatile("syscall")`)
- language: -std=c99/c11/c17/gnu11/c++17/... (an explicit list), -ansi
- debug info: -g, -g0..-g3, -ggdb (not -gsplit-dwarf: it writes a .dwo file)

The cuda rules (NVRTC compiles to PTX, nvJitLink links it; neither has -wrapper, but include paths read the pod's
files into a kernel and some options write files):

- optimisation: -O0..-O3 (accepted for habit; candidate_flags drops them, NVRTC does not take them)
- fast math: --use_fast_math, --ftz=, --prec-div=, --prec-sqrt=, --fmad= (true|false), --extra-device-vectorization
- registers: -maxrregcount=N / --maxrregcount=N (also as two words)
- ptxas: -Xptxas=OPT / --ptxas-options=OPT (also as two words, and nvcc's OPT,OPT lists, which candidate_flags
  splits) with OPT one of -v, -O0..-O3, --warn-on-spills (-warn-spills), --warn-on-local-memory-usage
  (-warn-lmem-usage), --warn-on-double-precision-use (-warn-double-usage), --allow-expensive-optimizations=,
  --def-load-cache= (-dlcm=), --def-store-cache= (-dscm=), --maxrregcount=N, --suppress-stack-size-warning,
  --fmad= (none of them names a file; ptxas's --output-file, --input-as-string, --options-file are not listed)
- language: --std=c++03|11|14|17|20, -default-device / --device-as-default-execution-space, --restrict
- debug info: -lineinfo / --generate-line-info
- macros: -DNAME, -DNAME=NUMBER, --define-macro=... (the same number-only values as cpu)
- warnings: -w / --disable-warnings, --diag-error=/--diag-suppress=/--diag-warn= with error numbers
Refused, with the reason: -I/--include-path and -include/--pre-include (read files of the pod; the compiler adds
the one include path it needs itself), -arch/--gpu-architecture (the target chooses the architecture), -rdc,
-dc, -dw, -dlto/--dlink-time-opt, -ewp (change what NVRTC emits: the pipeline links PTX), --time= and
--fdevice-time-trace= (write files), --create-pch/--use-pch/--pch-dir (read and write files).

check_flags returns the shlex-split words; a string shlex cannot split (an unclosed quote) is refused too. The
targets call it at the root of every compile (kfactory.targets.cpu.target CpuTarget.compile,
kfactory.targets.cuda.compile compile_cuda and its option builders), so every path is covered; callers may also
call it early to refuse a campaign before it starts.
"""
from __future__ import annotations

import re
import shlex

#: the targets whose compilers take flags (the replay target compiles nothing)
FLAG_TARGETS = ("cpu", "cuda")

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# a C literal number: 8, -1, 0x1F, 1.5f, 1e-3, 64u, 2ull
_NUMBER = r"-?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[uUlLfF]{0,3}"
_MACRO = rf"-D{_IDENT}(?:={_NUMBER})?"
_BOOL = r"(?:true|false)"

# -f switches that only change the code generated; each is allowed as -fNAME and -fno-NAME
_MATH_SWITCHES = (
    "fast-math", "math-errno", "finite-math-only", "trapping-math", "associative-math", "reciprocal-math",
    "signed-zeros", "rounding-math", "unsafe-math-optimizations", "cx-limited-range", "single-precision-constant",
    "signaling-nans",
)
_CODEGEN_SWITCHES = (
    "unroll-loops", "unroll-all-loops", "peel-loops", "tree-vectorize", "tree-loop-vectorize", "tree-slp-vectorize",
    "omit-frame-pointer", "strict-aliasing", "strict-overflow", "wrapv", "prefetch-loop-arrays", "ipa-pta", "gcse",
    "gcse-after-reload", "predictive-commoning", "split-loops", "unswitch-loops", "version-loops-for-strides",
    "loop-interchange", "loop-unroll-and-jam", "ivopts", "inline", "inline-functions", "inline-small-functions",
    "inline-functions-called-once", "early-inlining", "semantic-interposition", "plt", "function-sections",
    "data-sections", "schedule-insns", "schedule-insns2", "sched-pressure", "modulo-sched", "section-anchors",
    "tree-loop-distribution", "tree-loop-distribute-patterns", "tree-loop-im", "tree-loop-optimize", "tree-pre",
    "tree-partial-pre", "tracer", "web", "rename-registers", "expensive-optimizations", "caller-saves",
    "move-loop-invariants", "reorder-blocks", "optimize-sibling-calls", "aggressive-loop-optimizations",
    "split-paths", "ipa-cp-clone", "jump-tables", "builtin", "common", "exceptions", "rtti", "signed-char",
    "unsigned-char", "asynchronous-unwind-tables", "unwind-tables", "delete-null-pointer-checks",
    "align-functions", "align-loops", "align-jumps", "align-labels",
)
_OPENMP_SWITCHES = ("openmp", "openmp-simd")


def _switches(names: tuple[str, ...]) -> str:
    return "-f(?:no-)?(?:" + "|".join(re.escape(n) for n in names) + ")"


_STD_C = r"(?:c|gnu)(?:89|90|99|9x|11|1x|17|18|2x|23)"
_STD_CXX = r"(?:c|gnu)\+\+(?:98|03|0x|11|1y|14|1z|17|2a|20|2b|23)"
_ISA_VALUE = r"[A-Za-z0-9_.+\-]+"

#: cpu rules: (category as the error names it, the words it allows)
_CPU_RULES: tuple[tuple[str, str], ...] = (
    ("optimisation (-O*)", r"-O[0-3sgz]?|-Ofast"),
    ("target ISA (-march=, -mtune=, -mcpu=, -mFEATURE, -mno-FEATURE)",
     rf"-m(?:arch|tune|cpu|fpu|fpmath|prefer-vector-width|sve-vector-bits|cmodel)={_ISA_VALUE}"
     r"|-m(?!(?:llvm|x32)\Z)(?:no-)?[a-z][a-z0-9.\-]*"),
    ("math (-ffast-math, -ffp-contract=, ...)",
     _switches(_MATH_SWITCHES) + r"|-ffp-contract=(?:fast|on|off)|-fexcess-precision=(?:fast|standard|16)"
     r"|-ffp-model=(?:precise|strict|fast)"),
    ("OpenMP (-fopenmp)", _switches(_OPENMP_SWITCHES)),
    ("codegen (-funroll-loops, -ftree-vectorize, ...)",
     _switches(_CODEGEN_SWITCHES) + r"|-falign-(?:functions|loops|jumps|labels)=\d+(?::\d+)*"
     r"|-finline-limit=\d+|-fmax-errors=\d+"
     r"|-f(?:vect|simd)-cost-model=(?:unlimited|dynamic|cheap|very-cheap)"),
    ("--param NAME=N", r"--param=[a-z][a-z0-9\-]*=\d+"),
    ("warnings (-W*, but not -Wl, -Wa, -Wp)",
     r"-W(?!(?:l|a|p)\Z)(?:[a-z][a-z0-9+\-]*(?:=[a-z0-9+\-]+)?)?|-w|-pedantic(?:-errors)?"),
    ("macros (-DNAME[=NUMBER])", _MACRO),
    ("language (-std=)", rf"-std=(?:{_STD_C}|{_STD_CXX})|-ansi"),
    ("debug info (-g)", r"-g(?:gdb)?[0-3]?"),
)

# ptxas options as nvJitLink's ptxas takes them (long forms, and the short forms ptxas itself spells with one dash)
_PTXAS_OPTION = (r"(?:-v|--verbose|-O[0-3]|--opt-level=[0-3]|--warn-on-spills|-warn-spills"
                 r"|--warn-on-local-memory-usage|-warn-lmem-usage|--warn-on-double-precision-use|-warn-double-usage"
                 r"|--?allow-expensive-optimizations=" + _BOOL +
                 r"|--def-load-cache=(?:ca|cg|cs|lu|cv)|-dlcm=(?:ca|cg|cs|lu|cv)"
                 r"|--def-store-cache=(?:wb|cg|cs|wt)|-dscm=(?:wb|cg|cs|wt)|--?maxrregcount=\d+"
                 r"|--?suppress-stack-size-warning|--?fmad=" + _BOOL + ")")

#: cuda rules (NVRTC and nvJitLink)
_CUDA_RULES: tuple[tuple[str, str], ...] = (
    ("optimisation (-O0..-O3)", r"-O[0-3]"),
    ("fast math (--use_fast_math, --ftz=, --prec-div=, --prec-sqrt=, --fmad=)",
     rf"--?use_fast_math|--?(?:ftz|prec-div|prec-sqrt|fmad)={_BOOL}|--?extra-device-vectorization"),
    ("registers (-maxrregcount=N)", r"--?maxrregcount=\d+"),
    ("ptxas (-Xptxas -v, -Xptxas -O3, ...)", rf"(?:-Xptxas|--ptxas-options)={_PTXAS_OPTION}(?:,{_PTXAS_OPTION})*"),
    ("language (--std=c++17, -default-device, --restrict)",
     r"--?std=c\+\+(?:03|11|14|17|20)|-default-device|--device-as-default-execution-space|--?restrict"),
    ("debug info (-lineinfo)", r"-lineinfo|--generate-line-info"),
    ("macros (-DNAME[=NUMBER])", rf"{_MACRO}|--define-macro={_IDENT}(?:={_NUMBER})?"),
    ("warnings (-w, --diag-suppress=N)", r"-w|--disable-warnings|--?diag-(?:error|suppress|warn)=\d+(?:,\d+)*"),
)

_RULES = {"cpu": [(c, re.compile(p)) for c, p in _CPU_RULES],
          "cuda": [(c, re.compile(p)) for c, p in _CUDA_RULES]}

#: words that take the next word as their value, and how the two are joined into the one word that is checked
#: (the compiler pairs them the same way: gcc's -D and --param, nvcc's -Xptxas and -maxrregcount)
PAIRED: dict[str, dict[str, str]] = {
    "cpu": {"-D": "", "--param": "="},
    "cuda": {"-D": "", "-Xptxas": "=", "--ptxas-options": "=", "-maxrregcount": "=", "--maxrregcount": "="},
}

# Why a refused word is refused, for the message only: a word is allowed by the rules above or not at all, and
# these patterns never allow anything. First match wins; (pattern, rule as the error names it, why).
_WHY: tuple[tuple[re.Pattern, str, str], ...] = tuple((re.compile(p), rule, why) for p, rule, why in (
    (r"--?wrapper.*", "-wrapper", "runs a program in the compiler"),
    (r"-fplugin.*|-fpass-plugin.*|-Xclang", "-fplugin", "loads code into the compiler"),
    (r"-B.*|--?specs.*|-fuse-ld.*|--ld-path.*|-ccc-.*|--?gcc-toolchain.*|-fuse-linker-plugin|-no-integrated-as",
     "-B/-specs/-fuse-ld", "chooses the programs the compiler runs"),
    (r"-W[lap](?:,.*)?|-Xlinker|-Xassembler|-Xpreprocessor|-mllvm|-Xcompiler|-Xarch_.*|-Xopenmp-target.*|-z",
     "-Wl,/-Xlinker/-Xassembler/-mllvm", "passes options to another tool"),
    (r"@.*", "@file", "reads a response file of the compiler pod"),
    (r"-I.*|--include-path.*|-isystem.*|-iquote.*|-idirafter.*|-iprefix.*|-iwithprefix.*|-imultilib.*"
     r"|-isysroot.*|--sysroot.*|-include.*|-imacros.*|--include.*|--pre-include.*|-fprofile-use.*"
     r"|-fauto-profile.*|-fsanitize-(?:ignorelist|blacklist).*|--use-pch.*|--pch-dir.*|--pch",
     "files read", "reads files of the compiler pod"),
    (r"-L.*|-l.*", "-L/-l", "links files of the compiler pod"),
    (r"-o.*|--output.*|-save-temps.*|-fdump-.*|-fprofile-.*|-fstack-usage|-fcallgraph-info.*|-M.*|-dumpdir.*"
     r"|-dumpbase.*|-fsave-optimization-record.*|-fopt-info.*|-gsplit-dwarf|-fdiagnostics-format.*|--time.*"
     r"|-ftime-trace.*|--fdevice-time-trace.*|--create-pch.*|-fcoverage.*|--coverage|-ftest-coverage"
     r"|-fprofile-arcs|-aux-info.*", "files written", "writes files in the compiler pod"),
    (r"-f(?:debug|file|macro|profile)-prefix-map.*|-frecord-.*", "path maps", "records or rewrites the pod's paths"),
    (r"-fsanitize.*|-finstrument-functions.*|-pg|-p", "instrumentation",
     "adds runtime instrumentation the sandbox does not load"),
    (r"-arch.*|--gpu-architecture.*|-target|--target.*|-m(?:32|64|x32|16)", "architecture",
     "the target chooses the architecture and ABI"),
    (r"-rdc.*|--relocatable-device-code.*|-dc|-dw|--device-[cw]|-dlto|--dlink-time-opt|-ewp"
     r"|--extensible-whole-program", "output kind", "changes what NVRTC emits (the pipeline links PTX)"),
    (r"-x.*|-E|-S|-c|-shared|-static.*|-nostdlib.*|-nostartfiles|-nodefaultlibs|-pie|-no-pie|-r|-rdynamic"
     r"|--?print.*|--help.*|-v|-###|--version|--verbose|-dump.*|-fsyntax-only|-pass-exit-codes|-time.*",
     "driver modes", "changes what the compiler driver does"),
    (r"-D.*|--define-macro.*", "-D", "a macro is a plain identifier, optionally =NUMBER (an identifier or text "
     "value could re-spell a word the source rules refuse)"),
    (r"--param.*", "--param", "takes NAME=INTEGER"),
    (r"(?:-Xptxas|--ptxas-options)=.*", "-Xptxas", "ptxas option not on the whitelist"),
    (r"[^-].*", "input files", "names a file for the compiler to read"),
))


class FlagRefused(ValueError):
    """A compile flag that is not on the target's whitelist; the message names the flag and the rule."""

    def __init__(self, target: str, flag: str, rule: str, why: str):
        self.target, self.flag, self.rule, self.why = target, flag, rule, why
        super().__init__(f"flag {flag!r}: {why} (refused: {rule}); allowed: {allowed_summary(target)}")


def allowed_summary(target: str) -> str:
    """The categories of flags the target allows, as the error message lists them."""
    return ", ".join(category for category, _ in _RULES[_kind(target)])


def check_flags(target: str, flags: str) -> list[str]:
    """The shlex-split words of `flags` when every word is on `target`'s whitelist ("cpu" or "cuda"; a target
    spec such as "cuda:sm_90a" names its kind before the colon). Raises FlagRefused naming the first word that
    is not (an unsplittable string is refused too), ValueError for a target that has no whitelist."""
    kind = _kind(target)
    try:
        words = shlex.split(flags)
    except ValueError as exc:   # shlex: an unclosed quote or a trailing escape
        raise FlagRefused(kind, flags, "unparsable", f"cannot be split into words ({exc})") from exc
    for shown, word in _checked_words(kind, words):
        _check_word(kind, shown, word)
    return words


def join_pairs(target: str, words: list[str]) -> list[str]:
    """The words with each two-word flag (PAIRED: -D NAME, -Xptxas -v, ...) joined into one."""
    return [word for _, word in _checked_words(_kind(target), words)]


def _kind(target: str) -> str:
    kind = target.split(":", 1)[0]
    if kind not in FLAG_TARGETS:
        raise ValueError(f"no compile-flag whitelist for target {target!r} (only {', '.join(FLAG_TARGETS)})")
    return kind


def _checked_words(kind: str, words: list[str]) -> list[tuple[str, str]]:
    """(as the user wrote it, as it is checked) per flag: a PAIRED word and its value are one flag."""
    out, i, paired = [], 0, PAIRED[kind]
    while i < len(words):
        word = words[i]
        if word in paired:
            if i + 1 == len(words):
                raise FlagRefused(kind, word, word, "needs a value after it")
            out.append((f"{word} {words[i + 1]}", word + paired[word] + words[i + 1]))
            i += 2
            continue
        out.append((word, word))
        i += 1
    return out


def _check_word(kind: str, shown: str, word: str) -> None:
    if any(pattern.fullmatch(word) for _, pattern in _RULES[kind]):
        return
    rule, why = next(((rule, why) for pattern, rule, why in _WHY if pattern.fullmatch(word)),
                     (shown, "not on the whitelist"))
    raise FlagRefused(kind, shown, rule, why)
