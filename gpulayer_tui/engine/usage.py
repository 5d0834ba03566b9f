"""What each job used: per-GPU series, a summary, right-sizing advice, idle warnings.

The sampler already reads every GPU each tick; :class:`UsageRecorder` turns those readings
into per-job figures without another NVML call. Each tick, for every GPU domain, each job
holding the domain gets one observation: the VRAM its processes hold there (the domain's
account), the GPU's utilisation, memory-bandwidth utilisation and power, and the energy
the GPU took since the last tick (the driver's total-energy counter where it has one,
power x time otherwise, marked estimated). Utilisation and energy are the GPU's, not a
process's: when several jobs share a GPU, energy is split between them and the summary
says ``shared``.

Each job's series is bounded (:class:`GpuSeries`: at most ``[usage] max_points`` points
per GPU; when full, neighbours merge and the step doubles), kept in memory while the job
runs, written to SQLite every ``save_interval`` seconds and when the job ends, and pruned
with the job's history.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..wire import RowUsageJSON, UsageJSON, UsageSeriesJSON, UsageSummaryJSON
from .config import PolicySettings, UsageSettings
from .domain import Domain
from .gpus import GIB

MIB = 1024**2
# One reading never stands for more than this (a sampler stalled for longer, or an engine
# that was down, must not be booked as minutes of use at the last reading's values).
MAX_TICK_SECONDS = 300.0
# Advice needs a few readings: a job seen once says little about what it needs.
MIN_SAMPLES_FOR_ADVICE = 3
# Declared VRAM is "far above" what was held when it is at least this many times the
# suggestion and at least this much more (small jobs are not worth a remark).
OVER_FACTOR = 2.0
OVER_MARGIN = 2 * GIB
HEADROOM = 1.15  # the suggestion: the peak plus this share, rounded up to half a GiB


def suggest_vram_gb(peak_bytes: int) -> float:
    """The ``vram_gb`` to declare for a job whose processes held at most ``peak_bytes``
    on one GPU: the peak plus 15 %, rounded up to half a GiB."""
    return max(0.5, math.ceil(peak_bytes * HEADROOM / GIB * 2) / 2)


def _gb(value: float) -> str:
    text = f"{value / GIB:.1f}"
    return text[:-2] if text.endswith(".0") else text


class GpuSeries:
    """One job's readings on one GPU over time, in at most ``max_points`` points.

    Points are buckets of ``step`` seconds (the first ones one tick each): the VRAM is the
    bucket's peak (so a spike is never averaged away), the rest its mean. When the series
    is full, neighbouring points merge and the step doubles, so a week-long job keeps the
    same number of points as an hour-long one, each covering more time.
    """

    __slots__ = ("_open", "gpu", "max_points", "mem", "power", "step", "t", "t0", "util", "vram")

    def __init__(self, gpu: int, t0: float, max_points: int) -> None:
        self.gpu = gpu
        self.t0 = t0
        self.step = 0.0  # 0: one point per tick until the first merge
        self.max_points = max_points
        self.t: list[float] = []  # seconds since t0
        self.vram: list[int] = []  # MiB
        self.util: list[int | None] = []
        self.mem: list[int | None] = []
        self.power: list[float | None] = []
        # The bucket being filled: start, count, vram peak, sums and counts of the rest.
        self._open: list[Any] | None = None

    def add(
        self, at: float, vram: int, util: int | None, mem: int | None, power: float | None
    ) -> None:
        """One tick's reading (``vram`` in bytes)."""
        offset = at - self.t0
        bucket = self._open
        if bucket is not None and offset - bucket[0] >= self.step * 0.95:
            self._close()
            bucket = None
        if bucket is None:
            bucket = self._open = [offset, 0, 0, 0, 0, 0, 0, 0.0, 0]
        bucket[1] += 1
        bucket[2] = max(bucket[2], vram // MIB)
        if util is not None:
            bucket[3] += util
            bucket[4] += 1
        if mem is not None:
            bucket[5] += mem
            bucket[6] += 1
        if power is not None:
            bucket[7] += power
            bucket[8] += 1

    def _close(self) -> None:
        bucket = self._open
        self._open = None
        if bucket is None:
            return
        self._append(bucket)
        if len(self.t) > self.max_points:
            self._halve()

    def _append(self, bucket: list[Any]) -> None:
        self.t.append(round(bucket[0], 1))
        self.vram.append(bucket[2])
        self.util.append(round(bucket[3] / bucket[4]) if bucket[4] else None)
        self.mem.append(round(bucket[5] / bucket[6]) if bucket[6] else None)
        self.power.append(round(bucket[7] / bucket[8], 1) if bucket[8] else None)

    def _halve(self) -> None:
        span = self.t[-1] - self.t[0]
        self.step = max(self.step * 2, 2 * span / max(1, len(self.t) - 1))
        # Pairs (an odd last point stays alone): the first's time, the peak VRAM, means.
        pairs = [(i, min(i + 1, len(self.t) - 1)) for i in range(0, len(self.t), 2)]
        self.t = [self.t[i] for i, _ in pairs]
        self.vram = [max(self.vram[i], self.vram[j]) for i, j in pairs]
        self.util = [
            self.util[i] if i == j else _mean2(self.util[i], self.util[j]) for i, j in pairs
        ]
        self.mem = [self.mem[i] if i == j else _mean2(self.mem[i], self.mem[j]) for i, j in pairs]
        power = [
            self.power[i] if i == j else _mean2(self.power[i], self.power[j]) for i, j in pairs
        ]
        self.power = [None if p is None else round(p, 1) for p in power]

    def to_json(self) -> UsageSeriesJSON:
        """The series, with the bucket being filled as its last point."""
        out: UsageSeriesJSON = {
            "gpu": self.gpu,
            "t0": round(self.t0, 3),
            "step": round(self.step, 3),
            "t": list(self.t),
            "vram_mib": list(self.vram),
            "util": list(self.util),
            "mem_util": list(self.mem),
            "power_w": list(self.power),
        }
        if self._open is not None:
            tail = GpuSeries(self.gpu, self.t0, self.max_points)
            tail._append(self._open)
            out["t"].append(tail.t[0])
            out["vram_mib"].append(tail.vram[0])
            out["util"].append(tail.util[0])
            out["mem_util"].append(tail.mem[0])
            out["power_w"].append(tail.power[0])
        return out

    @classmethod
    def from_json(cls, data: UsageSeriesJSON, max_points: int) -> GpuSeries:
        """A stored series, to go on with after an engine restart."""
        series = cls(int(data["gpu"]), float(data["t0"]), max_points)
        series.step = float(data.get("step") or 0.0)
        series.t = [float(v) for v in data.get("t", [])]
        series.vram = [int(v) for v in data.get("vram_mib", [])]
        series.util = list(data.get("util", []))
        series.mem = list(data.get("mem_util", []))
        series.power = list(data.get("power_w", []))
        return series


def _mean2(a: float | None, b: float | None) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return round((a + b) / 2) if isinstance(a, int) and isinstance(b, int) else (a + b) / 2


@dataclass(slots=True)
class _GpuClock:
    """What the last tick saw of one GPU: when, and its energy counter."""

    at: float
    energy_mj: int | None


class JobUsage:
    """One job's running totals and series (all GPUs it held)."""

    def __init__(self, job_id: int, declared_vram: int | None, max_points: int) -> None:
        self.job_id = job_id
        self.declared_vram = declared_vram
        self.max_points = max_points
        self.series: dict[int, GpuSeries] = {}
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.samples = 0
        self.gpu_seconds = 0.0
        self.vram_peak = 0
        self.vram_byte_seconds = 0.0
        self.util_weighted = 0.0
        self.util_seconds = 0.0
        self.util_histogram = [0] * 101
        self.mem_weighted = 0.0
        self.mem_seconds = 0.0
        self.energy_j = 0.0
        self.estimated = False
        self.idle_seconds = 0.0
        self.shared = False
        self.idle_streak = 0.0
        self.idle_warning: str | None = None
        self.saved_at = 0.0

    def observe(
        self,
        at: float,
        seconds: float,
        gpu: int,
        vram: int,
        util: int | None,
        mem: int | None,
        power: float | None,
        energy_j: float,
        estimated: bool,
        idle_below: int,
    ) -> None:
        """One GPU's reading for this job, standing for the last ``seconds``."""
        if self.first_at is None:
            self.first_at = at
        self.last_at = at
        series = self.series.get(gpu)
        if series is None:
            series = self.series[gpu] = GpuSeries(gpu, at, self.max_points)
        series.add(at, vram, util, mem, power)
        self.vram_peak = max(self.vram_peak, vram)
        self.gpu_seconds += seconds
        self.vram_byte_seconds += vram * seconds
        if util is not None:
            self.util_histogram[max(0, min(100, util))] += 1
            self.util_weighted += util * seconds
            self.util_seconds += seconds
            if util < idle_below:
                self.idle_seconds += seconds
        if mem is not None:
            self.mem_weighted += mem * seconds
            self.mem_seconds += seconds
        self.energy_j += energy_j
        self.estimated = self.estimated or estimated

    def _p95(self) -> int | None:
        total = sum(self.util_histogram)
        if not total:
            return None
        rank = math.ceil(0.95 * total)
        seen = 0
        for value, count in enumerate(self.util_histogram):
            seen += count
            if seen >= rank:
                return value
        return 100  # pragma: no cover - the loop always reaches rank

    def advice(self) -> tuple[float | None, str | None]:
        """``(suggested vram_gb, advice)`` from the peak and what was declared."""
        if self.samples < MIN_SAMPLES_FOR_ADVICE or self.vram_peak <= 0:
            return None, None
        peak = self.vram_peak
        suggestion = suggest_vram_gb(peak)
        declared = self.declared_vram
        if declared is None:
            return suggestion, (
                f"held at most {_gb(peak)} GiB per GPU; declare vram_gb = {suggestion:g} so it "
                "can share a GPU"
            )
        if peak > declared * 1.05:
            return suggestion, (
                f"held up to {_gb(peak)} GiB per GPU, more than the {_gb(declared)} GiB "
                f"declared; declare vram_gb = {suggestion:g} so the scheduler reserves it"
            )
        if declared >= suggestion * GIB * OVER_FACTOR and declared - peak >= OVER_MARGIN:
            return suggestion, (
                f"declared {_gb(declared)} GiB per GPU but held at most {_gb(peak)} GiB; "
                f"vram_gb = {suggestion:g} would do and leave the rest to others"
            )
        return None, None

    def summary(self) -> UsageSummaryJSON:
        """The figures every finished job shows (and a running one, so far)."""
        suggestion, advice = self.advice()
        gpu_s = self.gpu_seconds
        out: UsageSummaryJSON = {
            "gpus": sorted(self.series),
            "samples": self.samples,
            "seconds": round((self.last_at or 0) - (self.first_at or 0), 1),
            "gpu_hours": round(gpu_s / 3600, 4),
            "peak_vram": self.vram_peak,
            "mean_vram": int(self.vram_byte_seconds / gpu_s) if gpu_s else self.vram_peak,
            "util_mean": (
                round(self.util_weighted / self.util_seconds, 1) if self.util_seconds else None
            ),
            "util_p95": self._p95(),
            "mem_util_mean": (
                round(self.mem_weighted / self.mem_seconds, 1) if self.mem_seconds else None
            ),
            "energy_wh": round(self.energy_j / 3600, 3),
            "energy_estimated": self.estimated,
            "idle_share": round(self.idle_seconds / self.util_seconds, 3)
            if self.util_seconds
            else None,
            "shared": self.shared,
            "declared_vram": self.declared_vram,
            "suggest_vram_gb": suggestion,
            "advice": advice,
            "idle_warning": self.idle_warning,
        }
        return out

    def row(self) -> RowUsageJSON:
        """The figures a jobs table shows (a row's ``use``)."""
        return {
            "peak_vram": self.vram_peak,
            "util_mean": (
                round(self.util_weighted / self.util_seconds, 1) if self.util_seconds else None
            ),
            "energy_wh": round(self.energy_j / 3600, 3),
        }

    def to_json(self) -> UsageJSON:
        """Summary plus every GPU's series, as stored and as the API answers."""
        return {
            "job": self.job_id,
            "summary": self.summary(),
            "series": [self.series[g].to_json() for g in sorted(self.series)],
            "totals": {
                "samples": self.samples,
                "first_at": self.first_at,
                "last_at": self.last_at,
                "gpu_seconds": self.gpu_seconds,
                "vram_byte_seconds": self.vram_byte_seconds,
                "util_weighted": self.util_weighted,
                "util_seconds": self.util_seconds,
                "util_histogram": list(self.util_histogram),
                "mem_weighted": self.mem_weighted,
                "mem_seconds": self.mem_seconds,
                "energy_j": self.energy_j,
                "idle_seconds": self.idle_seconds,
            },
        }

    @classmethod
    def from_json(cls, data: UsageJSON, max_points: int) -> JobUsage:
        """A stored record, to go on with after an engine restart."""
        summary = data["summary"]
        assert summary is not None  # (only records with a summary are stored)
        usage = cls(data["job"], summary.get("declared_vram"), max_points)
        totals = data.get("totals") or {}
        usage.samples = int(totals.get("samples", summary.get("samples", 0)))
        usage.first_at = totals.get("first_at")
        usage.last_at = totals.get("last_at")
        usage.gpu_seconds = float(totals.get("gpu_seconds", 0.0))
        usage.vram_peak = int(summary.get("peak_vram", 0))
        usage.vram_byte_seconds = float(totals.get("vram_byte_seconds", 0.0))
        usage.util_weighted = float(totals.get("util_weighted", 0.0))
        usage.util_seconds = float(totals.get("util_seconds", 0.0))
        histogram = list(totals.get("util_histogram") or [])
        if len(histogram) == 101:
            usage.util_histogram = [int(v) for v in histogram]
        usage.mem_weighted = float(totals.get("mem_weighted", 0.0))
        usage.mem_seconds = float(totals.get("mem_seconds", 0.0))
        usage.energy_j = float(totals.get("energy_j", 0.0))
        usage.estimated = bool(summary.get("energy_estimated", False))
        usage.idle_seconds = float(totals.get("idle_seconds", 0.0))
        usage.shared = bool(summary.get("shared", False))
        usage.idle_warning = summary.get("idle_warning")
        usage.series = {int(s["gpu"]): GpuSeries.from_json(s, max_points) for s in data["series"]}
        return usage


# (job id) -> (started_at, declared VRAM per GPU in bytes), or None for a job not running.
JobFacts = Callable[[int], tuple[float | None, int | None] | None]
# (job id, warning, stop it) -> None
IdleWarn = Callable[[int, str, bool], None]
# (job id, record) -> None: queue the record for the next commit
SaveUsage = Callable[[int, UsageJSON], None]


class UsageRecorder:
    """Per-job usage from each tick's readings (see the module docstring)."""

    def __init__(
        self,
        settings: UsageSettings,
        policy: PolicySettings,
        facts: JobFacts,
        save: SaveUsage,
        warn: IdleWarn,
    ) -> None:
        self._settings = settings
        self._policy = policy
        self._facts = facts
        self._save = save
        self._warn = warn
        self._jobs: dict[int, JobUsage] = {}
        self._clocks: dict[int, _GpuClock] = {}

    def reconfigure(self, settings: UsageSettings, policy: PolicySettings) -> None:
        """A reloaded ``[usage]`` / ``[policy]``."""
        self._settings = settings
        self._policy = policy
        if not settings.series:
            self._jobs.clear()

    def restore(self, records: Iterable[UsageJSON]) -> None:
        """Running jobs' records from before a restart: their series go on."""
        for record in records:
            usage = JobUsage.from_json(record, self._settings.max_points)
            self._jobs[usage.job_id] = usage

    def live(self, job_id: int) -> JobUsage | None:
        """The record of a job being observed now, if any."""
        return self._jobs.get(job_id)

    def running(self) -> list[JobUsage]:
        """Every job being observed now."""
        return list(self._jobs.values())

    def observe(self, at: float, domains: Iterable[Domain]) -> None:
        """Book one tick (read at ``at``): every job holding a GPU domain gets that GPU's
        reading."""
        if not self._settings.series:
            return
        idle_below = self._policy.idle_below
        seen: dict[int, bool] = {}  # job id -> every GPU it holds was idle this tick
        longest: dict[int, float] = {}
        for domain in domains:
            reading = domain.reading
            if domain.gpu_index is None or reading is None or not domain.holdings:
                continue
            account = domain.account
            clock = self._clocks.get(reading.index)
            self._clocks[reading.index] = _GpuClock(at, reading.energy_mj)
            tick = 0.0 if clock is None else min(MAX_TICK_SECONDS, max(0.0, at - clock.at))
            counter_j: float | None = None
            if (
                clock is not None
                and clock.energy_mj is not None
                and reading.energy_mj is not None
                and reading.energy_mj >= clock.energy_mj
            ):
                counter_j = (reading.energy_mj - clock.energy_mj) / 1000.0
            holders = list(domain.holdings)
            shared = len(holders) > 1
            for job_id in holders:
                facts = self._facts(job_id)
                if facts is None:
                    continue
                started_at, declared = facts
                usage = self._jobs.get(job_id)
                if usage is None:
                    usage = self._jobs[job_id] = JobUsage(
                        job_id, declared, self._settings.max_points
                    )
                seconds = tick
                if started_at is not None:
                    seconds = min(seconds, max(0.0, at - started_at))
                if counter_j is not None:
                    energy, estimated = counter_j * (seconds / tick if tick else 0.0), False
                elif seconds > 0:  # no counter on this GPU (or it went back): power x time
                    energy, estimated = (reading.power_watts or 0.0) * seconds, True
                else:  # its first reading: no time behind it yet
                    energy, estimated = 0.0, False
                held = account.held_by_job.get(job_id, 0) if account is not None else 0
                usage.shared = usage.shared or shared
                usage.observe(
                    at,
                    seconds,
                    reading.index,
                    held,
                    reading.utilization,
                    reading.memory_utilization,
                    reading.power_watts,
                    energy / len(holders),
                    estimated,
                    idle_below,
                )
                idle = reading.utilization is not None and reading.utilization < idle_below
                seen[job_id] = seen.get(job_id, True) and idle
                longest[job_id] = max(longest.get(job_id, 0.0), seconds)
        now_saved: list[JobUsage] = []
        for job_id, idle in seen.items():
            usage = self._jobs[job_id]
            usage.samples += 1
            self._idle(usage, idle, longest[job_id])
            if usage.last_at is not None and usage.last_at - usage.saved_at >= (
                self._settings.save_interval
            ):
                now_saved.append(usage)
        for usage in now_saved:
            self._store(usage)

    def _idle(self, usage: JobUsage, idle: bool, seconds: float) -> None:
        usage.idle_streak = usage.idle_streak + seconds if idle else 0.0
        after = self._policy.idle_after
        if after is None or usage.idle_warning is not None or usage.idle_streak < after:
            return
        stop = self._policy.idle_action == "stop"
        usage.idle_warning = (
            f"idle: its GPUs were under {self._policy.idle_below}% utilisation for "
            f"{_duration(usage.idle_streak)} ([policy] idle_after = {after:g} s)"
        )
        self._warn(usage.job_id, usage.idle_warning, stop)

    def idle_now(self, job_id: int) -> bool:
        """True while a warned job is still idle (the dashboard's count)."""
        usage = self._jobs.get(job_id)
        return bool(usage and usage.idle_warning and usage.idle_streak > 0)

    def _store(self, usage: JobUsage) -> None:
        usage.saved_at = usage.last_at or 0.0
        self._save(usage.job_id, usage.to_json())

    def save_all(self) -> None:
        """Queue every running job's record (the engine is stopping; its jobs go on)."""
        for usage in self._jobs.values():
            self._store(usage)

    def job_ended(self, job_id: int) -> None:
        """The job ended: its record is written one last time and forgotten here."""
        usage = self._jobs.pop(job_id, None)
        if usage is not None:
            self._save(job_id, usage.to_json())


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"
