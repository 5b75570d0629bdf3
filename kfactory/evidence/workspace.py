"""The local workspace: what campaigns made on this machine, kept under KFACTORY_DATA_DIR after they end.

    <data_dir>/archive.sqlite          memory's archive (every event; flags and launch rules are in the
                                       candidate_created events)
    <data_dir>/objects/<sha256>        sources and compiled artifacts, by content digest (memory mirrors them
                                       from the bus's object store as it archives their events)
    <data_dir>/reports/<campaign>/     a copy of each report `kfactory run` wrote

The bus's object store lives in the NATS server's store, which `kfactory run` removes at exit; this store does
not, so a campaign's winning source can be read back with no service running.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from kfactory.platform.fsutil import atomic_write

#: what a digest looks like (the bus keys artifacts by the hex sha256 of their bytes, kfactory.bus.events.sha256_hex)
DIGEST = re.compile(r"^[0-9a-f]{64}$")


def is_digest(value: str) -> bool:
    """Whether a string can name an object (64 lowercase hex digits): anything else never becomes a path."""
    return bool(DIGEST.fullmatch(value))


class Workspace:
    """A data directory: the archive's path, a content-addressed object store, and report copies."""

    def __init__(self, data_dir: Path | str, archive_path: Path | str | None = None):
        self.root = Path(data_dir).expanduser()
        self.objects = self.root / "objects"
        self.reports = self.root / "reports"
        self.archive_path = Path(archive_path) if archive_path else self.root / "archive.sqlite"

    @classmethod
    def of(cls, settings) -> "Workspace":
        """The workspace a Settings names (data_dir, and archive_path where it moves the archive)."""
        return cls(settings.data_dir, settings.archive())

    def _path(self, digest: str) -> Path | None:
        """Where an object lives; None for a string that is no digest (it would name a path outside objects/)."""
        return self.objects / digest if is_digest(digest) else None

    def has(self, digest: str) -> bool:
        """Whether the object is here (not checked: `get` checks)."""
        path = self._path(digest)
        return path is not None and path.is_file()

    def put(self, data: bytes) -> str:
        """Keep bytes under their sha256 and return it. Idempotent; written to a temporary file in the same
        directory and renamed, so a reader (or a crash) never sees half an object."""
        digest = hashlib.sha256(data).hexdigest()
        path = self.objects / digest
        if path.is_file():
            return digest
        self.objects.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
        return digest

    def get(self, digest: str) -> bytes | None:
        """The object's bytes, or None when it is not here or its bytes no longer hash to its name (a damaged
        file is never served as the artifact)."""
        path = self._path(digest)
        if path is None:
            return None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return data if hashlib.sha256(data).hexdigest() == digest else None

    def report_dir(self, campaign: str) -> Path:
        """Where the copy of a campaign's report goes."""
        return self.reports / campaign

    def write_report(self, campaign: str, markdown: str, png: bytes) -> Path:
        """Keep a copy of a campaign's report (report.md and plot.png); returns the directory."""
        out = self.report_dir(campaign)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(markdown)
        (out / "plot.png").write_bytes(png)
        return out
