"""What each job used: per-GPU series, a summary, right-sizing advice, idle warnings.

The sampler already reads every GPU each tick; :class:`UsageRecorder` turns those readings
into per-job figures without another NVML call. Each tick, for every GPU domain, each job
holding the domain gets one observation: the VRAM its processes hold there (the domain's
account), the GPU's utilisation, memory-bandwidth utilisation and power, and the energy
the GPU took since the last tick (the driver's total-energy counter where it has one,
power x time otherwise, marked estimated). Utilisation and energy are the GPU's, not a
process's: when several jobs share a GPU, energy is split between them and the summary
says ``shared``. Reading the energy counter is costly on some GPUs, so the probe reads it
every few seconds: between reads energy is booked as power x time, and each read corrects
the window it closes to what the counter says (see :meth:`UsageRecorder._counter_read`).

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
        """One reading (``vram`` in bytes)."""
        offset = at - self.t0
        if not self.step:  # each reading its own point (until the first merge): no bucket
            self.t.append(round(offset, 1))
            self.vram.append(vram // MIB)
            self.util.append(util)
            self.mem.append(mem)
            self.power.append(None if power is None else round(power, 1))
            if len(self.t) > self.max_points:
                self._halve()
            return
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


_SCALARS = (
    "ticks",
    "seconds",
    "util_weighted",
    "util_seconds",
    "mem_weighted",
    "mem_seconds",
    "idle_seconds",
    "energy_j",
    "estimated_ticks",
    "shared_ticks",
)


_ENERGY = _SCALARS.index("energy_j")  # (where a snapshot keeps energy per holder)


class GpuTotals:
    """One GPU's running sums since the engine began watching it (all monotonic).

    A job's share of any of them is the difference between now and when it was first
    seen on the GPU, so a tick costs the same with 1 job or 50: per-job work happens only
    when a job appears, leaves, or its VRAM changes (and once per series point).
    """

    __slots__ = (
        *_SCALARS,
        "at",
        "booked_until",
        "counter_at",
        "counter_mj",
        "energy_per_holder_j",
        "factor",
        "held",
        "histogram",
        "idle_since",
        "members",
        "mem",
        "power",
        "util",
        "window_booked_per_holder",
        "window_est",
        "window_mark",
        "window_est_per_holder",
    )

    def __init__(self) -> None:
        self.ticks = 0
        self.seconds = 0.0
        self.util_weighted = 0.0
        self.util_seconds = 0.0
        self.mem_weighted = 0.0
        self.mem_seconds = 0.0
        self.idle_seconds = 0.0
        self.energy_j = 0.0  # (unused: energy is kept per holder, below)
        self.estimated_ticks = 0
        self.shared_ticks = 0
        self.energy_per_holder_j = 0.0
        self.histogram = [0] * 101
        self.at: float | None = None
        # The end of the last interval booked to its holders (a tick with none is not):
        # a job's VRAM-seconds end there too, as its GPU-seconds do (a job that left
        # between two ticks was booked VRAM for the last one and not its seconds: its
        # mean VRAM came out above its peak).
        self.booked_until: float | None = None
        self.counter_mj: int | None = None
        self.counter_at: float | None = None
        self.factor = 1.0  # counter / (power x time) over the last window
        # Since the last counter read: power x time (all of it, and per holder), and what
        # was booked per holder.
        self.window_est = 0.0
        self.window_est_per_holder = 0.0
        self.window_booked_per_holder = 0.0
        self.window_mark = 0.0  # energy_per_holder_j when the window began
        self.held: dict[int, int] = {}
        self.members: set[int] = set()
        self.idle_since: float | None = None
        self.util: int | None = None
        self.mem: int | None = None
        self.power: float | None = None

    def snapshot(self) -> tuple[float, ...]:
        """The sums now (a job's base), energy per holder in place of ``energy_j``."""
        return (
            self.ticks,
            self.seconds,
            self.util_weighted,
            self.util_seconds,
            self.mem_weighted,
            self.mem_seconds,
            self.idle_seconds,
            self.energy_per_holder_j,
            self.estimated_ticks,
            self.shared_ticks,
        )


@dataclass(slots=True)
class _OnGpu:
    """A job on one GPU: the GPU's sums when the job was first seen there, and its VRAM."""

    totals: GpuTotals
    base: tuple[float, ...]
    base_histogram: list[int]
    held: int = 0
    since: float = 0.0  # when ``held`` began
    window_peak: int = 0  # the peak read since the last series point
    point_ticks: float = 0  # the GPU's tick count at the last series point


class JobUsage:
    """One job's usage: what it carried over from before a restart plus, for each GPU it
    holds, the GPU's sums since it was first seen there; its VRAM and its series."""

    def __init__(self, job_id: int, declared_vram: int | None, max_points: int) -> None:
        self.job_id = job_id
        self.declared_vram = declared_vram
        self.max_points = max_points
        self.series: dict[int, GpuSeries] = {}
        self.on: dict[int, _OnGpu] = {}  # by GPU index, while it holds the GPU
        self.carried = dict.fromkeys(_SCALARS, 0.0)  # before a restart, or GPUs it left
        self.carried_histogram = [0] * 101
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.vram_peak = 0
        self.vram_byte_seconds = 0.0
        self.idle_warning: str | None = None
        self.saved_at = 0.0
        # Taken back after a restart: from when nothing observed it (its last tick), and
        # the GPUs whose unobserved time is booked already. The GPUs were held all along:
        # without it, GPU-hours left the engine's downtime out (a job's "0.007 GPU-hours"
        # for 30 s on 2 GPUs, beside the 60 GPU-seconds fair share booked).
        self.unobserved_from: float | None = None
        self._gap_booked: set[int] = set()
        # No record of it was taken back (it ran for less than a save's interval before
        # the engine was killed): every GPU it is first seen on was held since its start.
        self.gap_on_every_gpu = False
        # GPU-seconds of such gaps: held, but with no reading (left out of the mean VRAM,
        # as they are of the utilisation: counted as 0 GiB they lowered it at each restart).
        self.unobserved_seconds = 0.0
        # The part of those while no engine ran (or one ran that had lost its record): the
        # rest is the time before its first reading and after its last, which every job
        # has; said as "while no engine ran", it was said of every short job (tester h182).
        self.offline_seconds = 0.0
        # Gaps with no mean power to book their energy at (no record was taken back: it
        # was younger than a save's interval), by GPU: booked at the power of its first
        # readings there, estimated. Left out, its energy went back at an engine SIGKILL
        # (1.809 Wh read 0.226 after) while its GPU-seconds went on (tester h109).
        self._gap_unpriced: dict[int, float] = {}
        # One of its GPUs' domains takes more than one job (slots > 1): only there does a
        # declared vram_gb let it share a GPU ("so it can share a GPU" was said where every
        # domain had one slot: tester h67).
        self.shareable = False
        # GPUs it held that no reading saw it on (it ended between two): named anyway.
        self.unseen_gpus: set[int] = set()

    # -- what the recorder calls ---------------------------------------------------------

    def join(self, gpu: int, totals: GpuTotals, at: float, held: int) -> None:
        """First seen on ``gpu`` at ``at`` (its sums count from here; after a restart, the
        time it held the GPU unobserved is booked as held)."""
        if self.first_at is None:
            self.first_at = at
        gap_from = self.unobserved_from
        if (
            gap_from is not None
            and (gpu in self.series or self.gap_on_every_gpu)
            and gpu not in self._gap_booked
        ):
            self._gap_booked.add(gpu)
            gap = max(0.0, at - gap_from)
            held_before = self.carried["seconds"]
            if held_before > 0 and self.carried["energy_j"] > 0 and gap > 0:
                # Its energy meanwhile at its mean power so far, marked estimated: without
                # it the job's energy (and its /metrics counter) went back by what the last
                # engine had not saved, while its GPU-seconds went on (tester h63).
                self.carried["energy_j"] += self.carried["energy_j"] / held_before * gap
                self.carried["estimated_ticks"] += 1
            elif gap > 0:
                self._gap_unpriced[gpu] = self._gap_unpriced.get(gpu, 0.0) + gap
            self.carried["seconds"] += gap
            self.unobserved_seconds += gap
            self.offline_seconds += gap
        on = self.on[gpu] = _OnGpu(
            totals, totals.snapshot(), list(totals.histogram), held, at, held, totals.ticks
        )
        self.vram_peak = max(self.vram_peak, held)
        self._point(gpu, on, at)  # its first point now, not at the next series point

    def leave(self, gpu: int, at: float) -> None:
        """No longer on ``gpu``: what it used there is kept."""
        on = self.on.pop(gpu, None)
        if on is None:
            return
        # (its last time on a GPU: with none held, its span ended at 0, "-1.8e9 s")
        self.last_at = max(self.last_at or at, at)
        until = min(at, on.totals.booked_until or on.since)
        self.vram_byte_seconds += on.held * max(0.0, until - on.since)
        now = on.totals.snapshot()
        for i, key in enumerate(_SCALARS):
            # (ticks are the same ticks on each of its GPUs: counted once, from the last)
            if key != "ticks" or not self.on:
                self.carried[key] += now[i] - on.base[i]
        self.carried_histogram = [
            c + n - b
            for c, n, b in zip(
                self.carried_histogram, on.totals.histogram, on.base_histogram, strict=True
            )
        ]

    def held_now(self, gpu: int, at: float, held: int) -> None:
        """Its processes hold ``held`` bytes on ``gpu`` from ``at``."""
        on = self.on[gpu]
        if held == on.held:
            return
        self.vram_byte_seconds += on.held * max(0.0, at - on.since)
        if on.totals.ticks - 1 > on.point_ticks:  # a tick since the last point read the old
            on.window_peak = max(on.window_peak, on.held)
        on.held, on.since = held, at
        on.window_peak = max(on.window_peak, held)
        self.vram_peak = max(self.vram_peak, held)

    def point(self, at: float) -> None:
        """A series point for each GPU it holds: the VRAM peak since the last point, the
        GPU's latest utilisation, memory bandwidth and power."""
        series = self.series
        for gpu, on in self.on.items():
            totals = on.totals
            if on.point_ticks != totals.ticks and gpu in series:
                # (the common case, inline: this runs for every job at every point)
                held = on.held
                peak = on.window_peak
                series[gpu].add(
                    at, peak if peak > held else held, totals.util, totals.mem, totals.power
                )
                on.window_peak, on.point_ticks = 0, totals.ticks
            elif gpu not in series:
                self._point(gpu, on, at)

    def book_gap_until(self, now: float) -> None:
        """Book its unobserved time up to ``now`` on each GPU it held, its energy at its
        mean power so far (estimated), as :meth:`join` does when it is seen again: done
        as the engine starts, so that what it serves never reads less than before the
        restart (the saved record alone did, until the first sample: a Prometheus counter
        read that as a reset and counted the whole job's energy again: tester h113)."""
        gap_from = self.unobserved_from
        gpus = [gpu for gpu in self.series if gpu not in self._gap_booked]
        if gap_from is None or now <= gap_from or not gpus:
            return
        gap = (now - gap_from) * len(gpus)
        held_before, energy = self.carried["seconds"], self.carried["energy_j"]
        if held_before > 0 and energy > 0:
            self.carried["energy_j"] += energy / held_before * gap
            self.carried["estimated_ticks"] += 1
        self.carried["seconds"] += gap
        self.unobserved_seconds += gap
        self.offline_seconds += gap
        self.unobserved_from = now

    @property
    def gaps_unpriced(self) -> bool:
        """Whether an unobserved gap's energy waits for a reading (see :meth:`price_gaps`)."""
        return bool(self._gap_unpriced)

    def price_gaps(self) -> bool:
        """Book the energy of unobserved gaps with no mean power before them at the mean
        power read on that GPU since (estimated), once there is any (the recorder calls
        it each tick until it is done); True when none is left to book."""
        seconds = _SCALARS.index("seconds")
        for gpu, gap in list(self._gap_unpriced.items()):
            on = self.on.get(gpu)
            if on is None:
                continue  # (left before a reading: its gap stays unpriced)
            now = on.totals.snapshot()
            held = now[seconds] - on.base[seconds]
            energy = now[_ENERGY] - on.base[_ENERGY]
            if held > 0 and energy > 0:
                self.carried["energy_j"] += energy / held * gap
                self.carried["estimated_ticks"] += 1
                del self._gap_unpriced[gpu]
        return not self._gap_unpriced

    def _point(self, gpu: int, on: _OnGpu, at: float) -> None:
        series = self.series.get(gpu)
        if series is None:
            series = self.series[gpu] = GpuSeries(gpu, at, self.max_points)
        totals = on.totals
        series.add(at, max(on.window_peak, on.held), totals.util, totals.mem, totals.power)
        on.window_peak, on.point_ticks = 0, totals.ticks

    # -- figures ---------------------------------------------------------------------------

    def totals(self) -> dict[str, float]:
        """Every sum: what was carried plus each GPU's difference since the job came."""
        out = dict(self.carried)
        ticks = 0.0
        for on in self.on.values():
            now = on.totals.snapshot()
            for i, key in enumerate(_SCALARS):
                if key == "ticks":
                    ticks = max(ticks, now[i] - on.base[i])  # the same ticks on each GPU
                else:
                    out[key] += now[i] - on.base[i]
        out["ticks"] += ticks
        return out

    def histogram(self) -> list[int]:
        """How many GPU-ticks were at each utilisation percent (0-100)."""
        out = list(self.carried_histogram)
        for on in self.on.values():
            for i, (now, base) in enumerate(
                zip(on.totals.histogram, on.base_histogram, strict=True)
            ):
                out[i] += now - base
        return out

    @property
    def samples(self) -> int:
        """Ticks it was seen in."""
        return int(self.totals()["ticks"])

    @property
    def gpu_seconds(self) -> float:
        """GPU-seconds held."""
        return self.totals()["seconds"]

    @property
    def energy_j(self) -> float:
        """Its share of its GPUs' energy, joules."""
        return self.totals()["energy_j"]

    @property
    def idle_seconds(self) -> float:
        """GPU-seconds under ``[policy] idle_below`` percent."""
        return self.totals()["idle_seconds"]

    def _byte_seconds(self) -> float:
        total = self.vram_byte_seconds
        for on in self.on.values():
            if on.totals.booked_until is not None:
                total += on.held * max(0.0, on.totals.booked_until - on.since)
        return total

    def _p95(self, histogram: list[int]) -> int | None:
        total = sum(histogram)
        if not total:
            return None
        rank = math.ceil(0.95 * total)
        seen = 0
        for value, count in enumerate(histogram):
            seen += count
            if seen >= rank:
                return value
        return 100  # pragma: no cover - the loop always reaches rank

    def advice(self, samples: int | None = None) -> tuple[float | None, str | None]:
        """``(suggested vram_gb, advice)`` from the peak and what was declared."""
        samples = self.samples if samples is None else samples
        if samples < MIN_SAMPLES_FOR_ADVICE or self.vram_peak <= 0:
            return None, None
        peak = self.vram_peak
        suggestion = suggest_vram_gb(peak)
        declared = self.declared_vram
        if declared is None:
            if not self.shareable:
                return None, None  # (nothing to gain here: a GPU takes one job whatever)
            if self.totals()["shared_ticks"] > 0:
                # (it did share: "so it can share a GPU" read wrong beside "(GPU shared
                # with other jobs)"; tester h176)
                return suggestion, (
                    f"held at most {_gb(peak)} GiB per GPU; declare vram_gb = {suggestion:g} "
                    "so the scheduler keeps that much for it beside the jobs sharing its GPU"
                )
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

    def _last_at(self) -> float | None:
        times = [on.totals.at for on in self.on.values() if on.totals.at is not None]
        return max(times) if times else self.last_at

    def summary(self) -> UsageSummaryJSON:
        """The figures every finished job shows (and a running one, so far)."""
        sums = self.totals()
        samples = int(sums["ticks"])
        suggestion, advice = self.advice(samples)
        gpu_s, util_s, mem_s = sums["seconds"], sums["util_seconds"], sums["mem_seconds"]
        gpus = sorted(set(self.series) | set(self.on) | self.unseen_gpus)
        # With no sample, what was never read is null, not 0 (a record of a job that ended
        # between two samples said it held 0 GiB and used 0 Wh: tester h180)
        read = samples > 0
        return {
            "gpus": gpus,
            "samples": samples,
            "seconds": round(_or0(self._last_at()) - _or0(self.first_at), 1),
            "gpu_hours": round(gpu_s / 3600, 4),
            "peak_vram": self.vram_peak if read else None,
            "mean_vram": (
                None
                if not read
                else int(self._byte_seconds() / seen_s)
                if (seen_s := gpu_s - self.unobserved_seconds) > 0
                else self.vram_peak
            ),
            "util_mean": round(sums["util_weighted"] / util_s, 1) if util_s else None,
            "util_p95": self._p95(self.histogram()),
            "mem_util_mean": round(sums["mem_weighted"] / mem_s, 1) if mem_s else None,
            "energy_wh": round(sums["energy_j"] / 3600, 3) if read else None,
            "energy_estimated": sums["estimated_ticks"] > 0,
            "idle_share": round(sums["idle_seconds"] / util_s, 3) if util_s else None,
            "shared": sums["shared_ticks"] > 0,
            "declared_vram": self.declared_vram,
            "suggest_vram_gb": suggestion,
            "advice": advice,
            "idle_warning": self.idle_warning,
        }

    def row(self) -> RowUsageJSON:
        """The figures a jobs table shows (a row's ``use``)."""
        sums = self.totals()
        util_s = sums["util_seconds"]
        read = sums["ticks"] > 0
        return {
            "peak_vram": self.vram_peak if read else None,
            "util_mean": round(sums["util_weighted"] / util_s, 1) if util_s else None,
            "energy_wh": round(sums["energy_j"] / 3600, 3) if read else None,
        }

    def to_json(self) -> UsageJSON:
        """Summary plus every GPU's series, as stored and as the API answers."""
        sums = self.totals()
        return {
            "job": self.job_id,
            "summary": self.summary(),
            "series": [self.series[g].to_json() for g in sorted(self.series)],
            "totals": {
                **sums,
                "histogram": self.histogram(),
                "first_at": self.first_at,
                "last_at": self._last_at(),
                "vram_byte_seconds": self._byte_seconds(),
                "unobserved_seconds": self.unobserved_seconds,
                "offline_seconds": self.offline_seconds,
            },
        }

    @classmethod
    def from_json(cls, data: UsageJSON, max_points: int) -> JobUsage:
        """A stored record, to go on with after an engine restart."""
        summary = data["summary"]
        assert summary is not None  # (only records with a summary are stored)
        usage = cls(data["job"], summary.get("declared_vram"), max_points)
        totals = data.get("totals") or {}
        for key in _SCALARS:
            usage.carried[key] = float(totals.get(key, 0.0))
        histogram = list(totals.get("histogram") or [])
        if len(histogram) == 101:
            usage.carried_histogram = [int(v) for v in histogram]
        usage.first_at = totals.get("first_at")
        usage.last_at = totals.get("last_at")
        usage.unobserved_from = usage.last_at
        usage.vram_peak = int(summary.get("peak_vram") or 0)
        usage.vram_byte_seconds = float(totals.get("vram_byte_seconds", 0.0))
        usage.unobserved_seconds = float(totals.get("unobserved_seconds", 0.0))
        # (a record from before the split: all of it, as it was said then)
        usage.offline_seconds = float(totals.get("offline_seconds", usage.unobserved_seconds))
        usage.idle_warning = summary.get("idle_warning")
        usage.series = {int(s["gpu"]): GpuSeries.from_json(s, max_points) for s in data["series"]}
        return usage


# (job id) -> (declared VRAM per GPU in bytes), or None for a job that is not running.
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
        once_saved: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self._settings = settings
        self._policy = policy
        self._facts = facts
        self._save = save
        self._warn = warn
        # Runs its callback once what was saved so far is committed (the store's
        # after_commit); without a store, at once.
        self._once_saved = once_saved or (lambda callback: callback())
        self._jobs: dict[int, JobUsage] = {}
        # An ended job's last record, until its write is committed: read in between, its
        # usage was neither live nor stored, and came back empty.
        self._ending: dict[int, UsageJSON] = {}
        self._gpus: dict[int, GpuTotals] = {}
        self._last_point = 0.0
        # Jobs running when the engine started with no record to take back: killed
        # before their first save, their time until they are seen again is unobserved.
        self._unrecorded: set[int] = set()
        self._pricing: set[int] = set()  # jobs with gaps to book at the power read since

    def reconfigure(self, settings: UsageSettings, policy: PolicySettings) -> None:
        """A reloaded ``[usage]`` / ``[policy]``."""
        self._settings = settings
        self._policy = policy
        if not settings.series:
            self._jobs.clear()
            self._gpus.clear()

    def restore(self, records: Iterable[UsageJSON], running: Iterable[int] = ()) -> None:
        """Active jobs' records from before a restart: their sums and series go on. Only
        the ``running`` ones held their GPUs while nothing observed them; the others (a
        service waiting to be placed again, a requeued job) held none meanwhile."""
        held = set(running)
        for record in records:
            usage = JobUsage.from_json(record, self._settings.max_points)
            if usage.job_id not in held:
                usage.unobserved_from = None
            self._jobs[usage.job_id] = usage
        self._unrecorded = held - self._jobs.keys()

    def live(self, job_id: int) -> JobUsage | None:
        """The record of a job being observed now, if any."""
        return self._jobs.get(job_id)

    def _saved(self, job_id: int) -> None:
        self._ending.pop(job_id, None)

    def ending(self, job_id: int) -> UsageJSON | None:
        """The last record of a job that has just ended, while its write is not yet
        committed (afterwards the store has it)."""
        return self._ending.get(job_id)

    def running(self) -> list[JobUsage]:
        """Every job being observed now."""
        return list(self._jobs.values())

    def book_gaps(self, running: Iterable[int], now: float) -> None:
        """At start, once recovery has said which jobs still run: book each one's time
        since its record up to ``now`` (see :meth:`JobUsage.book_gap_until`)."""
        for job_id in running:
            usage = self._jobs.get(job_id)
            if usage is not None:
                usage.book_gap_until(now)

    def observe(self, at: float, domains: Iterable[Domain]) -> None:
        """Book one tick (read at ``at``): each GPU's sums move on; jobs are touched only
        when they come, go or change their VRAM, and once per series point."""
        if not self._settings.series:
            return
        below = self._policy.idle_below
        idle_gpus: list[GpuTotals] = []
        for domain in domains:
            reading = domain.reading
            if domain.gpu_index is None or reading is None:
                continue
            totals = self._gpus.get(reading.index)
            if totals is None:
                totals = self._gpus[reading.index] = GpuTotals()
            holders = domain.holdings
            tick = 0.0
            if totals.at is not None:
                tick = min(MAX_TICK_SECONDS, max(0.0, at - totals.at))
            # Its last reads failed: the reading is the last good one's, not the GPU's now.
            # The time is held, but has no utilisation or energy (a lost GPU's job went on
            # being booked 70 % and 270 W for as long as the GPU gave no reading).
            stale = reading.lost or domain.failures > 0
            util = None if stale else reading.utilization
            mem = None if stale else reading.memory_utilization
            power = None if stale else reading.power_watts
            totals.at = at
            totals.util, totals.mem, totals.power = util, mem, power
            if util is not None and util < below:
                if totals.idle_since is None:
                    totals.idle_since = at - tick
                idle_gpus.append(totals)
            else:
                totals.idle_since = None
            if holders and tick:
                totals.booked_until = at
                totals.ticks += 1
                totals.seconds += tick
                if util is not None:
                    totals.histogram[max(0, min(100, util))] += 1
                    totals.util_weighted += util * tick
                    totals.util_seconds += tick
                    if util < below:
                        totals.idle_seconds += tick
                if mem is not None:
                    totals.mem_weighted += mem * tick
                    totals.mem_seconds += tick
                # Each tick, power x time (scaled by what the counter said of the last
                # window); when the counter is read again, its window is made exact.
                share = (power or 0.0) * tick / len(holders)
                totals.window_est_per_holder += share
                totals.window_booked_per_holder += share * totals.factor
                totals.energy_per_holder_j += share * totals.factor
                if reading.energy_at is None and not stale:
                    totals.estimated_ticks += 1  # this GPU has no counter
                if len(holders) > 1:
                    totals.shared_ticks += 1
            elif holders:
                totals.ticks += 1
            totals.window_est += (power or 0.0) * tick
            if (
                not stale
                and reading.energy_at is not None
                and reading.energy_at != totals.counter_at
            ):
                self._counter_read(reading.index, totals, reading.energy_mj, reading.energy_at)
            self._members(reading.index, totals, holders.keys(), domain, at)
        for job_id in list(self._pricing):
            usage = self._jobs.get(job_id)
            if usage is None or usage.price_gaps():
                self._pricing.discard(job_id)
        if self._policy.idle_after is not None and idle_gpus:
            self._idle(at, idle_gpus)
        if at - self._last_point >= self._settings.point_interval:
            self._last_point = at
            for usage in self._jobs.values():
                usage.point(at)
            self._save_due(at)

    def _counter_read(
        self, gpu: int, totals: GpuTotals, counter: int | None, read_at: float
    ) -> None:
        """A new read of the GPU's energy counter closes a window: what the window booked
        for each job there (power x time) is corrected to the job's share of what the
        counter says the GPU took; the ratio scales the next window's bookings."""
        last = totals.counter_mj
        if last is not None and counter is not None and counter >= last:
            took = (counter - last) / 1000.0
            booked = totals.window_booked_per_holder
            if totals.window_est > 0:
                exact = took * totals.window_est_per_holder / totals.window_est
                totals.factor = min(4.0, max(0.25, took / totals.window_est))
            else:  # no power figure: split what it took between who holds it now
                exact = took / len(totals.members) if totals.members else 0.0
            mark, now = totals.window_mark, totals.energy_per_holder_j
            for job_id in totals.members:
                usage = self._jobs.get(job_id)
                on = usage.on.get(gpu) if usage is not None else None
                if usage is None or on is None:
                    continue
                # Its part of the window: all of it, or from when it came.
                mine = now - max(mark, on.base[_ENERGY])
                share = mine / booked if booked > 0 else float(on.base[_ENERGY] <= mark)
                usage.carried["energy_j"] += (exact - booked) * share
        totals.counter_mj, totals.counter_at = counter, read_at
        totals.window_mark = totals.energy_per_holder_j
        totals.window_est = totals.window_est_per_holder = totals.window_booked_per_holder = 0.0

    def _members(
        self, gpu: int, totals: GpuTotals, holders: Any, domain: Domain, at: float
    ) -> None:
        """Jobs that came to or left this GPU, and VRAM that changed."""
        account = domain.account
        held = account.held_by_job if account is not None else {}
        if holders != totals.members:
            for job_id in totals.members - holders:
                gone = self._jobs.get(job_id)
                if gone is not None:
                    gone.leave(gpu, at)
            for job_id in holders - totals.members:
                usage = self._jobs.get(job_id)
                if usage is None:
                    facts = self._facts(job_id)
                    if facts is None:
                        continue
                    usage = self._jobs[job_id] = JobUsage(
                        job_id, facts[1], self._settings.max_points
                    )
                    started = facts[0]
                    if job_id in self._unrecorded and started is not None and started < at:
                        # (it was "2 points over 4 s" of a job running 40 s: its time before
                        # the restart was lost, not even counted as unobserved)
                        usage.first_at = usage.unobserved_from = started
                        usage.gap_on_every_gpu = True
                    self._unrecorded.discard(job_id)
                usage.join(gpu, totals, at, held.get(job_id, 0))
                if usage.gaps_unpriced:
                    self._pricing.add(job_id)
                usage.shareable = usage.shareable or domain.slots > 1
            totals.members = {j for j in holders if j in self._jobs}
        if held != totals.held:
            for job_id in totals.members:
                usage = self._jobs.get(job_id)
                if usage is not None and gpu in usage.on:
                    usage.held_now(gpu, at, held.get(job_id, 0))
            totals.held = dict(held)

    def _idle(self, at: float, idle_gpus: list[GpuTotals]) -> None:
        after = self._policy.idle_after
        assert after is not None
        for totals in idle_gpus:
            if totals.idle_since is None or at - totals.idle_since < after:
                continue
            for job_id in totals.members:
                usage = self._jobs.get(job_id)
                if usage is None or usage.idle_warning is not None:
                    continue
                since = [on.totals.idle_since for on in usage.on.values()]
                if any(s is None for s in since):
                    continue  # another of its GPUs is busy
                first = at if usage.first_at is None else usage.first_at
                start = max([first, *(s for s in since if s is not None)])
                streak = at - start
                if streak < after:
                    continue
                usage.idle_warning = (
                    f"idle: its GPUs were under {self._policy.idle_below}% utilisation for "
                    f"{_duration(streak)} ([policy] idle_after = {after:g} s)"
                )
                self._warn(job_id, usage.idle_warning, self._policy.idle_action == "stop")

    def idle_now(self, job_id: int) -> bool:
        """True while a warned job is still idle (the dashboard's count)."""
        usage = self._jobs.get(job_id)
        if usage is None or usage.idle_warning is None or not usage.on:
            return False
        return all(on.totals.idle_since is not None for on in usage.on.values())

    def _save_due(self, at: float) -> None:
        interval = self._settings.save_interval
        for usage in self._jobs.values():
            if at - usage.saved_at >= interval and usage.on:
                if usage.saved_at == 0.0:
                    usage.saved_at = at  # (a job just seen: its first save comes later)
                    continue
                self._store(usage, at)

    def _store(self, usage: JobUsage, at: float) -> None:
        usage.saved_at = at
        self._save(usage.job_id, usage.to_json())

    def save_all(self) -> None:
        """Queue every running job's record (the engine is stopping; its jobs go on)."""
        for usage in self._jobs.values():
            self._store(usage, usage.saved_at)

    def job_ended(
        self,
        job_id: int,
        ended_at: float | None = None,
        gpus: int = 0,
        held_since: float | None = None,
        gpu_indexes: Iterable[int] = (),
    ) -> None:
        """The job ended (at ``ended_at``, holding ``gpus`` GPUs): its record is written one
        last time and forgotten here. Ended while no engine observed it, the time since
        its last tick is booked as held. ``held_since``: when it took those GPUs and held
        them to its end (a batch job's one run): its GPU-seconds are at least that span
        (ticks book the time between them: a 2 s job read 1.0 s, the time before its
        first tick and after its last left out: tester h63). ``gpu_indexes``: the GPUs it
        held, named in the record of a job no reading saw (it ended between two)."""
        usage = self._jobs.pop(job_id, None)
        if usage is None:
            usage = self._unseen(job_id, ended_at, gpus, held_since, gpu_indexes)
            if usage is None:
                return
        gap_from = usage.unobserved_from
        if gap_from is not None and not usage.on and not usage._gap_booked and ended_at:
            usage.carried["seconds"] += max(0.0, ended_at - gap_from) * gpus
            usage.unobserved_seconds += max(0.0, ended_at - gap_from) * gpus
            usage.offline_seconds += max(0.0, ended_at - gap_from) * gpus
            usage.last_at = max(usage.last_at or ended_at, ended_at)
        if held_since is not None and ended_at is not None and gpus and usage.first_at:
            short = max(0.0, ended_at - held_since) * gpus - usage.gpu_seconds
            if short > 0:
                usage.carried["seconds"] += short
                usage.unobserved_seconds += short  # (no reading: out of the means)
        for totals in self._gpus.values():
            totals.members.discard(job_id)
        record = usage.to_json()
        self._ending[job_id] = record
        self._save(job_id, record)
        self._once_saved(lambda: self._saved(job_id))

    def _unseen(
        self,
        job_id: int,
        ended_at: float | None,
        gpus: int,
        held_since: float | None,
        gpu_indexes: Iterable[int],
    ) -> JobUsage | None:
        """The record of a GPU job that started and ended between two readings of its
        GPUs: no sample, the GPU-seconds it held. It had none at all: no usage in its
        status, the API or the TUI, where one read once said "not read" with its
        GPU-hours (tester h176)."""
        if not self._settings.series or not gpus or held_since is None or ended_at is None:
            return None
        facts = self._facts(job_id)
        usage = JobUsage(job_id, facts[1] if facts else None, self._settings.max_points)
        held = max(0.0, ended_at - held_since) * gpus
        usage.first_at, usage.last_at = held_since, max(held_since, ended_at)
        usage.carried["seconds"] += held
        usage.unobserved_seconds += held  # (no reading: out of the means)
        usage.unseen_gpus = set(gpu_indexes)
        return usage


def _or0(value: float | None) -> float:
    return 0.0 if value is None else value


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"
