"""Cluster jobs benchmark (issue 16): submitting through Slurm, and following many jobs.

Against the real single-node Slurm of the tests (``tests/slurm/cluster.sh``: root and the
Debian packages slurm-wlm and munge; without them it says so and exits 0):

* **Submission**: N trivial jobs through ``gpulayer-tui submit --file - --cluster test``
  (until every one has its Slurm id), against a plain loop of ``sbatch --wrap true`` in
  the same run. Target: within 1.2x of the loop.
* **Following**: the node drained so every job stays pending, M cluster jobs through the
  engine, then the ``--serve`` process's CPU over a window of polls (1 s apart), less the
  same window with no cluster job (the sampler's ticks). Target: under 50 ms of engine
  CPU per poll for 1,000 jobs.

Usage::

    python bench/bench_cluster.py [--jobs 500] [--follow 1000]
    python bench/bench_cluster.py --quick      # 100 / 200
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common
from common import BenchFailure, machine, serving, temp_home

SCRIPT = common.ROOT / "tests" / "slurm" / "cluster.sh"
CLUSTER_DIR = Path(f"/tmp/gpulayer-slurm-test-{os.getuid()}")
RATIO_TARGET = 1.2
FOLLOW_TARGET_MS = 50.0


def _cluster() -> str | None:
    """SLURM_CONF of a running test cluster, or None (and why) when it cannot run here."""
    if shutil.which("sbatch") is None or os.geteuid() != 0:
        return None
    done = subprocess.run(
        [str(SCRIPT), "start", str(CLUSTER_DIR)], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise BenchFailure(f"the test Slurm did not start: {done.stderr[-1000:]}")
    return done.stdout.strip().split("=", 1)[1]


def _scontrol(conf: str, *args: str) -> None:
    subprocess.run(["scontrol", *args], env=dict(os.environ, SLURM_CONF=conf), check=True)


def _config() -> str:
    return '[clusters.test]\npartition = "gpu"\npoll_interval = 1.0\ncommand_timeout = 60\n'


def sbatch_loop(conf: str, n: int) -> float:
    """Seconds for ``n`` plain ``sbatch --wrap true`` calls, one after another."""
    env = dict(os.environ, SLURM_CONF=conf)
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run(
            ["sbatch", "--parsable", "-p", "gpu", "-o", "/dev/null", "--wrap", "true"],
            env=env,
            check=True,
            capture_output=True,
        )
    return time.perf_counter() - t0


def _submitted(client: Any, n: int) -> int:
    """Jobs that have their Slurm id (said in their message, or already ended well)."""
    rows = client.jobs_page(limit=n + 10)["jobs"]
    bad = [r for r in rows if r["status"] in ("failed", "cancelled")]
    if bad:
        raise BenchFailure(f"{len(bad)} cluster jobs failed, e.g. {bad[0]['message']!r}")
    return sum(
        1 for r in rows if r["message"].startswith("cluster test job") or r["status"] == "completed"
    )


def through_engine(conf: str, n: int) -> dict[str, float]:
    """``submit --file - --cluster test`` with ``n`` lines: CLI time, and time until
    every job has its Slurm id."""
    os.environ["SLURM_CONF"] = conf  # (the engine runs Slurm's commands with it)
    with temp_home("cluster") as tmp, serving(tmp / "home", "1xA100-80GB", _config()) as srv:
        lines = "".join("true\n" for _ in range(n))
        t0 = time.perf_counter()
        subprocess.run(
            [*common.cli_argv(), "submit", "--cluster", "test", "--cwd", "/tmp", "--file", "-"],
            input=lines,
            env=srv.env,
            text=True,
            check=True,
            capture_output=True,
        )
        cli = time.perf_counter() - t0
        while _submitted(srv.client, n) < n:
            if time.perf_counter() - t0 > 120:
                raise BenchFailure("cluster jobs were not all submitted within 2 min")
            time.sleep(0.05)
        return {"cli_s": cli, "all_submitted_s": time.perf_counter() - t0}


def following(conf: str, m: int, polls: int) -> dict[str, float]:
    """Engine CPU per poll with ``m`` pending cluster jobs, less the idle engine's."""
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    _scontrol(conf, "update", f"NodeName={host}", "State=DRAIN", "Reason=bench")
    os.environ["SLURM_CONF"] = conf
    try:
        with temp_home("follow") as tmp, serving(tmp / "home", "1xA100-80GB", _config()) as srv:
            pid = srv.proc.pid
            time.sleep(2.0)  # (settle after start)
            c0 = common.proc_cpu(pid)[0]
            time.sleep(polls)
            idle = common.proc_cpu(pid)[0] - c0
            lines = "".join("true\n" for _ in range(m))
            subprocess.run(
                [*common.cli_argv(), "submit", "--cluster", "test", "--cwd", "/tmp", "--file", "-"],
                input=lines,
                env=srv.env,
                text=True,
                check=True,
                capture_output=True,
            )
            deadline = time.perf_counter() + 300
            while _submitted(srv.client, m) < m:
                if time.perf_counter() > deadline:
                    raise BenchFailure("cluster jobs were not all submitted within 15 min")
                time.sleep(0.2)
            time.sleep(2.0)
            c0 = common.proc_cpu(pid)[0]
            time.sleep(polls)
            busy = common.proc_cpu(pid)[0] - c0
            pending = sum(
                1 for r in srv.client.jobs_page(limit=m + 10)["jobs"] if r["status"] == "queued"
            )
    finally:
        subprocess.run(
            ["scancel", "-u", "root", "-p", "gpu"], env=dict(os.environ, SLURM_CONF=conf)
        )
        _scontrol(conf, "update", f"NodeName={host}", "State=RESUME")
    return {
        "jobs": m,
        "pending_seen": pending,
        "polls": polls,
        "idle_ms_per_poll": 1000 * idle / polls,
        "busy_ms_per_poll": 1000 * busy / polls,
        "follow_ms_per_poll": 1000 * max(0.0, busy - idle) / polls,
    }


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Target verdicts."""
    if "skipped" in r:
        return []
    sub, fol = r["submit"], r["follow"]
    ratio = sub["all_submitted_s"] / sub["loop_s"]
    return [
        {
            "target": f"{sub['jobs']} cluster jobs submitted (each with its Slurm id) within "
            f"{RATIO_TARGET:g}x a plain sbatch loop",
            "value": f"{ratio:.2f}x",
            "met": ratio <= RATIO_TARGET,
        },
        {
            "target": f"following {fol['jobs']} cluster jobs < {FOLLOW_TARGET_MS:g} ms of engine "
            "CPU per poll",
            "value": f"{fol['follow_ms_per_poll']:.1f} ms",
            "met": fol["follow_ms_per_poll"] < FOLLOW_TARGET_MS,
        },
    ]


def render(r: dict[str, Any]) -> str:
    """The Markdown report."""
    lines = [
        "# Cluster jobs: submitting through Slurm, following many",
        "",
        f"Command: `{r['command']}`",
        "",
        common.machine_line(r["machine"]) + f" Run took {r['elapsed_s']:.1f} s.",
        "",
    ]
    if "skipped" in r:
        return "\n".join([*lines, f"Not measured: {r['skipped']}", ""])
    sub, fol = r["submit"], r["follow"]
    lines += [
        "| what | seconds |",
        "|---|---:|",
        f"| {sub['jobs']} x `sbatch --wrap true`, one after another | {sub['loop_s']:.2f} |",
        f"| `submit --file - --cluster test`: the CLI returns | {sub['cli_s']:.2f} |",
        f"| ... every job has its Slurm id | {sub['all_submitted_s']:.2f} |",
        "",
        f"Following: node drained, {fol['jobs']} pending cluster jobs ({fol['pending_seen']} "
        f"seen queued), {fol['polls']} polls 1 s apart: engine CPU {fol['busy_ms_per_poll']:.1f}"
        f" ms per poll, {fol['idle_ms_per_poll']:.1f} ms with no cluster job: "
        f"**{fol['follow_ms_per_poll']:.1f} ms** for the jobs.",
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
    parser.add_argument("--jobs", type=int, default=None, help="jobs submitted (500)")
    parser.add_argument("--follow", type=int, default=None, help="jobs followed (1000)")
    parser.add_argument("--quick", action="store_true", help="short run for CI")
    parser.add_argument("--tmpdir", default=None, help="where temp state dirs go")
    root = common.ROOT / "bench"
    parser.add_argument("--out", type=Path, default=root / "results-cluster.md")
    parser.add_argument("--json", type=Path, default=root / "results-cluster.json")
    args = parser.parse_args(argv)
    common.TMP_BASE = args.tmpdir
    n = args.jobs or (100 if args.quick else 500)
    m = args.follow or (200 if args.quick else 1000)
    polls = 5 if args.quick else 10
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": shlex.join(["python", "bench/bench_cluster.py", *sys.argv[1:]]),
        "machine": machine(),
    }
    try:
        conf = _cluster()
        if conf is None:
            results["skipped"] = "no Slurm here (needs root and slurm-wlm, munge)"
        else:
            common.step(f"sbatch loop, {n} jobs")
            loop = sbatch_loop(conf, n)
            common.step(f"submit --file --cluster, {n} jobs")
            results["submit"] = {"jobs": n, "loop_s": loop, **through_engine(conf, n)}
            common.step(f"following {m} pending cluster jobs")
            results["follow"] = following(conf, m, polls)
    except BenchFailure as err:
        print(f"bench_cluster: FAILED: {err}", file=sys.stderr)
        return 1
    common.finish(
        results, started, args.out, args.json, lambda r: r.update(targets=targets(r)), render
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
