"""Scheduling pass benchmark (issue 18): fair share, limits and reservations at scale.

The engine's scheduling parts alone (the job book over an in-memory journal, the
scheduler over 8 GPU domains, the queue with ``[scheduling]`` and ``[users.*]``), as the
engine wires them but without a loop, SQLite or processes: what a pass itself costs.

* 8 GPU domains, each busy with a running job; 500 jobs waiting from 20 users (1- and
  2-GPU jobs, some with declared VRAM and timeouts, three priorities), some users with
  limits, everyone with recent use (fair share).
* **Blocked pass**: nothing can start (what runs on every GPU sample): wall time per pass.
* **Pass after an end**: a running job ends, the pass starts the best waiting job (with
  the reservation and backfill rules in play), a new job refills its place.

Target (issue 18): a pass under 1 ms with 500 queued jobs, 8 domains and 20 users.

Usage::

    python bench/bench_sched.py [--passes 2000]
    python bench/bench_sched.py --quick
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import common
from common import machine

from gpulayer_tui.engine.config import SchedulingSettings, UserLimits
from gpulayer_tui.engine.domain import Domain
from gpulayer_tui.engine.events import EventBus
from gpulayer_tui.engine.fairness import Limits
from gpulayer_tui.engine.gpus import GIB, GpuReading, ProbeResult, ProbeStatus
from gpulayer_tui.engine.jobbook import ActiveJob, JobBook, release_holds, take_holds
from gpulayer_tui.engine.jobqueue import JobQueue
from gpulayer_tui.engine.models import Event, Job, JobKind, JobStatus, TerminationReason
from gpulayer_tui.engine.scheduler import Scheduler
from gpulayer_tui.engine.spec import parse_spec

GPUS = 8
QUEUED = 500
USERS = 20
TARGET_MS = 1.0


class _Journal:
    """Commits at once, keeps nothing (the pass is what is measured)."""

    def save(
        self, job: Job | None, events: Iterable[Event] = (), wait: bool = False, new: bool = False
    ) -> None:
        return None

    def after_commit(self, callback: Callable[[], None]) -> None:
        callback()


class _Soon:
    def __init__(self) -> None:
        self.calls: list[Callable[[], None]] = []

    def __call__(self, callback: Callable[[], None]) -> _Soon:
        self.calls.append(callback)
        return self

    def cancel(self) -> None:
        self.calls.clear()


def _world(rng: random.Random) -> tuple[JobQueue, JobBook, Scheduler, list[ActiveJob], Any]:
    scheduler = Scheduler()
    readings = [
        GpuReading(i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 80 * GIB, 0) for i in range(GPUS)
    ]
    scheduler.replace_domains(
        [Domain(f"gpu{i}", i, f"GPU-{i}", 1) for i in range(GPUS)] + [Domain("cpu", None, None, 4)]
    )
    scheduler.observe(ProbeResult(ProbeStatus.OK, tuple(readings)), {}, {})
    book = JobBook(_Journal(), EventBus())  # type: ignore[arg-type]
    running: list[ActiveJob] = []

    def start(act: ActiveJob, domains: list[Domain]) -> None:
        take_holds(act, domains)
        act.job.domains = [d.name for d in domains]
        book.transition(act, JobStatus.RUNNING, message="running")
        act.job.started_at = time.time() - rng.uniform(0, 3600)
        running.append(act)

    users = {"default": UserLimits(max_gpus=4)}
    soon = _Soon()
    queue = JobQueue(
        book,
        scheduler,
        _lookup,
        start,
        soon,
        settings=SchedulingSettings(preempt_after=600),
        limits=Limits(users),
    )
    book.on_end(release_holds)
    book.on_end(queue.job_ended)
    now = time.time()
    for uid in range(1000, 1000 + USERS):
        queue.fair.charge(uid, rng.uniform(0, 50 * 3600), now - rng.uniform(0, 86400))
    return queue, book, scheduler, running, soon


async def _lookup(job_id: int) -> Job | None:
    return None


def _submit(book: JobBook, queue: JobQueue, scheduler: Scheduler, rng: random.Random) -> ActiveJob:
    spec: dict[str, Any] = {"command": ["true"], "gpus": rng.choice((1, 1, 1, 2))}
    if rng.random() < 0.4:
        spec["vram_gb"] = rng.choice((10, 20, 40))
    if rng.random() < 0.3:
        spec["timeout"] = rng.choice((600, 3600, 7200))
    if rng.random() < 0.2:
        spec["preemptible"] = True
    priority = rng.choice((0, 0, 0, 1, 2))
    spec["priority"] = priority
    parsed = parse_spec(spec)
    act = book.create(
        name="b",
        kind=JobKind.COMMAND,
        spec_json=parsed.model_dump(mode="json", exclude_none=True),
        spec=parsed,
        request=scheduler.request_for(parsed),
        priority=priority,
        owner_uid=1000 + rng.randrange(USERS),
    )
    queue.enqueue(act, [])
    return act


def measure(passes: int) -> dict[str, Any]:
    """Per-pass wall time, blocked and after an end."""
    rng = random.Random(18)
    queue, book, scheduler, running, soon = _world(rng)
    # Fill every GPU first (one 1-GPU job each), then the queue.
    for _ in range(GPUS):
        parsed = parse_spec({"command": ["sleep", "1"], "gpus": 1})
        act = book.create(
            name="r",
            kind=JobKind.COMMAND,
            spec_json=parsed.model_dump(mode="json", exclude_none=True),
            spec=parsed,
            request=scheduler.request_for(parsed),
            owner_uid=1000 + rng.randrange(USERS),
        )
        queue.enqueue(act, [])
        queue.schedule()
    for _ in range(QUEUED):
        _submit(book, queue, scheduler, rng)
    queue.schedule()
    soon.cancel()
    waiting = len(queue)
    if waiting < QUEUED * 0.9:
        raise common.BenchFailure(f"sched: only {waiting} jobs waiting")
    blocked: list[float] = []
    for _ in range(passes):
        t0 = time.perf_counter()
        queue.schedule()
        blocked.append(time.perf_counter() - t0)
    after_end: list[float] = []
    started = 0
    for _ in range(max(50, passes // 10)):
        live = [a for a in running if a.job.status is JobStatus.RUNNING]
        victim = rng.choice(live)
        before = len(running)
        book.finish(victim, JobStatus.COMPLETED, TerminationReason.EXIT_CODE, "done", 0)
        soon.cancel()
        t0 = time.perf_counter()
        queue.schedule()
        after_end.append(time.perf_counter() - t0)
        started += len(running) - before
        _submit(book, queue, scheduler, rng)
        soon.cancel()
    return {
        "waiting": waiting,
        "users": USERS,
        "gpus": GPUS,
        "blocked_ms": {
            "p50": common.ms(common.pct(blocked, 50)),
            "p95": common.ms(common.pct(blocked, 95)),
            "n": len(blocked),
        },
        "after_end_ms": {
            "p50": common.ms(common.pct(after_end, 50)),
            "p95": common.ms(common.pct(after_end, 95)),
            "n": len(after_end),
            "started": started,
        },
    }


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Target verdicts."""
    worst = max(r["sched"]["blocked_ms"]["p50"], r["sched"]["after_end_ms"]["p50"])
    return [
        {
            "target": f"scheduling pass < {TARGET_MS:g} ms ({QUEUED} queued, {GPUS} domains, "
            f"{USERS} users; p50, the slower of blocked and after an end)",
            "value": f"{worst:.3f} ms",
            "met": worst < TARGET_MS,
        }
    ]


def render(r: dict[str, Any]) -> str:
    """The Markdown report."""
    s = r["sched"]
    lines = [
        "# Scheduling pass: fair share, limits, reservations",
        "",
        f"Command: `{r['command']}`",
        "",
        common.machine_line(r["machine"]) + f" Run took {r['elapsed_s']:.1f} s.",
        "",
        f"{s['waiting']} jobs waiting from {s['users']} users (1- and 2-GPU, some with VRAM, "
        f"timeouts, preemptible, 3 priorities; `[users.default] max_gpus = 4`; everyone with "
        f"recent use), {s['gpus']} busy GPU domains. The parts alone: no loop, SQLite or "
        "processes.",
        "",
        "| pass | n | p50 ms | p95 ms |",
        "|---|---:|---:|---:|",
        f"| blocked (nothing can start; every GPU sample) | {s['blocked_ms']['n']} | "
        f"{s['blocked_ms']['p50']:.3f} | {s['blocked_ms']['p95']:.3f} |",
        f"| after a job ends ({s['after_end_ms']['started']} started) | "
        f"{s['after_end_ms']['n']} | {s['after_end_ms']['p50']:.3f} | "
        f"{s['after_end_ms']['p95']:.3f} |",
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
    parser.add_argument("--passes", type=int, default=None, help="blocked passes (2000)")
    parser.add_argument("--quick", action="store_true", help="short run for CI")
    parser.add_argument("--tmpdir", default=None, help="(unused; for run_all)")
    root = common.ROOT / "bench"
    parser.add_argument("--out", type=Path, default=root / "results-sched.md")
    parser.add_argument("--json", type=Path, default=root / "results-sched.json")
    args = parser.parse_args(argv)
    passes = args.passes or (300 if args.quick else 2000)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": shlex.join(["python", "bench/bench_sched.py", *sys.argv[1:]]),
        "machine": machine(),
    }
    try:
        common.step(f"scheduling pass, {QUEUED} queued, {GPUS} domains, {USERS} users")
        results["sched"] = measure(passes)
    except common.BenchFailure as err:
        print(f"bench_sched: FAILED: {err}", file=sys.stderr)
        return 1
    common.finish(
        results, started, args.out, args.json, lambda r: r.update(targets=targets(r)), render
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
