"""Small file-system helpers shared by the stores that write files others read concurrently."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `data` to `path` so that a reader sees the old file or the whole new one, never a part. `mode`: its
    permissions (default: mkstemp's 0600, this user's alone; the umask is not asked, since asking sets it for
    every thread of the process)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def out_dir(text: str) -> Path:
    """An argparse `type=` for the directory a command writes its files into: an empty path is refused (argparse
    then names the flag and exits 2), since Path("") is the working directory, which nobody asked the files to go
    into; `.` says that."""
    import argparse

    if not text:
        raise argparse.ArgumentTypeError("an empty path: name the directory to write into ('.' for the working "
                                         "directory)")
    return Path(text)
