"""The JSON shapes of the wire contract (``TypedDict``), re-exported by :mod:`.wire`.

Kept apart so that what the CLI loads on every call (the enums and field rules of
:mod:`.wire`) does not build these classes and import :mod:`typing` (~3 ms): annotations
name them through ``wire`` under ``TYPE_CHECKING``, and ``wire.JobJSON`` at run time
loads this module on first use.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class ReplicaJSON(TypedDict):
    """One replica of a service."""

    index: int
    state: str
    domains: list[str]
    gpus: list[int]
    pid: int | None
    start_ticks: int | None
    port: int | None
    endpoint: str | None
    restarts: int
    backoff_step: int
    next_restart_at: float | None
    started_at: float | None
    last_exit_code: int | None
    message: str
    launches: int
    down_since: NotRequired[float | None]  # (rows stored before it)
    roll: NotRequired[str]  # its place in a rolling restart ("" when none; rows before it)


class UsageSummaryJSON(TypedDict):
    """What a job used of its GPUs (issue 17): on every GPU job that was seen running.

    VRAM in bytes per GPU (what the job's processes held there); utilisation figures in
    percent of the GPU (the whole GPU's: ``shared`` says another job held it too); energy
    from the driver's counter, or from power x time when ``energy_estimated``.
    """

    gpus: list[int]
    samples: int
    seconds: float
    gpu_hours: float
    peak_vram: int | None
    """None (as ``mean_vram`` and ``energy_wh``) while no sample was read."""
    mean_vram: int | None
    util_mean: float | None
    util_p95: int | None
    mem_util_mean: float | None
    energy_wh: float | None
    energy_estimated: bool
    idle_share: float | None
    """Share of the time its GPUs were under ``[policy] idle_below`` percent."""
    shared: bool
    declared_vram: int | None
    suggest_vram_gb: float | None
    advice: str | None
    """Right-sizing: the declared ``vram_gb`` against what was held, in words."""
    idle_warning: str | None


class UsageSeriesJSON(TypedDict):
    """One GPU's series for one job: ``t`` in seconds since ``t0`` (each point a bucket of
    ``step`` seconds, 0 while each point is one tick), VRAM in MiB (the bucket's peak),
    the rest the bucket's means."""

    gpu: int
    t0: float
    step: float
    t: list[float]
    vram_mib: list[int]
    util: list[int | None]
    mem_util: list[int | None]
    power_w: list[float | None]


class UsageJSON(TypedDict):
    """``GET /v1/jobs/ID/usage``: the summary and every GPU's series (``totals``: the
    running sums the engine goes on from after a restart)."""

    job: int
    summary: UsageSummaryJSON | None
    series: list[UsageSeriesJSON]
    totals: NotRequired[dict[str, Any]]


class RowUsageJSON(TypedDict):
    """The usage figures a jobs table can show (a row's ``use``)."""

    peak_vram: int | None
    """None (as ``energy_wh``) while no sample was read."""
    util_mean: float | None
    energy_wh: float | None


class JobRowJSON(TypedDict):
    """A job's *row*: what a table shows. Lists (``GET /v1/jobs``) and events carry rows:
    the spec cut to ``ROW_SPEC_KEYS``, times to the millisecond, ``kill_at`` only while a
    stop is under way. The whole job is :class:`JobJSON`."""

    id: int
    name: str
    kind: str
    status: str
    termination_reason: str | None
    exit_code: int | None
    message: str
    domains: list[str]
    gpus: list[int]
    pid: int | None
    started_at: float | None
    ended_at: float | None
    kill_at: NotRequired[float | None]
    spec: dict[str, Any]
    owner_uid: int
    """Who submitted it: the socket peer's uid, or the engine's own user's (in-process
    submissions, and jobs from before owners were kept)."""
    created_at: float
    """When it was submitted (the list's order: newest first)."""
    replicas: NotRequired[list[ReplicaJSON]]
    use: NotRequired[RowUsageJSON]
    """GPU jobs that were seen running: peak VRAM, mean utilisation, energy."""


class JobJSON(JobRowJSON):
    """A whole job (``GET /v1/jobs/ID``, ``POST /v1/jobs``, ``status --json``): its row
    with the whole spec, plus when it was created and queued, its owner, priority, why it
    was asked to stop, and (services) its placement attempt."""

    priority: int
    queued_at: float | None
    stop_reason: str | None
    attempt: NotRequired[int]
    cancels_dependents: NotRequired[list[int]]
    """An active job's (``GET /v1/jobs/ID``, its cancel's answer): the waiting jobs its end
    other than completed cancels (they wait for it to complete, not ``--after-any``; and
    theirs, on down); absent when none."""
    usage: NotRequired[UsageSummaryJSON]
    cluster: NotRequired[str]
    """A Slurm cluster's job (issue 16): the cluster's name, and its id there."""
    cluster_job_id: NotRequired[str | None]


class JobPageJSON(TypedDict):
    """``GET /v1/jobs``: one page of job rows (the spec cut to ``ROW_SPEC_KEYS``)."""

    jobs: list[JobRowJSON]
    more: bool
    """True when another page follows."""


class TimelineEntryJSON(TypedDict):
    """One stored event of a job's timeline."""

    at: float
    kind: str
    status: str | None
    reason: str | None
    message: str | None
    data: dict[str, Any]


class JobDetailJSON(TypedDict):
    """``GET /v1/jobs/ID``: the job and its timeline (which includes its current status)."""

    job: JobJSON
    events: list[TimelineEntryJSON]


class RestartedJSON(TypedDict):
    """``POST /v1/jobs/ID/restart``: the new job, the dependencies it no longer waits for
    (cleaned from the history), and what the restarter should know (absent when none: a
    restart of a job whose earlier restart has not ended runs it a second time). A
    running service is restarted in place: ``job`` is itself, ``rolling`` the replicas
    it restarts one at a time."""

    job: JobJSON
    left_out: list[int]
    warnings: NotRequired[list[str]]
    rolling: NotRequired[list[int]]


class DomainJSON(TypedDict):
    """A domain's state (``GET /v1/domains``, drain and release answers)."""

    name: str
    gpu_index: int | None
    state: str
    state_reason: str
    drain_reason: NotRequired[str | None]
    """The operator's drain (its reason), also while a quarantine is on top of it: a
    release lifts the quarantine and the domain drains again (an older engine leaves it
    out)."""
    previous_drain_reason: NotRequired[str]
    """Only in a drain's answer that changed a drain's reason: the reason it replaced."""
    health: str
    failures: int
    last_error: str
    slots: int
    used_slots: int


class GpuJSON(TypedDict):
    """The latest reading of a domain's GPU."""

    name: str
    memory_total: int | None
    memory_used: int | None
    memory_reserved: int | None
    utilization: int | None
    temperature: int | None
    power_watts: float | None
    power_limit_watts: float | None
    error: str | None
    lost: bool


class VramJSON(TypedDict):
    """The VRAM formula's result for one domain (bytes). ``total`` is what jobs can have:
    the GPU's memory less ``driver_reserved``, what the driver keeps for itself (0 where
    the driver does not say)."""

    total: int
    used: int
    owned: int
    unregistered: int
    unattributed: int
    reserved_extra: int
    free: int
    leaving: int
    driver_reserved: int


class ProcessJSON(TypedDict):
    """A process listed on a GPU; ``job_id`` is ``None`` when no job owns it.

    ``gpu_util`` is its SM utilisation of this GPU in percent (the driver's per-process
    samples since the last read; ``None`` when it has none). ``user`` is the process's
    real uid's name; ``ppid`` its parent's pid; ``started_at`` epoch seconds; ``cpu_percent``
    its host CPU over the last sample interval (100 = one core; ``None`` on the first
    sample that sees it, or when unreadable); ``rss`` its resident host memory in bytes.
    """

    pid: int
    used_bytes: int | None
    gpu_util: int | None
    job_id: int | None
    user: str
    command: str
    start_ticks: int | None
    ppid: int | None
    started_at: float | None
    cpu_percent: float | None
    rss: int | None


class DomainViewJSON(DomainJSON):
    """A domain in ``GET /v1/gpus``: its state plus reading, accounting and processes."""

    gpu_uuid: str | None
    jobs: list[int]
    leaving_jobs: NotRequired[list[int]]
    """Jobs that ended since the sample its processes are from: theirs until the next."""
    gpu: GpuJSON | None
    vram: VramJSON | None
    processes: list[ProcessJSON]
    history: NotRequired[list[list[float | int | None]]]


class OtherGpuJSON(TypedDict):
    """A GPU the config gives no domain (``auto_domains = false``): not the engine's to
    schedule on, shown for its load and memory (and for jobs still running there since
    its domain was removed)."""

    gpu_index: int
    gpu_uuid: str | None
    jobs: list[int]
    gpu: GpuJSON | None
    processes: list[ProcessJSON]
    history: NotRequired[list[list[float | int | None]]]
    missing: NotRequired[bool]
    """True for a GPU jobs still run on that the driver no longer lists (``gpu`` is None)."""
    name: NotRequired[str]
    """A missing GPU's last domain's name."""


class MissingGpuJSON(TypedDict):
    """A GPU that had a domain here and that the driver no longer lists."""

    name: str
    """Its last domain's name."""
    gpu_uuid: str


class GpusJSON(TypedDict):
    """``GET /v1/gpus`` and the data of ``gpu.sample`` events."""

    backend: str
    capacity: str
    message: str | None
    driver_version: str | None
    taken_at: float | None
    probe_seconds: float | None
    unregistered_total: int
    domains: list[DomainViewJSON]
    gpus_without_domain: NotRequired[list[OtherGpuJSON]]
    """GPUs the engine sees but the config gives no domain (an older engine leaves it out)."""
    missing_gpus: NotRequired[list[MissingGpuJSON]]
    """GPUs that had a domain here and that the driver did not list at the engine's start
    (capacity that may come back: jobs needing them wait) until forgotten."""
    clusters: NotRequired[list[dict[str, Any]]]
    """Each ``[clusters.NAME]`` (issue 16): partition, nodes, GPUs total/allocated/idle,
    whether it answers."""


class HealthJSON(TypedDict):
    """``GET /v1/health``."""

    engine: str
    version: str
    pid: int
    state_dir: str
    config_file: str
    backend: str
    capacity: str
    capacity_message: str
    no_gpu_notice: str | None
    started_at: float
    uptime: float
    active_jobs: int
    store_failure: str | None
    launcher_problem: NotRequired[str | None]
    """Why no launcher answers (jobs decided to start wait for it); ``None`` while one does."""
    paused_at: NotRequired[float | None]
    """When the queue was paused (``gpulayer-tui pause``); ``None`` while it runs."""
    running_jobs: NotRequired[int]
    """Jobs running now (of ``active_jobs``)."""
    waiting_jobs: NotRequired[int]
    """Jobs pending or queued now (of ``active_jobs``): a TUI that loaded only part of
    them counts these (its dashboard said "10000 queued" of 20,000: tester h104)."""


class UserJSON(TypedDict):
    """One user in ``GET /v1/users``: fair-share figures, what runs and waits, the limits
    (``None``: no limit)."""

    user: str
    """The user's name (the uid as a number where it has none)."""
    uid: int
    gpu_hours: float
    """GPU-hours used recently (halved every ``[scheduling] fairshare_half_life``), plus
    what its running jobs have used so far."""
    share: float
    fair_usage: float
    """``gpu_hours / share``: what orders users (least first)."""
    running_jobs: int
    running_gpus: int
    running_vram_gb: float
    waiting: int
    max_gpus: int | None
    max_vram_gb: float | None
    max_queued: int | None
    max_priority: int | None


class UsersJSON(TypedDict):
    """``GET /v1/users``: every user with recent use, running or waiting jobs, in
    fair-share order (the order jobs of equal priority start in)."""

    users: list[UserJSON]


class EventJSON(TypedDict):
    """One event on ``GET /v1/events`` (one JSON object per line)."""

    seq: int
    at: float
    kind: str
    job_id: int | None
    data: dict[str, Any]
    job: NotRequired[JobRowJSON]


class ProcessInfoJSON(TypedDict):
    """``GET /v1/processes/PID``: what the engine sees of a process (to adopt it)."""

    pid: int
    start_ticks: int
    uid: int
    user: str
    command: str
    started_at: float
    name: NotRequired[str]  # the job name its adoption gets when none is given (older: absent)
    gpus: NotRequired[list[int]]  # GPUs it holds memory on, in the latest sample
    used_bytes: NotRequired[int]  # that memory, in all
    most_on_a_gpu: NotRequired[int]  # the most of it on one GPU
    refused: NotRequired[str]  # why it can never be adopted (a job's already, ...)


class ErrorJSON(TypedDict):
    """Every error answer; ``field`` names the input at fault, when there is one."""

    error: str
    field: NotRequired[str]


class AdoptRequest(TypedDict):
    """A validated adopt request (see :func:`parse_adopt_request`)."""

    pid: int
    start_ticks: int | None
    name: str | None
    vram_gb: float | None
    gpu: bool
    domain: list[str]
