"""Regenerate the committed protobuf/gRPC code under kfactory/v1 from proto/kfactory/v1.

Usage: python scripts/gen_proto.py [OUT_ROOT]   (default: the repository root)
"""
import re
import sys
import tomllib
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
    pin_grpc_version(out_root)


def grpcio_floor() -> str:
    """The grpcio version pyproject.toml requires at least ("grpcio>=X")."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = [d.split(">=", 1)[1].split(",")[0].strip() for d in deps if re.match(r"grpcio\s*>=", d)]
    if len(floors) != 1:
        raise SystemExit(f"pyproject.toml should require grpcio>=X once, found {floors}")
    return floors[0]


def pin_grpc_version(out_root: Path) -> None:
    """Write the grpcio floor into the generated stubs' GRPC_GENERATED_VERSION (each refuses an older grpcio at
    import). grpcio-tools writes its own version there, so every patch release (1.85.1, then 1.85.4) changed the
    committed code and failed the drift test on a fresh install, and demanded a newer grpcio than pyproject does."""
    floor = grpcio_floor()
    for path in (out_root / "kfactory" / "v1").glob("*_pb2_grpc.py"):
        text = path.read_text()
        pinned = re.sub(r"^GRPC_GENERATED_VERSION = '[^']*'$", f"GRPC_GENERATED_VERSION = '{floor}'", text,
                        count=1, flags=re.M)
        if pinned != text:
            path.write_text(pinned)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
