"""The content-addressed cache of compile results: a key over everything that decides the result (toolchain
versions and header directory included); cubins and typed failures stored so that a reader never sees one torn."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from google.protobuf import json_format

from kfactory.platform.fsutil import atomic_write
from kfactory.targets.base import CompileResult
from kfactory.targets.cuda.toolchain import _toolchain
from kfactory.v1 import events_pb2 as pb


def cache_key(source: str, language: str, flags: str, entry: str, arch: str) -> str:
    """sha256 over everything that decides the result, toolchain versions and header directory included."""
    tc = _toolchain()
    parts = [language, source, flags, entry, arch, tc.nvrtc_version, tc.nvjitlink_version, tc.header_dir]
    h = hashlib.sha256()
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "little") + data)   # length-prefixed: no two part lists collide
    return h.hexdigest()


def _cache_load(cache_dir: Path, key: str) -> CompileResult | None:
    meta_path, cubin_path = cache_dir / f"{key}.json", cache_dir / f"{key}.cubin"
    try:
        meta = json.loads(meta_path.read_text())
        report = json_format.Parse(json.dumps(meta["report"]), pb.CompileReport())
        cubin = cubin_path.read_bytes() if meta["ok"] else b""
    except (OSError, ValueError, KeyError, json_format.ParseError):
        return None   # absent or torn: compile again
    if meta["ok"] and len(cubin) != report.artifact_bytes:
        return None
    report.cached = True
    return CompileResult(meta["ok"], report, artifact=cubin, log=meta["log"], reason=meta["reason"],
                         message=meta["message"])


def _cache_store(cache_dir: Path, key: str, result: CompileResult) -> None:
    """The cubin first, then the JSON: an entry counts only once its JSON is there, so a reader never sees a
    JSON without its cubin. Typed failures are cached too (json only): the same bad candidate fails the same way."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    if result.ok:
        atomic_write(cache_dir / f"{key}.cubin", result.artifact)
    meta = {"ok": result.ok, "reason": int(result.reason), "message": result.message, "log": result.log,
            "report": json_format.MessageToDict(result.report, preserving_proto_field_name=True)}
    atomic_write(cache_dir / f"{key}.json", json.dumps(meta).encode())
