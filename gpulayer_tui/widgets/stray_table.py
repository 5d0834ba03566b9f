"""The strays table: GPU processes the engine does not own, one row per pid."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.message import Message
from textual.widgets import DataTable

from .. import keymap
from ..fields import printable
from ..formatting import GIB, duration
from ..wire import GpusJSON
from .own_keys import OwnKeys
from .row_keys import cursor_number


def strays_from(gpu_state: GpusJSON | None) -> list[dict[str, Any]]:
    """Foreign GPU processes, merged per pid across GPUs, most memory first: those of no
    job, and a job's on a GPU the job does not hold (its memory there is unregistered:
    left out, the rows added up to less than the unregistered figure; `gpus` lists them
    too: tester h184)."""
    merged: dict[int, dict[str, Any]] = {}
    for dom in gpu_state["domains"] if gpu_state else []:
        # (a job that just ended owns its processes until the next sample: as `gpus`)
        held = set(dom.get("jobs") or ()) | set(dom.get("leaving_jobs") or ())
        for proc in dom["processes"]:
            owner = proc.get("job_id")
            if owner is not None and owner in held:
                continue
            whose = "" if owner is None else f"job {owner}'s, outside its GPUs: "
            row = merged.setdefault(
                proc["pid"],
                {
                    "pid": proc["pid"],
                    "user": proc.get("user", ""),
                    "command": whose + proc.get("command", ""),
                    "start_ticks": proc.get("start_ticks"),
                    "started_at": proc.get("started_at"),
                    "gpus": [],
                    "used_bytes": 0,
                    "most_on_a_gpu": 0,  # (the adopt dialog's VRAM per GPU)
                    "unknown": False,
                },
            )
            row["gpus"].append(dom["gpu_index"])
            if proc.get("used_bytes") is None:
                row["unknown"] = True
            else:
                row["used_bytes"] += proc["used_bytes"]
                row["most_on_a_gpu"] = max(row["most_on_a_gpu"], proc["used_bytes"])
    return sorted(merged.values(), key=lambda r: (-r["used_bytes"], r["pid"]))


class StrayTable(OwnKeys, DataTable[Any]):
    """Foreign GPU processes: pid, user, GPUs, VRAM, age, command."""

    BINDINGS: ClassVar[list[BindingType]] = list(keymap.bindings(keymap.TABLE))

    DEFAULT_CSS = """
    StrayTable { height: 1fr; }
    """

    class AdoptRequested(Message):
        """The user asked to adopt the process on the cursor row."""

        def __init__(self, process: dict[str, Any]) -> None:
            super().__init__()
            self.process = process

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.rows_by_pid: dict[int, dict[str, Any]] = {}

    def on_mount(self) -> None:
        self.add_column("PID", key="pid")
        self.add_column("USER", key="user")
        self.add_column("GPU", key="gpu")
        self.add_column("VRAM GiB", key="vram")
        self.add_column("AGE", key="age")
        self.add_column("COMMAND", key="command")

    def show(self, strays: list[dict[str, Any]], now: float) -> None:
        """Replace the rows (a handful at most), keeping the cursor on the same pid."""
        current = self.cursor_pid
        self.clear()
        self.rows_by_pid = {s["pid"]: s for s in strays}
        for stray in strays:
            vram = (
                "?"
                if stray["unknown"] and not stray["used_bytes"]
                else (f"{stray['used_bytes'] / GIB:.1f}" + ("+?" if stray["unknown"] else ""))
            )
            age = duration(now - stray["started_at"]) if stray.get("started_at") else "?"
            # (Text: a user name and a command line are shown as written, never as
            # markup: DataTable reads a str cell as markup)
            self.add_row(
                Text(str(stray["pid"]), justify="right"),
                Text(stray["user"] or "?"),
                ",".join(str(g) for g in stray["gpus"]),
                Text(vram, justify="right"),
                Text(age, justify="right"),
                # (on one line: see formatting.short_command)
                Text(printable(stray["command"]) or "?"),
                key=str(stray["pid"]),
            )
        if current in self.rows_by_pid:
            self.move_cursor(row=self.get_row_index(str(current)))

    @property
    def cursor_pid(self) -> int | None:
        """The pid on the cursor row, if any."""
        return cursor_number(self)

    def action_adopt(self) -> None:
        """Ask to adopt the cursor row's process."""
        pid = self.cursor_pid
        if pid is not None:
            self.post_message(self.AdoptRequested(self.rows_by_pid[pid]))

    @property
    def cursor_process(self) -> dict[str, Any] | None:
        """The stray on the cursor row, if any."""
        pid = self.cursor_pid
        return None if pid is None else self.rows_by_pid.get(pid)
