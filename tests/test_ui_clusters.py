"""The dashboard's cluster panel (issue 16) without a cluster: its lines from fixed views.

The same panel over a real engine and a real Slurm is in tests/test_slurm.py.
"""

from __future__ import annotations

import time
from typing import Any

from textual.app import App, ComposeResult
from textual.reactive import reactive

from gpulayer_tui.widgets.cluster_panel import ClusterPanel, cluster_line
from gpulayer_tui.widgets.memory_bar import BAR_CHAR

ANSWERING = {
    "name": "lab",
    "kind": "slurm",
    "partition": "gpu",
    "answering": True,
    "error": None,
    "down_since": None,
    "jobs": 3,
    "state": "UP",
    "nodes": 2,
    "node_states": {"mixed": 1, "idle": 1},
    "gpus_total": 8,
    "gpus_allocated": 4,
    "gpus_idle": 4,
    "max_time_s": 3600.0,
}


def test_an_answering_cluster_in_one_line() -> None:
    assert cluster_line(ANSWERING).plain == (
        f"● cluster lab · partition gpu · up · 2 nodes (1 idle, 1 mixed) · GPUs {BAR_CHAR * 8}"
        " 8 total · 4 allocated · 4 idle · 3 jobs"
    )


def test_a_silent_cluster_says_since_when_and_keeps_its_last_figures() -> None:
    since = time.mktime((2027, 1, 15, 14, 2, 11, 0, 0, -1))
    view = {**ANSWERING, "answering": False, "down_since": since}
    view["error"] = "squeue did not answer within 30 s"
    text = cluster_line(view).plain
    assert text.startswith(
        "◐ cluster lab · partition gpu · not answering since 14:02:11: "
        "squeue did not answer within 30 s · 2 nodes"
    )
    assert "8 total · 4 allocated" in text
    # Never read: no figures at all.
    first = {"name": "lab", "partition": "gpu", "answering": False, "error": "sinfo: boom"}
    assert (
        cluster_line(first).plain == "◐ cluster lab · partition gpu · refused: sinfo: boom · 0 jobs"
    )
    # `gpus` says it as the panel does (it said "not answering" of a refusal: h150)
    from gpulayer_tui.cli.format import _not_answering

    assert _not_answering(first) == "refused: sinfo: boom"
    assert _not_answering(view) == (
        "not answering since 14:02:11: squeue did not answer within 30 s"
    )


def test_names_and_errors_are_text_never_markup() -> None:
    hostile = "[bold red]x[/] [@click=app.quit]y[/]"
    view = {**ANSWERING, "name": hostile, "partition": hostile, "answering": False}
    view["error"] = hostile
    text = cluster_line(view).plain
    assert text.count(hostile) == 3


class _Panel(App[None]):
    gpu_state: reactive[Any] = reactive(None)  # (what the panel follows in the real app)

    def compose(self) -> ComposeResult:
        yield ClusterPanel(id="clusters")


async def test_the_panel_hides_without_clusters_and_shows_one_line_each() -> None:
    app = _Panel()
    async with app.run_test(size=(140, 10)) as pilot:
        panel = app.query_one(ClusterPanel)
        panel.show([])
        await pilot.pause()
        assert not panel.display
        other: dict[str, Any] = {**ANSWERING, "name": "hpc", "state": "DOWN"}
        panel.show([ANSWERING, other])
        await pilot.pause()
        assert panel.display and panel.size.height == 2
        lines = str(panel.content).splitlines()
        assert lines[0].startswith("● cluster lab") and lines[1].startswith("◐ cluster hpc")
        assert "· down ·" in lines[1]
