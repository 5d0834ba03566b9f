"""gpulayer-tui's themes: Textual ``Theme`` objects plus ``app.tcss``.

This folder is installed as the package ``gpulayer_tui.themes`` (see pyproject). Widgets
use only ``$variables`` (Textual's, plus the ``memory-*`` ones below for the VRAM split),
never literal colours, so every theme restyles everything. Coloured text is drawn in
Textual's ``$text-success``, ``$text-warning``, ... (never ``$success`` and the like,
which a theme may mean for backgrounds: in Textual's atom-one-light, "completed" in
``$success`` on its background was 1.01:1, unreadable: tester h165); Textual makes
those readable on the theme's background, and ours set them to their own colours,
chosen for it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from textual.color import Color
from textual.theme import Theme

CSS_PATH = Path(__file__).with_name("app.tcss")

DARK = Theme(
    name="gpulayer-dark",
    primary="#5AA9E6",
    secondary="#7FC8A9",
    accent="#F4B860",
    warning="#F4B860",
    error="#E5625E",
    success="#7FC8A9",
    foreground="#D8DEE9",
    background="#0E1116",
    surface="#161B22",
    panel="#1F2630",
    dark=True,
    variables={
        "memory-owned": "#5AA9E6",
        "memory-unregistered": "#E5625E",
        "memory-unattributed": "#B48EAD",
        "memory-free": "#2E3440",
        "footer-key-foreground": "#F4B860",
    },
)

LIGHT = Theme(
    name="gpulayer-light",
    primary="#1F6FB2",
    secondary="#2E8B57",
    accent="#B7791F",
    warning="#B7791F",
    error="#C0392B",
    success="#2E8B57",
    foreground="#1B1F24",
    background="#F7F8FA",
    surface="#FFFFFF",
    panel="#E8ECF1",
    dark=False,
    variables={
        "memory-owned": "#1F6FB2",
        "memory-unregistered": "#C0392B",
        "memory-unattributed": "#8E44AD",
        "memory-free": "#D5DBE3",
        "footer-key-foreground": "#B7791F",
    },
)


def _text_as_chosen(theme: Theme) -> None:
    """Coloured text in ``theme``'s own colours (chosen to read on its background), not
    the paler mixes Textual makes for a theme that does not say."""
    for name in ("primary", "secondary", "accent", "warning", "error", "success"):
        theme.variables.setdefault(f"text-{name}", getattr(theme, name))


_text_as_chosen(DARK)
_text_as_chosen(LIGHT)

THEMES: tuple[Theme, ...] = (DARK, LIGHT)

TEXT_CONTRAST = 4.5
"""What coloured text of Textual's themes is made to read at (WCAG's AA for text) on
the theme's background, surface and panel: the ``text-*`` colours Textual derives read at
about 3:1 on the background of its light themes, and 2.1-2.7:1 on table stripes and
the header and footer bars, which are darker (tester h166)."""


def contrast(a: Color, b: Color) -> float:
    """The WCAG contrast ratio of two colours (1 to 21)."""

    def luminance(c: Color) -> float:
        def channel(v: int) -> float:
            s = v / 255
            return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

        return 0.2126 * channel(c.r) + 0.7152 * channel(c.g) + 0.0722 * channel(c.b)

    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def readable(theme: Theme) -> Theme:
    """``theme`` with each ``text-*`` colour it does not set itself darkened (light
    themes) or lightened (dark ones) until it reads at :data:`TEXT_CONTRAST` on the
    theme's background, surface and panel (or as near as 20 steps take it)."""
    colours = theme.to_color_system().generate()
    grounds = [Color.parse(colours[key]) for key in ("background", "surface", "panel")]
    variables = dict(theme.variables)
    for name in ("primary", "secondary", "accent", "warning", "error", "success"):
        key = f"text-{name}"
        if key in theme.variables:
            continue
        colour = Color.parse(colours[key])
        for _ in range(20):
            if min(contrast(colour, ground) for ground in grounds) >= TEXT_CONTRAST:
                break
            colour = colour.lighten(0.04) if theme.dark else colour.darken(0.04)
        variables[key] = colour.hex
    return dataclasses.replace(theme, variables=variables)


DEFAULT_THEME = DARK.name
