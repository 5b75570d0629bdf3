"""Engines side by side: one table row per (engine, threads) result, for bench/engine_baselines.py and the
engine bench that adds kfactory's own engine beside the baselines."""
from __future__ import annotations

from typing import Iterable


#: the table's letter for the bound that sets a roofline fraction (roofline.token_roofline's "bound")
BOUND_LETTERS = {"memory": "m", "compute": "c", "compute_int8": "i"}


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table(results: Iterable[dict]) -> str:
    """A plain-text table: decode tokens/s per context, prefill tokens/s, peak RSS, roofline fractions (each
    followed by the bound that sets it: m for memory, c for fp32 compute, i for int8 compute); an engine that
    did not run shows its status and reason instead."""
    rows = list(results)
    contexts = sorted({c for r in rows for c in r.get("decode_tokens_per_s", {})}, key=int)
    prefills = sorted({k for r in rows for k in r.get("roofline_fraction", {}) if k.startswith("prefill_")})
    head = (["engine", "threads", "format"] + [f"decode@{c} tok/s" for c in contexts] + ["prefill tok/s", "RSS MB"]
            + [f"roof@{c}" for c in contexts] + [f"roof {p.replace('_', ' ')}" for p in prefills])
    lines = [head]
    notes = []
    for r in rows:
        if not r.get("available"):
            lines.append([r["name"], str(r.get("threads", "-")), r.get("status", "-")] + ["-"] * (len(head) - 3))
            notes.append(f"{r['name']} ({r.get('threads')} threads): {r.get('status')}: {r.get('reason')}")
            continue
        decode, roof = r["decode_tokens_per_s"], r.get("roofline_fraction", {})
        per = r.get("roofline", {}).get("per_token", {})

        def frac(key: str) -> str:
            bound = (per.get(key) or {}).get("bound")
            return _pct(roof.get(key)) + (f" {BOUND_LETTERS[bound]}" if bound and roof.get(key) is not None else "")

        lines.append([r["name"], str(r["threads"]), str(r.get("weights_format"))]
                     + [_num(decode.get(c)) for c in contexts]
                     + [_num(r.get("prefill_tokens_per_s")), _num(r.get("peak_rss_mb"), "{:.0f}")]
                     + [frac(c) for c in contexts] + [frac(p) for p in prefills])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths)))
            for line in lines]
    return "\n".join(text + notes)
