"""The themes package, installed or beside the package in a source checkout.

An install maps the top-level ``themes/`` folder into the package as
``gpulayer_tui.themes`` (``pyproject.toml``'s ``package-dir``); a checkout run from
``PYTHONPATH`` has no such mapping, and the TUI ended in ``ModuleNotFoundError`` there
while every CLI command worked (tester h75). There the folder beside the package is
loaded under the same name.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _load() -> ModuleType:
    try:
        return importlib.import_module("gpulayer_tui.themes")
    except ModuleNotFoundError as missing:
        folder = Path(__file__).resolve().parent.parent / "themes"
        spec = importlib.util.spec_from_file_location(
            "gpulayer_tui.themes", folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        if spec is None or spec.loader is None or not (folder / "__init__.py").is_file():
            raise missing
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module


themes = _load()
"""``gpulayer_tui.themes``: ``THEMES``, ``DARK``, ``DEFAULT_THEME``, ``CSS_PATH``."""


def theme_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names a ``[ui] theme`` may give: ours (the default first), and Textual's own."""
    from textual.theme import BUILTIN_THEMES

    default = themes.DEFAULT_THEME
    ours = (default, *(t.name for t in themes.THEMES if t.name != default))
    return ours, tuple(sorted(BUILTIN_THEMES))


def unknown_theme_words(theme: str) -> str:
    """What is said of a ``[ui] theme`` no theme has (the TUI said only "unknown theme")."""
    ours = theme_names()[0]
    return (
        f"[ui] theme {theme!r} is no theme: the TUI uses {ours[0]} (ours: {', '.join(ours)}; "
        "Textual's own, such as nord or dracula, work too)"
    )
