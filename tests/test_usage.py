"""Per-job GPU usage (issue 17): series, summaries, energy, right-sizing, idle warnings.

The engine runs for real over the fake NVML (only pynvml is faked); the sampler's own
loop is slowed to an hour so each test takes its ticks itself (``sample_once``) and the
figures are exact.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from gpulayer_tui.engine.config import PolicySettings, UsageSettings
from gpulayer_tui.engine.domain import Domain
from gpulayer_tui.engine.gpus import GIB, GpuProcess, GpuReading
from gpulayer_tui.engine.models import JobStatus
from gpulayer_tui.engine.nvml import NvmlProbe
from gpulayer_tui.engine.usage import GpuSeries, UsageRecorder, suggest_vram_gb

from .conftest import EngineFactory, Served, eventually, make_config, pid_reaped, wait_for

if TYPE_CHECKING:
    from gpulayer_tui.engine.engine import Engine

    from .fake_nvml import FakeNvml

MIB = 1024**2


# -- the series and the summary, alone ---------------------------------------------------


def test_a_series_stays_bounded_and_keeps_its_peaks() -> None:
    series = GpuSeries(0, t0=1000.0, max_points=16)
    for tick in range(200):
        vram = 30 * GIB if tick == 137 else 2 * GIB
        series.add(1000.0 + tick, vram, util=tick % 100, mem=10, power=100.0)
    out = series.to_json()
    assert 8 <= len(out["t"]) <= 17  # full series merge to half, plus the open bucket
    assert len(out["t"]) == len(out["vram_mib"]) == len(out["util"]) == len(out["power_w"])
    assert out["step"] >= 16  # 200 ticks in at most 16 points: each covers many ticks
    assert max(out["vram_mib"]) == 30 * 1024  # a one-tick spike survives every merge
    assert out["t"] == sorted(out["t"]) and out["t"][0] == 0.0
    assert set(out["power_w"]) == {100.0}


def test_a_series_goes_on_from_its_stored_form() -> None:
    series = GpuSeries(1, t0=50.0, max_points=16)
    for tick in range(40):
        series.add(50.0 + tick, GIB, util=50, mem=None, power=None)
    stored = series.to_json()
    again = GpuSeries.from_json(stored, 16)
    again.add(50.0 + 40 * 1.0 + stored["step"], GIB, util=50, mem=None, power=None)
    assert len(again.to_json()["t"]) <= 17 and again.gpu == 1


class _Box:
    """Real domains fed hand-made readings at chosen times: a recorder's exact figures."""

    def __init__(self, gpus: int = 1, slots: int = 4, **policy: Any) -> None:
        self.domains = [Domain(f"gpu{i}", i, f"GPU-{i}", slots) for i in range(gpus)]
        self.declared: dict[int, int | None] = {}
        self.warnings: list[tuple[int, str, bool]] = []
        self.saved: dict[int, Any] = {}
        self.recorder = UsageRecorder(
            UsageSettings(point_interval=0),
            PolicySettings(**policy),
            lambda job: (None, self.declared[job]) if job in self.declared else None,
            self.saved.__setitem__,
            lambda job, text, stop: self.warnings.append((job, text, stop)),
        )

    def run(self, job: int, gpu: int = 0, declared: int | None = None) -> None:
        self.declared[job] = declared
        self.domains[gpu].hold(job, declared, False)

    def read(self, gpu: int = 0, held: dict[int, int] | None = None, **fields: Any) -> None:
        """Give ``gpu`` a reading: ``held`` is job -> bytes its process holds there."""
        held = held or {}
        reading = GpuReading(
            gpu,
            f"GPU-{gpu}",
            "test",
            80 * GIB,
            sum(held.values()),
            processes=tuple(GpuProcess(1000 + job, used) for job, used in held.items()),
            **fields,
        )
        self.domains[gpu].apply_sample(reading, {1000 + j: j for j in held}, {})

    def tick(
        self, at: float, gpu: int = 0, held: dict[int, int] | None = None, **fields: Any
    ) -> None:
        """One GPU's reading, then a tick at ``at``."""
        self.read(gpu, held, **fields)
        self.recorder.observe(at, self.domains)


def test_the_summary_reports_p95_idle_share_energy_and_advice() -> None:
    box = _Box()
    box.run(7, declared=40 * GIB)
    utils = [0] * 10 + [90] * 90  # 10 % of the time idle
    box.tick(0.0, held={7: 8 * GIB}, utilization=50, power_watts=200.0)  # seen: counts from here
    for tick, util in enumerate(utils, start=1):
        box.tick(
            float(tick),
            held={7: 8 * GIB},
            utilization=util,
            memory_utilization=30,
            power_watts=200.0,
        )
    usage = box.recorder.live(7)
    assert usage is not None
    summary = usage.summary()
    assert summary["samples"] == 100 and summary["seconds"] == 100.0
    assert summary["util_p95"] == 90
    assert summary["util_mean"] == 81.0 and summary["mem_util_mean"] == 30.0
    assert summary["idle_share"] == 0.1
    assert summary["gpu_hours"] == round(100 / 3600, 4)
    # No energy counter: power x time, said to be an estimate.
    assert summary["energy_wh"] == round(200 * 100 / 3600, 3) and summary["energy_estimated"]
    assert summary["peak_vram"] == summary["mean_vram"] == 8 * GIB
    assert summary["suggest_vram_gb"] == suggest_vram_gb(8 * GIB) == 9.5
    assert summary["advice"] is not None and "declared 40 GiB" in summary["advice"]
    assert "vram_gb = 9.5" in summary["advice"]
    assert summary["shared"] is False


def test_energy_comes_from_the_counter_and_is_split_between_sharers() -> None:
    box = _Box()
    box.run(1)
    box.run(2)
    box.tick(10.0, held={1: GIB, 2: 3 * GIB}, energy_mj=1_000_000, energy_at=10.0)
    box.tick(11.0, held={1: GIB, 2: 3 * GIB}, energy_mj=8_200_000, energy_at=11.0)  # 2 Wh
    one, two = box.recorder.live(1), box.recorder.live(2)
    assert one is not None and two is not None
    for usage in (one, two):
        summary = usage.summary()
        assert summary["energy_wh"] == 1.0 and not summary["energy_estimated"]
        assert summary["shared"] is True
    assert (one.vram_peak, two.vram_peak) == (GIB, 3 * GIB)


def test_a_counter_read_now_and_then_corrects_the_power_estimate_of_its_window() -> None:
    box = _Box()
    box.run(1)
    box.tick(0.0, held={1: GIB}, power_watts=100.0, energy_mj=0, energy_at=0.0)
    # Ten ticks at 100 W, the counter not read again: booked as power x time.
    for at in range(1, 11):
        if at == 6:
            box.run(2)  # job 2 comes at 6 s: it shares the GPU (and counts) from there
        held = {1: GIB, 2: GIB} if at >= 6 else {1: GIB}
        box.tick(float(at), held=held, power_watts=100.0, energy_mj=0, energy_at=0.0)
    one, two = box.recorder.live(1), box.recorder.live(2)
    assert one is not None and two is not None
    assert one.energy_j == 100 * 5 + 50 * 5 and two.energy_j == 50 * 4  # (2 counts from 6 s)
    # The counter, read at 10 s, says the GPU took 1,500 J, not 1,000: the window is
    # corrected to each holder's share of it (by its share of the power x time).
    box.tick(10.0, held={1: GIB, 2: GIB}, power_watts=100.0, energy_mj=1_500_000, energy_at=10.0)
    assert abs(one.energy_j - 1500 * 750 / 1000) < 1e-6
    assert abs(two.energy_j - 1500 * 200 / 1000) < 1e-6  # its part of the window only
    # The next window is booked at the counter's rate (1.5x the power figure).
    box.tick(11.0, held={1: GIB, 2: GIB}, power_watts=100.0, energy_mj=1_500_000, energy_at=10.0)
    assert abs(one.energy_j - (1125 + 75)) < 1e-6
    assert not one.summary()["energy_estimated"]


def test_a_job_s_series_keeps_what_each_tick_read() -> None:
    box = _Box()
    box.run(3)
    for at, gib in ((0.0, 8), (1.0, 12), (2.0, 12), (3.0, 4), (4.0, 4)):
        box.tick(at, held={3: gib * GIB}, utilization=int(at) * 10)
    usage = box.recorder.live(3)
    assert usage is not None
    (series,) = usage.to_json()["series"]
    assert series["vram_mib"] == [8 * 1024, 12 * 1024, 12 * 1024, 4 * 1024, 4 * 1024]
    assert series["util"] == [0, 10, 20, 30, 40]
    # mean VRAM: 12 GiB for 2 s, 4 GiB for 1 s ... over the 4 s counted after the first tick
    assert usage.summary()["mean_vram"] == int((8 * 1 + 12 * 2 + 4 * 1) * GIB / 4)


def test_a_job_idle_past_the_policy_is_warned_once_and_a_busy_one_never() -> None:
    box = _Box(gpus=2, idle_after=30, idle_below=5)
    box.run(1, gpu=0)
    box.run(2, gpu=1)
    for at in range(0, 61, 10):
        box.read(0, held={1: GIB}, utilization=2)
        box.read(1, held={2: GIB}, utilization=2 if at < 20 else 70)
        box.recorder.observe(float(at), box.domains)
    assert [w[0] for w in box.warnings] == [1]
    _job, text, stop = box.warnings[0]
    assert text.startswith("idle: its GPUs were under 5% utilisation for 30 s") and not stop
    assert box.recorder.idle_now(1) and not box.recorder.idle_now(2)
    box.tick(70.0, gpu=0, held={1: GIB}, utilization=50)
    assert not box.recorder.idle_now(1)  # busy again: warned, but not idle now


def test_a_job_that_ends_is_saved_once_more_and_forgotten() -> None:
    box = _Box()
    box.run(5)
    box.tick(0.0, held={5: GIB}, utilization=10)
    box.tick(1.0, held={5: 2 * GIB}, utilization=10)
    box.recorder.job_ended(5)
    assert box.recorder.live(5) is None
    assert box.saved[5]["summary"]["peak_vram"] == 2 * GIB


def test_advice_says_when_a_job_held_more_than_it_declared_or_declared_nothing() -> None:
    box = _Box()
    box.run(1, declared=8 * GIB)
    box.run(2, declared=None)
    box.run(3, declared=10 * GIB)
    for at in range(4):
        box.tick(float(at), held={1: 9 * GIB, 2: 9 * GIB, 3: 9 * GIB}, utilization=50)
    advice = {j: (box.recorder.live(j).summary()["advice"] or "") for j in (1, 2, 3)}  # type: ignore[union-attr]
    assert "more than the 8 GiB declared" in advice[1]
    # (it shared its GPU: "so it can share a GPU" read wrong beside that: tester h176 #5)
    assert advice[2].endswith(
        "declare vram_gb = 10.5 so the scheduler keeps that much for it beside the jobs "
        "sharing its GPU"
    )
    assert advice[3] == ""  # 10 declared for 9 held: right-sized
    alone = _Box()
    alone.run(2, declared=None)
    for at in range(4):
        alone.tick(float(at), held={2: 9 * GIB}, utilization=50)
    said = alone.recorder.live(2).summary()["advice"]  # type: ignore[union-attr]
    assert said is not None and said.endswith("declare vram_gb = 10.5 so it can share a GPU")


def test_no_advice_to_declare_vram_where_a_gpu_takes_one_job_whatever() -> None:
    # "declare vram_gb = 1.5 so it can share a GPU" was said where every domain had one
    # slot: declaring changed nothing there (tester h67).
    box = _Box(slots=1)
    box.run(2, declared=None)
    for at in range(4):
        box.tick(float(at), held={2: 9 * GIB}, utilization=50)
    usage = box.recorder.live(2)
    assert usage is not None and usage.summary()["advice"] is None
    box = _Box(slots=1)
    box.run(1, declared=40 * GIB)  # (declared too much: still said, whatever the slots)
    for at in range(4):
        box.tick(float(at), held={1: 9 * GIB}, utilization=50)
    said = box.recorder.live(1).summary()["advice"]  # type: ignore[union-attr]
    assert said is not None and said.startswith("declared 40 GiB per GPU but held at most 9")


def test_no_advice_from_a_job_seen_once() -> None:
    box = _Box()
    box.run(1, declared=80 * GIB)
    box.tick(0.0, held={1: GIB}, utilization=50)
    box.tick(1.0, held={1: GIB}, utilization=50)
    usage = box.recorder.live(1)
    assert usage is not None and usage.summary()["advice"] is None


# -- through the engine, over the fake NVML --------------------------------------------------


async def _engine(make_engine: EngineFactory, **sections: Any) -> Engine:
    usage = {"point_interval": 0, **sections.pop("usage", {})}
    config = make_config(engine={"sample_interval": 3600}, usage=usage, **sections)
    return await make_engine(probe=NvmlProbe(energy_interval=0), config=config)


async def test_a_job_s_series_summary_and_energy_from_the_counter(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    gpu0 = fake_nvml.devices[0]
    gpu0.compute = []
    engine = await _engine(make_engine)
    job = await engine.submit(
        {"command": ["sleep", "60"], "gpus": 1, "domain": "gpu0", "vram_gb": 40}
    )
    assert job.status is JobStatus.RUNNING and job.pid
    gpu0.compute = [(job.pid, 8 * GIB)]
    gpu0.utilization, gpu0.memory_utilization, gpu0.energy_mj = 50, 20, 1_000_000
    await engine.sampler.sample_once()  # the first reading: no interval behind it yet
    gpu0.energy_mj += 3_600_000  # 3,600 J = 1 Wh since the last tick
    gpu0.compute = [(job.pid, 12 * GIB)]
    gpu0.utilization = 100
    await engine.sampler.sample_once()
    gpu0.compute = [(job.pid, 4 * GIB)]
    gpu0.utilization = 0
    gpu0.energy_mj += 1_800_000
    await engine.sampler.sample_once()
    await engine.sampler.sample_once()  # (the same again)

    live = await engine.usage_of(job.id)
    summary = live["summary"]
    assert summary is not None
    assert summary["gpus"] == [0] and summary["samples"] == 3  # (ticks after the first)
    assert summary["peak_vram"] == 12 * GIB
    assert summary["energy_wh"] == 1.5 and summary["energy_estimated"] is False
    assert summary["shared"] is False
    assert summary["suggest_vram_gb"] == 14.0 and "vram_gb = 14" in (summary["advice"] or "")
    (series,) = live["series"]
    assert series["vram_mib"] == [8 * 1024, 12 * 1024, 4 * 1024, 4 * 1024]
    assert series["util"] == [50, 100, 0, 0] and series["mem_util"] == [20] * 4
    detail, _ = await engine.job_detail(job.id)
    assert detail["usage"] == summary  # the whole job carries it while it runs

    sub = engine.bus.subscribe()
    await engine.cancel(job.id)
    await engine.wait(job.id, timeout=10)
    # Its end's event carries its figures (a table kept those a page had brought).
    events, _ = sub.ready()
    sub.close()
    (end,) = [e for e in events if e.job_id == job.id and e.data.get("status") == "cancelled"]
    assert end.job is not None and end.job["use"] == {
        "peak_vram": 12 * GIB,
        "util_mean": summary["util_mean"],
        "energy_wh": 1.5,
    }
    stored = await engine.usage_of(job.id)  # from SQLite now
    assert stored["summary"] == summary and stored["series"] == live["series"]
    detail, _ = await engine.job_detail(job.id)
    assert detail["usage"] == summary
    rows = [row async for chunk in engine.job_rows(_query()) for row in chunk]
    (row,) = [r for r in rows if r["id"] == job.id]
    assert row["use"] == {
        "peak_vram": 12 * GIB,
        "util_mean": summary["util_mean"],
        "energy_wh": 1.5,
    }


async def test_a_job_s_usage_is_read_whole_while_its_end_is_being_committed(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # Ended, a job's record left the live recorder at once, but reached SQLite only with
    # the next commit: read in between (`usage` just after `wait` on a busy engine), its
    # usage came back empty, and the TUI's plots went blank.
    gpu0 = fake_nvml.devices[0]
    engine = await _engine(make_engine)
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu0"})
    assert job.pid
    gpu0.compute = [(job.pid, 8 * GIB)]
    gpu0.utilization = 60
    for _ in range(3):
        await engine.sampler.sample_once()
    live = await engine.usage_of(job.id)
    assert live["summary"] is not None and live["summary"]["peak_vram"] == 8 * GIB
    release = threading.Event()
    busy = asyncio.create_task(engine.store.run_on_writer(lambda db: release.wait(10)))
    try:
        os.kill(job.pid, signal.SIGKILL)  # its end is taken in; its commit waits
        await eventually(lambda: engine.usage.live(job.id) is None)  # (the end taken in)
        ending = await engine.usage_of(job.id)
        assert ending["summary"] == live["summary"]
        assert ending["series"] == live["series"]
        detail, _ = await engine.job_detail(job.id)
        assert detail["usage"] == live["summary"]
    finally:
        release.set()
        await busy
    await engine.wait(job.id, timeout=10)
    stored = await engine.usage_of(job.id)  # (SQLite's now, the same)
    assert stored["summary"] == live["summary"]
    assert engine.usage.ending(job.id) is None  # (kept only until the commit)


def _query():  # type: ignore[no-untyped-def]
    from gpulayer_tui.engine.models import JobQuery

    return JobQuery(limit=100)


async def test_a_gpu_that_gives_no_reading_books_no_use_and_plots_a_gap(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # Its last good reading was booked at every tick while it was lost: a job's energy and
    # mean utilisation grew for a GPU that said nothing, and its graph went on at 70 %.
    # (the simulator, as a driver that keeps answering with the GPU marked lost: the
    # domain keeps its last good reading, marked stale)
    from gpulayer_tui.engine.simulate import SimLedger

    engine = await make_engine("1xA100-80GB")
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1})
    assert job.pid

    async def ticks(count: int) -> None:
        for _tick in range(count):  # (half a second apart: the simulator books wall time)
            since = time.time()
            await eventually(lambda: time.time() > since + 0.5)  # noqa: B023
            await engine.sampler.sample_once()

    await engine.sampler.sample_once()
    await ticks(2)
    before = (await engine.usage_of(job.id))["summary"]
    assert before is not None and before["energy_wh"] > 0 and before["util_mean"]
    SimLedger(engine.paths.state_dir).set_gpu(0, lost=True, error="GPU is lost")
    await ticks(4)
    after = (await engine.usage_of(job.id))["summary"]
    assert after is not None
    assert after["energy_wh"] == before["energy_wh"]
    assert after["util_mean"] == before["util_mean"]
    history = engine.sampler.history[0]
    assert [p.utilization for p in list(history)[-4:]] == [None] * 4
    await engine.cancel(job.id)


async def test_energy_is_estimated_from_power_where_the_gpu_has_no_counter(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    gpu1 = fake_nvml.devices[1]
    gpu1.energy_mj, gpu1.power_mw, gpu1.utilization = None, 100_000, 80
    engine = await _engine(make_engine)
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu1"})
    gpu1.compute = [(job.pid or 0, 2 * GIB)]
    for _ in range(4):
        await engine.sampler.sample_once()
    summary = (await engine.usage_of(job.id))["summary"]
    assert summary is not None and summary["energy_estimated"] is True
    usage = engine.usage.live(job.id)
    assert usage is not None and usage.gpu_seconds > 0
    assert usage.energy_j == 100.0 * usage.gpu_seconds  # 100 W for the time it held the GPU


async def test_two_jobs_on_one_gpu_share_its_energy(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    gpu0 = fake_nvml.devices[0]
    gpu0.compute, gpu0.energy_mj = [], 0
    engine = await _engine(make_engine, domains={"gpu0": {"gpu": 0, "slots": 2}})
    first = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu0"})
    second = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu0"})
    gpu0.compute = [(first.pid or 0, GIB), (second.pid or 0, 3 * GIB)]
    await engine.sampler.sample_once()
    gpu0.energy_mj = 7_200_000  # 2 Wh for the two of them
    await engine.sampler.sample_once()
    one, two = (engine.usage.live(j.id) for j in (first, second))
    assert one is not None and two is not None
    assert one.summary()["energy_wh"] == two.summary()["energy_wh"] == 1.0
    assert one.summary()["shared"] and two.summary()["shared"]
    assert (one.vram_peak, two.vram_peak) == (GIB, 3 * GIB)


async def test_the_series_is_bounded_through_the_engine(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    engine = await _engine(make_engine, usage={"max_points": 16})
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu1"})
    fake_nvml.devices[1].compute = [(job.pid or 0, GIB)]
    for _ in range(60):
        await engine.sampler.sample_once()
    (series,) = (await engine.usage_of(job.id))["series"]
    assert len(series["t"]) <= 17
    assert (await engine.usage_of(job.id))["summary"]["samples"] == 59  # type: ignore[index]


async def test_usage_survives_an_engine_restart(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    engine = await _engine(make_engine)
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu1"})
    fake_nvml.devices[1].compute = [(job.pid or 0, 5 * GIB)]
    for _ in range(3):
        await engine.sampler.sample_once()
    await engine.stop()  # the job runs on; what it used so far is written
    again = await _engine(make_engine)
    assert again.usage.live(job.id) is not None
    fake_nvml.devices[1].compute = [(job.pid or 0, 6 * GIB)]
    await again.sampler.sample_once()  # seen again: counts from here
    await again.sampler.sample_once()
    usage = await again.usage_of(job.id)
    summary = usage["summary"]
    # 2 ticks counted before the restart (after the first), 2 after it (the restarted
    # engine reads the GPUs again once it has its jobs back: it sees it there, at 5 GiB,
    # and counts from then); one series.
    assert summary is not None and summary["samples"] == 4 and summary["peak_vram"] == 6 * GIB
    (series,) = usage["series"]
    assert series["vram_mib"] == [5 * 1024] * 4 + [6 * 1024] * 2


async def test_gpu_time_held_while_no_engine_ran_is_booked(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # Nothing observed the job while the engine was down: its GPU-hours left that time
    # out (30 s on 2 GPUs read 0.007 GPU-hours, fair share 60 GPU-seconds).
    engine = await _engine(make_engine)
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu1"})
    fake_nvml.devices[1].compute = [(job.pid or 0, 5 * GIB)]
    for _ in range(3):
        await engine.sampler.sample_once()
    seen = engine.usage.live(job.id)
    assert seen is not None and seen.energy_j > 0
    energy_before = seen.energy_j
    await engine.stop()
    down = time.time()
    await eventually(lambda: time.time() > down + 1.5, interval=0.1)  # (no engine)
    again = await _engine(make_engine)
    await again.sampler.sample_once()
    live = again.usage.live(job.id)
    assert live is not None and live.gpu_seconds >= 1.5
    # Its energy meanwhile is booked at its mean power, estimated (it went back by what
    # the last engine had not saved while its GPU-seconds went on: tester h63).
    assert live.energy_j > energy_before
    assert live.summary()["energy_estimated"] is True
    # Its VRAM, unknown meanwhile, is left out of the mean (5 GiB held throughout read
    # lower after each restart, the gap counted as 0 GiB).
    assert live.summary()["mean_vram"] == live.summary()["peak_vram"] == 5 * GIB
    # Ended while none ran: booked up to its end.
    short = await again.submit({"command": ["sleep", "2"], "gpus": 1, "domain": "gpu0"})
    fake_nvml.devices[0].compute = [(short.pid or 0, GIB)]
    await again.sampler.sample_once()
    await again.stop()
    await eventually(lambda: pid_reaped(short.pid or 0), timeout=10)
    third = await _engine(make_engine)
    done = await third.wait(short.id, timeout=10)
    summary = (await third.usage_of(short.id))["summary"]
    assert summary is not None and done.started_at is not None and done.ended_at is not None
    assert summary["gpu_hours"] * 3600 == pytest.approx(done.ended_at - done.started_at, abs=0.3)


async def test_a_short_jobs_gpu_hours_are_the_time_it_held_its_gpus(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # Ticks book the time between them: a 2 s job read 1.0 s, the time before its first
    # tick and after its last left out (tester h63).
    engine = await _engine(make_engine)
    job = await engine.submit({"command": ["sleep", "1.5"], "gpus": 2})
    for index in (0, 1):
        fake_nvml.devices[index].compute = [(job.pid or 0, GIB)]
    await eventually(lambda: time.time() > (job.started_at or 0) + 0.5, interval=0.05)
    await engine.sampler.sample_once()
    await engine.sampler.sample_once()  # (one interval booked: well under 1.5 s)
    done = await engine.wait(job.id, timeout=10)
    assert done.started_at is not None and done.ended_at is not None
    summary = (await engine.usage_of(job.id))["summary"]
    assert summary is not None
    held = (done.ended_at - done.started_at) * 2
    assert summary["gpu_hours"] * 3600 == pytest.approx(held, abs=0.4)
    assert summary["mean_vram"] == GIB  # (the time without a reading is out of the mean)


async def test_a_cpu_job_has_no_usage_and_an_unknown_id_is_named(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    import pytest

    from gpulayer_tui.engine.errors import UnknownJob

    engine = await _engine(make_engine)
    job = await engine.submit({"command": ["true"]})
    await engine.wait(job.id, timeout=10)
    assert await engine.usage_of(job.id) == {"job": job.id, "summary": None, "series": []}
    with pytest.raises(UnknownJob):
        await engine.usage_of(9999)


async def test_a_job_idle_past_the_policy_is_warned(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    gpu1 = fake_nvml.devices[1]
    gpu1.utilization = 1
    config = make_config(policy={"idle_after": 1, "idle_below": 5})
    engine = await make_engine(
        probe=NvmlProbe(energy_interval=0), config=config
    )  # ticks every 0.2 s
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu1"})
    gpu1.compute = [(job.pid or 0, GIB)]
    live = await eventually(lambda: engine.book.live(job.id), timeout=5)
    await eventually(lambda: live.job.message.startswith("idle:"), timeout=10)
    assert "[policy] idle_after = 1 s" in live.job.message
    assert live.job.status is JobStatus.RUNNING  # "warn" leaves it running
    events = await engine.events_of(job.id)
    assert [e for e in events if e["kind"] == "job.idle"]
    summary = (await engine.usage_of(job.id))["summary"]
    assert summary is not None and (summary["idle_warning"] or "").startswith("idle:")


async def test_a_job_idle_past_the_policy_is_stopped_when_asked(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    gpu1 = fake_nvml.devices[1]
    gpu1.utilization = 0
    config = make_config(policy={"idle_after": 1, "idle_action": "stop"})
    engine = await make_engine(probe=NvmlProbe(energy_interval=0), config=config)
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu1"})
    gpu1.compute = [(job.pid or 0, GIB)]
    done = await engine.wait(job.id, timeout=20)
    assert done.status is JobStatus.CANCELLED
    assert done.message.startswith("stopped by [policy]: idle:")


async def test_a_busy_job_is_never_warned(make_engine: EngineFactory, fake_nvml: FakeNvml) -> None:
    gpu1 = fake_nvml.devices[1]
    gpu1.utilization = 60
    config = make_config(policy={"idle_after": 1})
    engine = await make_engine(probe=NvmlProbe(energy_interval=0), config=config)
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu1"})
    gpu1.compute = [(job.pid or 0, GIB)]
    # Past the idle time, by the engine's own ticks: no warning.
    await eventually(
        lambda: (u := engine.usage.live(job.id)) is not None and u.gpu_seconds > 1.5, timeout=10
    )
    usage = engine.usage.live(job.id)
    assert usage is not None and usage.idle_warning is None
    await asyncio.sleep(0)


# -- the CLI, against a real --serve --------------------------------------------------------


def test_a_young_jobs_energy_never_goes_back_at_an_engine_sigkill(served: Served) -> None:
    # Younger than a save's interval, it had no record to take back: its energy restarted
    # from 0 (1.809 Wh read 0.226 after) while its GPU-seconds went on (tester h109).
    # Its time unobserved is now booked at the power read since, estimated.
    import json

    served.home.mkdir(mode=0o700, exist_ok=True)
    (served.home / "config.toml").write_text("[engine]\nsample_interval = 0.1\n")
    served.start("--simulate", "1xA100-80GB")
    job_id = served.cli("submit", "--gpus", "1", "--", "sleep", "600").stdout.strip()

    def usage() -> dict[str, Any]:
        answer = served.cli("status", job_id, "--json")
        return json.loads(answer.stdout)["job"].get("usage") or {}

    before = wait_for(lambda: (u := usage()).get("samples", 0) >= 10 and u, timeout=20)
    assert before["energy_wh"] > 0 and before["gpu_hours"] > 0
    assert served.proc is not None
    served.proc.kill()  # (SIGKILL: nothing more is saved)
    served.proc.wait(timeout=10)
    served.start("--simulate", "1xA100-80GB")
    # Booked at the power read since, its mean power stays what it was (unbooked, its
    # energy restarted from 0 while its GPU-hours went on: half of it, or far less).
    power = before["energy_wh"] / before["gpu_hours"]
    after = wait_for(lambda: (u := usage()).get("samples", 0) >= before["samples"] + 5 and u)
    assert after["energy_wh"] / after["gpu_hours"] > power / 2, (before, after)
    assert after["energy_wh"] >= before["energy_wh"], (before, after)


def test_status_shows_usage_plots_it_and_submit_like_takes_the_advice(served: Served) -> None:
    import json

    from gpulayer_tui.engine.simulate import SimLedger

    served.home.mkdir(mode=0o700, exist_ok=True)
    # (only the ledger puts memory on the GPU: a simulated job's own 40 GiB, sampled
    # before the ledger's 6 GiB is written, would be its peak)
    (served.home / "config.toml").write_text(
        "[engine]\nsample_interval = 0.1\n[simulate]\njobs = false\n"
    )
    served.start("--simulate", "1xA100-80GB")
    job = served.cli("submit", "--gpus", "1", "--vram-gb", "40", "--", "sleep", "60")
    job_id = job.stdout.strip()
    pid = json.loads(served.cli("status", job_id, "--json").stdout)["job"]["pid"]
    SimLedger(served.home).hold(0, pid, 6.0)

    def seen() -> bool:
        usage = json.loads(served.cli("status", job_id, "--json").stdout)["job"].get("usage")
        return bool(usage and usage["samples"] >= 3 and usage["peak_vram"] == 6 * GIB)

    wait_for(seen, timeout=20)
    text = served.cli("status", job_id).stdout
    assert "GPU memory  peak 6.0 GiB" in text
    assert "declared 40 GiB per GPU but held at most 6 GiB; vram_gb = 7 would do" in text
    plot = served.cli("status", job_id, "--plot").stdout
    assert "GPU #0" in plot and "VRAM" in plot and "peak 6.0 GiB" in plot
    assert any(ch in plot for ch in "▁▂▃▄▅▆▇█")

    assert served.cli("cancel", job_id).returncode == 0
    served.cli("wait", job_id)
    again = served.cli("submit", "--like", job_id, "--name", "rerun", "--", "true")
    assert again.returncode == 0, again.stderr
    assert f"vram_gb 40 -> 7: job {job_id} held at most 6.0 GiB per GPU" in again.stderr
    new = json.loads(served.cli("status", again.stdout.strip(), "--json").stdout)["job"]
    assert new["spec"]["vram_gb"] == 7 and new["spec"]["command"] == ["true"]
    assert new["name"] == "rerun" and new["spec"]["gpus"] == 1
    usage = json.loads(served.cli("status", "999", "--json").stdout or "{}")
    # (an unknown id: the error as a document, as on stderr: tester h178)
    assert usage == {"error": "no job 999", "id": 999}
    assert "999" in served.cli("status", "999", "--plot").stderr
    # A job with no usage recorded (a CPU job here; a GPU job that ends before its GPU is
    # first sampled reads the same): the sentence allows for both.
    quick = served.cli("submit", "--gpus", "0", "--", "true").stdout.strip()
    served.cli("wait", quick)
    plot = served.cli("status", quick, "--plot").stdout
    assert (
        f"job {quick}: no GPU usage recorded (it held no GPU, or ended before its GPUs "
        "were first sampled)"
    ) in plot
    # A waiting job is told it has not started (it was told the above: tester h182 #2).
    blocker = served.cli("submit", "--gpus", "0", "--", "sleep", "600").stdout.strip()
    waiting = served.cli("submit", "--after", blocker, "--", "true").stdout.strip()
    plot = served.cli("status", waiting, "--plot").stdout
    assert f"job {waiting}: not started yet: no GPU usage to plot" in plot, plot
    assert served.cli("cancel", blocker).returncode == 0


async def test_metrics_show_what_running_jobs_use(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    from gpulayer_tui.engine.metrics import render

    gpu0 = fake_nvml.devices[0]
    gpu0.compute, gpu0.energy_mj, gpu0.utilization = [], 0, 0
    engine = await _engine(make_engine)
    job = await engine.submit(
        {"name": 'a "quoted" name', "command": ["sleep", "60"], "gpus": 1, "domain": "gpu0"}
    )
    gpu0.compute = [(job.pid or 0, 3 * GIB)]
    await engine.sampler.sample_once()
    gpu0.energy_mj = 7_200_000
    await engine.sampler.sample_once()
    body = (await render(engine)).decode()
    # (job_id and job_name, not job: Prometheus' own label, renamed exported_job: h153)
    label = f'job_id="{job.id}",job_name="a \\"quoted\\" name"'
    assert f"gpulayer_job_energy_joules_total{{{label}}} 7200.0" in body
    assert f"gpulayer_job_vram_peak_bytes{{{label}}} 3.221225472e+09" in body
    usage = engine.usage.live(job.id)
    assert usage is not None
    from prometheus_client.utils import floatToGoString

    idle = floatToGoString(usage.idle_seconds)
    assert usage.idle_seconds > 0  # 0 % utilisation: all its time was idle
    assert f"gpulayer_job_idle_seconds_total{{{label}}} {idle}" in body
    await engine.cancel(job.id)
    await engine.wait(job.id, timeout=10)
    assert f'job_id="{job.id}"' not in (await render(engine)).decode()  # running jobs only


async def _ticks(engine: Engine, count: int) -> None:
    for _ in range(count):
        await engine.sampler.sample_once()
        await asyncio.sleep(0.02)  # (ticks a little apart: each books some seconds)


async def test_a_service_placed_again_keeps_its_usage_across_the_move_and_a_restart(
    make_engine: EngineFactory,
) -> None:
    # After a move its mean VRAM read above its peak (the GPU it left was booked VRAM
    # for a last interval whose seconds it was not booked); and an engine restarted while
    # it waited to be placed again dropped all it had used.
    from gpulayer_tui.engine.simulate import SimLedger

    config = make_config(engine={"sample_interval": 3600}, usage={"point_interval": 0})
    engine = await make_engine("2xA100-80GB", config=config)
    service = await engine.submit(
        {"kind": "service", "command": ["sleep", "600"], "gpus": 1, "port": False}
    )
    # (a --no-port replica is "up" as it is asked for: its pid comes a moment later)
    pid = await eventually(lambda: engine.book.get(service.id).job.replicas[0].pid)
    ledger = SimLedger(engine.paths.state_dir)
    act = engine.book.get(service.id)
    first_gpu = act.job.gpus[0]
    ledger.hold(first_gpu, pid, 1.0)
    await _ticks(engine, 6)
    before = engine.usage.live(service.id).summary()  # type: ignore[union-attr]
    ledger.set_gpu(first_gpu, lost=True, error="GPU is lost")
    await engine.sampler.sample_once()
    await eventually(
        lambda: (
            (a := engine.book.get(service.id)) is not None
            and a.job.gpus not in ([], [first_gpu])
            and a.job.replicas[0].pid not in (None, pid)
        ),
        timeout=20,
    )
    act = engine.book.get(service.id)
    ledger.hold(act.job.gpus[0], act.job.replicas[0].pid or 0, 1.0)
    await _ticks(engine, 3)
    moved = engine.usage.live(service.id).summary()  # type: ignore[union-attr]
    assert moved["samples"] > before["samples"] and moved["gpu_hours"] >= before["gpu_hours"]
    assert moved["seconds"] >= before["seconds"] >= 0
    assert moved["mean_vram"] <= moved["peak_vram"] == GIB
    # Both GPUs lost: it waits to be placed again, and the engine restarts meanwhile.
    ledger.set_gpu(act.job.gpus[0], lost=True, error="GPU is lost")
    await engine.sampler.sample_once()
    await eventually(lambda: engine.book.get(service.id).job.status is JobStatus.QUEUED, timeout=20)
    waiting = engine.usage.live(service.id).summary()  # type: ignore[union-attr]
    # (waiting, on no GPU: its span read 0 - first_at, "-1796203134.6 s")
    assert waiting["seconds"] >= moved["seconds"]
    await engine.stop()
    again = await make_engine("2xA100-80GB", config=config)
    kept = again.usage.live(service.id)
    assert kept is not None  # (it was gone: its next placement started from nothing)
    assert kept.summary()["samples"] == waiting["samples"] >= moved["samples"]
    await again.cancel(service.id)


def test_an_older_jobs_energy_never_reads_less_right_after_an_engine_sigkill(
    served: Served,
) -> None:
    # The saved record alone was served until the first sample: less than before the
    # kill, which a Prometheus counter takes for a reset, counting the whole job's
    # energy again (tester h113). Its time since the record is booked as it starts.
    import json

    served.home.mkdir(mode=0o700, exist_ok=True)
    (served.home / "config.toml").write_text(
        "[engine]\nsample_interval = 1\n[usage]\nsave_interval = 4\npoint_interval = 1\n"
    )
    served.start("--simulate", "1xA100-80GB")
    job_id = served.cli("submit", "--gpus", "1", "--", "sleep", "600").stdout.strip()

    def usage() -> dict[str, Any]:
        answer = served.cli("status", job_id, "--json")
        return json.loads(answer.stdout)["job"].get("usage") or {}

    wait_for(lambda: usage().get("samples", 0) >= 7, timeout=30)  # (saved once at least)
    before = usage()
    assert served.proc is not None
    served.proc.kill()
    served.proc.wait(timeout=10)
    served.start("--simulate", "1xA100-80GB")
    first = usage()  # (as soon as it answers: its record, and the time since)
    assert first["energy_wh"] >= before["energy_wh"], (before, first)
    assert first["gpu_hours"] >= before["gpu_hours"], (before, first)


def test_a_job_that_ended_between_two_readings_says_it_was_not_read() -> None:
    # "util ?" and "energy 0 Wh" (not marked estimated) read as measured for a job that
    # ended before its GPUs were next sampled (tester h156).
    from gpulayer_tui.formatting import usage_lines

    summary: dict[str, Any] = {
        "gpus": [0],
        "samples": 0,
        "gpu_hours": 0.0003,
        "peak_vram": None,
        "mean_vram": None,
        "util_mean": None,
        "util_p95": None,
        "mem_util_mean": None,
        "energy_wh": None,
        "energy_estimated": False,
        "idle_share": None,
        "shared": False,
        "advice": None,
        "idle_warning": None,
    }
    assert usage_lines(summary) == [  # type: ignore[arg-type]
        (
            "GPU use",
            "not read: it ended before its GPUs were next sampled ([engine] sample_interval) (#0)",
        ),
        ("energy", "not measured, 1.1 GPU-seconds held"),
    ]
    # Not ended: not read yet ("it ended before ..." of a job just started: tester h163).
    assert usage_lines(summary, active=True) == [  # type: ignore[arg-type]
        ("GPU use", "not read yet: its GPUs are read every [engine] sample_interval (#0)")
    ]
    read = dict(summary, samples=1, util_mean=55.0, energy_wh=0.011, peak_vram=GIB, mean_vram=GIB)
    said = dict(usage_lines(read))  # type: ignore[arg-type]
    assert said["GPU use"].startswith("util mean 55%") and said["energy"].startswith("0.011 Wh")
    # GPU time under a thousandth of an hour in GPU-seconds ("0.000 GPU-hours held" of a
    # half-second job read as nothing held: tester h180).
    from gpulayer_tui.formatting import gpu_time

    assert gpu_time(0.5) == "0.500 GPU-hours" and gpu_time(0.0) == "0.000 GPU-hours"
    assert gpu_time(0.0002) == "0.7 GPU-seconds"
    # Always to the Wh's thousandth, as stored ("0.78 Wh" beside "14.943 Wh": h176 #8).
    said = dict(usage_lines(dict(read, energy_wh=0.78)))  # type: ignore[arg-type]
    assert said["energy"].startswith("0.780 Wh")


async def test_a_gpu_job_no_reading_saw_has_a_record_of_the_gpus_it_held(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # Started and ended between two readings, a GPU job had no usage at all (status, the
    # API and the TUI each said so differently) while one read once said "not read" with
    # the GPU-hours it held (tester h176 #1).
    engine = await _engine(make_engine)
    job = await engine.submit({"command": ["sleep", "0.3"], "gpus": 2})
    done = await engine.wait(job.id, timeout=10)
    assert done.started_at is not None and done.ended_at is not None
    usage = await engine.usage_of(job.id)
    summary = usage["summary"]
    assert summary is not None and usage["series"] == []
    assert summary["samples"] == 0 and summary["gpus"] == sorted(done.gpus)
    held = (done.ended_at - done.started_at) * 2
    assert summary["gpu_hours"] == round(held / 3600, 4)
    # What was never read is null, not 0 ("held 0 GiB, used 0 Wh": tester h180 #4), in the
    # record, in the row a table shows, and in the panel's line.
    assert summary["util_mean"] is None and summary["energy_wh"] is None
    assert summary["peak_vram"] is None and summary["mean_vram"] is None
    rows = [row async for chunk in engine.job_rows(_query()) for row in chunk]
    row = next(r for r in rows if r["id"] == job.id)
    assert row["use"] == {"peak_vram": None, "util_mean": None, "energy_wh": None}
    from gpulayer_tui.widgets.job_columns import use_texts
    from gpulayer_tui.widgets.usage_panel import collapsed_line

    assert use_texts(row) == ("", "", "")
    # Its plot says so (an empty line was printed: tester h187 #2).
    from gpulayer_tui.formatting import usage_plot

    gpus = ", ".join(f"#{g}" for g in sorted(done.gpus))
    assert usage_plot(usage, 60, "completed").startswith(
        f"job {job.id}: no GPU usage read: it ended before its GPUs ({gpus}) were first sampled ("
    ), usage_plot(usage, 60, "completed")
    assert collapsed_line(summary, active=False).plain == (
        "GPU usage  not read: it ended before its GPUs were sampled"
    )


async def test_a_gpu_job_whose_launch_failed_has_no_usage(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # It never ran: "not read: it ended before its GPUs were next sampled" was said of it
    # (tester h180).
    engine = await _engine(make_engine)
    job = await engine.submit({"command": ["/nonexistent/program"], "gpus": 1})
    done = await engine.wait(job.id, timeout=10)
    assert done.termination_reason is not None and done.termination_reason.value == "launch_failed"
    assert (await engine.usage_of(job.id))["summary"] is None


async def test_the_time_before_a_jobs_first_reading_is_not_said_as_no_engine_running(
    make_engine: EngineFactory, fake_nvml: FakeNvml
) -> None:
    # Every job holds its GPU a while before its first reading and after its last; that
    # time is booked as held with no reading, and was said as "no readings for 1s while
    # no engine ran" of every short job, the engine up all along (tester h182 #1).
    from gpulayer_tui.formatting import unobserved_note, usage_plot

    gpu0 = fake_nvml.devices[0]
    engine = await _engine(make_engine)
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu0"})
    assert job.status is JobStatus.RUNNING and job.pid and job.started_at
    gpu0.compute = [(job.pid, 2 * GIB)]
    started = job.started_at
    await eventually(lambda: time.time() - started >= 1.5, timeout=10)
    await engine.sampler.sample_once()  # its first reading, 1.5 s after its start
    await engine.cancel(job.id)
    await engine.wait(job.id, timeout=20)
    usage = await engine.usage_of(job.id)
    totals = usage["totals"]
    assert totals["unobserved_seconds"] >= 1.5  # (held, no reading: out of the means)
    assert totals["offline_seconds"] == 0
    assert unobserved_note(usage) == ""
    assert "no readings kept" not in usage_plot(usage)
