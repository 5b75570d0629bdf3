"""Prompts from files: kfactory/agents/prompts/*.md, rendered with Jinja2 from the problem, the family's ABI and
launch rule, the target's facts, the parents' evidence and memory's lessons."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from kfactory.bus import events as ev
from kfactory.agents.personas import Persona
from kfactory.v1 import events_pb2 as pb
from kfactory.judge import objective
from kfactory.judge.measure import floor_bandwidth_gbps

PROMPTS = Path(__file__).parent / "prompts"


@dataclass
class Prompt:
    """A rendered prompt: the system text and the first user message; `digest` names it in the object store."""
    system: str
    user: str

    @property
    def text(self) -> str:
        return f"# system\n{self.system}\n\n# user\n{self.user}"

    @property
    def digest(self) -> str:
        return ev.sha256_hex(self.text)


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(PROMPTS), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def render(name: str, **context) -> str:
    """Render one prompt file."""
    return _env().get_template(name).render(**context)


def build(persona: Persona, problem, target: str, device: pb.DeviceInfo, parents: list[dict], lessons: str,
          family=None) -> Prompt:
    """The prompt for one agent task."""
    kind = target.split(":")[0]
    abi = problem.spec.abi[kind]
    language = family.spec.language if family is not None else ("cuda" if kind == "cuda" else "c")
    ctx = {"persona": persona, "problem": _problem(problem), "abi": abi, "target": kind, "language": language,
           "entry": family.spec.entry if family is not None else "kernel",
           "family": _family(family), "device": _device(device), "floors": _floors(problem, device),
           "parents": parents, "lessons": lessons.strip()}
    return Prompt(render("system.md", **ctx), render("task.md", **ctx))


def reask(error: str, language: str, entry: str) -> str:
    """The follow-up message when a reply held no usable kernel."""
    return render("reask.md", error=error, language=language, entry=entry)


def _problem(problem) -> dict:
    s = problem.spec
    return {"name": s.name, "description": " ".join(s.description.split()),
            "inputs": [f"{t.name}: {t.dtype}[{', '.join(map(str, t.shape))}]" for t in s.inputs],
            "outputs": [f"{t.name}: {t.dtype}[{', '.join(map(str, t.shape))}]" for t in s.outputs],
            "optimize": [problem.shape_str(x) for x in s.shapes.optimize],
            # what the campaign ranks by (kfactory/judge/objective.py): one shape's median, or a weighted sum
            "objective": (f"the sum of weight x median over {objective.label(problem)}" if objective.by_name(problem)
                          else f"the median at {objective.label(problem)}"),
            "verify": [problem.shape_str(x) for x in s.shapes.verify],
            "distributions": list(s.distributions),
            "tolerance": {k: v.model_dump() for k, v in s.tolerance.items()},
            "bytes": s.cost.bytes, "flops": s.cost.flops,
            # the kernel takes a param listed in the ABI as an argument; any other one it must compile in
            "params": [f"{n} = {p.value!r} ({p.type}, "
                       + ("a kernel argument" if any(n in a.args for a in s.abi.values()) else "compile it in")
                       + (f"; {' '.join(p.doc.split())}" if p.doc else "") + ")" for n, p in s.params.items()]}


def _family(family) -> dict | None:
    if family is None:
        return None
    f = family.spec
    return {"name": f.name, "language": f.language, "launch": dict(f.launch), "flags": f.compile_flags,
            "params": json.dumps(f.params)}


def _device(d: pb.DeviceInfo) -> dict:
    return {"model": d.model, "arch": d.arch, "threads": d.threads, "bandwidth_gbps": d.mem_bandwidth_gbps,
            "read_bandwidth_gbps": d.read_bandwidth_gbps, "peak_gflops": d.peak_gflops,
            "peak_int8_gops": d.peak_int8_gops, "peak_bf16_gflops": d.peak_bf16_gflops, "l2_bytes": d.l2_bytes,
            "sm_count": d.sm_count}


def _floors(problem, d: pb.DeviceInfo) -> list[dict]:
    """Per optimisation shape: bytes, flops, and the speed-of-light time from the measured ceilings (the bandwidth
    the judge's floor uses: the copy and read figures weighted by the share of bytes written)."""
    out = []
    for shape in problem.shapes("optimize"):
        nbytes, flops = problem.cost(shape)
        bw = floor_bandwidth_gbps(problem, shape, d)
        t_mem = nbytes / (bw * 1e9) if bw else 0.0
        t_fl = flops / (d.peak_gflops * 1e9) if d.peak_gflops else 0.0
        out.append({"shape": problem.shape_str(shape), "bytes": nbytes, "flops": flops,
                    "floor_ms": max(t_mem, t_fl) * 1e3, "bound": "memory" if t_mem >= t_fl else "compute"})
    return out
