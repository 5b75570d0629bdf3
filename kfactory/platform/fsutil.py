"""Small file-system helpers: files written so that concurrent readers see them whole, and the checks that a
command's output paths can be written before its work starts."""
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


def output_misfit(path: str | Path | None, flag: str = "--json") -> str:
    """Why a file a command writes after its campaign cannot be written there ('' when it can, or no path): found
    before the campaign runs, not after it (when a long campaign's result would be lost with exit 1)."""
    if not path:
        return ""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        return f"{flag} {path}: is a directory; name a file"
    if not parent.is_dir():
        return f"{flag} {path}: the directory {parent} does not exist"
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        return f"{flag} {path}: cannot be written here (permissions)"
    return ""


def dir_misfit(path: str | Path, flag: str) -> str:
    """Why a directory a command makes and writes into after its campaign cannot be ('' when it can): the nearest
    part of the path that exists must be a directory this user may write into."""
    there = Path(path).absolute()
    while not os.path.lexists(there) and there.parent != there:
        there = there.parent
    if there.is_symlink() and not there.exists():
        return f"{flag} {path}: {there} is a symbolic link to nothing; name a directory"
    if not there.is_dir():
        return f"{flag} {path}: {there} is a file, not a directory; name a directory"
    if not os.access(there, os.W_OK):
        return f"{flag} {path}: {there} cannot be written (permissions)"
    return ""


def others_may_write(d: Path) -> str:
    """Why a directory (or a file) whose contents this process will load or trust is not this user's alone (""
    when it is): it must belong to this user and be writable by no one else, since a file planted in it would be
    taken as this user's own (a compiled object, loaded and run). OSError when it cannot be read."""
    st = d.stat()
    if st.st_uid == os.getuid() and not st.st_mode & 0o022:
        return ""
    return (f"{d} must belong to this user (uid {os.getuid()}, not {st.st_uid}) and be writable by no one else "
            f"(mode {st.st_mode & 0o777:o}): a file planted there would be taken as this user's own")
