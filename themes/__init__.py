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

from pathlib import Path

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
DEFAULT_THEME = DARK.name
