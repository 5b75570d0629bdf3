"""Regenerate the committed protobuf/gRPC code under kfactory/v1 from proto/kfactory/v1.

Usage: python scripts/gen_proto.py [OUT_ROOT]   (default: the repository root)
"""
import sys
from pathlib import Path

from grpc_tools import protoc
import grpc_tools

ROOT = Path(__file__).resolve().parent.parent


def generate(out_root: Path) -> None:
    """Run protoc for every .proto under proto/, writing kfactory/v1/*_pb2*.py below out_root."""
    protos = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = ["protoc", f"-I{ROOT / 'proto'}", f"-I{include}", f"--python_out={out_root}",
            f"--pyi_out={out_root}", f"--grpc_python_out={out_root}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
