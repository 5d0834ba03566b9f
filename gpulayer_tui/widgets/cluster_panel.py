"""The dashboard's Slurm clusters (issue 16): one line per ``[clusters.NAME]``.

``● cluster lab · partition gpu · up · 2 nodes (1 mixed, 1 idle) · GPUs ▆▆░░ 8 total ·
4 allocated · 4 idle · 3 jobs``, or, while the cluster does not answer, its last known
figures after ``not answering since 14:02:11: squeue did not answer within 30 s``. It
follows the app's ``gpu_state`` (the engine's ``/gpus`` and ``gpu.sample`` events carry
``clusters``) and is hidden on an engine without clusters. Names, partitions, states and
errors come from the config and from Slurm: they are shown as text, never as markup.
"""

from __future__ import annotations

import time
from typing import Any

from textual.content import Content
from textual.widgets import Static

from ..view import view_of
from .memory_bar import BAR_CHAR

BAR_WIDTH = 8
"""Cells of the allocated-GPUs bar."""

_SEP = (" · ", "$text-muted")


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _since(at: float | None) -> str:
    return "" if not at else f" since {time.strftime('%H:%M:%S', time.localtime(at))}"


def cluster_line(cluster: dict[str, Any]) -> Content:
    """One cluster of ``/gpus``'s ``clusters``, as one line of text."""
    answering = bool(cluster.get("answering"))
    state = str(cluster.get("state") or "unknown").lower()
    up = answering and state == "up"
    pieces: list[tuple[str, str]] = [
        (
            "●" if up else "◐",
            "$text-success" if up else "$text-warning" if answering else "$text-error",
        ),
        (" cluster ", "bold"),
        (str(cluster.get("name", "")), "bold"),
        (" · partition ", "$text-muted"),
        (str(cluster.get("partition", "")), ""),
    ]
    if not answering:
        why = cluster.get("error")
        if cluster.get("down_since"):
            words = f"not answering{_since(cluster.get('down_since'))}"
        else:
            words = "refused" if why else "not answering"
        pieces += [_SEP, (words, "$text-error bold")]
        if why:
            pieces.append((f": {why}", "$text-error"))
    if "nodes" in cluster:  # (read at least once: while it does not answer, the last known)
        muted = "" if answering else "$text-muted"
        if answering:
            pieces += [_SEP, (state, "" if up else "$text-warning")]
        pieces += [_SEP, (_plural(cluster.get("nodes", 0), "node"), muted)]
        states = cluster.get("node_states") or {}
        if states:
            each = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
            pieces.append((f" ({each})", "$text-muted"))
        total = int(cluster.get("gpus_total") or 0)
        allocated = int(cluster.get("gpus_allocated") or 0)
        filled = 0 if not total else round(min(allocated, total) / total * BAR_WIDTH)
        if allocated and not filled:
            filled = 1
        pieces += [
            (" · GPUs ", "$text-muted"),
            (BAR_CHAR * filled, "$text-secondary"),
            (BAR_CHAR * (BAR_WIDTH - filled), "$memory-free"),
            (f" {total} total", muted or "bold"),
            _SEP,
            (f"{allocated} allocated", muted),
            _SEP,
            (f"{cluster.get('gpus_idle', max(0, total - allocated))} idle", muted),
        ]
    pieces += [_SEP, (_plural(int(cluster.get("jobs") or 0), "job"), "")]
    return Content.assemble(*pieces)


class ClusterPanel(Static):
    """Each configured Slurm cluster, one line each (hidden when there are none)."""

    DEFAULT_CSS = """
    ClusterPanel {
        height: auto;
        padding: 0 1;
        display: none;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: str | None = None

    def on_mount(self) -> None:
        self.watch(self.app, "gpu_state", self._on_gpu_state, init=True)

    def _on_gpu_state(self, _state: object = None) -> None:
        state = view_of(self).gpu_state
        if state is not None:
            self.show(state.get("clusters") or [])

    def show(self, clusters: list[dict[str, Any]]) -> None:
        """Redraw from ``/gpus``'s ``clusters`` (unchanged lines cost no repaint)."""
        self.display = bool(clusters)
        content = Content("\n").join(cluster_line(c) for c in clusters)
        if content.markup != self._shown:
            self._shown = content.markup
            self.update(content)
