"""From a model's reply to a kernel: the fenced source, optional compile flags, and the static checks that a
candidate must pass before it enters the pipeline (the compiler checks again; this saves it the trip and lets
the agent be asked to fix what it got wrong)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from kfactory.agents.errors import AgentNoCode, StaticCheckFailed
from kfactory.targets.cpu.rules import check_source
from kfactory.targets.cuda.launch import parse_header

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.S)
#: fence tags a kernel may come in, per candidate language
_TAGS = {"c": {"c", "h", "cpp", "c++"}, "cpp": {"cpp", "c++", "cc", "cxx"}, "cuda": {"cuda", "cu", "cpp", "c++"},
         "ptx": {"ptx"}}
#: compile flags an agent may ask for, per target (anything else, e.g. -fplugin, -B, @file, -Wl, is refused)
_FLAGS = {
    "cpu": re.compile(r"-O[0-3s]|-Ofast|-march=native|-mtune=native|-ffast-math|-fno-math-errno|-funroll-loops|"
                      r"-fno-trapping-math|-ffp-contract=(?:fast|on|off)|-fopenmp|-fopenmp-simd|-ftree-vectorize|"
                      r"-fno-finite-math-only|-std=(?:c99|c11|c17|gnu99|gnu11|gnu17|c\+\+17|c\+\+20)|"
                      r"-m(?:avx|avx2|fma|avx512f|avx512bw|avx512vl|avx512dq|f16c|bmi2)|-mprefer-vector-width=\d+"),
    "cuda": re.compile(r"-?-use_fast_math|-?-maxrregcount=\d+|-std=c\+\+(?:14|17|20)|-?-ftz=(?:true|false)|"
                       r"-?-prec-div=(?:true|false)|-?-prec-sqrt=(?:true|false)|-?-fmad=(?:true|false)|"
                       r"-?-extra-device-vectorization|-?-restrict|-lineinfo|-O[0-3]"),
}


@dataclass
class Kernel:
    """A kernel taken from a reply: source, compile flags (None: keep the parent's) and launch rule JSON."""
    source: str
    flags: str | None
    launch: dict | None


def extract(text: str, language: str, entry: str) -> tuple[str, str | None]:
    """(source, flags or None) from the reply's fenced blocks: the longest block in the language that
    defines `entry`, and a block tagged `flags`. Raises AgentNoCode when no block defines the entry point."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(text)]
    flags = next((" ".join(body.split()) for tag, body in blocks if tag == "flags"), None)
    defines = re.compile(rf"\b{re.escape(entry)}\s*\(") if language != "ptx" else re.compile(
        rf"\.entry\s+{re.escape(entry)}\b")
    fitting = [body for tag, body in blocks if (tag in _TAGS.get(language, ()) or not tag) and defines.search(body)]
    if not fitting:
        tags = sorted({tag or "(untagged)" for tag, _ in blocks})
        raise AgentNoCode(f"no fenced ```{language} block defining {entry}(...) in the reply "
                          f"({len(blocks)} fenced blocks: {', '.join(tags) or 'none'}; {len(text)} characters)")
    return max(fitting, key=len).strip() + "\n", flags


def check(source: str, flags: str | None, target: str, parent_launch: dict | None) -> Kernel:
    """Static checks: the cpu sandbox rules, the flag whitelist, and (cuda) the launch header, which falls back
    to the parent's launch rule. Raises StaticCheckFailed with every problem found."""
    kind = target.split(":")[0]
    problems = []
    if flags is not None:
        allowed = _FLAGS.get(kind)
        bad = [f for f in flags.split() if allowed is None or not allowed.fullmatch(f)]
        if bad:
            problems.append(f"flags not allowed: {' '.join(bad)}")
    if kind == "cpu":
        problems += [str(v) for v in check_source(source)]
    launch = None
    if kind == "cuda":
        try:
            launch = parse_header(source) or parent_launch
        except ValueError as e:
            problems.append(str(e))
        if launch is None and not problems:
            problems.append("no launch rule: start the source with // kfactory: grid=EXPR block=EXPR [smem=EXPR]")
    if problems:
        raise StaticCheckFailed("; ".join(problems))
    return Kernel(source, flags, launch)
