"""Talking to a Slurm cluster through its own commands (issue 16).

Every call is ``[command_prefix...] sbatch|squeue|sacct|sinfo|scontrol|scancel ...`` run as a
subprocess with a deadline (never on the event loop's time), so a cluster reached through
``ssh login1`` works the same as a local one. Output is read as JSON where the command
offers it (``squeue --json``, ``sinfo --json``), else in its one-line forms.

This module only talks and translates: what a cluster job's state means for the job
(record 003's queued / over capacity / ended) is :mod:`.cluster_runner`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .config import ClusterSettings
from .models import JobStatus, TerminationReason

Reason = TerminationReason


class ClusterError(Exception):
    """A cluster command failed or did not answer; the message says which and why."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True, slots=True)
class Partition:
    """What a partition can ever give one job (for over-capacity verdicts)."""

    name: str
    nodes: int
    max_gpus: int  # GPUs on its largest node (by GPU count)
    max_mem_mb: int
    max_cpus: int
    max_time_s: float | None  # None: unlimited
    state: str
    gpus_total: int
    gpus_used: int
    node_states: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job as ``squeue`` shows it."""

    job_id: str
    state: str
    reason: str
    exit_code: int | None  # the command's exit status (None while it runs)
    signal: int | None
    start_time: float | None
    end_time: float | None
    name: str = ""


_GRES_GPUS = re.compile(r"gpu(?::[^:,()]+)?:(\d+)")


def gres_gpus(gres: str | None) -> int:
    """GPUs in a gres string (``gpu:4``, ``gpu:a100:2(S:0-1)``, ``gpu:(null):1(IDX:0)``)."""
    if not gres:
        return 0
    return sum(int(n) for n in _GRES_GPUS.findall(gres.replace("(null)", "x")))


def slurm_time(text: str) -> float | None:
    """Seconds in a Slurm time (``01:00:00``, ``2-00:00:00``, ``30``); None: UNLIMITED."""
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days = 0
    if "-" in text:
        day, text = text.split("-", 1)
        days = int(day)
    parts = [int(p) for p in text.split(":")]
    if len(parts) == 1:
        seconds = parts[0] * 60  # a bare number is minutes
    elif len(parts) == 2:
        seconds = parts[0] * 60 + parts[1]
    else:
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return float(days * 86400 + seconds)


def minutes(seconds: float) -> int:
    """Slurm's ``--time`` in whole minutes (rounded up, at least 1)."""
    return max(1, math.ceil(seconds / 60))


def _number(value: Any) -> Any:
    """Slurm's JSON numbers: a plain number, or ``{"set": true, "number": N}`` (23.x)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        return value.get("number")
    return value


def _exit(job: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(exit status, signal)`` of a squeue job (a wait status, or 23.x's object)."""
    raw = job.get("exit_code")
    if isinstance(raw, dict):  # 23.x: {"status": [...], "return_code": N, "signal": {...}}
        code = _number(raw.get("return_code"))
        sig = raw.get("signal", {})
        signal_id = _number(sig.get("id")) if isinstance(sig, dict) else None
        return code, signal_id or None
    if raw is None:
        return None, None
    status = int(raw)
    if status & 0x7F:
        return None, status & 0x7F
    return status >> 8, None


def parse_jobs(text: str) -> list[SlurmJob]:
    """``squeue --json``'s jobs."""
    data = json.loads(text)
    out = []
    for job in data.get("jobs", []):
        state = job.get("job_state")
        if isinstance(state, list):
            state = state[0] if state else ""
        code, sig = _exit(job)
        start = _number(job.get("start_time"))
        end = _number(job.get("end_time"))
        out.append(
            SlurmJob(
                job_id=str(job.get("job_id")),
                state=str(state or ""),
                reason=str(job.get("state_reason") or ""),
                exit_code=code,
                signal=sig,
                start_time=float(start) if start else None,
                end_time=float(end) if end else None,
                name=str(job.get("name") or ""),
            )
        )
    return out


SQUEUE_FORMAT = "%i|%T|%r|%S|%e|%j"


def _stamp(text: str) -> float | None:
    """Epoch seconds of a Slurm local time (``2026-12-01T01:44:43``); None for N/A."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def exit_pair(text: str) -> tuple[int | None, int | None]:
    """``(exit status, signal)`` of Slurm's ``ExitCode`` (``3:0``, ``0:9``)."""
    match = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if match is None:
        return None, None
    code, sig = int(match.group(1)), int(match.group(2))
    return (None, sig) if sig else (code, None)


def _parsable(text: str, third: str) -> list[SlurmJob]:
    """Jobs from ``ID|STATE|THIRD|START|END|NAME`` lines (the name last: it may hold
    ``|``); ``third`` is squeue's ``reason`` or sacct's ``exit`` code."""
    out = []
    for line in text.splitlines():
        parts = line.split("|", 5)
        if len(parts) < 6:
            continue
        job_id, state, extra, start, end, name = parts
        code, sig = exit_pair(extra) if third == "exit" else (None, None)
        out.append(
            SlurmJob(
                job_id=job_id.strip(),
                state=(state.split() or [""])[0],  # (sacct: "CANCELLED by 0")
                reason=extra.strip() if third == "reason" else "",
                exit_code=code,
                signal=sig,
                start_time=_stamp(start),
                end_time=_stamp(end),
                name=name,
            )
        )
    return out


def parse_squeue(text: str) -> list[SlurmJob]:
    """``squeue -h -o SQUEUE_FORMAT`` lines."""
    return _parsable(text, "reason")


# Ends from accounting: one line per job (-X: the allocation, not its steps); the name
# last, since it may hold ``|``.
SACCT_FORMAT = "JobID,State,ExitCode,Start,End,JobName"
_SH_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a variable name POSIX sh takes
# What `sbatch --parsable` prints: the job's id, and ";CLUSTER" on a federation.
_PARSABLE = re.compile(r"(\d+)(?:;\S+)?")


def parsable_id(out: str) -> str:
    """The job id in ``sbatch --parsable``'s answer: its last line.

    What a ``command_prefix`` such as ssh puts before it (a login banner a shell's rc file
    prints on stdout) is passed over: the whole answer was kept as the id, and every later
    squeue and sacct of the cluster, given it, failed ("Bad job/step specified"): none of
    its jobs was followed again (tester h150).

    Raises:
        ClusterError: No line of it is a job id (said with what it was).
    """
    for line in reversed(out.strip().splitlines()):
        if match := _PARSABLE.fullmatch(line.strip()):
            return match.group(1)
    shown = " ".join(out.split())[:200] or "nothing"
    raise ClusterError(
        f"sbatch --parsable printed no job id (it printed {shown!r}): whether the job reached "
        "the cluster is not known; a job named for it there is not followed"
    )


# sacct's words for "this cluster keeps no such records" (slurmdbd, job completion log).
NO_ACCOUNTING = ("accounting storage is disabled", "job completion is disabled")


def parse_sacct(text: str) -> list[SlurmJob]:
    """``sacct -X -P -n -o SACCT_FORMAT`` lines (``CANCELLED by 0`` reads ``CANCELLED``;
    ``ExitCode`` is ``status:signal``)."""
    return _parsable(text, "exit")


def parse_partition(sinfo: str, scontrol: str, name: str) -> Partition:
    """A partition from ``sinfo --json -p NAME`` and ``scontrol show partition NAME -o``."""
    nodes = [n for n in json.loads(sinfo).get("nodes", []) if name in (n.get("partitions") or [])]
    fields = dict(item.split("=", 1) for item in shlex.split(scontrol.strip()) if "=" in item)
    if not fields.get("PartitionName"):
        raise ClusterError(f"partition {name} does not exist")
    states: dict[str, int] = {}
    for node in nodes:
        state = node.get("state")
        state = state[0] if isinstance(state, list) and state else state
        states[str(state).lower()] = states.get(str(state).lower(), 0) + 1
    return Partition(
        name=name,
        nodes=len(nodes),
        max_gpus=max((gres_gpus(n.get("gres")) for n in nodes), default=0),
        max_mem_mb=max((int(_number(n.get("real_memory")) or 0) for n in nodes), default=0),
        max_cpus=max((int(_number(n.get("cpus")) or 0) for n in nodes), default=0),
        max_time_s=slurm_time(fields.get("MaxTime", "UNLIMITED")),
        state=fields.get("State", "UNKNOWN"),
        gpus_total=sum(gres_gpus(n.get("gres")) for n in nodes),
        gpus_used=sum(gres_gpus(n.get("gres_used")) for n in nodes),
        node_states=states,
    )


# Slurm's pending reasons in plain words (what the job waits for).
_PENDING: dict[str, str] = {
    "Resources": "waiting for resources: the nodes of partition {p} are busy",
    "Priority": "waiting behind higher-priority jobs in partition {p}",
    "Dependency": "waiting for its Slurm dependencies",
    "ReqNodeNotAvail": "a node it needs is not available (down, drained or reserved)",
    "PartitionDown": "partition {p} is down",
    "PartitionInactive": "partition {p} is inactive",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "BeginTime": "waiting for its begin time",
    "None": "pending: Slurm has not looked at it yet",
}


def pending_words(reason: str, partition: str) -> str:
    """A pending job's Slurm reason, in plain words."""
    if reason in _PENDING:
        return _PENDING[reason].format(p=partition)
    if reason.startswith(("QOS", "Assoc")):
        return f"held by a QOS or association limit ({reason})"
    return f"pending in Slurm ({reason})" if reason else "pending in Slurm"


RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "STAGE_OUT", "SIGNALING"})
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED"})


def ended(state: str) -> bool:
    """Whether a Slurm job state is an end (neither pending nor running)."""
    return bool(state) and state not in PENDING_STATES and state not in RUNNING_STATES


def end_of(
    job: SlurmJob, stop_message: str, limit_s: float | None = None
) -> tuple[JobStatus, TerminationReason, str]:
    """How a cluster job that left Slurm's queue ends (the same reasons as local jobs;
    ``limit_s``: the time limit it was submitted with, for a timeout's message)."""
    state = job.state
    if state == "COMPLETED":
        return JobStatus.COMPLETED, Reason.EXIT_CODE, "exited with code 0"
    if state == "CANCELLED":
        return JobStatus.CANCELLED, Reason.CANCELLED, stop_message or "cancelled on the cluster"
    if state in ("TIMEOUT", "DEADLINE"):
        limit = f" of {minutes(limit_s)} min" if limit_s else ""
        return (
            JobStatus.FAILED,
            Reason.TIMEOUT,
            f"timed out: Slurm stopped it at its time limit{limit} ({state})",
        )
    if state == "NODE_FAIL":
        return JobStatus.FAILED, Reason.DOMAIN_LOST, "its node failed (Slurm NODE_FAIL)"
    if state == "OUT_OF_MEMORY":
        return JobStatus.FAILED, Reason.SIGNAL, "killed: out of memory (Slurm OUT_OF_MEMORY)"
    if state == "PREEMPTED":
        return JobStatus.FAILED, Reason.PREEMPTED, "preempted on the cluster"
    if state == "BOOT_FAIL":
        return JobStatus.FAILED, Reason.LAUNCH_FAILED, "its node failed to boot (BOOT_FAIL)"
    if job.signal:
        return JobStatus.FAILED, Reason.SIGNAL, f"killed by signal {job.signal}"
    code = job.exit_code
    if code is None:  # (the accounting kept no exit status: a cwd with a newline, say)
        return JobStatus.FAILED, Reason.EXIT_CODE, f"failed ({state.lower()}); exit status unknown"
    return JobStatus.FAILED, Reason.EXIT_CODE, f"exited with code {code} ({state.lower()})"


class SlurmCluster:
    """One ``[clusters.NAME]``: its commands, run with a deadline."""

    def __init__(self, name: str, settings: ClusterSettings) -> None:
        self.name = name
        self.settings = settings
        # Where ends are read: "sacct" (slurmdbd), "jobcomp" (``sacct -c``: the job
        # completion log), "none" (neither is kept); None until the first try.
        self.accounting: str | None = None

    def quoted(self, argv: tuple[str, ...] | list[str]) -> list[str]:
        """``argv`` as the prefix should pass it on: each argument quoted for the remote
        shell when the prefix hands the command to one (ssh joins its arguments with
        spaces, so a cwd, a job name or squeue's ``%i|%T`` would be read as shell code)."""
        prefix = self.settings.command_prefix
        shell = self.settings.prefix_shell
        if shell is None:
            shell = any(os.path.basename(part) == "ssh" for part in prefix)
        return [shlex.quote(a) for a in argv] if prefix and shell else list(argv)

    async def run(
        self,
        *argv: str,
        stdin: str | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
    ) -> str:
        """Run a Slurm command; its stdout. With ``gate``, the command is started, then
        given its input (and its deadline starts) only once ``gate()`` returns: what it does
        before it reads its input (start, load its libraries and the Slurm config) is done
        meanwhile.

        Raises:
            ClusterError: It failed (its stderr), or did not answer in time (unreachable).
        """
        full = [*self.settings.command_prefix, *self.quoted(argv)]
        try:
            proc = await asyncio.create_subprocess_exec(
                *full,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as failed:
            raise ClusterError(
                f"cannot run {full[0]}: {failed.strerror}", unreachable=True
            ) from None
        try:
            if gate is not None:
                await gate()
            out, err = await asyncio.wait_for(
                proc.communicate(None if stdin is None else stdin.encode()),
                self.settings.command_timeout,
            )
        except TimeoutError:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            await proc.wait()
            raise ClusterError(
                f"{argv[0]} did not answer within {self.settings.command_timeout:g} s",
                unreachable=True,
            ) from None
        except BaseException:
            # Cancelled (the engine stops while a poll runs): it ran on, unreaped, and its
            # pipes were found open when collected.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)
            with contextlib.suppress(BaseException):
                await asyncio.shield(proc.wait())
            raise
        if proc.returncode != 0:
            # (Some say why on stdout: `scontrol show partition NAME` prints "Partition
            # NAME not found" there, and "exit code 1" was all anyone learnt.)
            text = (err or out).decode(errors="replace").strip().splitlines()
            why = text[-1] if text else f"exit code {proc.returncode}"
            # A controller that does not answer is not a refusal of the job.
            # (munge down fails every command with an authentication error: the cluster is
            # out of reach for now, not refusing the job, which failed for good)
            unreachable = any(
                w in why
                for w in (
                    "Unable to contact",
                    "Connection refused",
                    "timed out",
                    "authentication error",
                    "Munge",
                )
            )
            # ("sbatch: sbatch: error: ...": Slurm's commands name themselves: h150)
            said = why if why.startswith(f"{argv[0]}: ") else f"{argv[0]}: {why}"
            raise ClusterError(said, unreachable=unreachable)
        return out.decode(errors="replace")

    async def partition(self) -> Partition:
        """What the configured partition has (nodes, GPUs, memory, time limit)."""
        name = self.settings.partition
        sinfo = await self.run("sinfo", "--json", "-p", name)
        scontrol = await self.run("scontrol", "show", "partition", name, "-o")
        return parse_partition(sinfo, scontrol, name)

    async def submit(
        self,
        argv: list[str],
        options: list[str],
        env: dict[str, str],
        cwd: str | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
    ) -> str:
        """``sbatch --parsable`` with a script that sets ``env`` and execs ``argv``; the
        job's id on the cluster. (The environment travels in the script, not sbatch's
        ``--export``, so values may hold commas and a ``command_prefix`` such as ssh does
        not lose it.) ``gate``: see :meth:`run` (sbatch reads its script before it asks the
        controller for an id, so submissions let through one at a time keep their order)."""
        lines = ["#!/bin/sh"]
        # Names sh can export (dash aborts the whole script at "export café=1"; Python's
        # isidentifier took it).
        lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items() if _SH_NAME.fullmatch(k)]
        if cwd is not None:
            # Slurm runs a job whose -D it cannot enter in /tmp, with a line in the log:
            # the command ran in another folder and "completed" (as a local job does
            # not: it fails to launch). It fails here, saying why.
            folder = shlex.quote(cwd)
            lines.append(
                f"cd -- {folder} 2>/dev/null || {{ echo 'gpulayer-tui: working directory "
                f"does not exist on the node: '{folder} >&2; exit 1; }}"
            )
        lines.append("exec " + shlex.join(argv))
        out = await self.run(
            "sbatch",
            "--parsable",
            "--export=ALL",
            *options,
            stdin="\n".join(lines) + "\n",
            gate=gate,
        )
        return parsable_id(out)

    async def jobs(self, ids: list[str]) -> list[SlurmJob]:
        """Every one of ``ids`` the controller still knows (one squeue call), without exit
        codes (:meth:`ends` reads those for the jobs that left the queue).

        Text, not ``--json``: some versions' JSON answers every job the controller
        remembers whatever was asked (thousands, parsed on every poll), the text form
        only those asked for.
        """
        # (an id that is no number, stored by an older version from a login banner, made
        # every call fail "Invalid job id" and froze all the cluster's jobs: tester h150)
        ids = [i for i in ids if i.isdigit()]
        if not ids:
            return []
        try:
            out = await self.run(
                "squeue", "-h", "-t", "all", "--jobs", ",".join(ids), "-o", SQUEUE_FORMAT
            )
        except ClusterError as err:
            if "Invalid job id" in str(err):
                return []  # (none of them is known any more)
            raise
        wanted = set(ids)
        return [job for job in parse_squeue(out) if job.job_id in wanted]

    async def ends(self, ids: list[str]) -> dict[str, SlurmJob] | None:
        """How ``ids`` ended, from accounting, in one ``sacct`` call: slurmdbd's, else the
        job completion log's (``sacct -c``, ``JobCompType=jobcomp/filetxt``); None when the
        cluster keeps neither (then only ``scontrol`` knows, while the controller remembers
        the job: ``MinJobAge``). Jobs it has no end for (yet) are left out; of several
        records for one id (requeued, or ids reused) the last.

        Raises:
            ClusterError: sacct failed (or did not answer) for another reason.
        """
        ids = [i for i in ids if i.isdigit()]  # (see :meth:`jobs`)
        if not ids or self.accounting == "none":
            return None if self.accounting == "none" else {}
        modes = ["sacct", "jobcomp"] if self.accounting is None else [self.accounting]
        for mode in modes:
            flags = ["-c"] if mode == "jobcomp" else []
            try:
                out = await self.run(
                    "sacct", *flags, "-X", "-P", "-n", "-o", SACCT_FORMAT, "-j", ",".join(ids)
                )
            except ClusterError as err:
                if any(words in str(err) for words in NO_ACCOUNTING):
                    continue
                raise
            self.accounting = mode
            wanted = set(ids)
            return {
                job.job_id: job
                for job in parse_sacct(out)
                if job.job_id in wanted and ended(job.state)
            }
        self.accounting = "none"
        return None

    async def exit_of(self, job_id: str) -> tuple[int | None, int | None]:
        """``(exit status, signal)`` of an ended job (``scontrol show job``)."""
        out = await self.run("scontrol", "show", "job", "-o", job_id)
        match = re.search(r"\bExitCode=(\S+)", out)
        return (None, None) if match is None else exit_pair(match.group(1))

    async def find(self, name: str, since: float | None = None) -> list[SlurmJob]:
        """Jobs by name (a submission whose id was not recorded before a crash): the
        controller's, else accounting's since ``since`` (epoch s). A job that ran and was
        forgotten by the controller (``MinJobAge``) before the engine looked was taken
        as never submitted, and submitted again: it ran twice."""
        found = parse_jobs(await self.run("squeue", "--json", "-t", "all", "--name", name))
        found = [job for job in found if job.name == name]
        if found or self.accounting == "none":
            return found
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime((since or time.time()) - 60))
        modes = ["sacct", "jobcomp"] if self.accounting is None else [self.accounting]
        for mode in modes:
            # (jobcomp's records are filtered here: its --name filter is not to be relied on)
            flags = ["-c"] if mode == "jobcomp" else ["--name", name]
            try:
                out = await self.run(
                    "sacct", *flags, "-X", "-P", "-n", "-o", SACCT_FORMAT, "-S", start
                )
            except ClusterError as err:
                if any(words in str(err) for words in NO_ACCOUNTING):
                    continue
                raise
            self.accounting = mode
            return [job for job in parse_sacct(out) if job.name == name]
        self.accounting = "none"
        return []

    async def cancel(self, job_id: str) -> None:
        """``scancel`` (TERM, then KILL as the cluster is configured)."""
        await self.run("scancel", job_id)
