"""Adopting a process started elsewhere (record 004): verify, record, watch, never run it.

``adopt(pid)`` opens a pidfd first, then reads /proc/PID (start time, owner, command line,
working directory), so once the checks pass the fd is known to name the process the user
meant. Refusals are loud and kept in history: a terminal ``failed`` job with reason
``adopt_pid_gone``, ``adopt_pid_mismatch`` or ``adopt_uid_mismatch``. An accepted process
becomes a ``running`` job at once (never queued, so no requeue or retry path can ever see
it), holds its domains (even a full one: it already runs there), and its pid and
descendants count as owned VRAM. When it exits the job is ``orphaned`` with
``adopted_exit_unobserved``: only a parent can learn an exit status.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from . import procs
from .domain import Domain
from .gpus import GIB
from .lifecycle import _Active
from .models import EventKind, Job, JobKind, JobStatus, TerminationReason
from .restore import Restore
from .sampler import Sampler
from .scheduler import Request
from .spec import SpecError
from .store import StoreError
from .supervisor import open_pidfd

Reason = TerminationReason


@dataclass(frozen=True, slots=True)
class ProcessSnapshot:
    """What /proc says about a process at adoption time."""

    pid: int
    start_ticks: int
    uid: int
    command: str
    cwd: str


def read_process(pid: int) -> ProcessSnapshot | None:
    """Read /proc/PID; ``None`` if it does not exist or is already a zombie."""
    stat = procs.read_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return None
    uid = procs.read_real_uid(pid)
    if uid is None:
        return None
    return ProcessSnapshot(
        pid=pid,
        start_ticks=stat.start_ticks,
        uid=uid,
        command=procs.read_cmdline(pid, limit=4096),
        cwd=procs.read_cwd(pid),
    )


class Adoption(Restore):
    """The ``adopt`` operation, mixed into :class:`~gpulayer_tui.engine.engine.Engine`."""

    sampler: Sampler

    async def adopt(
        self,
        pid: Any,
        *,
        start_ticks: int | None = None,
        name: str | None = None,
        vram_gb: float | None = None,
        gpu: bool = False,
        domain: str | list[str] | None = None,
        requester_uid: int | None = None,
    ) -> Job:
        """Adopt a running process as a job.

        Args:
            pid: The process.
            start_ticks: Its /proc start time as the caller saw it; a different value now
                means the pid was recycled (``adopt_pid_mismatch``).
            name: Label (defaults to the program's name).
            vram_gb: Declared GiB per GPU; reserves ``max(0, declared - held)``.
            gpu: Adopt it on the GPUs where it (or a descendant) holds memory; an error
                if it holds none.
            domain: Adopt it on these domains instead of finding them.
            requester_uid: The asking user's uid (``SO_PEERCRED``); ``None`` in-process.

        Returns:
            The job: ``running``, or ``failed`` with an ``adopt_*`` reason (kept in history).

        Raises:
            SpecError: Invalid arguments (nothing is recorded).
        """
        self._check_writable()
        if isinstance(pid, bool) or not isinstance(pid, int) or pid < 1:
            raise SpecError(f"pid must be a positive integer, not {pid!r}")
        if vram_gb is not None and (
            isinstance(vram_gb, bool) or not isinstance(vram_gb, int | float) or vram_gb <= 0
        ):
            raise SpecError(f"vram_gb must be a number greater than 0, not {vram_gb!r}")
        if name is not None and (not isinstance(name, str) or not name or len(name) > 200):
            raise SpecError("name must be 1 to 200 characters")
        pins = [domain] if isinstance(domain, str) else list(domain or [])
        for pin in pins:
            if pin not in self.scheduler.domains:
                known = ", ".join(self.scheduler.domains)
                raise SpecError(f"domain: unknown domain '{pin}' (known: {known})")

        pidfd = open_pidfd(pid)
        snapshot = read_process(pid) if pidfd is not None else None
        try:
            refusal = self._refusal(pid, snapshot, start_ticks, requester_uid)
            if refusal is None:
                assert snapshot is not None
                domains = pins or await asyncio.to_thread(
                    self._domains_of, pid, snapshot, gpu, vram_gb
                )
        except BaseException:
            if pidfd is not None and pidfd >= 0:
                os.close(pidfd)
            raise
        if refusal is not None:
            if pidfd is not None and pidfd >= 0:
                os.close(pidfd)
            reason, message = refusal
            job = self._record_refusal(pid, snapshot, name, reason, message, requester_uid)
        else:
            assert snapshot is not None
            job = self._accept(snapshot, pidfd, name, vram_gb, domains, requester_uid)
        try:
            await self.store.flush()
        except StoreError as err:
            self._unadopt(job, f"not recorded: {err}")
            raise
        return job

    def _unadopt(self, job: Job, message: str) -> None:
        """An adoption that could not be recorded is undone: stop watching the process
        (never signal it: it was not ours to start) and end the job ``cancelled``."""
        act = self._active.get(job.id)
        if act is None or job.status is not JobStatus.RUNNING:
            return
        self.supervisor.forget(job.id)
        if job.pid is not None:
            self._roots.pop(job.pid, None)
        self._finish(act, JobStatus.CANCELLED, Reason.CANCELLED, f"{message}; pid left alone")

    def _refusal(
        self,
        pid: int,
        snapshot: ProcessSnapshot | None,
        start_ticks: int | None,
        requester_uid: int | None,
    ) -> tuple[TerminationReason, str] | None:
        if snapshot is None:
            return Reason.ADOPT_PID_GONE, f"no process with pid {pid} (it exited, or never was)"
        if start_ticks is not None and start_ticks != snapshot.start_ticks:
            return (
                Reason.ADOPT_PID_MISMATCH,
                f"pid {pid} is a different process now (start time {snapshot.start_ticks}, "
                f"expected {start_ticks}): the pid was reused",
            )
        engine_uid = os.getuid()
        if snapshot.uid != engine_uid:
            return (
                Reason.ADOPT_UID_MISMATCH,
                f"pid {pid} belongs to {procs.user_name(snapshot.uid)}, but this engine runs "
                f"as {procs.user_name(engine_uid)}: it could neither watch nor stop it safely",
            )
        if requester_uid is not None and requester_uid != snapshot.uid:
            return (
                Reason.ADOPT_UID_MISMATCH,
                f"pid {pid} belongs to {procs.user_name(snapshot.uid)}, not to the user "
                f"asking ({procs.user_name(requester_uid)})",
            )
        return None

    def _domains_of(
        self, pid: int, snapshot: ProcessSnapshot, gpu: bool, vram_gb: float | None
    ) -> list[str]:
        """The GPU domains where ``pid`` or a descendant holds memory (blocking: /proc)."""
        sample = self.sampler.latest
        roots: dict[int, tuple[int, int | None]] = {pid: (0, snapshot.start_ticks)}
        found: list[str] = []
        by_index = {d.gpu_index: d for d in self.scheduler.gpu_domains}
        if sample is not None:
            for reading in sample.result.gpus:
                dom = by_index.get(reading.index)
                if dom is None or dom.name in found:
                    continue
                if any(procs.find_owner(p.pid, roots) == 0 for p in reading.processes):
                    found.append(dom.name)
        if found:
            return found
        if gpu or vram_gb is not None:
            gpus = self.scheduler.gpu_domains
            if len(gpus) == 1:
                return [gpus[0].name]
            raise SpecError(f"pid {pid} holds no GPU memory now; name its GPU domain (--domain)")
        return ["cpu"]

    def _new_adopted_job(
        self,
        pid: int,
        snapshot: ProcessSnapshot | None,
        name: str | None,
        spec: dict[str, Any],
        owner_uid: int | None,
    ) -> _Active:
        self._next_id += 1
        command = snapshot.command if snapshot else ""
        label = name or (os.path.basename(command.split(" ", 1)[0]) if command else f"pid {pid}")
        job = Job(
            id=self._next_id,
            name=label,
            kind=JobKind.ADOPTED,
            spec=spec,
            owner_uid=owner_uid,
        )
        act = _Active(job, None, None, asyncio.get_running_loop().create_future())
        self._active[job.id] = act
        event = self._job_event(EventKind.SUBMITTED, job, {"status": "pending", "message": ""})
        self.store.save(job, [event])
        return act

    def _record_refusal(
        self,
        pid: int,
        snapshot: ProcessSnapshot | None,
        name: str | None,
        reason: TerminationReason,
        message: str,
        owner_uid: int | None,
    ) -> Job:
        spec: dict[str, Any] = {"kind": "adopted", "pid": pid}
        if snapshot is not None:
            spec.update(command=snapshot.command, start_ticks=snapshot.start_ticks)
        act = self._new_adopted_job(pid, snapshot, name, spec, owner_uid)
        self._finish(act, JobStatus.FAILED, reason, f"refused to adopt: {message}")
        return act.job

    def _accept(
        self,
        snapshot: ProcessSnapshot,
        pidfd: int | None,
        name: str | None,
        vram_gb: float | None,
        domains: list[str],
        owner_uid: int | None,
    ) -> Job:
        spec: dict[str, Any] = {
            "kind": "adopted",
            "pid": snapshot.pid,
            "start_ticks": snapshot.start_ticks,
            "command": snapshot.command,
            "cwd": snapshot.cwd,
            "uid": snapshot.uid,
            "domain": domains,
        }
        if vram_gb is not None:
            spec["vram_gb"] = vram_gb
        act = self._new_adopted_job(snapshot.pid, snapshot, name, spec, owner_uid)
        job = act.job
        holds: list[Domain] = [self.scheduler.domains[d] for d in domains]
        declared = None if vram_gb is None else int(vram_gb * GIB)
        act.request = Request(
            gpus=len([d for d in holds if d.is_gpu]),
            vram_bytes=declared,
            pins=tuple(domains),
            exclusive=False,
        )
        for dom in holds:
            # Even on a full domain: the process runs there already; this only stops new
            # placements until room frees (record 004).
            dom.hold(job.id, declared if dom.is_gpu else None, False)
        act.holds = holds
        job.domains = list(domains)
        job.gpus = [d.gpu_index for d in holds if d.gpu_index is not None]
        job.pid, job.start_ticks = snapshot.pid, snapshot.start_ticks
        self._roots[snapshot.pid] = (job.id, snapshot.start_ticks)
        self.supervisor.watch_adopted(
            job.id,
            snapshot.pid,
            pidfd if pidfd is not None and pidfd >= 0 else None,
            snapshot.start_ticks,
        )
        self._transition(
            act, JobStatus.RUNNING, message=f"adopted pid {snapshot.pid} on {', '.join(domains)}"
        )
        self._schedule_soon()
        return job
