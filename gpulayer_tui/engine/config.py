"""Paths and the TOML configuration file, validated strictly.

Example ``config.toml``::

    [engine]
    sample_interval = 1.0   # seconds between GPU samples
    grace_period = 10.0     # SIGTERM -> SIGKILL delay for launched jobs (seconds)
    adopt_grace_period = 60.0  # the same for adopted processes (they never expected us)
    release_after = 30.0    # a process alive this long after SIGKILL is released (unkillable)

    [cpu]
    slots = 8               # concurrent gpus=0 jobs (default: CPU core count)

    [health]
    degrade_after = 2       # consecutive failed reads of a GPU before "degraded"
    quarantine_after = 5    # ... before its domain is quarantined (a lost GPU: at once)

    [ui]
    theme = "gpulayer-dark" # the TUI's theme (it saves the choice here)

    [domains.train]         # one domain = one GPU with one owner (record 002)
    gpu = 0                 # NVML index, or the GPU's UUID string
    slots = 2

    [security]              # who besides the engine's user (and root) may use the socket
    allowed_uids = [1001]   # these users...
    allowed_groups = ["gpu"]  # ... and members of these groups (names or gids)

    [limits]                # back-pressure: beyond these, submissions get 429
    active_jobs = 50000     # pending + queued + running jobs
    submissions_in_flight = 64  # submit requests being handled at once
    idle_connection = 30.0  # seconds a connection may wait without a whole request
    connections_per_user = 512  # open connections per uid (429 past it)

    [snapshot]              # submit --snapshot: the job runs a copy of its cwd
    default = false         # snapshot every submission of the engine's user
    max_mb = 512            # a bigger working directory is refused
    timeout = 120.0         # seconds a snapshot may take

    [usage]                 # per-job GPU series: VRAM, utilisation, power, energy
    series = true
    max_points = 1000       # per GPU of a job; older points merge as the job goes on

    [policy]
    idle_after = 1800       # warn when a job holds its GPUs under idle_below % this long
    idle_below = 5
    idle_action = "warn"    # or "stop": cancel it with the reason

    [notify]                # when jobs end: a command gets the job's JSON on stdin, a URL
    command = ["notify-send-job"]  # ... (argv, no shell) and/or it is POSTed to a URL
    url = "http://127.0.0.1:8080/hook"
    jobs = "marked"         # "marked": jobs submitted with --notify; "all": every job
    on = ["failed", "orphaned"]  # which ends (default: every terminal status)
    replicas = true         # also a service replica's restart or give-up
    timeout = 10.0          # seconds per notification (the command is then killed)

    [simulate]              # --simulate only: jobs on simulated GPUs look busy
    utilization = 70        # % each job adds to its GPU ...
    jitter = 15             # ... moved by up to 15 points a tick (seeded, repeatable)
    memory_fraction = 1.0   # of a job's vram_gb it holds (memory_gb when it declared none)

GPUs that no ``[domains.*]`` table names become ``gpu<index>`` domains with one slot,
unless ``engine.auto_domains = false``.
"""

from __future__ import annotations

import errno
import grp
import ipaddress
import json
import os
import pwd
import re
import stat
import tomllib
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..fields import CPU_POOL, VRAM_MIN_GB, printable
from ..wire import TERMINAL_STATUSES
from .gpus import GpuReading
from .paths import Paths, resolve_paths
from .pydantic_words import TYPE_WORDS, constraint_words

__all__ = ["CPU_DOMAIN", "Config", "ConfigError", "Paths", "load_config", "resolve_paths"]

CPU_DOMAIN = CPU_POOL
_DOMAIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")  # (fullmatch: "^...$" took "x\n")


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key or domain at fault."""


_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,253}[A-Za-z0-9])?")


class _Strict(BaseModel):
    # (no NaN or infinity: "nan" failed a bound's check and was refused for the wrong reason)
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class EngineSettings(_Strict):
    """``[engine]``: timings of the engine itself."""

    # Every timing has a floor: 1e-9 s between samples would spin a core for ever.
    sample_interval: float = Field(1.0, ge=0.05, le=3600)
    history: int = Field(120, ge=1, le=10_000)
    probe_timeout: float = Field(5.0, ge=0.05, le=600)
    grace_period: float = Field(10.0, ge=0, le=3600)
    adopt_grace_period: float = Field(60.0, ge=0, le=3600)
    # How long a process may outlive SIGKILL before its job is released (a process in
    # uninterruptible sleep, stuck in a GPU driver, may never die).
    release_after: float = Field(30.0, ge=0.1, le=86400)
    auto_domains: bool = True
    launcher_idle: float = Field(60.0, ge=0.1, le=86400)


class CpuSettings(_Strict):
    """``[cpu]``: the pool that runs ``gpus = 0`` jobs."""

    slots: int | None = Field(None, ge=1, le=4096)


class DomainSettings(_Strict):
    """``[domains.NAME]``: one GPU with one owner."""

    gpu: int | str
    slots: int = Field(1, ge=1, le=1024)


class HealthSettings(_Strict):
    """``[health]``: when failed reads of a GPU degrade, then quarantine, its domain."""

    degrade_after: int = Field(2, ge=1, le=1000)
    quarantine_after: int = Field(5, ge=1, le=1000)

    @model_validator(mode="after")
    def _in_order(self) -> HealthSettings:
        # (quarantine first, then "degraded": a state that never showed)
        if self.degrade_after > self.quarantine_after:
            raise ValueError(
                f"degrade_after ({self.degrade_after}) is more than quarantine_after "
                f"({self.quarantine_after}): a GPU is degraded before it is quarantined"
            )
        return self


class ServiceSettings(_Strict):
    """``[services]``: how replicas are reached and checked, and when a restart counts as
    steady."""

    host: str = Field("127.0.0.1", min_length=1, max_length=255)
    steady_after: float = Field(60.0, ge=0.1, le=86400)
    # An up replica's port is checked this often (0: only until it first answers) ...
    check_interval: float = Field(10.0, ge=0, le=3600)
    # ... and after this many failed checks in a row it is down (its endpoint withdrawn)
    down_after: int = Field(3, ge=1, le=1000)
    # ... and restarted once it has been down this long (0: never restarted for it).
    restart_down_after: float = Field(60.0, ge=0, le=86400)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            if not _HOSTNAME.fullmatch(value):
                raise ValueError(f"{value!r} is not an IP address or host name") from None
            if all(part.isdigit() for part in value.split(".")):
                # (no host name is all digits: "999.1.1.1" was taken: tester h193)
                raise ValueError(
                    f"{value!r} is not an IP address (four parts from 0 to 255) or a host name"
                ) from None
        return value


class UiSettings(_Strict):
    """``[ui]``: preferences of the TUI (the engine ignores them)."""

    theme: str | None = Field(None, min_length=1, max_length=64)


MAX_ID = 2**32 - 2  # the largest valid uid/gid ((uid_t) -1 means "no change")


class SecuritySettings(_Strict):
    """``[security]``: who, besides the engine's own user and root, may use the socket.

    Anyone allowed can run commands as the engine's user (jobs run as that user), so
    list only people trusted with that account. They can cancel only their own jobs, see
    other users' jobs without their environment values, and read other users' output only
    with ``share_logs``.
    """

    allowed_uids: list[Annotated[int, Field(ge=0, le=MAX_ID)]] = Field(
        default_factory=list, max_length=4096
    )
    allowed_groups: list[Annotated[int, Field(ge=0, le=MAX_ID)] | str] = Field(
        default_factory=list, max_length=4096
    )
    # Whether an allowed user may read the output of other users' jobs (their own, always;
    # the engine's user and root, always). Environment values are never shown to others.
    share_logs: bool = False

    @property
    def opens_socket(self) -> bool:
        """True if users other than the engine's own may connect."""
        return bool(self.allowed_uids or self.allowed_groups)

    def group_ids(self) -> frozenset[int]:
        """The allowed groups as gids (a name that no longer resolves is skipped)."""
        gids: set[int] = set()
        for group in self.allowed_groups:
            if isinstance(group, int):
                gids.add(group)
                continue
            try:
                gids.add(grp.getgrnam(group).gr_gid)
            except (KeyError, ValueError):
                continue
        return frozenset(gids)


class LimitsSettings(_Strict):
    """``[limits]``: back-pressure; submissions beyond these are refused with 429."""

    active_jobs: int = Field(50_000, ge=1, le=10_000_000)
    submissions_in_flight: int = Field(64, ge=1, le=100_000)
    # A connection to the socket that has not sent a whole request within this many
    # seconds (a half-open or stalled client) is closed: it would hold a file descriptor.
    idle_connection: float = Field(30.0, ge=0.1, le=86400)
    # Open streams (GET /v1/events, logs --follow) per uid: each holds a descriptor for as
    # long as it is read, and one user holding thousands locked every other user out.
    streams_per_user: int = Field(64, ge=1, le=100_000)
    # Connections to the socket per uid (each a descriptor): past it, 429 and closed.
    connections_per_user: int = Field(512, ge=1, le=100_000)


class LogSettings(_Strict):
    """``[logs]``: how much output a job may keep, and the disk space kept free."""

    # A job's log is cut back to its last part (with a note) once it passes this.
    max_bytes: int = Field(1024**3, ge=64 * 1024, le=2**50)
    # New jobs wait (with the reason) while the state dir's filesystem has less free.
    min_free_mb: int = Field(256, ge=0, le=2**30)


class HistorySettings(_Strict):
    """``[history]``: which finished jobs are kept (rows, timelines and logs): those that
    ended in the last ``keep_days``, and at most the ``keep_jobs`` that ended last."""

    keep_days: float | None = Field(None, ge=0.001, le=36500)  # None: forever
    keep_jobs: int | None = Field(None, ge=1, le=10**9)  # the N that ended last; None: all


class SnapshotSettings(_Strict):
    """``[snapshot]``: copy a job's working directory at submission (``submit --snapshot``)
    so that it runs the code as it was then (see ``engine/snapshot.py``)."""

    default: bool = False  # snapshot submissions that do not say (the engine's user's)
    max_mb: int = Field(512, ge=1, le=10**7)  # a bigger working directory is refused
    timeout: float = Field(120.0, ge=1, le=3600)  # seconds a snapshot may take
    # How a job's tree holds its files: "linked" (hard links to the store's read-only
    # objects, deduplicated), "private" (each job's own copies), "auto" (private when the
    # engine may write read-only files, i.e. runs as root: see engine/snapshot.py).
    files: Literal["auto", "linked", "private"] = "auto"


class UsageSettings(_Strict):
    """``[usage]``: the per-job GPU series (VRAM, utilisation, power, energy) and its size."""

    series: bool = True  # off: no per-job series, summaries or idle warnings
    # Points kept per GPU of a job; past it, neighbours merge and the step doubles.
    max_points: int = Field(1000, ge=16, le=100_000)
    # Seconds between a job's series points (0: one per sampling tick).
    point_interval: float = Field(5.0, ge=0, le=3600)
    # How often a running job's series is written (it is always written when the job ends).
    save_interval: float = Field(60.0, ge=1, le=86400)


class PolicySettings(_Strict):
    """``[policy]``: what the engine says (or does) about a job that holds a GPU idle."""

    # Seconds a running job may hold all its GPUs under ``idle_below`` percent utilisation
    # before it is warned; ``None`` (the default) never warns.
    idle_after: float | None = Field(None, ge=1, le=30 * 86400)
    idle_below: int = Field(5, ge=1, le=100)
    # "warn": a warning on the job (its timeline, its message, the dashboard, a metric);
    # "stop": the warning, then the job is cancelled with the reason.
    idle_action: Literal["warn", "stop"] = "warn"


class NotifySettings(_Strict):
    """``[notify]``: tell someone when a job ends (or a service replica restarts or gives
    up). Each notification is the job's JSON (see ``engine/notify.py``): on the stdin of
    ``command`` (argv, run without a shell) and/or POSTed to ``url``. A notification that
    fails is logged; it never changes the job."""

    command: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        None, min_length=1, max_length=256
    )
    url: str | None = Field(None, min_length=1, max_length=2048)
    # "marked": only jobs submitted with --notify (spec ``notify = true``); "all": every job.
    jobs: Literal["marked", "all"] = "marked"
    on: list[str] = Field(default_factory=lambda: sorted(TERMINAL_STATUSES), max_length=16)
    replicas: bool = True  # a replica's restart or give-up (of the services ``jobs`` picks)
    timeout: float = Field(10.0, ge=0.1, le=3600)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        try:
            parts = urlsplit(value)
        except ValueError:  # ("http://[x": Python's "Invalid IPv6 URL")
            raise ValueError("not an http:// or https:// URL with a host") from None
        if parts.scheme not in ("http", "https") or not parts.netloc:
            # (The value is not quoted: a webhook's secret is in it, and this message goes
            # to the log, to events and to doctor, which every allowed user reads.)
            raise ValueError("not an http:// or https:// URL with a host")
        try:
            port = parts.port
        except ValueError:
            port = 0  # (not a number, or past 65535)
        if port == 0 or not parts.hostname:
            raise ValueError("its port is not 1-65535 (or it names no host)")
        if any(ch.isspace() or ord(ch) < 32 for ch in value):
            raise ValueError("the URL contains white space or a control character")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if any("\0" in word for word in value):
            raise ValueError("the command contains a NUL byte")
        program = value[0]
        if "/" in program and not program.startswith("/"):
            # (run from the engine's working directory, which a unit sets to /: "./n.sh"
            # was taken, and every notification failed "No such file": tester h153)
            raise ValueError(
                f"{program!r} is a relative path; give an absolute path, or a program name "
                "found in PATH"
            )
        return value

    @field_validator("on")
    @classmethod
    def _on(cls, value: list[str]) -> list[str]:
        if not value:
            # (taken, "valid and applied", and no job notified again, without a word: h63)
            raise ValueError(
                "lists no status, so nothing would ever notify; leave it out for every end, "
                "or remove command and url to turn notifications off"
            )
        for status in value:
            if status not in TERMINAL_STATUSES:
                known = ", ".join(sorted(TERMINAL_STATUSES))
                raise ValueError(f"{status!r} is not a terminal status (one of: {known})")
        return value

    @property
    def enabled(self) -> bool:
        """True when there is somewhere to send notifications."""
        return bool(self.command or self.url)


class UserLimits(_Strict):
    """``[users.NAME]`` / ``[users.default]``: what one user may hold or queue at once.

    Jobs past a running limit wait with a reason naming it; a submission past
    ``max_queued``, or asking for a priority above ``max_priority`` (an edit too), is
    refused. ``share`` weighs the user's fair share (2: counts half its usage). Unset
    limits fall back to ``[users.default]``, then to none.
    """

    max_gpus: int | None = Field(None, ge=0, le=4096)  # GPUs held by its running jobs
    max_vram_gb: float | None = Field(None, ge=0, le=1e6)  # declared VRAM of running jobs
    max_queued: int | None = Field(None, ge=0, le=10_000_000)  # jobs waiting to run
    # (1e-320 was taken: a user's fair_usage divided by it was Infinity, which the API
    # wrote as no JSON allows: tester h167)
    share: float | None = Field(None, ge=0.001, le=1000)
    # The highest priority its jobs may ask for (a submission or edit above it is refused:
    # on a shared box, anyone's `--priority 1000` went ahead of everyone).
    max_priority: int | None = Field(None, ge=-1_000_000, le=1_000_000)

    @field_validator("max_vram_gb")
    @classmethod
    def _vram_a_job_can_have(cls, value: float | None) -> float | None:
        if value is not None and 0 < value < VRAM_MIN_GB:
            # (every job declaring VRAM failed over capacity: none may declare that little)
            raise ValueError(
                f"{value:g} GiB is less than the least VRAM a job may declare (1 MiB = "
                f"{VRAM_MIN_GB:g} GiB); 0 allows no declared VRAM at all"
            )
        return value


UNCATCHABLE_WARNINGS = {
    "SIGKILL": "kills the job at once: it is no warning to save",
    "SIGSTOP": "stops the job, which then cannot save on SIGTERM either",
    "SIGTSTP": "stops the job (unless it catches it), which then cannot save",
    "SIGTTIN": "stops the job (unless it catches it), which then cannot save",
    "SIGTTOU": "stops the job (unless it catches it), which then cannot save",
    "SIGCONT": "does nothing to a running job: it is no warning to save",
    "SIGCHLD": "is ignored by default: it is no warning to save",
    "SIGWINCH": "is ignored by default: it is no warning to save",
    "SIGURG": "is ignored by default: it is no warning to save",
}
"""Signals that cannot be a checkpoint's warning, and why (``[scheduling]
checkpoint_signal``)."""


class SchedulingSettings(_Strict):
    """``[scheduling]``: fair share, reservations and preemption (the shared box)."""

    # GPU-seconds used count half as much after this many seconds (Slurm's decay).
    fairshare_half_life: float = Field(7 * 86400.0, ge=60, le=365 * 86400)
    # The best waiting job that cannot start keeps the domains it will get (others only
    # backfill them when their timeout ends before it can start).
    reserve: bool = True
    # A job that has waited this long may preempt lower-priority preemptible jobs whose
    # domains would let it start (None: never preempt).
    preempt_after: float | None = Field(None, ge=0, le=30 * 86400)
    # Sent checkpoint_grace seconds before SIGTERM to a job being preempted ("" in the
    # file, None here: no warning; TOML has no null, and nothing could turn it off).
    checkpoint_signal: str | None = Field("SIGUSR1", max_length=16)
    checkpoint_grace: float = Field(30.0, ge=0, le=3600)

    @field_validator("checkpoint_signal", mode="before")
    @classmethod
    def _no_signal(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("checkpoint_signal")
    @classmethod
    def _signal(cls, value: str | None) -> str | None:
        import signal as _signal

        if value is None:
            return None
        # (the name as `signal --signal` takes it too, without SIG: "USR2" was refused
        # while SIGUSR2 was taken: tester h154)
        named = value if value.startswith("SIG") else f"SIG{value}"
        if not value.isascii() or not isinstance(getattr(_signal, named, None), _signal.Signals):
            raise ValueError(f"{value!r} is not a signal name (e.g. SIGUSR1)")
        value = named
        if value in UNCATCHABLE_WARNINGS:
            # (SIGSTOP froze the job through its SIGTERM: its handler never ran and it was
            # SIGKILLed unsaved; tester h59)
            raise ValueError(f"{value} {UNCATCHABLE_WARNINGS[value]} (use e.g. SIGUSR1)")
        return value


class ClusterSettings(_Strict):
    """``[clusters.NAME]``: a Slurm cluster jobs may be sent to (issue 16)."""

    kind: Literal["slurm"] = "slurm"
    partition: str = Field(min_length=1, max_length=128)
    account: str | None = Field(None, min_length=1, max_length=128)
    qos: str | None = Field(None, min_length=1, max_length=128)
    time_limit: float | None = Field(None, gt=0, le=365 * 86400)  # default run time, s
    # How to reach the cluster's commands, e.g. ["ssh", "login1"] (argv, no shell).
    command_prefix: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        default_factory=list, max_length=64
    )
    # Whether the prefix hands the command to a shell on the other side, as ssh does (it
    # joins its arguments with spaces for the remote shell): then every argument after
    # the prefix is quoted. Unset: true when the prefix runs ssh.
    prefix_shell: bool | None = None
    poll_interval: float = Field(5.0, ge=0.2, le=3600)
    command_timeout: float = Field(30.0, ge=1, le=600)


class SimulateSettings(_Strict):
    """``[simulate]``: how jobs look on simulated GPUs (``--simulate`` only).

    Each running job, service replica and adopted process placed on a simulated GPU
    shows there as a GPU process (its real pid) holding ``memory_fraction`` of its
    declared ``vram_gb`` (``memory_gb`` when it declared none) and adding
    ``utilization`` % to the GPU, moved by up to ``jitter`` points per tick by a pattern
    seeded with ``seed`` (the same seed, job and tick always give the same value).
    """

    jobs: bool = True  # off: only the ledger (sim-ledger.json) puts processes on GPUs
    utilization: int = Field(70, ge=0, le=100)
    jitter: int = Field(0, ge=0, le=100)
    memory_fraction: float = Field(1.0, ge=0, le=1)
    memory_gb: float = Field(1.0, ge=0, le=1e6)
    seed: int = Field(0, ge=0, le=2**63 - 1)


class Config(_Strict):
    """The whole config file."""

    engine: EngineSettings = EngineSettings()
    cpu: CpuSettings = CpuSettings()
    health: HealthSettings = HealthSettings()
    services: ServiceSettings = ServiceSettings()
    ui: UiSettings = UiSettings()
    domains: dict[str, DomainSettings] = {}
    security: SecuritySettings = SecuritySettings()
    limits: LimitsSettings = LimitsSettings()
    logs: LogSettings = LogSettings()
    history: HistorySettings = HistorySettings()
    snapshot: SnapshotSettings = SnapshotSettings()
    usage: UsageSettings = UsageSettings()
    policy: PolicySettings = PolicySettings()
    notify: NotifySettings = NotifySettings()
    users: dict[str, UserLimits] = {}
    scheduling: SchedulingSettings = SchedulingSettings()
    clusters: dict[str, ClusterSettings] = {}
    simulate: SimulateSettings = SimulateSettings()


def toml_key(part: object) -> str:
    """A key as TOML writes it: bare when it can be, else quoted (an empty key is ``""``)."""
    text = str(part)
    if isinstance(part, int) or (
        text.isascii() and text and all(c.isalnum() or c in "_-" for c in text)
    ):
        return text
    return json.dumps(text, ensure_ascii=False)  # (control characters stay escaped)


_UNION_MEMBERS = {"int": "an integer", "str": "a string", "float": "a number", "bool": "a boolean"}
"""A union's members as pydantic names them at the end of an error's location (``gpu =
0.5`` said ``domains.a.gpu.int: ...`` and ``domains.a.gpu.str: ...``), in words."""


def _keys_at(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The keys the table at ``path`` of ``model`` takes (a ``dict`` table's part is the
    name given: ``domains.NAME``); none where the path does not lead to a table."""
    import typing

    kind: Any = model
    for part in path:
        if typing.get_origin(kind) is dict:
            kind = typing.get_args(kind)[1]  # (any name: its value's table)
            continue
        if not (isinstance(kind, type) and issubclass(kind, BaseModel)):
            return []
        field = kind.model_fields.get(str(part))
        if field is None:
            return []
        kind = field.annotation
        # (an optional table: the table)
        members = [a for a in typing.get_args(kind) if a is not type(None)]
        if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(members) == 1:
            kind = members[0]
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return list(kind.model_fields)
    return []


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """`` (did you mean 'engine.sample_interval'?)`` for an unknown key close to one its
    table takes, as the CLI says of a flag (tester h182)."""
    import difflib

    if not loc:
        return ""
    # A key of another table, written where it does not go (`sample_interval` at the top,
    # not under [engine]: tester h187), before a near miss here ("slots" is not "logs").
    tables = [name for name in Config.model_fields if _keys_at(Config, (name,))]
    elsewhere = [f"{t}.{loc[-1]}" for t in tables if str(loc[-1]) in _keys_at(Config, (t,))]
    if len(elsewhere) == 1:
        return f" (did you mean '{elsewhere[0]}'?)"
    close = difflib.get_close_matches(str(loc[-1]), _keys_at(Config, loc[:-1]), n=1, cutoff=0.6)
    if close:
        return f" (did you mean '{'.'.join(toml_key(p) for p in (*loc[:-1], close[0]))}'?)"
    return ""


def _format_validation(err: ValidationError, source: str) -> str:
    lines: list[str] = []
    unions: dict[tuple[Any, ...], tuple[list[str], object]] = {}
    for item in err.errors():
        loc = tuple(item["loc"])
        member = str(loc[-1]).removeprefix("constrained-") if loc else ""
        if len(loc) > 1 and member in _UNION_MEMBERS and item["type"].endswith("_type"):
            words, _ = unions.setdefault(loc[:-1], ([], item.get("input")))
            words.append(_UNION_MEMBERS[member])
            continue
        where = ".".join(toml_key(p) for p in loc) or "(top level)"
        if item["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{where}'{_did_you_mean(loc)}")
        elif item["type"] == "missing":  # ("Field required": tester h193)
            lines.append(f"{source}: {where}: needed, and not given")
        elif item["type"] in ("model_type", "dict_type"):  # (not a class's name)
            table = "[users.NAME]" if loc[:1] == ("users",) else f"[{where}]"
            lines.append(
                f"{source}: {where}: expected a table ({table}), got {_as_toml(item.get('input'))}"
            )
        elif item["type"].endswith(("_type", "_parsing")):  # (the value given, too)
            # (in the words of the rest: "Input should be a valid integer": tester h170)
            typed = TYPE_WORDS.get(item["type"], item["msg"])
            lines.append(f"{source}: {where}: {typed}, got {_as_toml(item.get('input'))}")
        elif (said := constraint_words(item)) is not None:  # (in our words: tester h168)
            lines.append(f"{source}: {where}: {said}, got {_as_toml(item.get('input'))}")
        else:
            # (our own checks' words, without pydantic's "Value error, " before them)
            lines.append(f"{source}: {where}: {item['msg'].removeprefix('Value error, ')}")
    for loc, (words, given) in unions.items():
        where = ".".join(toml_key(p) for p in loc)
        lines.append(f"{source}: {where}: expected {' or '.join(words)}, got {_as_toml(given)}")
    return "\n".join(lines)


def _as_toml(value: object) -> str:
    """A value as TOML writes it (``true``, ``0.5``, ``"bob"``), near enough to point at."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def parse_config(data: dict[str, Any], source: str = "config") -> Config:
    """Validate a parsed TOML document.

    Raises:
        ConfigError: Naming every key at fault.
    """
    try:
        config = Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation(err, source)) from None
    for name in config.domains:
        if name == CPU_DOMAIN:
            raise ConfigError(f"{source}: domains.{name}: '{CPU_DOMAIN}' is the CPU pool's name")
        if name.lower() == CPU_DOMAIN:  # (a GPU named `CPU` beside the pool: tester h169)
            raise ConfigError(
                f"{source}: domains.{name}: too like '{CPU_DOMAIN}', the CPU pool's name "
                "(`--domain CPU` would be a GPU): choose another"
            )
        if not _DOMAIN_NAME.fullmatch(name):
            raise ConfigError(
                f"{source}: domains.{toml_key(name)}: a domain name is a letter then up to 31 "
                "letters, digits, '-' or '_'"
            )
    for name in config.clusters:
        # (Typed on command lines and shown in tables, as domain names are.)
        if not _DOMAIN_NAME.fullmatch(name):
            raise ConfigError(
                f"{source}: clusters.{toml_key(name)}: a cluster name is a letter then up to 31 "
                "letters, digits, '-' or '_'"
            )
    tables: dict[int, str] = {}
    for name in config.users:
        if name == "default":
            continue
        uid = uid_of_table(name)
        if uid is None:
            if name.isascii() and name.isdigit():
                raise ConfigError(
                    f"{source}: users.{toml_key(name)}: not a uid (at most {MAX_UID})"
                )
            raise ConfigError(
                f"{source}: users.{toml_key(name)}: no user named {name!r} on this machine (a uid "
                "with no name is written as its number: [users.1234])"
            )
        if uid in tables:
            # (both were taken, the last one winning, and swapping them said no change)
            raise ConfigError(
                f"{source}: users.{toml_key(name)}: users.{toml_key(tables[uid])} and "
                f"users.{toml_key(name)} are the same user "
                f"(uid {uid}): give its limits in one table"
            )
        tables[uid] = name
    for group in config.security.allowed_groups:
        if isinstance(group, str):
            try:
                grp.getgrnam(group)
            except (KeyError, ValueError):
                raise ConfigError(
                    f"{source}: security.allowed_groups: no group named {group!r} on this machine"
                ) from None
    return config


def uid_of_table(name: str) -> int | None:
    """The uid a ``[users.NAME]`` table is for: the user named so, else a uid written
    as a number (one with no passwd entry, as in many containers, is shown and named by
    its number); ``None`` if neither."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        if name.isascii() and name.isdigit() and int(name) <= MAX_UID:
            return int(name)
        return None


MAX_UID = 2**32 - 2
"""The largest uid Linux gives (2**32 - 1 is "no uid")."""


def absent_words(path: Path) -> str:
    """How a config file that cannot be found is said: ``absent``, or what the symbolic
    link in its place does (a link to itself read "was removed" and "absent"; tester h59)."""
    if not path.is_symlink():
        return "absent"
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symbolic link that loops (no file at its end)"
    try:
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    except OSError:
        return "absent"


def load_config(path: Path) -> Config:
    """Read and validate the config file; a missing file is the default config.

    Raises:
        ConfigError: On unreadable TOML or invalid keys, naming the file and the key.
    """
    try:
        # Only a regular file: reading a FIFO (or a device) would block the start for ever.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ConfigError(f"{path}: not a regular file; the config is a TOML file")
        data = path.read_bytes()
    except FileNotFoundError:
        return Config()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    return parse_config_text(_text_of(data, path), str(path))


def _text_of(data: bytes, path: Path) -> str:
    """A config file's bytes as text.

    Raises:
        ConfigError: They are not UTF-8, naming the line and column (as a TOML error
            does; a byte offset alone: tester h193).
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        # (in characters, as an editor and TOML's own errors count them, not bytes: h197)
        before = data[data.rfind(b"\n", 0, err.start) + 1 : err.start]
        column = len(before.decode("utf-8", "replace")) + 1
        raise ConfigError(
            f"{path}: not UTF-8 text: {err.reason} (at line {line}, column {column})"
        ) from None


def load_engine_config(path: Path) -> Config | None:
    """The config file as the engine reads it: only one no other user could write or
    replace, checked as it is opened and read from that descriptor (see
    :func:`.statedir.read_trusted_config`); None where there is no file.

    Raises:
        ConfigError: Another user controls it, it cannot be read, or it is invalid.
    """
    from .statedir import UntrustedConfig, read_trusted_config

    try:
        data = read_trusted_config(path)
    except UntrustedConfig as err:
        raise ConfigError(str(err)) from None
    except OSError as err:
        if err.errno == errno.EINVAL:
            raise ConfigError(f"{path}: not a regular file; the config is a TOML file") from None
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    if data is None:
        return None
    return parse_config_text(_text_of(data, path), str(path))


def _twice(err: tomllib.TOMLDecodeError, text: str) -> str:
    """For TOML's "Cannot overwrite a value" or "Cannot declare ... twice": that a key or
    table is given twice, and the second's line (neither named the key: tester h193)."""
    said = str(err)
    if "Cannot overwrite" not in said and "twice" not in said:
        return ""
    found = re.search(r"\(at line (\d+), column \d+\)", said)
    lines = text.splitlines()
    lineno = int(found.group(1)) if found else 0
    if not 0 < lineno <= len(lines):
        return ": a key or table is given twice"
    shown = printable(lines[lineno - 1].strip()[:80])
    return f": a key or table is given twice, the second time here: {shown}"


def parse_config_text(text: str, source: str = "config") -> Config:
    """Parse and validate the text of a config file.

    Raises:
        ConfigError: On invalid TOML or invalid keys, naming ``source`` and the key.
    """
    # A UTF-8 byte order mark (Notepad saves one) is not text: TOML refused the file at
    # "line 1, column 1" with no word of it (tester h193). Read without it, as the CLI
    # reads a spec file.
    text = text.removeprefix("\ufeff")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source}: not valid TOML: {err}{_twice(err, text)}") from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid TOML: nested too deeply") from None
    return parse_config(data, source)


@dataclass(frozen=True, slots=True)
class DomainPlan:
    """A domain bound to a real GPU (or the CPU pool when ``gpu_index`` is None)."""

    name: str
    gpu_index: int | None
    gpu_uuid: str | None
    slots: int


def plan_domains(
    config: Config,
    gpus: tuple[GpuReading, ...],
    cpu_count: int,
    source: str = "config",
    missing: dict[str, int | str] | None = None,
) -> list[DomainPlan]:
    """Bind the configured domains to the GPUs the probe sees.

    Rejects double ownership (the same GPU in two domains), GPUs that do not exist and
    name clashes with automatic ``gpu<N>`` domains. Returns GPU domains in index order,
    then the ``cpu`` pool.

    Args:
        missing: Given, a domain whose GPU does not exist is left out and put here (its
            name: the GPU it names) instead of refusing the config: an engine starting
            after a reboot that did not bring a GPU up (it refused to start at all).

    Raises:
        ConfigError: Naming the domain(s) at fault.
    """
    by_index = {g.index: g for g in gpus}
    by_uuid = {g.uuid: g for g in gpus if g.uuid}
    owner: dict[int, str] = {}
    plans: list[DomainPlan] = []
    visible = (
        "no GPUs are visible"
        if not gpus
        else f"the GPUs seen: {', '.join(f'GPU {i}' for i in by_index)}"  # ("visible GPUs: 0")
    )
    for name, dom in config.domains.items():
        gpu: GpuReading | None
        if isinstance(dom.gpu, int):
            gpu = by_index.get(dom.gpu)
            shown = f"gpu {dom.gpu}"
        else:
            gpu = by_uuid.get(dom.gpu)
            shown = f"gpu {dom.gpu!r}"
        if gpu is None:
            if missing is not None:
                missing[name] = dom.gpu
                continue
            raise ConfigError(f"{source}: domains.{name}: {shown} does not exist ({visible})")
        if gpu.index in owner:
            raise ConfigError(
                f"{source}: domains.{name}: domains.{owner[gpu.index]} and domains.{name} "
                "both claim GPU "
                f"{gpu.index}; a GPU has exactly one owning domain"
            )
        owner[gpu.index] = name
        plans.append(DomainPlan(name, gpu.index, gpu.uuid, dom.slots))
    if config.engine.auto_domains:
        for gpu in gpus:
            if gpu.index in owner:
                continue
            name = f"gpu{gpu.index}"
            if name in config.domains:
                named = config.domains[name].gpu
                if missing is not None and name in missing:
                    # (its own GPU is the problem: "rename it" sent the user the wrong way)
                    shown = f"gpu {named}" if isinstance(named, int) else f"gpu {named!r}"
                    raise ConfigError(
                        f"{source}: domains.{name}: {shown} does not exist ({visible}); "
                        f"name a GPU that does (GPU {gpu.index} is the one called '{name}' "
                        "when no domain owns it)"
                    )
                raise ConfigError(
                    f"{source}: domains.{name}: it names GPU {named} but "
                    f"'{name}' is also the automatic name of GPU {gpu.index}; rename it"
                )
            plans.append(DomainPlan(name, gpu.index, gpu.uuid, 1))
    plans.sort(key=lambda p: p.gpu_index if p.gpu_index is not None else -1)
    plans.append(DomainPlan(CPU_DOMAIN, None, None, config.cpu.slots or max(1, cpu_count)))
    return plans
