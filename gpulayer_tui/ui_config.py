"""Saving the TUI's preferences into the config file without losing the user's comments.

tomllib only reads TOML, and a full rewrite would drop comments and ordering, so the one
key we persist (``[ui] theme``) is edited in place as text.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

_SECTION = re.compile(r"^\s*\[([^\]]+)\]\s*(#.*)?$")
_THEME = re.compile(r"^\s*theme\s*=")


def save_theme(path: Path, theme: str) -> None:
    """Set ``[ui] theme`` in ``path`` (creating the file or section if needed).

    Raises:
        OSError: The file cannot be written.
        ValueError: The file is not valid TOML, or sets ``ui`` in a way this line-based
            edit cannot change alone (a dotted ``ui.theme`` key, an inline table): it is
            left as it was (written anyway, it declared ``ui`` twice and no engine or TUI
            could start on it).
    """
    line = f"theme = {json.dumps(theme)}\n"
    try:
        original = path.read_text()
    except FileNotFoundError:
        original = ""
    try:
        before = tomllib.loads(original)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path} is not valid TOML ({err}); it was left as it is") from None
    lines = original.splitlines(keepends=True)
    start = end = None  # the [ui] table: header line, and the line after its last one
    for index, text in enumerate(lines):
        match = _SECTION.match(text)
        if match is None:
            continue
        if start is not None and end is None:
            end = index
        if start is None and match.group(1).strip() == "ui":
            start = index
    if start is None:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines += (["\n"] if lines else []) + ["[ui]\n", line]
    else:
        end = len(lines) if end is None else end
        for index in range(start + 1, end):
            if _THEME.match(lines[index]):
                lines[index] = line
                break
        else:
            lines.insert(start + 1, line)
    text = "".join(lines)
    ui = before.get("ui", {})
    expected = {**before, "ui": {**ui, "theme": theme}} if isinstance(ui, dict) else None
    try:
        after: object = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        after = None
    if after is None or after != expected:
        raise ValueError(
            f"{path} sets [ui] in a way this cannot edit alone (a dotted key or an inline "
            f"table); set theme = {json.dumps(theme)} there"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
