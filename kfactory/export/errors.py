"""The exporter's one failure type: its message is one line that says what to do."""
from __future__ import annotations


class ExportError(ValueError):
    """An export cannot be made as asked (the kernel, the name, the problem's ABI or the toolchain is why)."""
