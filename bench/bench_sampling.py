"""Sampling benchmark: what watching 8 GPUs costs, and what an idle engine costs.

* **Cost per tick** of :meth:`Sampler.sample_once` for 8 GPUs: with the fake NVML
  (``tests/fake_nvml.py``: the real ``NvmlProbe`` code over pynvml functions that answer
  from a table; each GPU lists 2 processes that exist, so the /proc attribution runs too),
  with the simulated backend, and with the real driver when one is present. Wall and CPU
  (``time.process_time``: every thread of this process) per tick.
* **Per-job usage series** (issue 17): an in-process engine over the fake NVML with 8 GPUs
  and 50 running jobs (each a real ``sleep`` whose pid the fake lists with memory): engine
  CPU per tick (``sample_once`` and everything the engine does with the sample) with
  ``[usage] series`` on and off, in alternating blocks of the same run (target: under 5 %
  more), plus the recorder's own time per tick.
* **Engine idle**: ``--serve --simulate 8xA100-80GB`` sampling every 1 s with 1,000
  finished jobs in history and nobody attached: CPU over a window as a percentage of one
  core, and RSS (targets: under 1 % of a core, under 80 MiB).

Never fails on speed; exits non-zero only if the server does not start or jobs fail.

Usage::

    python bench/bench_sampling.py [--ticks 200] [--idle-seconds 30] [--jobs 1000]
    python bench/bench_sampling.py --quick      # 30 ticks, 3 s window, 100 jobs (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import common
from common import BenchFailure, check_jobs, machine, serving, temp_home, wait_all

GPUS = 8
CPU_TARGET_PCT = 1.0
RSS_TARGET_MIB = 80.0


# -- cost per tick --------------------------------------------------------------------------


async def tick_cost(probe: Any, ticks: int) -> dict[str, float]:
    """Wall and CPU per :meth:`Sampler.sample_once` over ``ticks`` ticks (after 3 warm-up)."""
    from gpulayer_tui.engine.sampler import Sampler

    pids = [os.getpid(), os.getppid()]
    roots = {pids[0]: (1, None)}  # this process "is" job 1: attribution finds an owner
    seen: list[Any] = []
    sampler = Sampler(probe, 1.0, 5.0, 60, lambda: dict(roots), seen.append)
    for _ in range(3):
        await sampler.sample_once()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(ticks):
        await sampler.sample_once()
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    last = seen[-1].result
    if len(last.gpus) != GPUS or any(g.failed for g in last.gpus):
        raise BenchFailure(f"sampling: expected {GPUS} good readings, got {last.gpus!r}")
    await sampler.stop()
    return {"ticks": ticks, "wall_ms": 1000 * wall / ticks, "cpu_ms": 1000 * cpu / ticks}


def fake_nvml_probe() -> tuple[Any, Any]:
    """An ``NvmlProbe`` over :class:`FakeNvml` with 8 GPUs, 2 live processes each."""
    import pytest

    from gpulayer_tui.engine.nvml import NvmlProbe
    from tests.fake_nvml import GIB, FakeDevice, FakeNvml

    pids = [os.getpid(), os.getppid()]
    devices = [
        FakeDevice(
            uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
            name="NVIDIA A100-SXM4-80GB",
            memory_total=80 * GIB,
            memory_used=20 * GIB,
            utilization=50,
            compute=[(pids[0], 10 * GIB), (pids[1], 9 * GIB)],
        )
        for i in range(GPUS)
    ]
    fake = FakeNvml(devices)
    patch = pytest.MonkeyPatch()
    fake.install(patch)
    return NvmlProbe(), patch


async def tick_costs(ticks: int, state_dir: Path) -> dict[str, Any]:
    """Per-tick cost for each backend available here."""
    from gpulayer_tui.engine.simulate import SimulatedProbe, parse_simulate_spec

    out: dict[str, Any] = {}
    probe, patch = fake_nvml_probe()
    try:
        out["fake_nvml"] = await tick_cost(probe, ticks)
    finally:
        patch.undo()
    sim = SimulatedProbe(parse_simulate_spec(f"{GPUS}xA100-80GB"), state_dir)
    out["simulated"] = await tick_cost(sim, ticks)
    out["real_nvml"] = await real_nvml(ticks)
    return out


async def real_nvml(ticks: int) -> dict[str, Any]:
    """The real driver's cost per tick, or why it was not measured."""
    from gpulayer_tui.engine.gpus import ProbeStatus
    from gpulayer_tui.engine.nvml import NvmlProbe

    probe = NvmlProbe()
    inventory = probe.inventory()
    if inventory.status is not ProbeStatus.OK or not inventory.device_count:
        probe.close()
        return {"skipped": inventory.message or "no NVIDIA GPU on this machine"}
    global GPUS
    saved, GPUS = GPUS, inventory.device_count
    try:
        return await tick_cost(probe, ticks) | {"gpus": GPUS}
    finally:
        GPUS = saved


# -- per-job usage series ---------------------------------------------------------------------

USAGE_JOBS = 50
USAGE_TARGET_PCT = 5.0


async def usage_cost(ticks: int, state_dir: Path) -> dict[str, Any]:
    """Engine CPU per tick with the per-job series on and off (8 GPUs, 50 running jobs)."""
    import pytest

    from gpulayer_tui.engine.config import UsageSettings, parse_config
    from gpulayer_tui.engine.engine import Engine
    from gpulayer_tui.engine.nvml import NvmlProbe
    from gpulayer_tui.engine.paths import Paths
    from tests.fake_nvml import GIB, FakeDevice, FakeNvml

    devices = [
        FakeDevice(
            uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
            name="NVIDIA A100-SXM4-80GB",
            memory_total=80 * GIB,
            memory_used=0,
            utilization=50,
            energy_mj=0,
        )
        for i in range(GPUS)
    ]
    patch = pytest.MonkeyPatch()
    FakeNvml(devices).install(patch)
    home = state_dir / "usage"
    config = parse_config(
        {
            "engine": {"sample_interval": 3600, "grace_period": 1.0},
            "domains": {f"gpu{i}": {"gpu": i, "slots": 8} for i in range(GPUS)},
        }
    )
    engine = Engine(Paths(home, home / "config.toml"), probe=NvmlProbe(), config=config)
    await engine.start()
    try:
        jobs = await engine.submit_many(
            [
                {"command": ["sleep", "600"], "gpus": 1, "domain": f"gpu{i % GPUS}"}
                for i in range(USAGE_JOBS)
            ]
        )
        if any(j.status.value != "running" or not j.pid for j in jobs):
            raise BenchFailure("usage: not every job started")
        for job in jobs:
            device = devices[job.gpus[0]]
            device.compute.append((job.pid or 0, GIB))
            device.memory_used += GIB
        # Ticks here come back to back, not 1 s apart: the default point interval (5 s:
        # a point every 5th tick at 1 s sampling) is scaled to this run's tick spacing.
        t0 = time.perf_counter()
        for _ in range(10):
            await engine.sampler.sample_once()
        spacing = (time.perf_counter() - t0) / 10
        on = UsageSettings(point_interval=5 * spacing * 0.99)
        every = UsageSettings(point_interval=0)  # the worst case: a series point each tick
        # "off" skips the recorder as ``series = false`` does, without dropping its state
        # (switching it off for real would make each "on" block start every job afresh).
        modes = {"on": on, "off": on, "every": every}
        policy = engine.config.policy
        observe = engine.usage.observe
        spent = [0.0]

        skip = [False]

        def timed(at: float, domains: Any) -> None:
            if skip[0]:
                return
            t0 = time.perf_counter()
            observe(at, domains)
            spent[0] += time.perf_counter() - t0

        engine.usage.observe = timed  # type: ignore[method-assign]
        cpu = dict.fromkeys(modes, 0.0)
        done = dict.fromkeys(modes, 0)
        block = max(5, ticks // 10)
        for _ in range(3):
            await engine.sampler.sample_once()
        order = ("on", "off", "every", "off")
        for round_ in range(len(order) * max(1, ticks // block // 2)):
            mode = order[round_ % len(order)]
            engine.usage.reconfigure(modes[mode], policy)
            skip[0] = mode == "off"
            for device in devices:
                device.energy_mj = (device.energy_mj or 0) + 250_000
            c0 = time.process_time()
            for _ in range(block):
                await engine.sampler.sample_once()
            cpu[mode] += time.process_time() - c0
            done[mode] += block
        engine.usage.reconfigure(on, policy)
        skip[0] = False
        await engine.sampler.sample_once()
        watched = len(engine.usage.running())
        spent[0] = 0.0  # (the recorder's own time: default settings, measured below)
        c_on = 0
        for _ in range(block):
            await engine.sampler.sample_once()
            c_on += 1
        if watched != USAGE_JOBS:
            raise BenchFailure(f"usage: {watched} of {USAGE_JOBS} jobs have a series")
        for job in jobs:
            await engine.cancel(job.id)
        for job in jobs:
            await engine.wait(job.id, timeout=30)
    finally:
        await engine.stop()
        patch.undo()
    on_ms = 1000 * cpu["on"] / done["on"]
    off_ms = 1000 * cpu["off"] / done["off"]
    every_ms = 1000 * cpu["every"] / done["every"]
    return {
        "jobs": USAGE_JOBS,
        "ticks": sum(done.values()),
        "cpu_ms_on": on_ms,
        "cpu_ms_off": off_ms,
        "cpu_ms_every": every_ms,
        "more_pct": 100.0 * (on_ms - off_ms) / off_ms,
        "every_more_pct": 100.0 * (every_ms - off_ms) / off_ms,
        "observe_ms": 1000 * spent[0] / c_on,
    }


# -- engine idle ------------------------------------------------------------------------------


def engine_idle(jobs: int, seconds: float) -> dict[str, Any]:
    """CPU % of a core and RSS of an idle ``--serve`` with 8 simulated GPUs."""
    config = "[engine]\nsample_interval = 1.0\n[cpu]\nslots = 2\n"
    with temp_home("idle") as tmp, serving(tmp / "home", f"{GPUS}xA100-80GB", config) as srv:
        ids = [j["id"] for j in srv.client.submit_many([{"command": ["true"]}] * jobs)]
        check_jobs("idle: history jobs", wait_all(srv.client, ids), jobs)
        time.sleep(2.0)  # settle: the last commits, the first ticks after the burst
        pid = srv.proc.pid
        c0, t0 = common.proc_cpu(pid)[0], time.monotonic()
        rss = [common.proc_rss_mib(pid)]
        while time.monotonic() - t0 < seconds:
            time.sleep(min(1.0, seconds))
            rss.append(common.proc_rss_mib(pid))
        cpu, wall = common.proc_cpu(pid)[0] - c0, time.monotonic() - t0
    return {
        "jobs": jobs,
        "window_s": wall,
        "cpu_pct": 100.0 * cpu / wall,
        "rss_mib_max": max(rss),
        "rss_mib_end": rss[-1],
    }


# -- report ----------------------------------------------------------------------------------


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Target verdicts."""
    idle, usage = r["idle"], r["usage"]
    return [
        {
            "target": f"per-job usage series: < {USAGE_TARGET_PCT:g} % more engine CPU per "
            f"tick ({GPUS} GPUs, {usage['jobs']} running jobs, default settings)",
            "value": f"{usage['more_pct']:+.1f} % ({usage['cpu_ms_off']:.2f} -> "
            f"{usage['cpu_ms_on']:.2f} ms)",
            "met": usage["more_pct"] < USAGE_TARGET_PCT,
        },
        {
            "target": f"idle engine CPU < {CPU_TARGET_PCT:g} % of a core "
            f"(8 simulated GPUs, {idle['jobs']:,} jobs, 1 s interval)",
            "value": f"{idle['cpu_pct']:.2f} %",
            "met": idle["cpu_pct"] < CPU_TARGET_PCT,
        },
        {
            "target": f"idle engine RSS < {RSS_TARGET_MIB:g} MiB",
            "value": f"{idle['rss_mib_max']:.1f} MiB",
            "met": idle["rss_mib_max"] < RSS_TARGET_MIB,
        },
    ]


def render(r: dict[str, Any]) -> str:
    """The Markdown report."""
    t, idle = r["ticks"], r["idle"]
    lines = [
        "# Sampling: cost per tick and the idle engine",
        "",
        f"Command: `{r['command']}`",
        "",
        common.machine_line(r["machine"]) + f" Run took {r['elapsed_s']:.1f} s.",
        "",
        "| backend | GPUs | ticks | wall ms/tick | CPU ms/tick |",
        "|---|---:|---:|---:|---:|",
    ]
    names = {
        "fake_nvml": "fake NVML (`NvmlProbe` over `tests/fake_nvml.py`)",
        "simulated": "simulated (`--simulate 8xA100-80GB`)",
        "real_nvml": "real NVML",
    }
    for key, label in names.items():
        fig = t[key]
        if "skipped" in fig:
            lines.append(f"| {label} | - | - | not measured: {fig['skipped']} | |")
            continue
        gpus = fig.get("gpus", GPUS)
        lines.append(
            f"| {label} | {gpus} | {fig['ticks']} | {fig['wall_ms']:.2f} | {fig['cpu_ms']:.2f} |"
        )
    lines += [
        "",
        "A tick reads the inventory, then every GPU in turn in one daemon thread, each under "
        "its own deadline (plus the /proc look-ups that attribute each GPU process to a job), "
        "and hands the sample over.",
        "",
        f"Per-job usage series (issue 17): an in-process engine over the fake NVML, {GPUS} "
        f"GPUs, {r['usage']['jobs']} running jobs listed with memory, {r['usage']['ticks']} "
        "ticks in alternating blocks: engine CPU per tick "
        f"**{r['usage']['cpu_ms_off']:.2f} ms** with `[usage] series = false`, "
        f"**{r['usage']['cpu_ms_on']:.2f} ms** with it on ({r['usage']['more_pct']:+.1f} %; "
        "a series point every 5th tick, as 5 s points at 1 s sampling give), "
        f"**{r['usage']['cpu_ms_every']:.2f} ms** with a point every tick "
        f"({r['usage']['every_more_pct']:+.1f} %, the worst case); "
        f"the recorder itself {r['usage']['observe_ms']:.3f} ms per tick. Per-job work "
        "happens only when a job comes, goes or changes its VRAM, and at series points: "
        "each GPU keeps running sums and a job's figures are the difference since it came.",
        "",
        f"Idle engine: `--serve --simulate {GPUS}xA100-80GB`, 1 s sampling, "
        f"{idle['jobs']:,} finished jobs, nobody attached, {idle['window_s']:.0f} s window: "
        f"**{idle['cpu_pct']:.2f} % of a core**, RSS max **{idle['rss_mib_max']:.1f} MiB**.",
        "",
        "| target | this run | verdict |",
        "|---|---|---|",
    ]
    for tg in r["targets"]:
        lines.append(f"| {tg['target']} | {tg['value']} | {common.met(tg['met'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure and write the report; 1 on a functional failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ticks", type=int, default=None, help="ticks per backend (200)")
    parser.add_argument("--idle-seconds", type=float, default=None, help="idle window (30)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs in history (1000)")
    parser.add_argument("--quick", action="store_true", help="short run for CI")
    parser.add_argument("--tmpdir", default=None, help="where temp state dirs go")
    root = common.ROOT / "bench"
    parser.add_argument("--out", type=Path, default=root / "results-sampling.md")
    parser.add_argument("--json", type=Path, default=root / "results-sampling.json")
    args = parser.parse_args(argv)
    common.TMP_BASE = args.tmpdir
    ticks = args.ticks or (30 if args.quick else 200)
    idle_s = args.idle_seconds or (3.0 if args.quick else 30.0)
    jobs = args.jobs or (100 if args.quick else 1000)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": shlex.join(["python", "bench/bench_sampling.py", *sys.argv[1:]]),
        "machine": machine(),
    }
    try:
        with temp_home("ticks") as tmp:
            common.step(f"cost per tick, {GPUS} GPUs")
            results["ticks"] = asyncio.run(tick_costs(ticks, tmp))
            common.step(f"per-job usage series, {GPUS} GPUs, {USAGE_JOBS} jobs")
            results["usage"] = asyncio.run(usage_cost(ticks * 2, tmp))
        common.step(f"idle engine, {jobs} jobs, {idle_s:g} s window")
        results["idle"] = engine_idle(jobs, idle_s)
    except BenchFailure as err:
        print(f"bench_sampling: FAILED: {err}", file=sys.stderr)
        return 1
    common.finish(
        results, started, args.out, args.json, lambda r: r.update(targets=targets(r)), render
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
