"""TUI benchmark: idle CPU, time to first frame, keypress latency with a slow GPU probe.

Run: ``python bench/bench_tui.py [--idle-seconds 30] [--jobs 1000] [--quick]``.
Writes ``bench/results-tui.md`` (and ``bench/results-tui.json``).

* **Idle CPU**: a ``--serve`` engine with 8 simulated GPUs and N jobs in history, sampling
  every 1 s; the TUI attaches to it (headless, 160x50, the dashboard showing) and sits idle.
  We report the TUI process's CPU time over the window as a percentage of one core
  (target: under 3 %).
* **Time to first frame**: from launching ``python`` to the dashboard showing every GPU
  panel, attached to that engine (target: under 1 s), next to a bare ``python -c pass``.
* **Keypress latency with a slow probe**: an embedded engine whose GPU probe takes 2 s per
  read (a wedged driver); we switch areas with ``d``/``j`` and time until the new screen
  has been painted. The UI must keep answering (no relation to the probe's 2 s).

Figures are wall clock on a shared machine: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

IDLE_CHILD = r"""
import asyncio, json, os, sys, time
t_start = float(sys.argv[1]); idle = float(sys.argv[2])
from gpulayer_tui.app import build_app
from gpulayer_tui.backend import SocketBackend
from gpulayer_tui.engine.paths import resolve_paths

async def main():
    backend = SocketBackend(resolve_paths())
    app = build_app(backend)
    out = {}
    async with app.run_test(size=(160, 50)) as pilot:
        from gpulayer_tui.widgets.gpu_panel import GpuPanel
        while len(app.screen.query(GpuPanel)) < 8:
            await pilot.pause(0.01)
        await pilot.pause()
        out["first_frame_s"] = time.time() - t_start
        out["jobs_loaded"] = len(app.job_store.jobs)
        await asyncio.sleep(2.0)  # settle
        c0, w0 = time.process_time(), time.monotonic()
        await asyncio.sleep(idle)
        c1, w1 = time.process_time(), time.monotonic()
        out["idle_cpu_pct"] = 100.0 * (c1 - c0) / (w1 - w0)
        out["idle_window_s"] = w1 - w0
    await backend.close()
    print(json.dumps(out))

asyncio.run(main())
"""


def _serve(home: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, GPULAYER_HOME=str(home))
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("[engine]\nsample_interval = 1.0\n[cpu]\nslots = 2\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulayer_tui", "--serve", "--simulate", "8xA100-80GB"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    sock = home / "engine.sock"
    deadline = time.monotonic() + 20
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the engine did not start")
        time.sleep(0.05)
    return proc


def _fill_history(home: Path, jobs: int) -> None:
    os.environ["GPULAYER_HOME"] = str(home)
    from gpulayer_tui.client import Client
    from gpulayer_tui.engine.paths import resolve_paths

    client = Client(resolve_paths(), timeout=120)
    ids = [j["id"] for j in client.submit_many([{"command": ["true"]}] * jobs)]
    client.wait(ids[-1])
    for job_id in ids[-10:]:
        client.wait(job_id)


def idle_and_first_frame(jobs: int, idle: float) -> dict[str, Any]:
    """Run the attached TUI in a child process next to a ``--serve`` with history."""
    with tempfile.TemporaryDirectory(prefix="gpulayer-bench-tui-") as tmp:
        home = Path(tmp) / "home"
        server = _serve(home)
        try:
            _fill_history(home, jobs)
            env = dict(os.environ, GPULAYER_HOME=str(home))
            t0 = time.time()
            child = subprocess.run(
                [sys.executable, "-c", IDLE_CHILD, str(t0), str(idle)],
                env=env,
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=idle + 120,
            )
            if child.returncode != 0:
                raise SystemExit(f"TUI child failed:\n{child.stderr[-2000:]}")
            result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=20)
    bare = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t)
    result["bare_python_s"] = statistics.median(bare)
    return result


class SlowProbe:
    """A simulated probe whose every read takes ``delay`` seconds (a wedged driver)."""

    def __init__(self, inner: Any, delay: float) -> None:
        self.inner = inner
        self.delay = delay
        self.backend = "simulated-slow"

    def read(self) -> Any:
        time.sleep(self.delay)
        return self.inner.read()

    def inventory(self) -> Any:
        time.sleep(self.delay)
        return self.inner.inventory()

    def read_device(self, index: int) -> Any:
        time.sleep(self.delay)
        return self.inner.read_device(index)

    def close(self) -> None:
        self.inner.close()


async def keypress_latency(presses: int, delay: float) -> dict[str, Any]:
    """Switch areas with a probe that takes ``delay`` s per read; time each repaint."""
    from gpulayer_tui.app import build_app
    from gpulayer_tui.backend import EmbeddedBackend
    from gpulayer_tui.engine.config import parse_config
    from gpulayer_tui.engine.engine import Engine
    from gpulayer_tui.engine.paths import resolve_paths
    from gpulayer_tui.engine.simulate import SimulatedProbe, parse_simulate_spec

    with tempfile.TemporaryDirectory(prefix="gpulayer-bench-keys-") as tmp:
        os.environ["GPULAYER_HOME"] = str(Path(tmp) / "home")
        paths = resolve_paths()
        probe = SlowProbe(SimulatedProbe(parse_simulate_spec("8xA100-80GB"), paths.state_dir), 0)
        config = parse_config({"engine": {"sample_interval": 0.5, "probe_timeout": 0.5}})
        backend = EmbeddedBackend(Engine(paths, probe=probe, config=config, cpu_count=2))
        await backend.start()
        probe.delay = delay  # the first sample (at start) was quick; from now on, wedged
        app = build_app(backend)
        times: list[float] = []
        try:
            async with app.run_test(size=(160, 50)) as pilot:
                await pilot.pause(0.5)
                for i in range(presses):
                    key, mode = ("2", "jobs") if i % 2 == 0 else ("1", "dashboard")
                    t = time.perf_counter()
                    await pilot.press(key)
                    while app.current_mode != mode:
                        await pilot.pause(0.001)
                    await pilot.pause()  # one refresh: the new screen is painted
                    times.append(time.perf_counter() - t)
        finally:
            await backend.close()
    times.sort()
    return {
        "presses": presses,
        "probe_delay_s": delay,
        "p50_ms": 1000 * statistics.median(times),
        "p95_ms": 1000 * times[int(0.95 * (len(times) - 1))],
        "max_ms": 1000 * times[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--presses", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="short run for CI")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results-tui.md")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results-tui.json")
    args = parser.parse_args()
    if args.quick:
        args.idle_seconds, args.jobs, args.presses = 3.0, 100, 6
    started = time.time()
    idle = idle_and_first_frame(args.jobs, args.idle_seconds)
    keys = asyncio.run(keypress_latency(args.presses, 2.0))
    results = {
        "idle": idle,
        "keys": keys,
        "args": vars(args) | {"out": str(args.out), "json": str(args.json)},
    }
    args.json.write_text(json.dumps(results, indent=2))
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
    cpu_ok = "met" if idle["idle_cpu_pct"] < 3.0 else "NOT met"
    frame_ok = "met" if idle["first_frame_s"] < 1.0 else "NOT met"
    lines = [
        "# gpulayer-tui TUI benchmark",
        "",
        f"Command: `python bench/bench_tui.py{' --quick' if args.quick else ''}`",
        "",
        f"Machine: nproc={os.cpu_count()}, CPython {platform.python_version()}, {when}.",
        "",
        "| figure | value | target |",
        "|---|---:|---|",
        f"| idle CPU of the attached TUI, 8 simulated GPUs, {args.jobs} jobs, 1 s samples, "
        f"{idle['idle_window_s']:.0f} s window | {idle['idle_cpu_pct']:.2f} % of a core | "
        f"< 3 % ({cpu_ok}) |",
        f"| launch to first frame (dashboard with 8 GPU panels, {idle['jobs_loaded']} jobs "
        f"loaded) | {idle['first_frame_s']:.3f} s | < 1 s ({frame_ok}) |",
        f"| bare `python -c pass`, same run | {idle['bare_python_s']:.3f} s | |",
        f"| first frame / bare python | {idle['first_frame_s'] / idle['bare_python_s']:.1f}x | |",
        f"| keypress to repaint (1/2), probe wedged {keys['probe_delay_s']:g} s per read, "
        f"p50 / p95 / max | {keys['p50_ms']:.1f} / {keys['p95_ms']:.1f} / "
        f"{keys['max_ms']:.1f} ms | UI keeps answering |",
        "",
        "Keypress latency is measured in-process (Textual's headless driver), from the key "
        "press to the first refresh of the new screen; terminal output time is not included.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
