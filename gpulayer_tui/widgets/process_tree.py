"""The process table's tree view: each job's GPU processes under a line for the job,
each process under its parent where the parent is listed too (nvitop's ``t``).

A pure function of the rows (already in the table's sort order) and what the jobs are, so
the order and the glyphs are tested without a table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from .process_row import ProcessRow


@dataclass(frozen=True)
class JobLine:
    """What the tree's line for a job shows: its leader's pid, its user and its name."""

    pid: int | None
    user: str
    name: str


def tree_lines(rows: list[ProcessRow], jobs: Mapping[int, JobLine]) -> list[ProcessRow]:
    """``rows`` as the tree view shows them.

    Groups come in the order of their first row: a job's processes (under a line for the
    job, ``job_line``), or one user's unregistered processes. Within a group a process goes
    under its parent when the parent is one of the group's rows, siblings in the table's
    order; ``tree_prefix`` holds the glyphs (``├─``, ``└─``, ``│``) its COMMAND gets.
    """
    groups: dict[tuple[str, int | str], list[ProcessRow]] = {}
    for row in rows:
        key: tuple[str, int | str] = (
            ("job", row.job_id) if row.job_id is not None else ("user", row.user)
        )
        groups.setdefault(key, []).append(row)
    out: list[ProcessRow] = []
    for (kind, ident), members in groups.items():
        under_job = kind == "job"
        if under_job:
            assert isinstance(ident, int)
            out.append(_job_line(ident, members, jobs.get(ident)))
        pids = {r.pid for r in members}
        children: dict[int, list[ProcessRow]] = {}
        roots: list[ProcessRow] = []
        for row in members:
            if row.ppid is not None and row.ppid in pids and row.ppid != row.pid:
                children.setdefault(row.ppid, []).append(row)
            else:
                roots.append(row)
        placed: set[int] = set()  # (a process on two GPUs: its children go under the first)
        _walk(roots, children, "", under_job, placed, out)
    return out


def _walk(
    rows: list[ProcessRow],
    children: dict[int, list[ProcessRow]],
    indent: str,
    nested: bool,
    placed: set[int],
    out: list[ProcessRow],
) -> None:
    for n, row in enumerate(rows):
        last = n == len(rows) - 1
        glyph = ("└─ " if last else "├─ ") if nested else ""
        out.append(replace(row, tree_prefix=indent + glyph))
        if row.pid in placed:
            continue
        placed.add(row.pid)
        below = children.get(row.pid, [])
        if below:
            deeper = indent + (("   " if last else "│  ") if nested else "")
            _walk(below, children, deeper, True, placed, out)


def _job_line(job_id: int, members: list[ProcessRow], job: JobLine | None) -> ProcessRow:
    """The job's line: its sums over its processes (VRAM, GPU %) where it has several; over
    one, the figures are that process's, on the row under it, and were said twice. Its
    leader's pid only where no row under it has that pid."""
    several = len(members) > 1
    known = [r.used_bytes for r in members if r.used_bytes is not None and several]
    utils = [r.gpu_util for r in members if r.gpu_util is not None and several]
    leader = job.pid if job is not None and job.pid is not None else 0
    return ProcessRow(
        gpu=min(r.gpu for r in members),
        pid=0 if any(r.pid == leader for r in members) else leader,
        user=job.user if job is not None else members[0].user,
        used_bytes=sum(known) if known else None,
        job_id=job_id,
        command=job.name if job is not None else f"job {job_id}",
        gpu_util=sum(utils) if utils else None,
        job_line=True,
        gpus=tuple(sorted({r.gpu for r in members})),
    )
