"""Soak benchmark: 20,000 short jobs and 2 flapping services through one ``--serve`` engine.

One ``--serve --simulate 2xA100-80GB`` engine (``[cpu] slots = 2``) on a temp state dir runs,
for several minutes (see ``bench/README.md``):

* N ``true`` jobs (20,000) submitted in batches through ``POST /v1/jobs``: most of them
  paced evenly over ``--duration`` seconds, the last ``--burst`` back to back (a drain with
  the whole history behind it). A 429 is honoured (``Retry-After``) and counted;
* service ``flap-exit`` (``sleep 0.5; exit 1``, no port, ``restart = on_failure``) and
  service ``flap-http`` (``python3 -m http.server $PORT``, ``restart = always``), one GPU
  each, so they never take the cpu slots of the jobs. Every ``--kill-every`` seconds the
  bench SIGKILLs the http replica while it is up: alternately the replica's pid from the
  API (the engine's ``sh`` wrapper) and the command under it.

The engine's RSS, open fds, threads, live and zombie children are sampled after the
warm-up, every ``--sample-every`` seconds and at the end; fds also on the idle engine
before the services start and after they are cancelled (a leak shows as a difference).
Targets: RSS flat within 20 % (end / start), no fd leak, no zombies, no processes left
behind. It reports numbers and never fails on them; it exits non-zero only on a functional
failure: a job lost or not completed, the engine gone, a service that does not end.

Usage::

    python bench/bench_soak.py [--jobs 20000] [--duration 240] [--burst 2000]
                               [--kill-every 5] [--sample-every 5] [--tmpdir DIR]
    python bench/bench_soak.py --quick      # 2,000 jobs, ~20 s (a smoke run)
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import common
import psutil
from common import BenchFailure, machine, serving, summary, temp_home

SIMULATE = "2xA100-80GB"
SLOTS = 2
RSS_TARGET_RATIO = 1.2  # the target: RSS flat within 20 %
MARK = "GPULAYER_SOAK_BENCH"  # in the services' env: finds what they leave behind

FLAP_EXIT = {
    "kind": "service",
    "name": "flap-exit",
    "shell": "sleep 0.5; exit 1",
    "restart": "on_failure",
    "port": False,
    "gpus": 1,
}
FLAP_HTTP = {
    "kind": "service",
    "name": "flap-http",
    "shell": "exec python3 -m http.server $PORT --bind 127.0.0.1",
    "restart": "always",
    "gpus": 1,
}


class EngineDied(BenchFailure):
    """The engine process is gone (or stopped answering)."""


# -- talking to the engine -----------------------------------------------------------------


class Api:
    """The project's :class:`Client`, plus what the soak needs beyond it.

    ``Client.request`` turns a 429 into an ``ApiError`` without the ``Retry-After`` header
    and decodes only JSON, so the submit and ``/metrics`` calls use its ``_open`` (the raw
    response: status, headers, body).
    """

    def __init__(self, server: common.Server) -> None:
        self.server = server
        self.client = server.client
        self.refusals = 0  # 429 answers to submissions
        self.retry_wait_s = 0.0  # time spent honouring Retry-After
        self.submit_s: list[float] = []  # one per accepted POST

    def alive(self) -> bool:
        """True while the ``--serve`` process runs."""
        return self.server.proc.poll() is None

    def _died(self, err: BaseException) -> EngineDied:
        rc = self.server.proc.poll()
        state = f"exited with {rc}" if rc is not None else "still running but not answering"
        return EngineDied(f"engine {state}: {type(err).__name__}: {err}")

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """``Client.request``; a dead engine raises :class:`EngineDied`."""
        from gpulayer_tui.client import ApiError, EngineNotRunning

        try:
            return self.client.request(method, path, body)
        except ApiError:
            raise
        except (EngineNotRunning, OSError) as err:
            raise self._died(err) from None

    def raw(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], bytes]:
        """Status, headers and body of one request."""
        from gpulayer_tui.client import EngineNotRunning

        try:
            response = self.client._open(method, path, body)
            data = response.read()
        except (EngineNotRunning, OSError) as err:
            raise self._died(err) from None
        return response.status, response.headers, data

    def submit(self, specs: list[dict[str, Any]], deadline_s: float = 300.0) -> list[int]:
        """POST one batch; on 429 wait ``Retry-After`` and resend. Returns the job ids."""
        import json

        give_up = time.monotonic() + deadline_s
        while True:
            t0 = time.perf_counter()
            status, headers, data = self.raw("POST", "/jobs", {"jobs": specs})
            if status == 201:
                self.submit_s.append(time.perf_counter() - t0)
                return [int(j["id"]) for j in json.loads(data)["jobs"]]
            if status != 429:
                raise BenchFailure(f"POST /v1/jobs answered {status}: {data[:300]!r}")
            self.refusals += 1
            if time.monotonic() > give_up:
                raise BenchFailure(f"submissions refused with 429 for {deadline_s:g} s")
            try:
                wait = float(headers.get("retry-after", "1"))
            except ValueError:
                wait = 1.0
            self.retry_wait_s += wait
            time.sleep(wait)

    def counts(self) -> dict[str, int]:
        """Jobs by status, from ``GET /metrics`` (``gpulayer_jobs``; history included)."""
        status, _, data = self.raw("GET", "/metrics")
        if status != 200:
            raise BenchFailure(f"GET /v1/metrics answered {status}")
        out: dict[str, int] = {}
        for line in data.decode().splitlines():
            if line.startswith('gpulayer_jobs{status="'):
                name = line.split('"', 2)[1]
                out[name] = int(float(line.rsplit(" ", 1)[1]))
        return out

    def job(self, job_id: int) -> dict[str, Any]:
        """``GET /v1/jobs/ID`` -> the job (without its events)."""
        return dict(self.call("GET", f"/jobs/{job_id}")["job"])


def terminal_count(counts: dict[str, int]) -> int:
    """Jobs in a terminal status."""
    return sum(counts.get(s, 0) for s in common.TERMINAL)


def wait_until(what: str, check: Any, timeout_s: float, api: Api, poll_s: float = 0.05) -> Any:
    """Poll ``check()`` until it returns something truthy; raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if not api.alive():
            raise api._died(RuntimeError(f"while waiting for {what}"))
        if time.monotonic() > deadline:
            raise BenchFailure(f"{what}: not reached within {timeout_s:g} s")
        time.sleep(poll_s)


# -- the engine process ----------------------------------------------------------------------


def fd_kind(target: str) -> str:
    """A class of an fd's target: ``anon_inode:[pidfd]``, ``socket``, a file's suffix..."""
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith("anon_inode:"):
        return target
    if target.startswith("/dev/"):
        return target
    name = Path(target).name
    if name.endswith(".log"):
        return "file *.log"
    if name.endswith(".exit"):
        return "file *.exit"
    return f"file {name}"


def fd_kinds(pid: int) -> dict[str, int]:
    """How many fds of ``pid`` point at each kind of target."""
    kinds: collections.Counter[str] = collections.Counter()
    fd_dir = Path(f"/proc/{pid}/fd")
    for entry in fd_dir.iterdir():
        try:
            kinds[fd_kind(os.readlink(entry))] += 1
        except OSError:
            continue  # closed meanwhile
    return dict(kinds)


def quiet_fd_kinds(pid: int, looks: int = 20) -> dict[str, int]:
    """:func:`fd_kinds` with the fewest fds over ``looks`` looks 50 ms apart.

    Taken while the bench sends no request: a connection of the bench's own last request
    can take a moment to close on the engine's side; a leaked fd stays in every look.
    """
    best = fd_kinds(pid)
    for _ in range(looks - 1):
        time.sleep(0.05)
        kinds = fd_kinds(pid)
        if sum(kinds.values()) < sum(best.values()):
            best = kinds
    return best


class Sampler:
    """Samples the engine process: RSS, fds, threads, children, zombies, CPU, jobs done."""

    def __init__(self, api: Api, pid: int) -> None:
        self.api = api
        self.pid = pid
        self.proc = psutil.Process(pid)
        self.t0 = time.monotonic()
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def sample(self, label: str = "") -> dict[str, Any]:
        """One sample (appended to :attr:`samples`)."""
        try:
            with self.proc.oneshot():
                rss = self.proc.memory_info().rss
                fds = self.proc.num_fds()
                threads = self.proc.num_threads()
                status = self.proc.status()
            kids = self.proc.children(recursive=False)
        except psutil.NoSuchProcess as err:
            raise self.api._died(err) from None
        if status == psutil.STATUS_ZOMBIE:
            raise self.api._died(RuntimeError("the engine process is a zombie"))
        zombies = 0
        for kid in kids:
            try:
                zombies += kid.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                continue
        own_cpu, kids_cpu = common.proc_cpu(self.pid)
        anon_kib = file_kib = 0
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    anon_kib = int(line.split()[1])
                elif line.startswith(("RssFile:", "RssShmem:")):
                    file_kib += int(line.split()[1])
        except OSError as err:
            raise self.api._died(err) from None
        counts = self.api.counts()
        row = {
            "t_s": round(time.monotonic() - self.t0, 2),
            "label": label,
            "rss_mib": rss / 2**20,
            "rss_anon_mib": anon_kib / 1024,
            "rss_file_mib": file_kib / 1024,
            "fds": fds,
            "threads": threads,
            "children": len(kids),
            "zombies": zombies,
            "cpu_s": own_cpu,
            "children_cpu_s": kids_cpu,
            "terminal": terminal_count(counts),
            "active": sum(counts.get(s, 0) for s in ("pending", "queued", "running")),
        }
        self.samples.append(row)
        return row

    def start(self, every_s: float) -> None:
        """Sample every ``every_s`` seconds in a thread until :meth:`stop`."""

        def loop() -> None:
            while not self._stop.wait(every_s):
                try:
                    self.sample()
                except BaseException as err:
                    self.error = err
                    return

        self._thread = threading.Thread(target=loop, name="sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the sampling thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise self.error


# -- the services ------------------------------------------------------------------------------


class Killer:
    """SIGKILLs the http service's replica every ``every_s`` seconds while it is up.

    Alternately the replica's pid from the API (the engine's ``sh`` wrapper, whose death
    leaves no exit file) and the command under it (the wrapper records 137). After each
    kill it waits, with a deadline, until the replica is up again with one more restart.
    """

    def __init__(self, api: Api, job_id: int, every_s: float) -> None:
        self.api = api
        self.job_id = job_id
        self.every_s = every_s
        self.kills: list[dict[str, Any]] = []
        self.skipped = 0  # ticks where the replica was not up (or had no pid)
        self.wrapper_pids: list[int] = []  # leaders (= process groups) killed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _replica(self) -> dict[str, Any]:
        return dict(self.api.job(self.job_id)["replicas"][0])

    def kill_once(self) -> None:
        """One kill (if the replica is up), then wait until it is up again."""
        replica = self._replica()
        pid = replica.get("pid")
        if replica.get("state") != "up" or not pid:
            self.skipped += 1
            return
        restarts = int(replica["restarts"])
        target, what = pid, "wrapper"
        if len(self.kills) % 2 == 1:
            try:
                kids = psutil.Process(pid).children()
            except psutil.NoSuchProcess:
                kids = []
            if kids:
                target, what = kids[0].pid, "command"
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            self.skipped += 1
            return
        t0 = time.monotonic()
        if what == "wrapper":
            self.wrapper_pids.append(pid)
        kill = {"t": t0, "what": what, "pid": target, "restarts_before": restarts}
        self.kills.append(kill)

        def back_up() -> dict[str, Any] | None:
            r = self._replica()
            if int(r["restarts"]) > restarts and r.get("state") == "up":
                return r
            return None

        r = wait_until(f"flap-http up again after kill {len(self.kills)}", back_up, 60, self.api)
        kill["up_again_s"] = time.monotonic() - t0
        kill["last_exit_code"] = r.get("last_exit_code")

    def start(self) -> None:
        """Kill every ``every_s`` seconds in a thread until :meth:`stop`."""

        def loop() -> None:
            while not self._stop.wait(self.every_s):
                try:
                    self.kill_once()
                except BaseException as err:
                    self.error = err
                    return

        self._thread = threading.Thread(target=loop, name="killer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop killing (after the kill in progress, if any, is back up)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise self.error


def marked_processes(mark: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``MARK=mark`` (the services' processes)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARK) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def describe(proc: psutil.Process) -> str:
    """``pid (cmdline)`` of a process, for the report."""
    try:
        return f"{proc.pid} ({' '.join(proc.cmdline())[:80]}; ppid {proc.ppid()})"
    except psutil.Error:
        return str(proc.pid)


def pgid(pid: int) -> int | None:
    """The process group of ``pid`` (``None`` if it is gone)."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def kill_marked(mark: str) -> int:
    """SIGKILL every process that carries the mark; how many there were."""
    procs = marked_processes(mark)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            continue
    return len(procs)


def service_figures(api: Api, job_id: int) -> dict[str, Any]:
    """Status, message and replicas (state, restarts, last exit) of a service."""
    job = api.job(job_id)
    return {
        "id": job_id,
        "name": job.get("name"),
        "status": job.get("status"),
        "message": job.get("message"),
        "termination_reason": job.get("termination_reason"),
        "replicas": [
            {
                k: r.get(k)
                for k in ("index", "state", "pid", "restarts", "last_exit_code", "message")
            }
            for r in job.get("replicas") or []
        ],
    }


# -- the soak --------------------------------------------------------------------------------


def submit_jobs(api: Api, n: int, batch: int, rate: float | None) -> list[int]:
    """Submit ``n`` ``true`` jobs in batches, at ``rate`` jobs/s (``None``: back to back)."""
    ids: list[int] = []
    t0 = time.monotonic()
    while len(ids) < n:
        size = min(batch, n - len(ids))
        if rate is not None:
            due = t0 + len(ids) / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing only: completion is checked by polling
        ids += api.submit([{"command": ["true"]}] * size)
    return ids


def wait_terminal(api: Api, expected: int, timeout_s: float, sampler: Sampler) -> float:
    """Poll ``/metrics`` until ``expected`` jobs are terminal; the monotonic time it was seen."""

    def done() -> float | None:
        if sampler.error is not None:
            raise sampler.error
        return time.monotonic() if terminal_count(api.counts()) >= expected else None

    return float(wait_until(f"{expected} jobs terminal", done, timeout_s, api, poll_s=0.05))


def verify_jobs(api: Api, ids: list[int]) -> dict[str, Any]:
    """Read back every terminal job; count completed (exit 0), failed and lost ones."""
    query = f"status={','.join(common.TERMINAL)}&limit={len(ids) + 1000}"
    rows = api.call("GET", f"/jobs?{query}")["jobs"]
    by_id = {int(j["id"]): j for j in rows}
    completed = failed = lost = 0
    bad: list[str] = []
    first_start = last_end = None
    for job_id in ids:
        job = by_id.get(job_id)
        if job is None:
            lost += 1
            if len(bad) < 5:
                bad.append(f"job {job_id}: not terminal / missing")
            continue
        if job["status"] == "completed" and job.get("exit_code") == 0:
            completed += 1
        else:
            failed += 1
            if len(bad) < 5:
                bad.append(
                    f"job {job_id}: {job['status']} exit={job.get('exit_code')} "
                    f"{job.get('message')}"
                )
        if job.get("started_at") is not None:
            s = float(job["started_at"])
            first_start = s if first_start is None else min(first_start, s)
        if job.get("ended_at") is not None:
            e = float(job["ended_at"])
            last_end = e if last_end is None else max(last_end, e)
    return {
        "submitted": len(ids),
        "completed": completed,
        "failed": failed,
        "lost": lost,
        "examples": bad,
        "server_span_s": (last_end - first_start) if first_start and last_end else None,
    }


def soak(srv: common.Server, args: argparse.Namespace, mark: str) -> dict[str, Any]:
    """The whole run on one engine; returns every figure."""
    api = Api(srv)
    out: dict[str, Any] = {}
    health = api.call("GET", "/health")
    pid = int(health["pid"])
    out["engine_pid"] = pid
    out["engine_start_s"] = srv.start_s

    common.step(f"warm-up: {args.warmup} jobs")
    warm_ids = submit_jobs(api, args.warmup, args.batch, None)
    sampler = Sampler(api, pid)
    wait_terminal(api, len(warm_ids), 120, sampler)
    idle_before = sampler.sample("idle, before the services")
    fds_before = quiet_fd_kinds(pid)

    common.step("services: flap-exit, flap-http")
    env = {"env": {MARK: mark}}
    exit_id, http_id = api.submit([FLAP_EXIT | env, FLAP_HTTP | env])
    wait_until(
        "flap-http up and flap-exit restarted",
        lambda: (
            api.job(http_id)["replicas"][0]["state"] == "up"
            and api.job(exit_id)["replicas"][0]["restarts"] >= 1
        ),
        60,
        api,
    )
    start = sampler.sample("start (after warm-up, services flapping)")
    killer = Killer(api, http_id, args.kill_every)
    sampler.start(args.sample_every)
    killer.start()
    meter = common.Meter(pid)

    paced = args.jobs - args.burst
    rate = paced / args.duration if args.duration > 0 else None
    common.step(
        f"paced: {paced} jobs in batches of {args.batch}"
        + (f" at {rate:.1f} jobs/s" if rate else " back to back")
    )
    expected = len(warm_ids)
    t_paced = time.monotonic()
    ids = submit_jobs(api, paced, args.batch, rate)
    t_paced_submitted = time.monotonic()
    expected += len(ids)
    t_paced_done = wait_terminal(api, expected, 120 + paced * 0.05, sampler)
    paced_done_at = len(sampler.samples)

    common.step(f"burst: {args.burst} jobs back to back")
    t_burst = time.monotonic()
    burst_ids = submit_jobs(api, args.burst, args.batch, None)
    t_burst_submitted = time.monotonic()
    expected += len(burst_ids)
    t_burst_done = wait_terminal(api, expected, 120 + args.burst * 0.05, sampler)
    ids += burst_ids
    cpu = meter.stop()

    killer.stop()
    sampler.stop()
    end = sampler.sample("end (all jobs done, services flapping)")
    common.step("cancel the services")
    services_before = [service_figures(api, i) for i in (exit_id, http_id)]
    cancel: dict[str, Any] = {}
    for job_id in (exit_id, http_id):
        t0 = time.monotonic()
        try:
            api.call("POST", f"/jobs/{job_id}/cancel")
        except Exception as err:  # a service that already ended cannot be cancelled (409)
            cancel[str(job_id)] = {"cancel_error": str(err)}
        waited = api.call("GET", f"/jobs/{job_id}/wait?timeout=30")
        cancel[str(job_id)] = cancel.get(str(job_id), {}) | {
            "timed_out": bool(waited.get("timed_out")),
            "ended_in_s": time.monotonic() - t0,
        }
    services_after = [service_figures(api, i) for i in (exit_id, http_id)]

    # Settle: wait (with a deadline) until the engine has no children left, then sample.
    def no_children() -> bool:
        try:
            return not psutil.Process(pid).children()
        except psutil.NoSuchProcess:
            return True

    try:
        wait_until("the engine's children gone", no_children, 10, api)
        settled = True
    except BenchFailure:
        settled = False
    idle_after = sampler.sample("idle, after the services were cancelled")
    fds_after = quiet_fd_kinds(pid)
    left = marked_processes(mark)
    leftovers = [describe(p) for p in left]
    from_kills = sum(pgid(p.pid) in killer.wrapper_pids for p in left)
    # Last, as it costs the engine memory of its own: one read of every job (20,000 rows).
    common.step("verify jobs")
    out["jobs"] = verify_jobs(api, warm_ids + ids)
    out["jobs"]["warmup"] = len(warm_ids)
    sampler.sample("after reading back every job")

    paced_samples = [s for s in sampler.samples[:paced_done_at] if s["label"] == ""]
    out |= {
        "samples": sampler.samples,
        "start": start,
        "end": end,
        "idle_before": idle_before,
        "idle_after": idle_after,
        "settled": settled,
        "fd_kinds_before": fds_before,
        "fd_kinds_after": fds_after,
        "max_zombies_seen": max(s["zombies"] for s in sampler.samples),
        "max_active_paced": max((s["active"] for s in paced_samples), default=None),
        "refusals": api.refusals,
        "retry_wait_s": api.retry_wait_s,
        "submit_batches": len(api.submit_s),
        "submit_latency": summary(api.submit_s),
        "engine_cpu": cpu,
        "paced": {
            "jobs": paced,
            "target_rate": rate,
            "submit_s": t_paced_submitted - t_paced,
            "done_s": t_paced_done - t_paced,
            "rate": paced / (t_paced_done - t_paced),
        },
        "burst": {
            "jobs": args.burst,
            "submit_s": t_burst_submitted - t_burst,
            "done_s": t_burst_done - t_burst,
            "rate": args.burst / (t_burst_done - t_burst) if args.burst else None,
        },
        "overall": {
            "jobs": len(ids),
            "wall_s": t_burst_done - t_paced,
            "rate": len(ids) / (t_burst_done - t_paced),
            "cpu_ms_per_job": 1000 * (cpu["self_cpu_s"]) / len(ids),
            "children_cpu_ms_per_job": 1000 * cpu["children_cpu_s"] / len(ids),
        },
        "rss_slope_mib_per_10k": rss_slope(sampler.samples),
        "services_before_cancel": services_before,
        "services_after_cancel": services_after,
        "cancel": cancel,
        "kills": [{k: v for k, v in kill.items() if k != "t"} for kill in killer.kills],
        "kills_skipped": killer.skipped,
        "killed_wrappers": killer.wrapper_pids,
        "leftover_processes": leftovers,
        "leftovers_in_killed_groups": from_kills,
    }
    return out


def rss_slope(samples: list[dict[str, Any]]) -> float | None:
    """RSS growth in MiB per 10,000 finished jobs (least squares, start to end sample)."""
    first = next(i for i, s in enumerate(samples) if s["label"].startswith("start"))
    last = next(i for i, s in enumerate(samples) if s["label"].startswith("end"))
    rows = samples[first : last + 1]
    xs = [float(s["terminal"]) for s in rows]
    ys = [float(s["rss_mib"]) for s in rows]
    if len(rows) < 3 or max(xs) == min(xs):
        return None
    return statistics.linear_regression(xs, ys).slope * 10_000


# -- report ----------------------------------------------------------------------------------


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Verdicts: the issue's targets and the functional checks."""
    s = r["soak"]
    jobs = s["jobs"]
    ratio = s["end"]["rss_mib"] / s["start"]["rss_mib"]
    fds_before = sum(s["fd_kinds_before"].values())
    fds_after = sum(s["fd_kinds_after"].values())
    fd_diff = fds_after - fds_before
    http_before = s["services_before_cancel"][1]["replicas"][0]
    kills = len(s["kills"])
    restarted = http_before["restarts"] >= kills
    ended = all(not c["timed_out"] for c in s["cancel"].values())
    final = [svc["status"] for svc in s["services_after_cancel"]]
    return [
        {
            "target": f"RSS flat within 20 % (end / start, {jobs['submitted']:,} jobs)",
            "value": f"{s['start']['rss_mib']:.1f} -> {s['end']['rss_mib']:.1f} MiB (x{ratio:.3f})",
            "met": ratio <= RSS_TARGET_RATIO,
        },
        {
            "target": "no leaked fds (idle engine before the services vs after they ended)",
            "value": f"{fds_before} -> {fds_after} ({fd_diff:+d})",
            "met": fd_diff <= 0,
        },
        {
            "target": "no zombie children (end; most seen in any sample)",
            "value": f"{s['idle_after']['zombies']}; {s['max_zombies_seen']}",
            "met": s["idle_after"]["zombies"] == 0 and s["end"]["zombies"] == 0,
        },
        {
            "target": "no processes left behind by the services after cancel",
            "value": str(len(s["leftover_processes"])),
            "met": not s["leftover_processes"],
        },
        {
            "target": "every job completed with exit 0 (functional)",
            "value": f"{jobs['completed']:,}/{jobs['submitted']:,} "
            f"(failed {jobs['failed']}, lost {jobs['lost']})",
            "met": jobs["completed"] == jobs["submitted"],
        },
        {
            "target": "flap-http restarted after every kill",
            "value": f"{http_before['restarts']} restarts, {kills} kills",
            "met": restarted,
        },
        {
            "target": "both services end after cancel (functional)",
            "value": ", ".join(final),
            "met": ended and all(st in common.TERMINAL for st in final),
        },
    ]


def functional_ok(r: dict[str, Any]) -> bool:
    """The checks that make the exit status non-zero."""
    jobs = r["soak"]["jobs"]
    cancel = r["soak"]["cancel"].values()
    return jobs["completed"] == jobs["submitted"] and not any(c["timed_out"] for c in cancel)


def sample_rows(samples: list[dict[str, Any]], most: int = 16) -> list[dict[str, Any]]:
    """At most ``most`` samples: every labelled one and evenly spaced periodic ones."""
    periodic = [s for s in samples if not s["label"]]
    step = max(1, -(-len(periodic) // max(1, most - 5)))
    keep = {id(s) for s in periodic[::step]}
    return [s for s in samples if s["label"] or id(s) in keep]


def render(r: dict[str, Any]) -> str:
    """The Markdown report."""
    s, p = r["soak"], r["params"]
    jobs = s["jobs"]
    lines = [
        "# Soak: 20,000 short jobs and 2 flapping services",
        "",
        f"Command: `{r['command']}`",
        "",
        common.machine_line(r["machine"]) + f" Run took {r['elapsed_s']:.1f} s.",
        "",
        f"One `--serve --simulate {SIMULATE}` engine, `[cpu] slots = {SLOTS}`, "
        f"`[services] steady_after = {p['steady_after']:g}` (so a crash restarts after 1 s "
        f"instead of backing off to 30 s). {jobs['warmup']} warm-up jobs, then "
        f"{s['paced']['jobs']:,} `true` jobs paced at {s['paced']['target_rate'] or 0:.1f} "
        f"jobs/s in batches of {p['batch']}, then {s['burst']['jobs']:,} back to back; "
        f"`flap-exit` (`{FLAP_EXIT['shell']}`, on_failure, no port) and `flap-http` "
        f"(`{FLAP_HTTP['shell']}`, always, SIGKILLed every {p['kill_every']:g} s while up), "
        "one GPU each. Engine sampled every "
        f"{p['sample_every']:g} s.",
        "",
        "| target | this run | verdict |",
        "|---|---|---|",
    ]
    for tg in r["targets"]:
        lines.append(f"| {tg['target']} | {tg['value']} | {common.met(tg['met'])} |")
    lines += [
        "",
        "## Jobs and throughput",
        "",
        "| what | figure |",
        "|---|---|",
        f"| jobs submitted (+ warm-up) | {jobs['submitted'] - jobs['warmup']:,} "
        f"(+ {jobs['warmup']}) in {s['submit_batches']} accepted batches |",
        f"| completed / failed / lost | {jobs['completed']:,} / {jobs['failed']} / "
        f"{jobs['lost']} |",
        f"| 429 refusals (Retry-After honoured) | {s['refusals']} "
        f"({s['retry_wait_s']:.1f} s waited) |",
        f"| batch submit latency p50 / p95 / max | {s['submit_latency']['p50_ms']:.1f} / "
        f"{s['submit_latency']['p95_ms']:.1f} / {s['submit_latency']['max_ms']:.1f} ms |",
        f"| paced phase: offered -> done | {s['paced']['target_rate'] or 0:.1f} jobs/s offered, "
        f"{s['paced']['rate']:.1f} jobs/s done ({s['paced']['jobs']:,} in "
        f"{s['paced']['done_s']:.1f} s); most jobs active in a sample: "
        f"{s['max_active_paced']} |",
    ]
    if s["burst"]["jobs"]:
        lines.append(
            f"| burst drain ({s['burst']['jobs']:,} jobs, {jobs['submitted']:,} in history) "
            f"| **{s['burst']['rate']:.1f} jobs/s** ({s['burst']['done_s']:.2f} s; "
            f"submitted in {s['burst']['submit_s']:.2f} s) |"
        )
    lines += [
        f"| whole soak | {s['overall']['jobs']:,} jobs in {s['overall']['wall_s']:.1f} s = "
        f"{s['overall']['rate']:.1f} jobs/s |",
        f"| engine CPU per job (own + reaped children, services included) "
        f"| {s['overall']['cpu_ms_per_job']:.2f} + "
        f"{s['overall']['children_cpu_ms_per_job']:.2f} ms |",
        "",
        "## The engine process",
        "",
        f"RSS slope over the soak: {fmt_slope(s['rss_slope_mib_per_10k'])} "
        "(least squares of RSS against finished jobs, from the start sample to the end).",
        "",
        "| t s | sample | jobs finished | active | RSS MiB | anon / file MiB | fds | threads "
        "| children | zombies |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in sample_rows(s["samples"]):
        lines.append(
            f"| {row['t_s']:.1f} | {row['label'] or 'periodic'} | {row['terminal']:,} "
            f"| {row['active']} | {row['rss_mib']:.1f} "
            f"| {row['rss_anon_mib']:.1f} / {row['rss_file_mib']:.1f} "
            f"| {row['fds']} | {row['threads']} "
            f"| {row['children']} | {row['zombies']} |"
        )
    before, after = s["fd_kinds_before"], s["fd_kinds_after"]
    diff = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after))}
    changed = ", ".join(f"{k}: {v:+d}" for k, v in diff.items() if v) or "none"
    lines += [
        "",
        f"fds by kind on the idle engine, before the services: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(before.items()))}. Changed after: "
        f"{changed}.",
    ]
    if not s["settled"]:
        lines.append("")
        lines.append("The engine still had children 10 s after the services were cancelled.")
    lines += [
        "",
        "## Services",
        "",
        "| service | restarts | before cancel | after cancel | replica after cancel |",
        "|---|---:|---|---|---|",
    ]
    for pre, post in zip(s["services_before_cancel"], s["services_after_cancel"], strict=True):
        rep0, rep1 = pre["replicas"][0], post["replicas"][0]
        lines.append(
            f"| {pre['name']} (job {pre['id']}) | {rep0['restarts']} | {pre['status']}, "
            f"replica {rep0['state']} | {post['status']} ({post['termination_reason']}) | "
            f"{rep1['state']}: {rep1['message']} |"
        )
    kills = s["kills"]
    if kills:
        ups = [k["up_again_s"] for k in kills if "up_again_s" in k]
        by_what = collections.Counter(k["what"] for k in kills)
        codes = collections.Counter(str(k.get("last_exit_code")) for k in kills)
        lines += [
            "",
            f"flap-http: {len(kills)} SIGKILLs ({by_what['wrapper']} of the wrapper pid from "
            f"the API, {by_what['command']} of the command under it; {s['kills_skipped']} "
            f"ticks skipped, replica not up); back up in p50 {statistics.median(ups):.2f} s, "
            f"max {max(ups):.2f} s (1 s back-off included); exit codes recorded: "
            + ", ".join(f"{c} x{n}" for c, n in sorted(codes.items()))
            + ".",
        ]
    if s["leftover_processes"]:
        lines += [
            "",
            f"**Left behind** after cancel ({len(s['leftover_processes'])} processes, killed "
            "by the bench afterwards): "
            + "; ".join(s["leftover_processes"][:8])
            + (" ..." if len(s["leftover_processes"]) > 8 else "")
            + f". {s['leftovers_in_killed_groups']} of them are in the process group of a "
            "wrapper the bench SIGKILLed: the command outlives its wrapper, and the engine "
            "starts a new replica without stopping the old group.",
        ]
    if jobs["examples"]:
        lines += ["", "Jobs that did not complete: " + "; ".join(jobs["examples"]) + "."]
    return "\n".join(lines) + "\n"


def fmt_slope(value: float | None) -> str:
    """MiB per 10,000 jobs, or why not computed."""
    return "n/a (too few samples)" if value is None else f"{value:+.2f} MiB per 10,000 jobs"


def main(argv: list[str] | None = None) -> int:
    """Run the soak and write the report; 1 on a functional failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=None, help="true jobs (20000)")
    parser.add_argument("--burst", type=int, default=None, help="of which back to back (2000)")
    parser.add_argument("--duration", type=float, default=None, help="paced phase, s (240)")
    parser.add_argument("--batch", type=int, default=None, help="jobs per POST (100)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up jobs (200)")
    parser.add_argument("--kill-every", type=float, default=None, help="s between kills (5)")
    parser.add_argument("--sample-every", type=float, default=None, help="s between samples (5)")
    parser.add_argument("--steady-after", type=float, default=0.25, help="[services] (0.25)")
    parser.add_argument("--quick", action="store_true", help="2,000 jobs in ~20 s")
    parser.add_argument("--tmpdir", default=None, help="where temp state dirs go")
    root = common.ROOT / "bench"
    parser.add_argument("--out", type=Path, default=root / "results-soak.md")
    parser.add_argument("--json", type=Path, default=root / "results-soak.json")
    args = parser.parse_args(argv)
    common.TMP_BASE = args.tmpdir
    q = args.quick
    args.jobs = args.jobs if args.jobs is not None else (2000 if q else 20_000)
    args.burst = min(args.jobs, args.burst if args.burst is not None else (500 if q else 2000))
    args.duration = args.duration if args.duration is not None else (12.0 if q else 240.0)
    args.batch = args.batch or (50 if q else 100)
    args.warmup = args.warmup or (50 if q else 200)
    args.kill_every = args.kill_every or (2.0 if q else 5.0)
    args.sample_every = args.sample_every or (1.0 if q else 5.0)
    started = time.perf_counter()
    params = {
        k: getattr(args, k)
        for k in (
            "jobs",
            "burst",
            "duration",
            "batch",
            "warmup",
            "kill_every",
            "sample_every",
            "steady_after",
        )
    }
    results: dict[str, Any] = {
        "command": shlex.join(["python", "bench/bench_soak.py", *sys.argv[1:]]),
        "params": params,
        "machine": machine(),
    }
    config = f"[cpu]\nslots = {SLOTS}\n[services]\nsteady_after = {args.steady_after}\n"
    mark = f"{os.getpid()}-{time.time_ns()}"
    try:
        with temp_home("soak") as tmp, serving(tmp / "home", SIMULATE, config) as srv:
            try:
                results["soak"] = soak(srv, args, mark)
            finally:
                results["killed_leftovers"] = kill_marked(mark)
    except BenchFailure as err:
        kill_marked(mark)
        print(f"bench_soak: FAILED: {err}", file=sys.stderr)
        return 1
    finally:
        kill_marked(mark)  # the engine's SIGTERM stops watching; services outlive it
    common.finish(
        results,
        started,
        args.out,
        args.json,
        lambda r: r.update(targets=targets(r), functional_ok=functional_ok(r)),
        render,
    )
    ok = bool(results["functional_ok"])
    if not ok:
        print("bench_soak: FAILED: jobs did not complete or a service did not end", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
