"""Check the real NVML path on a machine with an NVIDIA GPU (the prepared device script).

What it does, in one run, against the real driver (never the fakes):

1. NVML through ``NvmlProbe``: every device (name, UUID, memory, utilisation, processes) and
   the read latency.
2. A real CUDA process holding memory, started *outside* the engine (``libcuda`` through
   ctypes: no PyTorch needed): an in-process engine on a temp state dir must count it as
   unregistered VRAM and list it as a foreign process.
3. The same allocator submitted as a job with ``gpus = 1``: its memory must count as owned
   by that job (``CUDA_VISIBLE_DEVICES`` is honoured, the pid is attributed).
4. Adopting the stray process: its memory moves from unregistered to owned.
5. Cancelling both: the processes end and the memory is freed.
   Per-job usage (issue 17) on the real path: while the job runs its series and summary
   read the real GPU (peak VRAM, utilisation, energy from the driver's counter), and once
   it ends its record is stored.
6. What the engine sees of an idle GPU (memory the driver reserves with no process) before
   anything runs, and the sampler's cost per read through the engine.
7. NVML capabilities the per-job accounting issue will build on, read raw while the job holds
   memory (informational, never a failed check): total energy counter, power, memory
   bandwidth utilisation, per-process utilisation samples, the v2 memory info (reserved),
   MIG mode, accounting mode, each with its latency or the error NVML gave.

Usage: ``python bench/device_check.py [--out DIR] [--gib 1]``. It writes
``device-check.md`` and ``device-check.json`` into ``--out`` (default: the current dir) and
prints the report. Without a driver it says so and exits 0; it exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpulayer_tui.engine.config import parse_config
from gpulayer_tui.engine.engine import Engine
from gpulayer_tui.engine.gpus import GIB, ProbeStatus
from gpulayer_tui.engine.nvml import NvmlProbe
from gpulayer_tui.engine.paths import Paths
from gpulayer_tui.wire import parse_adopt_request

# A CUDA process holding memory: cuInit, a context on device 0 (as CUDA_VISIBLE_DEVICES
# maps it), cuMemAlloc, then sleep. Prints "held" once the memory is allocated.
ALLOCATOR = r"""
import ctypes, sys, time
gib, seconds = float(sys.argv[1]), float(sys.argv[2])
cuda = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed with CUDA error {rc}")
ok(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
ok(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
ptr = ctypes.c_uint64()
ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(gib * 2**30))), "cuMemAlloc")
print("held", flush=True)
time.sleep(seconds)
"""

# A process keeping the GPU's SM busy (matrix products through PyTorch, which the device
# image has; the check is skipped where it has not) for ``seconds``.
BUSY = r"""
import sys, time, torch
x = torch.randn(4096, 4096, device="cuda")
end = time.time() + float(sys.argv[1])
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()
"""


def _check(results: dict[str, Any], name: str, ok: bool, detail: str) -> None:
    results["checks"].append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)


def _devices(probe: NvmlProbe) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = probe.read()
    took = time.perf_counter() - t0
    return {
        "status": result.status.value,
        "message": result.message,
        "driver_version": result.driver_version,
        "read_ms": round(took * 1000, 2),
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "uuid": g.uuid,
                "memory_total": g.memory_total,
                "memory_used": g.memory_used,
                "utilization": g.utilization,
                "temperature": g.temperature,
                "error": g.error,
                "processes_listed": g.processes_listed,
                "processes": [
                    {"pid": p.pid, "used_bytes": p.used_bytes, "sm_util": p.sm_util}
                    for p in g.processes
                ],
            }
            for g in result.gpus
        ],
    }


def _timed(call: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        value = call()
    except Exception as err:  # any NVML error is a finding here, not a failure
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    return {"ok": True, "value": value, "ms": round((time.perf_counter() - t0) * 1000, 3)}


def _nvml_capabilities(pids: list[int]) -> dict[str, Any]:
    """Raw pynvml reads on GPU 0 that per-job accounting would need; errors are findings."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)

        def rates() -> dict[str, int]:
            r = pynvml.nvmlDeviceGetUtilizationRates(handle)
            return {"gpu": int(r.gpu), "memory": int(r.memory)}

        def process_samples() -> list[dict[str, int]]:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
            return [
                {"pid": int(s.pid), "sm": int(s.smUtil), "mem": int(s.memUtil)} for s in samples
            ]

        def memory_v2() -> dict[str, int]:
            m = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            return {k: int(getattr(m, k)) for k in ("total", "reserved", "free", "used")}

        def compute_processes() -> list[dict[str, Any]]:
            return [
                {"pid": int(p.pid), "used": p.usedGpuMemory}
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            ]

        def accounting() -> dict[str, Any]:
            mode = int(pynvml.nvmlDeviceGetAccountingMode(handle))
            stats: dict[int, Any] = {}
            for pid in pids:
                try:
                    st = pynvml.nvmlDeviceGetAccountingStats(handle, pid)
                    stats[pid] = {
                        "gpu": int(st.gpuUtilization),
                        "memory": int(st.memoryUtilization),
                        "max_memory": int(st.maxMemoryUsage),
                        "time_ms": int(st.time),
                    }
                except Exception as err:
                    stats[pid] = f"{type(err).__name__}: {err}"
            return {"mode": mode, "stats": stats}

        return {
            "total_energy_mj": _timed(
                lambda: int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))
            ),
            "power_mw": _timed(lambda: int(pynvml.nvmlDeviceGetPowerUsage(handle))),
            "utilization_rates": _timed(rates),
            "process_utilization": _timed(process_samples),
            "memory_info_v2": _timed(memory_v2),
            "compute_processes": _timed(compute_processes),
            "mig_mode": _timed(lambda: list(pynvml.nvmlDeviceGetMigMode(handle))),
            "accounting": _timed(accounting),
            "pcie_link": _timed(
                lambda: [
                    int(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
                    int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
                ]
            ),
        }
    finally:
        pynvml.nvmlShutdown()


def _torch_available() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
        capture_output=True,
        timeout=120,
    )
    return probe.returncode == 0


async def _busy_job_checks(results: dict[str, Any], engine: Engine, state: Path) -> None:
    """A job that keeps the SM busy: the probe's per-process utilisation (issue 17's
    ``gpu_util`` of each process) must name its pid with a non-zero figure, and the
    job's usage series must see the GPU busy. (Figures well above zero: the first
    samples after its start read 1 %, while PyTorch starts.)"""
    if not await asyncio.to_thread(_torch_available):
        results["busy_job"] = "skipped: no PyTorch with CUDA for sys.executable"
        print("[skip] busy job: no PyTorch with CUDA", flush=True)
        return
    job = await engine.submit(
        {
            "command": [sys.executable, "-c", BUSY, "120"],
            "gpus": 1,
            "domain": "gpu0",
            "cwd": str(state),
            "name": "device-check-busy",
        }
    )
    pid = (await engine.get(job.id)).pid

    def sm_seen() -> bool:
        reading = engine.scheduler.domains["gpu0"].reading
        return reading is not None and any(
            p.pid == pid and (p.sm_util or 0) >= 50 for p in reading.processes
        )

    seen = await _until(sm_seen, 60, engine)
    reading = engine.scheduler.domains["gpu0"].reading
    procs = [(p.pid, p.sm_util) for p in reading.processes] if reading else []
    _check(
        results,
        "a busy job's per-process SM utilisation is read",
        seen,
        f"job pid {pid}; (pid, sm_util) {procs}; GPU util "
        f"{reading.utilization if reading else None}%",
    )

    def util_seen() -> bool:
        usage = engine.usage.live(job.id)
        return usage is not None and (usage.summary()["util_mean"] or 0) >= 30

    await _until(util_seen, 60, engine)
    usage = engine.usage.live(job.id)
    summary = usage.summary() if usage is not None else None
    _check(
        results,
        "the busy job's usage series sees the GPU busy",
        summary is not None and (summary["util_mean"] or 0) >= 30,
        f"util_mean {summary and summary['util_mean']}, idle_share "
        f"{summary and summary['idle_share']}",
    )
    results["busy_job"] = {"pid": pid, "processes": procs, "summary": summary}
    await engine.cancel(job.id)
    ended = await engine.wait(job.id, timeout=30)
    _check(results, "busy job cancelled", ended.status.value == "cancelled", ended.message)


def _cuda_available() -> str | None:
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        return str(err)
    return None


async def _until(predicate: Any, timeout: float, engine: Engine) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await engine.sampler.sample_once()
        if predicate():
            return True
        await asyncio.sleep(0.5)
    return False


def _account(engine: Engine, name: str) -> Any:
    return engine.scheduler.domains[name].account


def _start_stray(gib: float) -> subprocess.Popen[str]:
    """The allocator as a process the engine did not start (GPU 0)."""
    return subprocess.Popen(
        [sys.executable, "-c", ALLOCATOR, str(gib), "600"],
        env=dict(os.environ, CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_ORDER="PCI_BUS_ID"),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


async def _engine_checks(
    results: dict[str, Any], gib: float, state: Path, strays: list[subprocess.Popen[str]]
) -> None:
    engine = Engine(
        Paths(state, state / "config.toml"),
        probe=NvmlProbe(),
        config=parse_config({"engine": {"grace_period": 2.0}}),
        cpu_count=2,
    )
    await engine.start()
    try:
        await engine.sampler.sample_once()
        idle = _account(engine, "gpu0")
        results["idle"] = {
            "unregistered": idle.unregistered if idle else None,
            "unattributed": idle.unattributed if idle else None,
            "driver_reserved": idle.driver_reserved if idle else None,
            "total": idle.total if idle else None,
            "free": idle.free if idle else None,
            "owned": idle.owned if idle else None,
            "foreign": [p.pid for p in idle.foreign] if idle else None,
        }
        _check(
            results,
            "an idle GPU shows no foreign process",
            idle is not None and not idle.foreign,
            f"{results['idle']}",
        )
        # The driver's own reserve (0.6 GiB on an H200) is said apart by the v2 memory
        # read, not shown as memory no process explains (a few MiB of slack allowed).
        _check(
            results,
            "an idle GPU's driver reserve is not unattributed",
            idle is not None and idle.unattributed < 64 * 2**20,
            f"unattributed {idle.unattributed if idle else None} bytes, driver reserve "
            f"{idle.driver_reserved if idle else None} bytes",
        )
        stray = _start_stray(gib)
        strays.append(stray)
        line = await asyncio.wait_for(asyncio.to_thread(stray.stdout.readline), 60)  # type: ignore[union-attr]
        _check(results, "stray CUDA process allocates", line.strip() == "held", repr(line))
        need = int(gib * GIB * 0.9)

        def stray_seen() -> bool:
            acc = _account(engine, "gpu0")
            return acc is not None and any(
                p.pid == stray.pid and (p.used_bytes or 0) >= need for p in acc.foreign
            )

        seen = await _until(stray_seen, 30, engine)
        acc = _account(engine, "gpu0")
        _check(
            results,
            "stray memory is unregistered VRAM",
            seen and acc is not None and acc.unregistered >= need,
            f"unregistered {acc.unregistered if acc else None} bytes, foreign pids "
            f"{[p.pid for p in acc.foreign] if acc else []}",
        )

        job = await engine.submit(
            {
                "command": [sys.executable, "-c", ALLOCATOR, str(gib), "600"],
                "gpus": 1,
                "domain": "gpu0",
                "cwd": str(state),
                "name": "device-check-alloc",
            }
        )
        _check(results, "job with gpus=1 starts", job.status.value == "running", job.message)

        def job_owns() -> bool:
            acc = _account(engine, "gpu0")
            return acc is not None and acc.held_by_job.get(job.id, 0) >= need

        owned = await _until(job_owns, 60, engine)
        acc = _account(engine, "gpu0")
        _check(
            results,
            "job's memory is owned by the job",
            owned,
            f"held_by_job {acc.held_by_job if acc else None}, owned {acc.owned if acc else None}",
        )

        def series_grown() -> bool:
            usage = engine.usage.live(job.id)
            return usage is not None and usage.samples >= 3

        await _until(series_grown, 30, engine)
        usage = engine.usage.live(job.id)
        summary = usage.summary() if usage is not None else None
        _check(
            results,
            "the job's usage series reads the real GPU",
            summary is not None
            and summary["peak_vram"] >= need
            and summary["samples"] >= 3
            and summary["gpu_hours"] > 0
            and summary["energy_wh"] > 0
            and summary["util_mean"] is not None,
            f"{summary}",
        )
        results["usage_summary_running"] = summary
        _check(
            results,
            "energy from the driver's counter (not estimated)",
            summary is not None and summary["energy_estimated"] is False,
            f"energy_wh {summary and summary['energy_wh']}, estimated "
            f"{summary and summary['energy_estimated']}",
        )
        job_pid = (await engine.get(job.id)).pid
        pids = [stray.pid] + ([job_pid] if job_pid else [])
        results["nvml_capabilities"] = await asyncio.wait_for(
            asyncio.to_thread(_nvml_capabilities, pids), 60
        )
        adopted = await engine.adopt(parse_adopt_request({"pid": stray.pid}))
        _check(results, "stray process adopted", adopted.status.value == "running", adopted.message)
        moved = await _until(
            lambda: (_account(engine, "gpu0") or acc).held_by_job.get(adopted.id, 0) >= need,
            30,
            engine,
        )
        _check(results, "adopted memory moves to owned", moved, f"domains {adopted.domains}")

        for job_id in (job.id, adopted.id):
            await engine.cancel(job_id)
        ended = [await engine.wait(j, timeout=30) for j in (job.id, adopted.id)]
        _check(
            results,
            "both cancelled",
            [e.status.value for e in ended] == ["cancelled", "cancelled"],
            ", ".join(f"{e.id}: {e.status.value} ({e.message})" for e in ended),
        )
        stored = await engine.usage_of(job.id)
        _check(
            results,
            "the finished job's usage is stored",
            stored["summary"] is not None
            and stored["summary"]["peak_vram"] >= need
            and bool(stored["series"])
            and len(stored["series"][0]["t"]) >= 1,  # (a point every 5 s: a short job has few)
            f"summary {stored['summary']}, points {[len(x['t']) for x in stored['series']]}",
        )
        freed = await _until(
            lambda: (
                (_account(engine, "gpu0") or acc).owned == 0
                and not any(p.pid == stray.pid for p in (_account(engine, "gpu0") or acc).foreign)
            ),
            30,
            engine,
        )
        _check(results, "memory freed after cancel", freed, "owned 0, stray gone from NVML")
        await _busy_job_checks(results, engine, state)
        results["sampler"] = {
            "reads": engine.sampler.reads,
            "read_ms_mean": round(
                1000 * engine.sampler.read_seconds / max(1, engine.sampler.reads), 2
            ),
            "timeouts": engine.sampler.timeouts,
        }
    finally:
        await engine.stop()


def _report(results: dict[str, Any]) -> str:
    lines = ["# Device check (real NVML)", "", f"Host: {results['host']}", ""]
    nvml = results["nvml"]
    lines.append(
        f"NVML: {nvml['status']} (driver {nvml['driver_version']}, read {nvml['read_ms']} ms)"
    )
    for gpu in nvml["gpus"]:
        lines.append(
            f"- GPU {gpu['index']}: {gpu['name']} {gpu['uuid']}, memory "
            f"{(gpu['memory_used'] or 0) / GIB:.1f}/{(gpu['memory_total'] or 0) / GIB:.1f} GiB, "
            f"util {gpu['utilization']}%, {len(gpu['processes'])} processes"
        )
    lines += ["", "| check | ok | detail |", "|---|---|---|"]
    for check in results["checks"]:
        lines.append(f"| {check['check']} | {'yes' if check['ok'] else 'NO'} | {check['detail']} |")
    if "idle" in results:
        lines += ["", f"Idle GPU 0 as the engine sees it: {results['idle']}"]
    if "busy_job" in results:
        lines += ["", f"Busy job: {results['busy_job']}"]
    if "sampler" in results:
        lines += ["", f"Engine sampler: {results['sampler']}"]
    if "nvml_capabilities" in results:
        lines += ["", "NVML capabilities (GPU 0, while the job held memory):", ""]
        lines += ["| read | result | ms |", "|---|---|---|"]
        for name, got in results["nvml_capabilities"].items():
            shown = got["value"] if got["ok"] else f"unsupported: {got['error']}"
            lines.append(f"| {name} | {shown} | {got.get('ms', '')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every check; write the report; 1 if a check failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".", help="where device-check.md/.json go")
    parser.add_argument("--gib", type=float, default=1.0, help="GiB each test process holds")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"host": os.uname().nodename, "checks": []}
    probe = NvmlProbe()
    results["nvml"] = _devices(probe)
    probe.close()
    status = results["nvml"]["status"]
    _check(results, "NVML read", status == ProbeStatus.OK.value, results["nvml"]["message"] or "ok")
    if status == ProbeStatus.OK.value and results["nvml"]["gpus"]:
        missing = _cuda_available()
        if missing is None:
            strays: list[subprocess.Popen[str]] = []
            try:
                with tempfile.TemporaryDirectory(prefix="gpulayer-device-") as tmp:
                    asyncio.run(_engine_checks(results, args.gib, Path(tmp) / "home", strays))
            finally:
                for stray in strays:
                    if stray.poll() is None:
                        stray.kill()
                    stray.wait()
        else:
            _check(results, "libcuda available", False, missing)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = _report(results)
    (out / "device-check.md").write_text(report)
    (out / "device-check.json").write_text(json.dumps(results, indent=2, default=str))
    print(report)
    if status == ProbeStatus.NO_DRIVER.value:
        return 0  # nothing to check here
    return 0 if all(c["ok"] for c in results["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
