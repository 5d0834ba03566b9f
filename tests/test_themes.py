"""Coloured text is readable in every theme the TUI can be given (tester h165: in
Textual's atom-one-light, "completed" drawn in ``$success`` was 1.01:1 on its
background)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from gpulayer_tui.themes import TEXT_CONTRAST, THEMES, contrast
from textual.color import Color
from textual.theme import BUILTIN_THEMES

from gpulayer_tui.app import build_app
from gpulayer_tui.widgets.job_table import JobTable

from .ui_support import FIXED_NOW, StaticBackend, until

REPO = Path(__file__).resolve().parent.parent
COLOURS = ("primary", "secondary", "accent", "warning", "error", "success")
# (ANSI themes take the terminal's own palette: no contrast to compute here)
KNOWN = {t.name: t for t in THEMES} | {
    name: theme for name, theme in BUILTIN_THEMES.items() if not name.startswith("ansi")
}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_each_themes_text_colours_read_on_its_grounds(name: str) -> None:
    # Textual's, as the app gives them (made to read at 4.5:1 on the background, the
    # surface and the panel: 2.1:1 on atom-one-light's table stripes, tester h166);
    # ours, in their own colours, at 3:1 on the background.
    app: Any = build_app(StaticBackend(), clock=lambda: FIXED_NOW)
    theme = app.get_theme(name)
    colours = {**theme.to_color_system().generate(), **theme.variables}
    ours = name in {t.name for t in THEMES}
    grounds = ["background"] if ours else ["background", "surface", "panel"]
    low = {
        (v, g): round(contrast(Color.parse(colours[f"text-{v}"]), Color.parse(colours[g])), 2)
        for v in COLOURS
        for g in grounds
    }
    assert min(low.values()) >= (3.0 if ours else TEXT_CONTRAST), low


def test_widgets_draw_coloured_text_in_the_text_variables() -> None:
    # $success and the like are a theme's accents (backgrounds, borders): text in them
    # was unreadable on light themes; $text-success is made to read.
    bare = re.compile(r"\$(" + "|".join(COLOURS) + r")(?![-\w])")
    found = []
    sources = [*(REPO / "gpulayer_tui").rglob("*.py"), REPO / "themes" / "app.tcss"]
    for path in sources:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not bare.search(line):
                continue
            if re.search(r"\b(background|border(-left|-top)?|outline)\s*:", line):
                continue  # (not text)
            found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == []


async def test_a_completed_job_reads_in_a_light_theme_of_textuals() -> None:
    app: Any = build_app(StaticBackend(), clock=lambda: FIXED_NOW, cursor_blink=False)
    async with app.run_test(size=(120, 32)) as pilot:
        app.theme = "atom-one-light"
        await pilot.press("2")
        table = await until(
            pilot, lambda: app.screen.query(JobTable) and app.screen.query_one(JobTable)
        )
        await pilot.pause()
        style = table.get_component_rich_style("jobtable--completed")
        assert style.color is not None and style.color.triplet is not None
        shown = Color(*style.color.triplet)
        background = Color.parse(app.current_theme.background or "#000000")
        assert contrast(shown, background) >= TEXT_CONTRAST, (shown.hex, background.hex)
