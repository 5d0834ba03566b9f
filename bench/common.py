"""Helpers shared by the benchmarks: statistics, temp state dirs, CPU meters, a server.

Every benchmark imports this module as ``common`` (the scripts run as ``python
bench/NAME.py``, so ``bench/`` is on ``sys.path``). Nothing here asserts on time: a helper
raises :class:`BenchFailure` only when something did not *work* (a job failed, the server
did not start), and the benchmarks turn that into a non-zero exit.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

TMP_BASE: str | None = None
"""Where temp state dirs go (``--tmpdir``; ``None``: the system's temp dir)."""

TERMINAL = ("completed", "failed", "cancelled", "orphaned")


_T0 = time.perf_counter()


def step(label: str) -> None:
    """Progress on stderr, with seconds since this benchmark started."""
    print(f"[{time.perf_counter() - _T0:6.1f}s] {label}", file=sys.stderr, flush=True)


class BenchFailure(RuntimeError):
    """Jobs did not complete (or the server did not come up): the run is invalid."""


# -- statistics ----------------------------------------------------------------------------


def ms(seconds: float) -> float:
    """Seconds to milliseconds."""
    return seconds * 1000.0


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (``q`` in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary(values_s: list[float]) -> dict[str, float]:
    """p50/p95/min/max/mean in milliseconds of timings given in seconds."""
    vals = [ms(v) for v in values_s]
    return {
        "n": len(vals),
        "p50_ms": statistics.median(vals),
        "p95_ms": pct(vals, 95),
        "min_ms": min(vals),
        "max_ms": max(vals),
        "mean_ms": statistics.fmean(vals),
    }


def lat_row(name: str, s: dict[str, float]) -> str:
    """One Markdown row of a latency table made by :func:`summary`."""
    return (
        f"| {name} | {s['n']} | {s['p50_ms']:.2f} | {s['p95_ms']:.2f} "
        f"| {s['min_ms']:.2f} | {s['max_ms']:.2f} |"
    )


LAT_HEADER = ["| what | n | p50 ms | p95 ms | min ms | max ms |", "|---|---:|---:|---:|---:|---:|"]


def met(ok: bool) -> str:
    """The verdict word used in every report."""
    return "met" if ok else "NOT met"


# -- state dirs -----------------------------------------------------------------------------


@contextmanager
def temp_home(tag: str) -> Iterator[Path]:
    """A fresh temp dir (removed afterwards) to use as ``GPULAYER_HOME``."""
    path = Path(tempfile.mkdtemp(prefix=f"gpulayer-bench-{tag}-", dir=TMP_BASE))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def gpulayer_home(path: Path) -> Iterator[None]:
    """Point ``GPULAYER_HOME`` at ``path`` for the duration (restored afterwards)."""
    old = os.environ.get("GPULAYER_HOME")
    os.environ["GPULAYER_HOME"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("GPULAYER_HOME", None)
        else:
            os.environ["GPULAYER_HOME"] = old


def check_jobs(where: str, jobs: list[dict[str, Any]], expected: int) -> None:
    """Raise unless ``expected`` jobs all completed with exit code 0."""
    bad = [j for j in jobs if j.get("status") != "completed" or j.get("exit_code") != 0]
    if len(jobs) != expected or bad:
        sample = "; ".join(
            f"job {j.get('id')}: {j.get('status')} exit={j.get('exit_code')} {j.get('message')}"
            for j in bad[:5]
        )
        raise BenchFailure(
            f"{where}: {len(jobs) - len(bad)}/{expected} jobs completed with exit 0"
            + (f" ({sample})" if sample else "")
        )


# -- meters -------------------------------------------------------------------------------


def proc_cpu(pid: int) -> tuple[float, float]:
    """(own CPU, reaped children's CPU) seconds of ``pid`` from ``/proc/PID/stat``."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # fields from 3 (state) on
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    tick = os.sysconf("SC_CLK_TCK")
    return (utime + stime) / tick, (cutime + cstime) / tick


def launcher_pid(state_dir: Path, timeout: float = 10.0) -> int:
    """The spawner serving ``state_dir`` (the parent of its jobs). It is nobody's child
    here, so its CPU is metered on its own (``Meter(also=...)``), never as reaped
    children's time."""
    import psutil

    needle = str(state_dir)
    deadline = time.monotonic() + timeout
    while True:
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if "gpulayer_tui.engine.launcher" in cmd and needle in cmd:
                return int(proc.pid)
        if time.monotonic() > deadline:
            raise BenchFailure(f"no launcher serves {state_dir}")
        time.sleep(0.02)


def stop_launcher(state_dir: Path) -> None:
    """Ask the launcher of ``state_dir`` to retire now if nothing runs (it would otherwise
    wait out its idle timeout over a deleted temp dir)."""
    import socket

    path = state_dir / "launch.sock"
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2.0)
            sock.connect(str(path))
            sock.sendall(b'{"op": "quit_if_idle"}\n')
    except OSError:
        pass


def proc_rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


class Meter:
    """Wall time plus CPU time (user + sys) of a process and of its reaped children.

    CPU time hardly grows when other work competes for the cores, so CPU ms/job is the
    load-robust companion of wall ms/job. ``pid=None`` meters this process (all threads);
    otherwise ``/proc/PID/stat`` is read (clock-tick resolution).
    """

    def __init__(self, pid: int | None = None, also: int | None = None) -> None:
        self.pid = pid
        self.also = also  # the launcher: its own CPU, reported as ``launcher_cpu_s``
        self.t0 = time.perf_counter()
        self.cpu0 = self._cpu()
        self.also0 = proc_cpu(also)[0] if also else 0.0

    def _cpu(self) -> tuple[float, float]:
        if self.pid is None:
            me = resource.getrusage(resource.RUSAGE_SELF)
            kids = resource.getrusage(resource.RUSAGE_CHILDREN)
            return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime
        return proc_cpu(self.pid)

    def stop(self) -> dict[str, float]:
        """Wall seconds and CPU seconds (own, children) since construction."""
        total = time.perf_counter() - self.t0
        cpu = self._cpu()
        return {
            "total_s": total,
            "self_cpu_s": cpu[0] - self.cpu0[0],
            "children_cpu_s": cpu[1] - self.cpu0[1],
            "launcher_cpu_s": proc_cpu(self.also)[0] - self.also0 if self.also else 0.0,
        }


def drain_figures(n: int, meter: dict[str, float]) -> dict[str, float]:
    """Per-job figures from a :meth:`Meter.stop` result."""
    own, kids = meter["self_cpu_s"], meter["children_cpu_s"]
    launcher = meter.get("launcher_cpu_s", 0.0)
    return meter | {
        "jobs": n,
        "ms_per_job": ms(meter["total_s"]) / n,
        "self_cpu_ms_per_job": ms(own) / n,
        "children_cpu_ms_per_job": ms(kids) / n,
        "launcher_cpu_ms_per_job": ms(launcher) / n,
        "cpu_ms_per_job": ms(own + kids + launcher) / n,
    }


# -- machine ------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What the report says about where it ran (load average at the start included)."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit, dirty = "", ""
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "git": commit + ("+dirty" if dirty else ""),
        "loadavg_start": os.getloadavg(),
    }


def machine_line(m: dict[str, Any]) -> str:
    """One line for a report: nproc, Python, commit, date and load averages."""
    end = m.get("loadavg_end")
    load = f"load average {m['loadavg_start'][0]:.2f} at start" + (
        f", {end[0]:.2f} at end" if end else ""
    )
    return (
        f"Machine: nproc={m['nproc']} (usable {m['usable_cpus']}), {m['implementation']} "
        f"{m['python']}, git {m['git'] or '?'}, {m['date']}; {load}."
    )


# -- a --serve process --------------------------------------------------------------------


def cli_argv() -> list[str]:
    """How a user runs the CLI: the venv's console script, else ``python -m``."""
    script = Path(sys.executable).parent / "gpulayer-tui"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "gpulayer_tui"]


class Server:
    """A ``gpulayer-tui --serve`` subprocess on its own state dir.

    Attributes:
        home: Its ``GPULAYER_HOME``.
        env: The environment to run CLI commands against it.
        client: A :class:`gpulayer_tui.client.Client` for it.
        proc: The server process.
        start_s: Seconds from launch until it answered ``/health``.
    """

    def __init__(self, home: Path, simulate: str, config: str) -> None:
        from gpulayer_tui.client import Client
        from gpulayer_tui.engine.paths import resolve_paths

        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(config)
        self.env = dict(os.environ, GPULAYER_HOME=str(home))
        # CLI runs use bytecode caches, as an installed package does (pip compiles them);
        # a PYTHONDONTWRITEBYTECODE left in the environment would recompile every module
        # on every call and add ~10 ms to each CLI figure.
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        with gpulayer_home(home):
            self.client = Client(resolve_paths(), timeout=300)
        self._log_path = home.parent / f"{home.name}.serve.log"
        self._log = open(self._log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpulayer_tui", "--serve", "--simulate", simulate],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        self.start_s = self._wait_ready()

    def _wait_ready(self) -> float:
        from gpulayer_tui.client import EngineNotRunning

        t0 = time.perf_counter()
        while True:
            if self.proc.poll() is not None:
                raise BenchFailure(f"server exited with {self.proc.returncode} at start")
            try:
                self.client.health()
                return time.perf_counter() - t0
            except (EngineNotRunning, OSError):
                pass
            if time.perf_counter() - t0 > 60:
                raise BenchFailure("server did not answer within 60 s")
            time.sleep(0.02)

    def log_tail(self) -> str:
        """The end of the server's output (shown when something failed)."""
        self._log.flush()
        try:
            return self._log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s; remove the log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        stop_launcher(self.home)
        self._log.close()
        self._log_path.unlink(missing_ok=True)


@contextmanager
def serving(home: Path, simulate: str, config: str) -> Iterator[Server]:
    """A running :class:`Server`, stopped afterwards; its log tail is shown on errors."""
    server = Server(home, simulate, config)
    try:
        yield server
    except BaseException:
        tail = server.log_tail()
        if tail:
            print(f"--- server log (tail) ---\n{tail}", file=sys.stderr)
        raise
    finally:
        server.stop()


def wait_all(client: Any, ids: list[int], poll_s: float = 0.005) -> list[dict[str, Any]]:
    """Block until every job in ``ids`` is terminal; return their rows.

    Waits on the highest id first (one long request), then polls the terminal list for
    the rest, so the cost to the server is a handful of requests, not one per job.
    """
    wanted = set(ids)
    client.wait(max(ids))
    while True:
        rows = client.jobs(statuses=list(TERMINAL), limit=len(ids) + 1000)
        mine = [j for j in rows if j["id"] in wanted]
        if len(mine) >= len(wanted):
            return mine
        time.sleep(poll_s)


def write_outputs(out: Path, json_path: Path, report: str, results: dict[str, Any]) -> None:
    """Write the Markdown report and the raw JSON (creating their folders)."""
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2, default=str) + "\n")


def finish(
    results: dict[str, Any],
    started: float,
    out: Path,
    json_path: Path,
    extra: Callable[[dict[str, Any]], None],
    render: Callable[[dict[str, Any]], str],
) -> str:
    """Stamp the end of a run (load average, elapsed time), add the verdicts ``extra`` computes
    from the results, then render, write and print the report; returns it."""
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["elapsed_s"] = time.perf_counter() - started
    extra(results)
    report = render(results)
    write_outputs(out, json_path, report, results)
    print(report)
    return report
