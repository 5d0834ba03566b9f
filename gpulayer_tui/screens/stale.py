"""Screens whose rows came from the engine: marked while no engine answers, so that their
last rows are not read as live (the header says why).

Each such screen dims its engine-made widgets under ``.-no-engine`` in its own CSS (the
dashboard since tester h130; the jobs, users, strays and job screens since h162/h167,
whose rows kept reading "running" with the engine gone)."""

from __future__ import annotations

from typing import Any

from textual.screen import Screen

NO_ENGINE = "-no-engine"
"""The screen's class while no engine answers."""


def mark_while_no_engine(screen: Screen[Any]) -> None:
    """Give ``screen`` the :data:`NO_ENGINE` class while the app has a connection problem
    (from now on; call it when the screen mounts)."""

    def follow(problem: str) -> None:
        screen.set_class(bool(problem), NO_ENGINE)

    screen.watch(screen.app, "connection_problem", follow, init=True)
