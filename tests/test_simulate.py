"""Simulated GPUs that come alive: jobs, replicas and adopted processes placed on them show
as GPU processes (their real pids) with memory and utilisation (``[simulate]``).

Real engines, real processes; the ledger plays the foreign processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from gpulayer_tui.engine.gpus import GIB
from gpulayer_tui.engine.models import JobStatus
from gpulayer_tui.engine.simulate import (
    PlacedProcess,
    SimLedger,
    SimulatedProbe,
    parse_simulate_spec,
)

from .conftest import EngineFactory, adopt, eventually, make_config


def _domain(engine: Any, name: str) -> Any:
    return next(d for d in engine.gpus()["domains"] if d["name"] == name)


async def test_a_job_on_a_simulated_gpu_shows_its_process_memory_and_utilisation(
    make_engine: EngineFactory, sleeper: int
) -> None:
    config = make_config(simulate={"utilization": 55, "memory_fraction": 0.5})
    engine = await make_engine("2xA100-80GB", config=config)
    job = await engine.submit({"command": ["sleep", "30"], "gpus": 1, "vram_gb": 20})
    assert job.status is JobStatus.RUNNING and job.pid and job.gpus == [0]
    SimLedger(engine.paths.state_dir).hold(0, sleeper, 4.0)  # a stray beside it
    await engine.sampler.sample_once()
    gpu0 = _domain(engine, "gpu0")
    by_pid = {p["pid"]: p for p in gpu0["processes"]}
    assert by_pid[job.pid]["job_id"] == job.id
    assert by_pid[job.pid]["used_bytes"] == 10 * GIB  # half its 20 GiB
    assert by_pid[job.pid]["gpu_util"] == 55  # its own share of the GPU's
    assert by_pid[sleeper]["job_id"] is None
    assert by_pid[sleeper]["gpu_util"] is None  # (a ledger entry says none)
    # Our job's memory is owned; only the stray's is unregistered.
    assert gpu0["vram"]["owned"] == 10 * GIB
    assert gpu0["vram"]["unregistered"] == 4 * GIB
    assert gpu0["vram"]["reserved_extra"] == 10 * GIB  # declared 20, holds 10
    assert gpu0["gpu"]["utilization"] == 55 + 40  # the job's level + a ledger process
    gpu1 = _domain(engine, "gpu1")
    assert gpu1["processes"] == [] and gpu1["gpu"]["utilization"] == 0
    # It ends: its process and its memory leave the GPU.
    await engine.cancel(job.id)
    await engine.wait(job.id, timeout=10)
    await engine.sampler.sample_once()
    gpu0 = _domain(engine, "gpu0")
    assert [p["pid"] for p in gpu0["processes"]] == [sleeper]
    assert gpu0["vram"]["owned"] == 0


async def test_a_job_without_vram_holds_memory_gb_and_jobs_false_turns_it_off(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine("1xA100-80GB", config=make_config(simulate={"memory_gb": 3}))
    job = await engine.submit({"command": ["sleep", "30"], "gpus": 1})
    await engine.sampler.sample_once()
    gpu0 = _domain(engine, "gpu0")
    assert [(p["pid"], p["used_bytes"]) for p in gpu0["processes"]] == [(job.pid, 3 * GIB)]
    assert gpu0["gpu"]["utilization"] == 70  # the default level
    # A live config edit turns the jobs off: the ledger alone puts processes on GPUs.
    engine._reconfigure(make_config(simulate={"jobs": False}))
    await engine.sampler.sample_once()
    gpu0 = _domain(engine, "gpu0")
    assert gpu0["processes"] == [] and gpu0["gpu"]["utilization"] == 0
    await engine.cancel(job.id)


async def test_each_service_replica_shows_on_its_own_gpu(make_engine: EngineFactory) -> None:
    engine = await make_engine("2xA100-80GB")
    spec = {"kind": "service", "command": ["sleep", "60"], "port": False, "replicas": 2}
    job = await engine.submit({**spec, "gpus": 1, "vram_gb": 8})
    assert job.status is JobStatus.RUNNING

    async def replica_pids() -> dict[int, int] | None:
        live = await engine.get(job.id)
        found = {r.gpus[0]: r.pid for r in live.replicas if r.pid and r.gpus}
        return found if len(found) == 2 else None

    pids = await eventually(replica_pids)
    await engine.sampler.sample_once()
    for gpu, pid in pids.items():
        procs = _domain(engine, f"gpu{gpu}")["processes"]
        assert [(p["pid"], p["job_id"], p["used_bytes"]) for p in procs] == [(pid, job.id, 8 * GIB)]
    await engine.cancel(job.id)


async def test_an_adopted_process_shows_on_its_gpu_as_owned(
    make_engine: EngineFactory, sleeper: int
) -> None:
    engine = await make_engine("1xA100-80GB")
    await eventually(lambda: Path(f"/proc/{sleeper}/cmdline").read_bytes().startswith(b"sleep"))
    job = await adopt(engine, sleeper, vram_gb=12, gpu=True)
    assert job.status is JobStatus.RUNNING and job.gpus == [0]
    await engine.sampler.sample_once()
    gpu0 = _domain(engine, "gpu0")
    assert [(p["pid"], p["job_id"]) for p in gpu0["processes"]] == [(sleeper, job.id)]
    assert gpu0["vram"]["owned"] == 12 * GIB and gpu0["vram"]["unregistered"] == 0


async def test_an_adopted_parent_whose_child_holds_the_memory_gets_none_beside_it(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # A shell adopted, its CUDA child named by the ledger: the shell was given its own
    # simulated 1 GiB beside the child's 20, as if it held memory too.
    engine = await make_engine("1xA100-80GB")
    ready = tmp_path / "ready"
    parent = await asyncio.create_subprocess_exec(
        "sh", "-c", f"sleep 600 & echo $! > {ready}.tmp; mv {ready}.tmp {ready}; wait"
    )
    try:
        await eventually(ready.exists)
        child = int(ready.read_text())
        SimLedger(engine.paths.state_dir).hold(0, child, 20.0)
        job = await adopt(engine, parent.pid, gpu=True)
        assert job.status is JobStatus.RUNNING and job.gpus == [0]
        await engine.sampler.sample_once()
        gpu0 = _domain(engine, "gpu0")
        assert [(p["pid"], p["used_bytes"]) for p in gpu0["processes"]] == [(child, 20 * GIB)]
        assert gpu0["vram"]["used"] == 20 * GIB
    finally:
        parent.kill()
        await parent.wait()
        with contextlib.suppress(ProcessLookupError, NameError):
            os.kill(child, signal.SIGKILL)


def test_a_ledger_asking_for_more_than_the_gpu_has_gets_what_is_left(
    tmp_path: Path, sleepers: Any
) -> None:
    # Ledger entries over a GPU's total showed processes holding more than the GPU has,
    # and unregistered VRAM past its total.
    probe = SimulatedProbe(parse_simulate_spec("1xL4-24GB"), tmp_path)
    first, second = sleepers().pid, sleepers().pid
    ledger = SimLedger(tmp_path)
    ledger.hold(0, first, 20.0)
    ledger.hold(0, second, 10.0)
    reading = probe.read().gpus[0]
    assert [(p.pid, p.used_bytes) for p in reading.processes] == [
        (first, 20 * GIB),
        (second, 4 * GIB),
    ]
    assert reading.memory_used == reading.memory_total == 24 * GIB


def test_the_utilisation_pattern_is_seeded_and_repeats(tmp_path: Path) -> None:
    def series(seed: int) -> list[int | None]:
        settings = make_config(simulate={"utilization": 50, "jitter": 20, "seed": seed}).simulate
        probe = SimulatedProbe(parse_simulate_spec("1xL4-24GB"), tmp_path, settings)
        probe.place((PlacedProcess(0, os.getpid(), 7, None),))
        out = []
        for _ in range(12):
            probe.inventory()
            out.append(probe.read_device(0).utilization)
        return out

    first = series(1)
    assert first == series(1)  # the same seed, the same run
    assert first != series(2)
    assert all(u is not None and 30 <= u <= 70 for u in first)
    assert len(set(first)) > 1  # it moves


def test_the_ledger_is_read_once_per_tick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = SimulatedProbe(parse_simulate_spec("8xA100-80GB"), tmp_path)
    SimLedger(tmp_path).set_gpu(3, utilization=9)
    loads = 0
    load = SimLedger.load

    def counting(self: SimLedger) -> dict[str, Any]:
        nonlocal loads
        loads += 1
        return load(self)

    monkeypatch.setattr(SimLedger, "load", counting)
    for _tick in range(3):
        inventory = probe.inventory()
        readings = [probe.read_device(i) for i in range(inventory.device_count)]
        assert [r.index for r in readings] == list(range(8))
        assert readings[3].utilization == 9
    assert loads == 3


def test_a_ledger_entry_holds_for_its_process_not_a_later_one_with_its_pid(
    tmp_path: Path, sleeper: int
) -> None:
    # Keyed by pid alone, an entry outlived its process: whatever got the pid next (another
    # user's process, a system daemon) showed as holding the memory, and the strays view
    # offered to signal it.
    probe = SimulatedProbe(parse_simulate_spec("1xA100-80GB"), tmp_path)
    ledger = SimLedger(tmp_path)
    ledger.hold(0, sleeper, 5.0)
    [entry] = ledger.load()["processes"]
    assert isinstance(entry["start"], int)
    assert [p.pid for p in probe.read().gpus[0].processes] == [sleeper]
    # The same pid, started at another time: another process.
    data = ledger.load()
    data["processes"][0]["start"] = entry["start"] + 1
    ledger.save(data)
    reading = probe.read().gpus[0]
    assert reading.processes == ()
    assert reading.memory_used == 0
    # A hand-written entry with no start speaks for the pid.
    del data["processes"][0]["start"]
    ledger.save(data)
    assert [p.pid for p in probe.read().gpus[0].processes] == [sleeper]


def test_a_simulated_gpus_power_follows_its_model(tmp_path: Path) -> None:
    # Every model had a 400 W limit and drew 60 + 3 W per % of load: an L4 at 360 W.
    settings = make_config(simulate={"utilization": 100, "jitter": 0}).simulate
    probe = SimulatedProbe(parse_simulate_spec("1xL4-24GB,1xA100-80GB"), tmp_path, settings)
    probe.place((PlacedProcess(0, os.getpid(), 7, None), PlacedProcess(1, os.getpid(), 8, None)))
    probe.inventory()
    l4, a100 = probe.read_device(0), probe.read_device(1)
    assert (l4.power_limit_watts, a100.power_limit_watts) == (72.0, 400.0)
    assert l4.power_watts == pytest.approx(72 * 0.9) and a100.power_watts == pytest.approx(360)
