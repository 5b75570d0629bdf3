#!/usr/bin/env python
"""How much the other devices' recorded spaces can say about this device's best points: the ceiling of any warm
start, measured on the data alone (no search runs).

    python bench/transfer_evidence.py [--data DIR] [--spaces NAME ...] [--within 1.05]

For each recorded space, and each other device's space of the same kernel (a source):
- `good`: how many points are within `within` of this device's optimum;
- `rank`: where the source puts this device's best good point (the good point it rates highest), of the
  points both measured; a warm start that trusts the source needs about that many evaluations;
- `corner`: the same inside the good point's corner (its values of every parameter but the launch geometry,
  the `block_size_*` ones), and that corner's rank among all corners by the source's best point in each. A
  source that ranks the corner first but the point low inside it can still guide a search to the right
  region; one that ranks both low cannot.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kfactory.targets.replay import load_space  # noqa: E402

GEOMETRY_PREFIX = "block_size_"


def _times(rs) -> dict[tuple, float]:
    """Each measured point's time (ms), keyed by its parameter values in the space's order."""
    return {tuple(r.params[k] for k in rs.params): r.time_ms for r in rs.records.values() if r.time_ms is not None}


def _rank(key: tuple, among: list[tuple], times: dict[tuple, float]) -> int:
    return sorted(among, key=lambda k: (times[k], k)).index(key) + 1


def compare(target, source, within: float) -> dict:
    """The figures of the module docstring for one (target, source) pair."""
    t, s = _times(target), _times(source)
    both = [k for k in t if k in s]
    opt = min(t.values())
    good = [k for k in both if t[k] <= within * opt]
    best = min(good, key=lambda k: (s[k], k))  # the good point the source rates highest
    geometry = [i for i, name in enumerate(target.params) if name.startswith(GEOMETRY_PREFIX)]

    def corner(k: tuple) -> tuple:
        return tuple(v for i, v in enumerate(k) if i not in geometry)

    inside = [k for k in both if corner(k) == corner(best)]
    corner_best: dict[tuple, float] = defaultdict(lambda: float("inf"))
    for k in both:
        corner_best[corner(k)] = min(corner_best[corner(k)], s[k])
    corners = sorted(corner_best, key=lambda c: (corner_best[c], c))
    return {"good": len(good), "points": len(both), "rank": _rank(best, both, s),
            "rank_in_corner": _rank(best, inside, s), "corner_size": len(inside),
            "corner_rank": corners.index(corner(best)) + 1, "corners": len(corners),
            "source_ratio": s[best] / min(s.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(os.environ.get(
        "KF_TUNING_SPACES", REPO.parent / "shared" / "data" / "tuning-spaces")))
    ap.add_argument("--spaces", nargs="*", help="space names (file stems); default: all")
    ap.add_argument("--within", type=float, default=1.05)
    args = ap.parse_args()
    files = sorted(args.data.glob("*.json.gz"))
    if not files:
        print(f"no recorded spaces (*.json.gz) in {args.data}", file=sys.stderr)
        return 2
    spaces = {f.name[: -len(".json.gz")]: load_space(f) for f in files}
    print(f"| space | source | points within {args.within:g}x of the optimum | source's rank of the best of them "
          "| its rank in its corner | its corner's rank | the source's time for it / its optimum |")
    print("|---|---|---|---|---|---|---|")
    for name, target in spaces.items():
        if args.spaces and name not in args.spaces:
            continue
        kernel = name.rsplit("-", 1)[0]
        for other, source in spaces.items():
            if other == name or other.rsplit("-", 1)[0] != kernel:
                continue
            c = compare(target, source, args.within)
            print(f"| {name} | {other.rsplit('-', 1)[1]} | {c['good']} of {c['points']} | {c['rank']} "
                  f"| {c['rank_in_corner']} of {c['corner_size']} | {c['corner_rank']} of {c['corners']} "
                  f"| {c['source_ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
