"""``GET /metrics``: Prometheus text format, machine-wide series plus per-domain ones.

Each scrape builds its families from the engine's current state (nothing is kept between
scrapes but the counters the engine already has), rendered by prometheus_client so the
output is valid exposition format. Per-domain series carry a ``domain`` label (record
002: ``..._domain_...{domain="gpu1"}``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .domain import DomainHealth, DomainState
from .models import JobStatus, ReplicaState

if TYPE_CHECKING:
    from .engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
VRAM_KINDS = ("total", "used", "owned", "reserved", "unregistered", "unattributed", "free")
# (``reserved``: declared by jobs beyond what they use; without it the kinds did not add up
# to ``total``)
_ACCOUNT_FIELD = {"reserved": "reserved_extra"}


class _Snapshot(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return iter(self.families)


def _families(engine: Engine, jobs_by_status: dict[str, int]) -> Iterator[Metric]:
    domains = list(engine.scheduler.domains.values())
    ready, _ = engine.domain_ops.readiness()
    yield GaugeMetricFamily("gpulayer_ready", "1 when every domain is ready", value=int(ready))

    free = engine.disk.free_mb()
    if free is not None:  # (a monitor could not see the floor holding every new job: h63)
        yield GaugeMetricFamily(
            "gpulayer_state_dir_free_bytes",
            "Free space where the engine keeps its state and logs (new jobs wait below "
            "[logs] min_free_mb)",
            value=free * 1024**2,
        )
        yield GaugeMetricFamily(
            "gpulayer_state_dir_floor_bytes",
            "[logs] min_free_mb, in bytes",
            value=engine.disk.min_free_mb * 1024**2,
        )

    # (a paused queue showed nowhere a monitor looks: only in `gpulayer-tui pause`'s
    # answer and the TUI's header: tester h153)
    yield GaugeMetricFamily(
        "gpulayer_queue_paused",
        "1 while the queue is paused (gpulayer-tui pause): no waiting job starts",
        value=int(engine.paused_at is not None),
    )
    if engine.paused_at is not None:
        yield GaugeMetricFamily(
            "gpulayer_queue_paused_since_seconds",
            "When the queue was paused (Unix time)",
            value=engine.paused_at,
        )

    # (failing deliveries showed only in the engine's log: tester h153)
    notifier = engine.notifier
    notes = CounterMetricFamily(
        "gpulayer_notifications",
        "[notify] deliveries since the engine started, by how they went",
        labels=["result"],
    )
    for result in ("sent", "failed", "dropped"):
        notes.add_metric([result], getattr(notifier, result))
    yield notes

    jobs = GaugeMetricFamily(
        "gpulayer_jobs", "Jobs by status (history included)", labels=["status"]
    )
    for status in JobStatus:
        jobs.add_metric([status.value], jobs_by_status.get(status.value, 0))
    yield jobs

    slots_total = GaugeMetricFamily("gpulayer_slots", "Slots of all domains", labels=["kind"])
    slots_total.add_metric(["total"], sum(d.slots for d in domains))
    slots_total.add_metric(["used"], sum(min(d.used_slots, d.slots) for d in domains))
    yield slots_total

    vram = GaugeMetricFamily("gpulayer_vram_bytes", "GPU memory, all GPUs", labels=["kind"])
    dvram = GaugeMetricFamily(
        "gpulayer_domain_vram_bytes", "GPU memory per domain", labels=["domain", "kind"]
    )
    for kind in VRAM_KINDS:
        total = 0
        for dom in domains:
            if dom.account is None:
                continue
            value = getattr(dom.account, _ACCOUNT_FIELD.get(kind, kind))
            total += value
            dvram.add_metric([dom.name, kind], value)
        vram.add_metric([kind], total)
    yield vram
    yield dvram

    dslots = GaugeMetricFamily(
        "gpulayer_domain_slots", "Slots per domain", labels=["domain", "kind"]
    )
    util = GaugeMetricFamily(
        "gpulayer_domain_utilization_percent", "GPU utilization per domain", labels=["domain"]
    )
    state = GaugeMetricFamily(
        "gpulayer_domain_state",
        "1 for the domain's current service state",
        labels=["domain", "state"],
    )
    health = GaugeMetricFamily(
        "gpulayer_domain_health", "1 for the domain's current health", labels=["domain", "health"]
    )
    failures = GaugeMetricFamily(
        "gpulayer_domain_read_failures",
        "Consecutive failed reads of the domain's GPU",
        labels=["domain"],
    )
    quarantines = CounterMetricFamily(
        "gpulayer_domain_quarantines", "Quarantines in this engine run", labels=["domain"]
    )
    for dom in domains:
        dslots.add_metric([dom.name, "total"], dom.slots)
        dslots.add_metric([dom.name, "used"], dom.used_slots)
        if dom.reading is not None and dom.reading.utilization is not None:
            util.add_metric([dom.name], dom.reading.utilization)
        for value in DomainState:
            state.add_metric([dom.name, value.value], int(dom.state is value))
        for hvalue in DomainHealth:
            health.add_metric([dom.name, hvalue.value], int(dom.health is hvalue))
        failures.add_metric([dom.name], dom.failures)
        quarantines.add_metric([dom.name], dom.quarantines)
    yield from (dslots, util, state, health, failures, quarantines)

    yield from _service_families(engine)
    yield from _usage_families(engine)

    sampler = engine.sampler
    reads = CounterMetricFamily("gpulayer_probe_reads", "Completed GPU probe reads")
    reads.add_metric([], sampler.reads)
    yield reads
    seconds = CounterMetricFamily(
        "gpulayer_probe_read_seconds", "Total time spent in GPU probe reads (NVML latency)"
    )
    seconds.add_metric([], sampler.read_seconds)
    yield seconds
    timeouts = CounterMetricFamily("gpulayer_probe_timeouts", "GPU probe reads past the deadline")
    timeouts.add_metric([], sampler.timeouts)
    yield timeouts
    last = GaugeMetricFamily("gpulayer_probe_last_read_seconds", "Duration of the latest read")
    last.add_metric([], sampler.latest.duration if sampler.latest else 0.0)
    yield last


def _service_families(engine: Engine) -> Iterator[Metric]:
    """Replicas of running services by state, and their restarts (record 000)."""
    replicas = GaugeMetricFamily(
        "gpulayer_service_replicas",
        "Replicas of active services by state",
        labels=["service", "state"],
    )
    restarts = CounterMetricFamily(
        "gpulayer_service_restarts", "Replica restarts of active services", labels=["service"]
    )
    for job in engine.services.active():
        label = f"{job.id}:{job.name}"
        for value in ReplicaState:
            count = sum(r.state is value for r in job.replicas)
            replicas.add_metric([label, value.value], count)
        # (and those of replicas a scale-down removed: a counter never goes back: h116)
        gone = sum(counts[1] for counts in job.removed_replicas.values())
        restarts.add_metric([label], sum(r.restarts for r in job.replicas) + gone)
    yield from (replicas, restarts)


def _usage_families(engine: Engine) -> Iterator[Metric]:
    """What each running GPU job uses (issue 17). Labels are bounded: running jobs only,
    as ``job_id="ID", job_name="NAME"`` (finished jobs' figures are in their history, not
    here). Not ``job``: Prometheus sets that label on every series it scrapes, to the
    scrape job's name, and renamed ours ``exported_job`` (tester h153)."""
    labels = ["job_id", "job_name"]
    gpu_seconds = CounterMetricFamily(
        "gpulayer_job_gpu_seconds", "GPU-seconds held by a running job", labels=labels
    )
    energy = CounterMetricFamily(
        "gpulayer_job_energy_joules",
        "Energy of the GPUs a running job holds (split between jobs sharing a GPU)",
        labels=labels,
    )
    idle = CounterMetricFamily(
        "gpulayer_job_idle_seconds",
        "GPU-seconds a running job held its GPUs under [policy] idle_below percent",
        labels=labels,
    )
    vram = GaugeMetricFamily(
        "gpulayer_job_vram_peak_bytes", "Peak VRAM on one GPU of a running job", labels=labels
    )
    warned = GaugeMetricFamily(
        "gpulayer_jobs_idle", "Running jobs warned as idle that are still idle"
    )
    idle_now = 0
    for usage in engine.usage.running():
        act = engine.book.live(usage.job_id)
        if act is None:
            continue
        label = [str(usage.job_id), act.job.name]
        gpu_seconds.add_metric(label, usage.gpu_seconds)
        if not usage.gaps_unpriced:
            # (until its time unobserved is priced, its energy reads low: left out, not
            # a counter that goes back, which Prometheus takes for a reset: h113)
            energy.add_metric(label, usage.energy_j)
        idle.add_metric(label, usage.idle_seconds)
        vram.add_metric(label, usage.vram_peak)
        idle_now += engine.usage.idle_now(usage.job_id)
    warned.add_metric([], idle_now)
    yield from (gpu_seconds, energy, idle, vram, warned)


async def render(engine: Engine) -> bytes:
    """The whole exposition, as bytes."""
    jobs_by_status = await engine.store.count_by_status()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(list(_families(engine, jobs_by_status))))
    return generate_latest(registry)
