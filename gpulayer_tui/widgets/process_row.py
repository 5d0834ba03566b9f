"""One row of the GPU process table: a process on one GPU, or the tree view's line for a
job (its own module: the table and the tree view both build rows)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessRow:
    """One process on one GPU (a process on two GPUs is two rows)."""

    gpu: int
    pid: int
    user: str
    used_bytes: int | None
    job_id: int | None
    command: str
    start_ticks: int | None = None
    """When the process started (with the pid, it names this very process)."""
    started_at: float | None = None
    """When the process started, epoch seconds."""
    cpu_percent: float | None = None
    """Host CPU over the last sample interval (100 = one core)."""
    rss: int | None = None
    """Resident host memory, bytes."""
    gpu_util: int | None = None
    """Its SM utilisation of the GPU, percent (``None``: the driver has no figure)."""
    ppid: int | None = None
    """Its parent's pid (the tree view nests it under a listed parent)."""
    tree_prefix: str = ""
    """The tree view's glyphs before its COMMAND."""
    job_line: bool = False
    """The tree view's line for a job (``job_id``) above its processes, not a process."""
    gpus: tuple[int, ...] = ()
    """A job line's GPUs."""
    managed: bool = True
    """Its GPU has a domain (a foreign process on one without is not "unregistered": the
    engine does not manage that GPU at all)."""

    @property
    def key(self) -> str:
        """The row's key in the table."""
        return f"job:{self.job_id}" if self.job_line else f"{self.gpu}:{self.pid}"
