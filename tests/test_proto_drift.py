"""The committed generated protobuf code matches proto/ (regenerated with the pinned grpcio-tools)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_has_not_drifted(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), str(tmp_path)], check=True)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*") if p.is_file())
    assert generated, "protoc produced nothing"
    drifted = [str(p) for p in generated if (tmp_path / p).read_bytes() != (ROOT / p).read_bytes()]
    assert not drifted, f"regenerate with `python scripts/gen_proto.py` and commit: {drifted}"
