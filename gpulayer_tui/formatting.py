"""Small text formatters shared by the CLI and the TUI (stdlib only)."""

from __future__ import annotations

GIB = 1024**3


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def gib(value: int | None) -> str:
    """Bytes as GiB with one decimal; ``?`` when unknown."""
    return "?" if value is None else f"{value / GIB:.1f}"
