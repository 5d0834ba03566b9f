"""The cursor row's key of a table whose rows are keyed by a number (a pid, a uid)."""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable


def cursor_number(table: DataTable[Any]) -> int | None:
    """The number the cursor row is keyed by; ``None`` for an empty table (or a row whose
    key is no number)."""
    if not table.row_count:
        return None
    try:
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
    except Exception:  # (a cursor past the rows while they are replaced)
        return None
    try:
        return int(key) if key else None
    except ValueError:
        return None
