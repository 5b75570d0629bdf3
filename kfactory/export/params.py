"""NAME_params.h: a Kernel Tuner-style header of a template family's best design point per device model.

Each device gets a block of #defines (one per parameter) chosen from the measurements of the family's points
on that device: the point that came closest to the best of its own campaign (campaigns on one device may have
optimised different shapes, so raw times are compared only within a campaign). A program selects a device by
defining KF_DEVICE_<slug> before including the header; without one it gets the exported kernel's own point.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from kfactory.export.evidence import Judged, c_comment
from kfactory.v1 import events_pb2 as pb


@dataclass(frozen=True)
class DevicePoint:
    device: str
    params: dict
    relative: float      # score over the best score of its campaign (1.0: that campaign's best)
    score_s: float
    campaign_id: str
    candidate_id: str
    points: int          # how many measured points of the family on this device it was chosen from


def slug(device: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3' (a macro-name fragment)."""
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9]", "_", device)).strip("_").upper() or "UNKNOWN"


def best_per_device(family: str, priors: list[pb.Prior], j: Judged) -> list[DevicePoint]:
    """The best point of `family` per device model from `priors` (memory's measurements of the family's
    points, every campaign's); the exported kernel's own measurement counts for its device when no prior does."""
    rows = [(p.device, json.loads(p.params_json), p.relative or 1.0, p.score_s, p.campaign_id, p.candidate_id)
            for p in priors if p.family == family and p.params_json]
    own = j.best_measurement()
    if own is not None and own.device.model and not any(r[0] == own.device.model for r in rows):
        rows.append((own.device.model, j.params, 1.0, own.score_s, j.candidate.campaign_id, j.candidate.id))
    by_device: dict[str, list] = {}
    for row in rows:
        by_device.setdefault(row[0], []).append(row)
    out = []
    for device, found in sorted(by_device.items()):
        best = min(found, key=lambda r: (r[2], r[3]))
        out.append(DevicePoint(device, best[1], best[2], best[3], best[4], best[5], len(found)))
    return out


def _value(v) -> str:
    """A parameter's value as C: 0/1 for a bool, the number, else a string literal."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int) or isinstance(v, float) and v == v and abs(v) != float("inf"):
        return repr(v)
    return _c_string(str(v))


def _c_string(text: str) -> str:
    """A C string literal: printable ASCII as it is (quote and backslash escaped), every other byte of its UTF-8
    as an octal escape."""
    out = []
    for byte in text.encode():
        ch = chr(byte)
        out.append("\\" + ch if ch in '"\\' else ch if 32 <= byte < 127 else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'



def _defines(name: str, params: dict) -> list[str]:
    return [f"#define {name}_{k} {_value(v)}" for k, v in sorted(params.items()) if re.fullmatch(r"\w+", k)]


def params_header(j: Judged, problem, name: str, priors: list[pb.Prior]) -> str:
    """The header's text (the caller writes it only for a template family's kernel)."""
    family = j.candidate.family
    points = best_per_device(family, priors, j)
    guard = f"KF_EXPORT_{name.upper()}_PARAMS_H"
    intro = [f"Best parameters of family {family} of problem {problem.name}, per device model, from kfactory's",
             "measurements (the point closest to the best of its own campaign). Define one KF_DEVICE_<slug> before",
             "including this file; without one you get the exported kernel's point "
             f"(candidate {j.candidate.id[:12]}).", "Devices:"]
    intro += [f"  KF_DEVICE_{slug(p.device)}: {p.device} ({p.points} points measured)" for p in points]
    parts = [c_comment(intro), f"#ifndef {guard}\n#define {guard}\n"]
    for i, p in enumerate(points):
        parts.append(f"#{'if' if i == 0 else 'elif'} defined(KF_DEVICE_{slug(p.device)})")
        parts.append(f"/* {p.device.replace('*/', '* /')}: {p.score_s * 1e3:.4g} ms, {p.relative:.3f}x its "
                     f"campaign's best (campaign {p.campaign_id}, candidate {p.candidate_id[:12]}) */")
        parts += _defines(name, p.params)
    parts.append("#else" if points else "/* no measurements: the exported kernel's point */")
    parts += _defines(name, j.params)
    if points:
        parts.append("#endif")
    parts.append(f"\n#endif /* {guard} */\n")
    return "\n".join(parts)


def write_params(j: Judged, problem, name: str, out_dir: Path, priors: list[pb.Prior]) -> list[Path]:
    """Write NAME_params.h when the kernel is a template family's point; nothing otherwise."""
    if not j.candidate.family or not j.params:
        return []
    path = out_dir / f"{name}_params.h"
    path.write_text(params_header(j, problem, name, priors))
    return [path]
