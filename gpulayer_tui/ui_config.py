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
_COMMENT = re.compile(r"\s+#[^\"']*$")  # a trailing comment with no quote in it


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
    # A config reached through a symlink (a dotfiles folder) is edited where it is: the
    # link was replaced by a plain file.
    path = Path(os.path.realpath(path))
    mode = None
    try:
        mode = path.stat().st_mode & 0o7777
        with open(path, newline="") as source:  # (as it is: CRLF endings kept)
            original = source.read()
    except FileNotFoundError:
        original = ""
    if mode is not None and not mode & 0o200:
        raise ValueError(f"{path} is read-only (mode {mode:o}); it was left as it is")
    try:
        before = tomllib.loads(original)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path} is not valid TOML ({err}); it was left as it is") from None
    crlf = "\r\n" in original
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
                raw = lines[index]
                body = raw.rstrip("\r\n")
                comment = _COMMENT.search(body)  # (kept: "theme = 'x'  # mine")
                kept = comment.group(0) if comment is not None else ""
                lines[index] = line[:-1] + kept + (raw[len(body) :] or "\n")
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
            f"{path} sets [ui] in a way this cannot edit alone (a dotted key, an inline "
            f"table, a quoted name); set theme = {json.dumps(theme)} there"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # Its mode kept (0600: it may hold a webhook URL; the umask made it 0644), its line
    # endings too (a CRLF file came back LF).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if mode is None else mode)
    with open(fd, "w", newline="") as out:
        out.write(text.replace("\r\n", "\n").replace("\n", "\r\n") if crlf else text)
    if mode is not None:
        os.chmod(tmp, mode)  # (os.open's mode passes through the umask)
    os.replace(tmp, path)
