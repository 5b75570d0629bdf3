"""An engine candidate's source artifact: everything its library is built from, in one JSON text.

A design that links searched op kernels (kfactory/engines/ops.py) is built from more than the generated C: each
kernel's verified source, entry and flags are translation units of their own. The coder, which has them, writes
them beside the engine's source; the compiler builds exactly that (the same `build(source, units=...)` the local
campaign runs, so the same object and the same build-cache entry), and what memory archives as the candidate's
source names every kernel the engine linked. One format for every engine candidate (with `kernels` empty when it
links none), so no stage has to guess which one it holds:

    {"format": "kfactory-engine-source/1", "engine": "<generated C>", "kernels": {"matvec_q4_1": OpKernel, ...}}
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from kfactory.engines.ops import OpKernel

FORMAT = "kfactory-engine-source/1"


class BundleError(ValueError):
    """The artifact is not an engine source bundle (another format, a field missing or of the wrong type)."""


@dataclass(frozen=True)
class EngineSource:
    """The generated engine source and the searched kernels ({op problem: OpKernel}) it links in."""
    engine: str
    kernels: dict[str, OpKernel] = field(default_factory=dict)

    def pack(self) -> str:
        """The bundle's canonical JSON text (sorted keys: the same inputs give the same candidate id)."""
        return json.dumps({"format": FORMAT, "engine": self.engine,
                           "kernels": {p: k.as_dict() for p, k in sorted(self.kernels.items())}},
                          sort_keys=True, indent=1)


def unpack(text: str) -> EngineSource:
    """The bundle `text` as an EngineSource; BundleError saying what is wrong with it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BundleError(f"an engine candidate's source is a {FORMAT} JSON bundle; this is not JSON ({e})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise BundleError(f"an engine candidate's source is a {FORMAT} bundle, not {got!r}")
    engine, kernels = data.get("engine"), data.get("kernels")
    if not isinstance(engine, str) or not isinstance(kernels, dict):
        raise BundleError("an engine source bundle holds 'engine' (the C source) and 'kernels' (an object)")
    try:
        return EngineSource(engine, {p: OpKernel.from_dict(k) for p, k in kernels.items()})
    except TypeError as e:   # a kernel entry without OpKernel's fields
        raise BundleError(f"an engine source bundle's kernel is not an OpKernel: {e}") from e
