"""Adopting a process started elsewhere (record 004): verify, record, watch, never run it.

``adopt(pid)`` opens a pidfd first, then reads /proc/PID (start time, owner, command line,
working directory), so once the checks pass the fd is known to name the process the user
meant. Refusals are loud and kept in history: a terminal ``failed`` job with reason
``adopt_pid_gone``, ``adopt_pid_mismatch``, ``adopt_uid_mismatch`` or ``adopt_refused``
(init, this engine, a kernel thread, gpulayer-tui's own processes, a process a job has
already). An accepted process becomes a ``running`` job at once (never queued, so no
requeue or retry path can ever see it), holds its domains (even a full one: it already
runs there), and its pid and descendants count as owned VRAM. When it exits the job is
``orphaned`` with ``adopted_exit_unobserved``: only a parent can learn an exit status.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from stat import S_ISFIFO
from typing import TYPE_CHECKING, Any

from ..fields import default_job_name, printable
from ..wire import AdoptRequest
from . import procs
from .batch import decide_stop
from .config import CPU_DOMAIN
from .domain import Domain, DomainState, gib_apart
from .errors import SpecError, StoreError
from .executor import Exit
from .gpus import GIB
from .jobbook import ActiveJob, JobBook, retake_holds, take_holds
from .launcher import TASK_ENV
from .models import Job, JobKind, JobStatus, TerminationReason
from .scheduler import Request
from .supervisor import Supervisor, open_pidfd
from .unkillable import StuckReleaser

if TYPE_CHECKING:
    from .config import EngineSettings
    from .sampler import Sample
    from .scheduler import Scheduler
    from .store import Store

Reason = TerminationReason

# gpulayer-tui's own long-lived processes (any engine's): never a job.
_OWN_MODULES = (
    "gpulayer_tui.engine.keeper",
    "gpulayer_tui.engine.launcher",
    "gpulayer-tui --serve",
)


@dataclass(frozen=True, slots=True)
class ProcessSnapshot:
    """What /proc says about a process at adoption time."""

    pid: int
    start_ticks: int
    uid: int
    command: str
    cwd: str
    program: str = ""  # argv[0] whole (``command`` joins the words with spaces)


def _shortened(command: str, limit: int = 80) -> str:
    """``command`` cut to ``limit`` characters, the cut said with an ellipsis."""
    return command if len(command) <= limit else command[: limit - 1] + "…"


def thread_group_of(pid: int) -> int | None:
    """The process whose thread ``pid`` is, where ``pid`` names a thread and not a process
    (``/proc/PID`` answers for a thread's id too), else ``None``."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Tgid:"):
                    leader = int(line.split()[1])
                    return leader if leader != pid else None
    except (OSError, ValueError, IndexError):
        return None
    return None


def _is_gpulayer(command: str) -> bool:
    """True for a process of gpulayer-tui itself: the engine's parts, and every client
    (the TUI, ``web``, ``wait``, ``logs -f``: its console script or ``-m gpulayer_tui``)."""
    if any(module in command for module in _OWN_MODULES):
        return True
    words = command.split()
    if any(os.path.basename(word) == "gpulayer-tui" for word in words[:2]):
        return True
    return any(
        word == "-m" and after.split(".")[0] == "gpulayer_tui"
        for word, after in itertools.pairwise(words[:4])
    )


def _ancestors(pid: int) -> set[int]:
    """The pids above ``pid``, up to (not with) the init process: a few /proc reads."""
    found: set[int] = set()
    current = pid
    for _ in range(64):
        stat = procs.read_stat(current)
        if stat is None or stat.ppid <= 1 or stat.ppid in found:
            break
        found.add(stat.ppid)
        current = stat.ppid
    return found


def runs_the_asker(
    pid: int, snapshot: ProcessSnapshot, requester_pid: int, *, typed: bool = True
) -> tuple[TerminationReason, str] | None:
    """A refusal if ``pid`` runs the process that asked to adopt it below it: the shell
    ``adopt --pid $$`` was typed in (``$!`` was meant), or the one the TUI runs in.
    Cancelled, it would end that terminal with everything in it (tester h75). ``typed``:
    the pid was typed in a shell (the CLI's ``adopt``), so ``$$`` and ``$!`` are named."""
    if pid not in _ancestors(requester_pid):
        return None
    hint = " ($$ is the shell's own pid; $! is the last background job's)" if typed else ""
    return (
        Reason.ADOPT_REFUSED,
        f"pid {pid} ({_shortened(snapshot.command)}) runs the command that asked to adopt "
        f"it: stopping it would end that command, and likely your terminal{hint}",
    )


def _reads_our_output(pid: int) -> bool:
    """Whether ``pid`` holds the pipe this process's stdout or stderr writes to (the
    ``tee`` or logger of ``--serve ... | tee``); a few /proc reads, none when neither is a
    pipe."""
    ours = set()
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if S_ISFIFO(st.st_mode):
            ours.add((st.st_dev, st.st_ino))
    if not ours:
        return False
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        try:
            st = os.stat(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in ours:
            return True
    return False


def _job_below(pid: int, roots: dict[int, tuple[int, int | None]]) -> tuple[int, int] | None:
    """``(job id, its root pid)`` of a running job whose process descends from ``pid``, if
    any (each job's ancestors are read: a few /proc reads per job, no scan of them all)."""
    for root, (job_id, _ticks) in roots.items():
        current = root
        for _ in range(64):
            stat = procs.read_stat(current)
            if stat is None or stat.ppid <= 1:
                break
            if stat.ppid == pid:
                return job_id, root
            current = stat.ppid
    return None


def _short_of_room(domains: list[Domain], snapshot: ProcessSnapshot, vram_gb: float | None) -> str:
    """What a declared ``vram_gb`` overbooks: more than a GPU has free for the process
    (what is free plus what it and its descendants hold there already), or "". It is
    still adopted (the process runs there anyway), but the declaration was taken without
    a word, and the GPU's free memory then read 0 (tester h87). Blocking: /proc."""
    if vram_gb is None:
        return ""
    need = int(float(vram_gb) * GIB)
    roots: dict[int, tuple[int, int | None]] = {snapshot.pid: (0, snapshot.start_ticks)}
    short: list[str] = []  # (each GPU short: the first alone was named, tester h200)
    asked = ""
    for dom in domains:
        account = dom.account  # (replaced whole by the loop, never changed in place)
        if account is None or not dom.is_gpu:
            continue  # (not read yet: nothing to compare with)
        own = sum(
            p.used_bytes or 0
            for p in account.foreign
            if p.used_bytes and procs.find_owner(p.pid, roots) == 0
        )
        room = account.free + own
        if need > room:
            asked, has = gib_apart(need, room)
            short.append(f"{dom.name} had {has}")
    if not short:
        return ""
    where = "there" if len(short) == 1 else "on them"
    return (
        f"{asked} declared, but {' and '.join(short)} free for it: nothing else starts "
        f"{where} until memory frees"
    )


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
        program=procs.read_program(pid),
    )


def default_name(pid: int, snapshot: ProcessSnapshot | None) -> str:
    """The name an adopted process gets when none is given: its program's."""
    return default_job_name(snapshot.program, f"pid {pid}") if snapshot else f"pid {pid}"


def adopted_request(spec: dict[str, Any]) -> Request:
    """What an adopted job holds: its domains (no capacity check: it runs there already)
    and, if declared, its memory per GPU."""
    domains = list(spec.get("domain") or [])
    vram = spec.get("vram_gb")
    return Request(
        gpus=len([d for d in domains if d != "cpu"]),
        vram_bytes=None if vram is None else int(float(vram) * GIB),
        pins=tuple(domains),
        exclusive=False,
    )


class Adopter:
    """Adopts running processes as jobs (see the module docstring).

    Args:
        book: The active jobs.
        scheduler: The domains (an adopted job holds its domains like any other job).
        executor: Watches and signals the process through its pidfd.
        store: Adoptions are answered once durable; none is taken while writes fail.
        latest_sample: The sampler's latest sample (which GPUs a process uses).
        settings: ``[engine]`` (``adopt_grace_period``).
        sample_now: Takes a sample now (``latest_sample`` answers it after): asked before
            each adoption, so a process that took GPU memory since the last tick is
            placed on its GPUs (it was put on the cpu pool: tester h171).
    """

    def __init__(
        self,
        book: JobBook,
        scheduler: Scheduler,
        executor: Supervisor,
        store: Store,
        latest_sample: Callable[[], Sample | None],
        settings: EngineSettings,
        state_dir: str = "",
        sample_now: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self._state_dir = state_dir
        self._sample_now = sample_now
        # One adoption at a time: two for one pid (or a parent and its child) both passed
        # the checks while the other waited on /proc, and two jobs owned one process.
        self._adopting = asyncio.Lock()
        self._book = book
        self._scheduler = scheduler
        self._executor = executor
        self._store = store
        self._latest_sample = latest_sample
        self._settings = settings
        self._stuck = StuckReleaser(book, lambda: self._settings.release_after, self._let_go)

    def reconfigure(self, settings: EngineSettings) -> None:
        """Use new ``[engine]`` settings from now on."""
        self._settings = settings

    async def adopt(
        self,
        request: AdoptRequest,
        requester_uid: int | None = None,
        requester_pid: int | None = None,
    ) -> Job:
        """Adopt a running process as a job.

        Args:
            request: The validated request (:func:`~gpulayer_tui.wire.parse_adopt_request`):
                ``pid``; ``start_ticks`` as the caller saw them (a different value now means
                the pid was recycled: ``adopt_pid_mismatch``); ``name``; ``vram_gb``
                declared per GPU (reserves ``max(0, declared - held)``); ``gpu`` (adopt it
                on the GPUs where it or a descendant holds memory, an error if none);
                ``domain`` (adopt it on these domains instead of finding them).
            requester_uid: The asking user's uid (``SO_PEERCRED``).
            requester_pid: The asking process (``SO_PEERCRED``): a process it runs below
                (the shell it was typed in) is refused, ``adopt_refused``.

        Returns:
            The job: ``running``, or ``failed`` with an ``adopt_*`` reason (kept in history).

        Raises:
            SpecError: Invalid arguments (nothing is recorded).
            StoreError: The database cannot be written (nothing is adopted).
        """
        if self._store.failure:
            raise StoreError(f"the engine refuses new work: {self._store.failure}")
        pid = request["pid"]
        pins = request["domain"]
        if len(set(pins)) != len(pins):
            twice = next(name for name in pins if pins.count(name) > 1)
            raise SpecError(f"domain: {twice} is named twice", "domain")
        for pin in pins:
            if pin not in self._scheduler.domains:
                raise SpecError(f"domain: {self._scheduler.unknown_domain(pin)}", "domain")
        name, vram_gb = request["name"], request["vram_gb"]
        async with self._adopting:
            if self._sample_now is not None:
                await self._sample_now()  # (where it holds memory now, not a tick ago)
            pidfd = open_pidfd(pid)
            snapshot = read_process(pid) if pidfd is not None else None
            overbooked = ""
            try:
                refusal = self._refusal(pid, snapshot, request["start_ticks"], requester_uid)
                if refusal is None and requester_pid is not None:
                    assert snapshot is not None
                    refusal = runs_the_asker(pid, snapshot, requester_pid)
                if refusal is None:
                    assert snapshot is not None
                    refusal = await asyncio.to_thread(self._other_engines, pid)
                if refusal is None:
                    assert snapshot is not None
                    if pins:
                        await asyncio.to_thread(self._check_pins, pid, snapshot, pins)
                    domains = pins or await asyncio.to_thread(
                        self._domains_of, pid, snapshot, request["gpu"], vram_gb
                    )
                    self._check_vram(vram_gb, domains)
                    overbooked = await asyncio.to_thread(
                        _short_of_room,
                        [self._scheduler.domains[d] for d in domains],
                        snapshot,
                        vram_gb,
                    )
            except BaseException:
                if pidfd is not None and pidfd >= 0:
                    os.close(pidfd)
                raise
            if refusal is not None:
                if pidfd is not None and pidfd >= 0:
                    os.close(pidfd)
                reason, message = refusal
                job = self._record_refusal(
                    pid, snapshot, request["start_ticks"], name, reason, message, requester_uid
                )
            else:
                assert snapshot is not None
                job = self._accept(
                    snapshot, pidfd, name, vram_gb, domains, requester_uid, overbooked
                )
        try:
            await self._store.flush()
        except StoreError as err:
            self._unadopt(job, f"not recorded: {err}")
            raise
        return job

    def _check_vram(self, vram_gb: float | None, domains: list[str]) -> None:
        """``vram_gb`` may not exceed what a GPU it names has: the ledger would show more
        memory owned than exists (a submitted job asking that much is over capacity)."""
        if vram_gb is None:
            return
        need = int(float(vram_gb) * GIB)
        for name in domains:
            dom = self._scheduler.domains[name]
            if not dom.is_gpu:
                raise SpecError(f"vram_gb: domain {name} has no GPU memory to declare", "vram_gb")
            size = dom.capacity_bytes
            if size is not None and need > size:
                raise SpecError(
                    f"vram_gb: {vram_gb:g} GiB is more than {name} has ({size / GIB:.1f} GiB)",
                    "vram_gb",
                )

    def _unadopt(self, job: Job, message: str) -> None:
        """An adoption that could not be recorded is undone: stop watching the process
        (never signal it: it was not ours to start) and end the job ``cancelled``."""
        act = self._book.get(job.id)
        if act is None or job.status is not JobStatus.RUNNING:
            return
        self._executor.forget(job.id)
        self._book.roots.drop(job.pid)
        self._book.finish(act, JobStatus.CANCELLED, Reason.CANCELLED, f"{message}; pid left alone")

    def _refusal(
        self,
        pid: int,
        snapshot: ProcessSnapshot | None,
        start_ticks: int | None,
        requester_uid: int | None,
    ) -> tuple[TerminationReason, str] | None:
        if snapshot is None:
            leader = thread_group_of(pid)
            if leader is not None:  # (a thread's id: /proc has it, no pidfd opens it)
                owner = procs.find_owner(leader, self._book.roots.snapshot())
                instead = f"job {owner}'s already" if owner else f"adopt {leader} instead"
                return (
                    Reason.ADOPT_REFUSED,
                    f"pid {pid} is a thread of process {leader}: {instead}",
                )
            return Reason.ADOPT_PID_GONE, procs.gone_words(pid)
        never = self._never_adoptable(pid, snapshot)
        if never is not None:
            return Reason.ADOPT_REFUSED, never
        if start_ticks is not None and start_ticks != snapshot.start_ticks:
            return (
                Reason.ADOPT_PID_MISMATCH,
                f"pid {pid} is a different process now (start time {snapshot.start_ticks}, "
                f"expected {start_ticks}): the pid was reused",
            )
        not_theirs = self.not_theirs(pid, snapshot, requester_uid)
        return None if not_theirs is None else (Reason.ADOPT_UID_MISMATCH, not_theirs)

    def not_theirs(
        self, pid: int, snapshot: ProcessSnapshot, requester_uid: int | None
    ) -> str | None:
        """Why ``requester_uid`` (``None``: the engine's own caller) may not adopt ``pid``
        for whose it is (another user's, or not the engine's user's), or ``None``."""
        engine_uid = os.getuid()
        if snapshot.uid != engine_uid:
            # (Root could signal it, so "could not stop it" was not true there: the rule
            # is record 004's, an engine adopts its own user's processes only.)
            why = (
                "an engine adopts only its own user's processes"
                if engine_uid == 0
                else "it could neither watch nor stop it safely"
            )
            return (
                f"pid {pid} belongs to {procs.user_name(snapshot.uid)}, but this engine runs "
                f"as {procs.user_name(engine_uid)}: {why}"
            )
        if requester_uid is not None and requester_uid != snapshot.uid:
            return (
                f"pid {pid} belongs to {procs.user_name(snapshot.uid)}, not to the user "
                f"asking ({procs.user_name(requester_uid)})"
            )
        return None

    def never_adopted(self, pid: int, snapshot: ProcessSnapshot) -> str | None:
        """Why no one may adopt ``pid`` whatever they ask (a job's already, another
        engine's, this engine, the init process...), or ``None`` (reads /proc)."""
        never = self._never_adoptable(pid, snapshot)
        if never is None:
            other = self._other_engines(pid)
            never = other[1] if other is not None else None
        return never

    def never_touched(self, pid: int, snapshot: ProcessSnapshot) -> str | None:
        """Why no one may signal ``pid`` through gpulayer-tui, or ``None``."""
        return self._never_adoptable(pid, snapshot, signalled=True)

    def _never_adoptable(
        self, pid: int, snapshot: ProcessSnapshot, signalled: bool = False
    ) -> str | None:
        """Why no one may adopt (or, ``signalled``, signal) ``pid`` (cancelling it would
        stop the machine or the engine, or it could never be stopped, or it is watched
        already), or ``None``."""
        if pid == 1:
            return "pid 1 is the init process: stopping it would stop the machine"
        if pid == os.getpid():
            return f"pid {pid} is this engine"
        stat = procs.read_stat(pid)
        if stat is not None and stat.flags & procs.PF_KTHREAD:
            return f"pid {pid} is a kernel thread: it holds no GPU memory and cannot be stopped"
        if _is_gpulayer(snapshot.command):
            return f"pid {pid} is part of gpulayer-tui itself ({_shortened(snapshot.command)})"
        if pid in _ancestors(os.getpid()):
            # (the shell or tmux pane that runs `--serve`: adopted and cancelled, it took
            # the engine's console and its log pipe with it: tester h72)
            return (
                f"pid {pid} runs this engine below it ({_shortened(snapshot.command)}): "
                "stopping it could stop the engine or take its console and log with it"
            )
        if _reads_our_output(pid):
            # (`--serve ... | tee engine.log`: adopted and cancelled, the engine's log went
            # with it, and its next write a SIGPIPE: tester h80)
            return (
                f"pid {pid} reads this engine's output through a pipe "
                f"({_shortened(snapshot.command)}): stopping it would take the engine's log "
                "with it"
            )
        roots = self._book.roots.snapshot()
        owner = procs.find_owner(pid, roots)
        if owner is not None:
            if signalled:  # (the adopt wording, "belongs to job 6 already", made no sense)
                return (
                    f"pid {pid} is job {owner}'s (it or an ancestor is that job's process): "
                    f"cancel job {owner} instead"
                )
            return f"pid {pid} belongs to job {owner} already (it or an ancestor is that job's)"
        below = _job_below(pid, roots)
        if below is not None:
            job_id, root = below
            return (
                f"pid {pid} has job {job_id}'s process (pid {root}) below it: adopted, the "
                "two jobs would own the same processes and GPU memory"
            )
        return None

    def _other_engines(self, pid: int) -> tuple[TerminationReason, str] | None:
        """A job of another gpulayer-tui engine (its launcher marks each job's environment,
        inherited by its children): adopted here too, two engines owned one process, and
        one's cancel ended the other's job (blocking: /proc)."""
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            return None
        for item in environ.split(b"\0"):
            if item.startswith(TASK_ENV.encode() + b"="):
                where = os.fsdecode(item.split(b"=", 1)[1]).rsplit("/", 1)[0]
                if where != self._state_dir:
                    return (
                        Reason.ADOPT_REFUSED,
                        f"pid {pid} is a job of another gpulayer-tui engine (state dir "
                        f"{printable(where)}): cancel it there",
                    )
        return None

    def _check_pins(self, pid: int, snapshot: ProcessSnapshot, pins: list[str]) -> None:
        """Domains named for a process must cover every GPU where it holds memory (blocking:
        /proc): adopted on gpu0 while it held 10 GiB on gpu1, it took gpu0's slot and its
        memory still counted as unregistered on gpu1. One holding none may be placed, but
        not on a domain out of service (a submission there is refused or waits)."""
        found, elsewhere = self._where_held(pid, snapshot)
        left_out = [name for name in found if name not in pins]
        if left_out:
            where = ", ".join(left_out)
            raise SpecError(
                f"domain: pid {pid} holds memory on {where}, which the domains named leave "
                f"out: name {where} (or name no domain, to find them)",
                "domain",
            )
        if elsewhere:
            raise self._unmanaged(pid, elsewhere)
        for name in pins:
            if name not in found:
                self._check_in_service(pid, name)

    def _check_in_service(self, pid: int, name: str) -> None:
        """A process holding no memory on domain ``name`` is not placed there while the
        domain is out of service (a submission there is refused or waits)."""
        dom = self._scheduler.domains[name]
        if dom.state is not DomainState.IN_SERVICE:
            raise SpecError(
                f"domain: {name} is {dom.state.value}"
                + (f" ({dom.state_reason})" if dom.state_reason else "")
                + f" and pid {pid} holds no memory there: nothing new is placed on it",
                "domain",
            )

    def _where_held(self, pid: int, snapshot: ProcessSnapshot) -> tuple[list[str], list[int]]:
        """The GPU domains where ``pid`` or a descendant holds memory, and the GPUs with
        no domain where it does (by index); blocking: /proc."""
        sample = self._latest_sample()
        roots: dict[int, tuple[int, int | None]] = {pid: (0, snapshot.start_ticks)}
        found: list[str] = []
        elsewhere: list[int] = []  # GPUs the config gives no domain where it holds memory
        by_index = {d.gpu_index: d for d in self._scheduler.gpu_domains}
        if sample is not None:
            for reading in sample.result.gpus:
                dom = by_index.get(reading.index)
                if dom is not None and dom.name in found:
                    continue
                if any(procs.find_owner(p.pid, roots) == 0 for p in reading.processes):
                    if dom is None:
                        elsewhere.append(reading.index)
                    else:
                        found.append(dom.name)
        return found, elsewhere

    @staticmethod
    def _unmanaged(pid: int, elsewhere: list[int], only: str = "") -> SpecError:
        which = ", ".join(map(str, elsewhere))
        on = f"GPUs {which}, which have" if len(elsewhere) > 1 else f"GPU {which}, which has"
        return SpecError(
            f"pid {pid} holds memory {only}on {on} no domain in the config: the engine "
            "does not manage it, so it cannot adopt it there",
            "domain",
        )

    def _domains_of(
        self, pid: int, snapshot: ProcessSnapshot, gpu: bool, vram_gb: float | None
    ) -> list[str]:
        """The GPU domains where ``pid`` or a descendant holds memory (blocking: /proc)."""
        found, elsewhere = self._where_held(pid, snapshot)
        if elsewhere:
            # (Taken as a CPU job it would hold no GPU here, and its memory be no one's;
            # taken on its managed GPUs alone, its memory on the others was counted as no
            # job's while `gpus` named it as the job's.)
            raise self._unmanaged(pid, elsewhere, "" if found else "only ")
        if found:
            return found
        if gpu or vram_gb is not None:
            gpus = self._scheduler.gpu_domains
            if len(gpus) != 1:
                raise SpecError(f"pid {pid} holds no GPU memory now; name its GPU domain", "domain")
            chosen = gpus[0].name
        else:
            chosen = CPU_DOMAIN
        # (Named, such a domain was refused; found for it, a drained pool took it: h121.)
        self._check_in_service(pid, chosen)
        return [chosen]

    def _new_job(
        self,
        pid: int,
        snapshot: ProcessSnapshot | None,
        name: str | None,
        spec: dict[str, Any],
        owner_uid: int | None,
        request: Request | None,
    ) -> ActiveJob:
        # (A program's name held to the name rule, as a submitted job's is: an argv0 with
        # a terminal escape reached the API and --json raw.)
        return self._book.create(
            name=name or default_name(pid, snapshot),
            kind=JobKind.ADOPTED,
            spec_json=spec,
            spec=None,
            request=request,
            owner_uid=owner_uid,
        )

    def _record_refusal(
        self,
        pid: int,
        snapshot: ProcessSnapshot | None,
        asked_ticks: int | None,
        name: str | None,
        reason: TerminationReason,
        message: str,
        owner_uid: int | None,
    ) -> Job:
        spec: dict[str, Any] = {"kind": "adopted", "pid": pid}
        if snapshot is not None:
            spec.update(command=snapshot.command, start_ticks=snapshot.start_ticks)
        if asked_ticks is not None:
            # (the process asked for, as asked: a reused pid's refusal recorded the start
            # time of the process found there instead, tester h116)
            spec["start_ticks"] = asked_ticks
        act = self._new_job(pid, snapshot, name, spec, owner_uid, None)
        self._book.finish(act, JobStatus.FAILED, reason, f"refused to adopt: {message}")
        return act.job

    def _accept(
        self,
        snapshot: ProcessSnapshot,
        pidfd: int | None,
        name: str | None,
        vram_gb: float | None,
        domains: list[str],
        owner_uid: int | None,
        overbooked: str = "",
    ) -> Job:
        spec: dict[str, Any] = {
            "kind": "adopted",
            "pid": snapshot.pid,
            "start_ticks": snapshot.start_ticks,
            "command": snapshot.command,
            "cwd": snapshot.cwd,
            "uid": snapshot.uid,
            "domain": domains,
            # (what it holds, as a job's spec says it: without it, rows read as 1 GPU)
            "gpus": sum(1 for d in domains if d != "cpu"),
        }
        if vram_gb is not None:
            spec["vram_gb"] = vram_gb
        act = self._new_job(snapshot.pid, snapshot, name, spec, owner_uid, adopted_request(spec))
        job = act.job
        # Even on a full domain: the process runs there already; this only stops new
        # placements until room frees (record 004).
        holds = [self._scheduler.domains[d] for d in domains]
        take_holds(act, holds)
        job.domains = list(domains)
        job.gpus = [d.gpu_index for d in holds if d.gpu_index is not None]
        job.pid, job.start_ticks = snapshot.pid, snapshot.start_ticks
        self._book.roots.add(snapshot.pid, job.id, snapshot.start_ticks)
        self._executor.watch_adopted(
            job.id,
            snapshot.pid,
            pidfd if pidfd is not None and pidfd >= 0 else None,
            snapshot.start_ticks,
            self._exit_handler(job.id),
        )
        message = f"adopted pid {snapshot.pid} on {', '.join(domains)}"
        for dom in holds:
            if dom.state is DomainState.QUARANTINED:
                # (as the jobs already there say: it said nothing of it)
                message += f"; warning: domain {dom.name} quarantined: {dom.state_reason}"
                break
        if overbooked:
            message += f"; warning: {overbooked}"
        self._book.transition(act, JobStatus.RUNNING, message=message)
        return job

    def _exit_handler(self, job_id: int) -> Callable[[Exit], None]:
        return lambda exit: self._exited(job_id)

    def _exited(self, job_id: int) -> None:
        act = self._book.get(job_id)
        if act is None:
            return
        job = act.job
        self._book.roots.drop(job.pid)
        job.kill_at = None
        if job.stop_reason is Reason.CANCELLED:
            message = job.stop_message + self._left_holding(job, cancelled=True)
            self._book.finish(act, JobStatus.CANCELLED, Reason.CANCELLED, message)
            return
        # Only a parent can wait() for a process: the exit status is unknowable, so the job
        # is never "completed" (record 004).
        self._book.finish(
            act,
            JobStatus.ORPHANED,
            Reason.ADOPTED_EXIT_UNOBSERVED,
            f"pid {job.pid} exited; its exit status cannot be observed "
            "(it was not started by gpulayer-tui)" + self._left_holding(job, cancelled=False),
        )

    def _left_holding(self, job: Job, cancelled: bool) -> str:
        """``; pids 6614, 6615 it started still hold 6.0 GiB ...`` of the processes the
        latest sample counted as the job's that still run as it ends: a cancel signals the
        adopted pid alone, and its children ran on, their memory now unregistered, with
        no word of it (tester h184). Read from the sample (no /proc walk on the loop):
        only processes holding GPU memory, the ones that matter here."""
        sample = self._latest_sample()
        if sample is None:
            return ""
        held: dict[int, int] = {}
        for gpu in sample.result.gpus:
            for process in gpu.processes:
                if process.pid != job.pid and sample.owners.get(process.pid) == job.id:
                    held[process.pid] = held.get(process.pid, 0) + (process.used_bytes or 0)
        alive = [
            pid
            for pid in sorted(held)
            if (info := sample.info.get(pid)) is not None
            and info.start_ticks is not None
            and procs.start_ticks(pid) == info.start_ticks
        ]
        if not alive:
            return ""
        pids = ", ".join(str(pid) for pid in alive)
        memory = sum(held[pid] for pid in alive) / GIB
        why = (
            "a cancel signals the adopted pid alone: `gpulayer-tui signal PID`"
            if cancelled
            else "`gpulayer-tui signal PID` stops one"
        )
        return (
            f"; {'pid' if len(alive) == 1 else 'pids'} {pids} it started still "
            f"{'holds' if len(alive) == 1 else 'hold'} {memory:.1f} GiB of GPU memory, now "
            f"unregistered ({why})"
        )

    def stop(self, act: ActiveJob, reason: TerminationReason, message: str) -> None:
        """Record the stop, then (once durable) SIGTERM that pid alone (never its group);
        SIGKILL after ``adopt_grace_period``."""
        grace = self._settings.adopt_grace_period
        if decide_stop(self._book, act, reason, message, grace):
            self._book.after_commit(functools.partial(self._signal_stop, act.job.id, grace))

    def _signal_stop(self, job_id: int, grace: float) -> None:
        act = self._book.get(job_id)
        if act is not None:
            self._executor.terminate(job_id, grace)
            self._stuck.arm(act)

    def _let_go(self, act: ActiveJob) -> None:
        """Stop watching a process that outlived SIGKILL (its job ends ``unkillable``)."""
        self._executor.forget(act.job.id)
        self._book.roots.drop(act.job.pid)

    def job_ended(self, act: ActiveJob) -> None:
        """End listener: no release is due for a job that ended."""
        self._stuck.job_ended(act)

    def close(self) -> None:
        """Engine stop: drop the release timers (a restarted engine re-arms them)."""
        self._stuck.close()

    def reattach(self, act: ActiveJob) -> None:
        """Watch an adopted process again after an engine restart, by pid + start time;
        a process that vanished meanwhile ends the job ``orphaned``."""
        job = act.job
        alive = job.pid is not None and self._executor.attach(
            job.id, job.pid, job.start_ticks, self._exit_handler(job.id), adopted=True
        )
        if not alive:
            # It ran at least until the last engine was last seen: its end is put there,
            # not at this restart (its runtime took in all the time no engine ran).
            seen = self._store.previous_run_seen_until
            ended_at, when = None, ""
            if seen is not None and seen[0] >= (job.started_at or 0):
                ended_at = seen[0]
                at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ended_at))
                when = (
                    f" (after {at}, when the last engine stopped)"
                    if seen[1]
                    else f" (after {at}, when the last engine, since killed, last wrote)"
                )
            self._book.finish(
                act,
                JobStatus.ORPHANED,
                Reason.ADOPTED_EXIT_UNOBSERVED,
                f"pid {job.pid} exited while no engine was watching{when}; exit status unknown",
                ended_at=ended_at,
            )
            return
        assert job.pid is not None
        self._book.roots.add(job.pid, job.id, job.start_ticks)
        domains = self._scheduler.domains
        if retake_holds(act, domains, self._scheduler.retired):
            self._book.save(act)  # (its domains' new names)
        if job.stop_reason is not None:
            # Being stopped when the engine stopped: go on, keeping the stored deadline.
            left = max(0.0, (job.kill_at or time.time()) - time.time())
            self._executor.terminate(job.id, left)
            self._stuck.arm(act)
