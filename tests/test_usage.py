"""Per-job GPU usage (issue 17): series, summaries, energy, right-sizing, idle warnings.

The engine runs for real over the fake NVML (only pynvml is faked); the sampler's own
loop is slowed to an hour so each test takes its ticks itself (``sample_once``) and the
figures are exact.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from gpulayer_tui.engine.gpus import GIB
from gpulayer_tui.engine.models import JobStatus
from gpulayer_tui.engine.nvml import NvmlProbe
from gpulayer_tui.engine.usage import GpuSeries, JobUsage, suggest_vram_gb

from .conftest import EngineFactory, Served, eventually, make_config, wait_for

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


def test_the_summary_reports_p95_idle_share_and_advice() -> None:
    usage = JobUsage(7, declared_vram=40 * GIB, max_points=100)
    utils = [0] * 10 + [90] * 90  # 10 % of the time idle
    for tick, util in enumerate(utils):
        usage.observe(float(tick), 1.0, 0, 8 * GIB, util, 30, 200.0, 200.0, True, 5)
        usage.samples += 1
    summary = usage.summary()
    assert summary["util_p95"] == 90
    assert summary["util_mean"] == 81.0
    assert summary["idle_share"] == 0.1
    assert summary["gpu_hours"] == round(100 / 3600, 4)
    assert summary["energy_wh"] == round(200 * 100 / 3600, 3) and summary["energy_estimated"]
    assert summary["peak_vram"] == summary["mean_vram"] == 8 * GIB
    assert summary["suggest_vram_gb"] == suggest_vram_gb(8 * GIB) == 9.5
    assert summary["advice"] is not None and "declared 40 GiB" in summary["advice"]
    assert "vram_gb = 9.5" in summary["advice"]


def test_advice_says_when_a_job_held_more_than_it_declared_or_declared_nothing() -> None:
    under = JobUsage(1, declared_vram=8 * GIB, max_points=10)
    unsaid = JobUsage(2, declared_vram=None, max_points=10)
    fitting = JobUsage(3, declared_vram=10 * GIB, max_points=10)
    for usage in (under, unsaid, fitting):
        for tick in range(3):
            usage.observe(float(tick), 1.0, 0, 9 * GIB, 50, None, None, 0.0, True, 5)
            usage.samples += 1
    assert "more than the 8 GiB declared" in (under.summary()["advice"] or "")
    assert "declare vram_gb = 10.5 so it can share" in (unsaid.summary()["advice"] or "")
    assert fitting.summary()["advice"] is None  # 10 declared for 9 held: right-sized


def test_no_advice_from_a_job_seen_once() -> None:
    usage = JobUsage(1, declared_vram=80 * GIB, max_points=10)
    usage.observe(0.0, 0.0, 0, GIB, 50, None, None, 0.0, True, 5)
    usage.samples += 1
    assert usage.summary()["advice"] is None


# -- through the engine, over the fake NVML --------------------------------------------------


async def _engine(make_engine: EngineFactory, **sections: object) -> Engine:
    config = make_config(engine={"sample_interval": 3600}, **sections)
    return await make_engine(probe=NvmlProbe(), config=config)


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

    live = await engine.usage_of(job.id)
    summary = live["summary"]
    assert summary is not None
    assert summary["gpus"] == [0] and summary["samples"] == 3
    assert summary["peak_vram"] == 12 * GIB
    assert summary["energy_wh"] == 1.5 and summary["energy_estimated"] is False
    assert summary["shared"] is False
    assert summary["suggest_vram_gb"] == 14.0 and "vram_gb = 14" in (summary["advice"] or "")
    (series,) = live["series"]
    assert series["vram_mib"] == [8 * 1024, 12 * 1024, 4 * 1024]
    assert series["util"] == [50, 100, 0] and series["mem_util"] == [20, 20, 20]
    detail, _ = await engine.job_detail(job.id)
    assert detail["usage"] == summary  # the whole job carries it while it runs

    await engine.cancel(job.id)
    await engine.wait(job.id, timeout=10)
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


def _query():  # type: ignore[no-untyped-def]
    from gpulayer_tui.engine.models import JobQuery

    return JobQuery(limit=100)


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
    assert (await engine.usage_of(job.id))["summary"]["samples"] == 60  # type: ignore[index]


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
    await again.sampler.sample_once()
    summary = (await again.usage_of(job.id))["summary"]
    assert summary is not None and summary["samples"] == 4 and summary["peak_vram"] == 6 * GIB


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
    engine = await make_engine(probe=NvmlProbe(), config=config)  # ticks every 0.2 s
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
    engine = await make_engine(probe=NvmlProbe(), config=config)
    job = await engine.submit({"command": ["sleep", "60"], "gpus": 1, "domain": "gpu1"})
    gpu1.compute = [(job.pid or 0, GIB)]
    done = await engine.wait(job.id, timeout=20)
    assert done.status is JobStatus.CANCELLED
    assert done.message.startswith("stopped by [policy]: idle:")


async def test_a_busy_job_is_never_warned(make_engine: EngineFactory, fake_nvml: FakeNvml) -> None:
    gpu1 = fake_nvml.devices[1]
    gpu1.utilization = 60
    config = make_config(policy={"idle_after": 1})
    engine = await make_engine(probe=NvmlProbe(), config=config)
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


def test_status_shows_usage_plots_it_and_submit_like_takes_the_advice(served: Served) -> None:
    import json

    from gpulayer_tui.engine.simulate import SimLedger

    served.home.mkdir(mode=0o700, exist_ok=True)
    (served.home / "config.toml").write_text("[engine]\nsample_interval = 0.1\n")
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
    assert usage == {}  # (an unknown id: nothing on stdout, the error on stderr)
    assert "999" in served.cli("status", "999", "--plot").stderr


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
    label = f'job="{job.id}:a \\"quoted\\" name"'
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
    assert f'job="{job.id}:' not in (await render(engine)).decode()  # running jobs only
