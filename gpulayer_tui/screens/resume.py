"""Screens that keep their styles when shown again, unless the app's look changed."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.screen import Screen


def _look(screen: Screen[Any]) -> tuple[object, ...]:
    """What the app contributes to every widget's style: the theme, the app's classes and
    pseudo-classes (focus or blur, dark or light, ansi, inline)."""
    app = screen.app
    return (app.theme, app.classes, app.pseudo_classes)


class KeepsStylesOnResume(Screen[Any]):
    """A screen that is not restyled whole each time it is shown again.

    Textual restyles every widget of a screen when it resumes (a switch to its mode, or
    the screen above it closing), and so every cached rendering of those widgets goes:
    the jobs table draws all of its rows again. A hidden screen's widgets are restyled
    when their own classes change anyway, and Textual refreshes a screen's CSS itself
    when the stylesheet changed while it was hidden; what remains is the app's look
    (theme, classes, pseudo-classes). This screen is restyled on resume only when that
    changed since it was hidden (or, the first time it is shown, since it was mounted:
    its widgets were styled then).
    """

    _look_when_hidden: tuple[object, ...] | None = None

    def _on_mount(self, event: events.Mount) -> None:
        # (Screen's own handler runs too: Textual calls each class's handler in turn)
        self._look_when_hidden = _look(self)

    def _on_screen_suspend(self) -> None:
        self._look_when_hidden = _look(self)

    def _on_screen_resume(self, event: events.ScreenResume) -> None:
        # (Screen's own handler runs after this one: it restyles when refresh_styles)
        if self._look_when_hidden is not None and self._look_when_hidden == _look(self):
            event.refresh_styles = False
        self._look_when_hidden = None
