"""Benchmark against a peer queue: drains through the API and the CLI, and task-spooler.

Measures, in one run, against one ``--serve`` engine with 2 CPU slots (see ``bench/README.md``):

* the launch floor: N x ``Popen(['true'])``, sequential and with 2 alive;
* drain of N ``true`` jobs until all have completed:
  (a) one ``POST /v1/jobs`` with all N (``Client.submit_many``),
  (b) the CLI's batch submit: ``gpulayer-tui submit --file FILE`` (one line per job),
  (c) one ``gpulayer-tui submit -- true`` call per job, as a shell loop would;
* the peer task-spooler (``tsp``, ``tsp -S 2``, its own ``TS_SOCKET``) with one ``tsp true``
  per job, if it is installed (otherwise the report says so and skips the row);
* submit -> start latency through the API (p50/p95), CLI submit latency next to a bare
  ``python -c pass``, and the CLI's import cost (``python -X importtime``), including a
  check that the submit path loads none of textual, aiohttp, pydantic or the engine.

It never fails on speed; it exits non-zero only if a job fails or a server does not start.

Usage::

    python bench/bench_peers.py [--jobs 500] [--cli-jobs 500] [--rounds 3] [--latency 50]
                                [--out FILE.md] [--json FILE.json]
    python bench/bench_peers.py --quick     # N=50, 20 CLI calls, 1 round (CI)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from bench_drain import floor_concurrent, floor_sequential
from common import (
    BenchFailure,
    Meter,
    Server,
    check_jobs,
    cli_argv,
    drain_figures,
    machine,
    ms,
    serving,
    summary,
    temp_home,
    wait_all,
)

SIMULATE = "2xA100-80GB"
SLOTS = 2
HEAVY = ("textual", "rich", "aiohttp", "pydantic", "aiosqlite", "pynvml", "prometheus_client")
# Engine modules the CLI may load: the package itself and where the state dir is.
ENGINE_ALLOWED = {"gpulayer_tui.engine", "gpulayer_tui.engine.paths"}


# -- gpulayer drains -----------------------------------------------------------------------


def drain_api(srv: Server, n: int) -> dict[str, Any]:
    """(a) One ``submit_many`` of N jobs, then wait until all are terminal."""
    meter = Meter(srv.proc.pid)
    jobs = srv.client.submit_many([{"command": ["true"]}] * n)
    call = time.perf_counter() - meter.t0
    rows = wait_all(srv.client, [j["id"] for j in jobs])
    check_jobs("API batch drain", rows, n)
    return drain_figures(n, meter.stop()) | {"submit_call_s": call}


def drain_cli_file(srv: Server, n: int, tmp: Path) -> dict[str, Any]:
    """(b) ``gpulayer-tui submit --file FILE`` with N lines, then wait until all are done."""
    lines = tmp / "jobs.txt"
    lines.write_text("true\n" * n)
    meter = Meter(srv.proc.pid)
    res = subprocess.run(
        [*cli_argv(), "submit", "--file", str(lines)],
        env=srv.env,
        capture_output=True,
        text=True,
        check=False,
    )
    call = time.perf_counter() - meter.t0
    if res.returncode != 0:
        raise BenchFailure(f"submit --file exited {res.returncode}: {res.stderr.strip()}")
    ids = [int(word) for word in res.stdout.split()]
    rows = wait_all(srv.client, ids)
    check_jobs("CLI batch drain", rows, n)
    return drain_figures(n, meter.stop()) | {"submit_call_s": call}


def drain_cli_each(srv: Server, n: int) -> dict[str, Any]:
    """(c) N x ``gpulayer-tui submit -- true``, one after another, then wait for all."""
    argv = [*cli_argv(), "submit", "--", "true"]
    meter = Meter(srv.proc.pid)
    ids = []
    for _ in range(n):
        res = subprocess.run(argv, env=srv.env, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise BenchFailure(f"CLI submit exited {res.returncode}: {res.stderr.strip()}")
        ids.append(int(res.stdout.split()[0]))
    calls = time.perf_counter() - meter.t0
    rows = wait_all(srv.client, ids)
    check_jobs("CLI one-per-job drain", rows, n)
    return drain_figures(n, meter.stop()) | {"calls_ms_per_job": ms(calls) / n}


# -- task-spooler --------------------------------------------------------------------------


def find_tsp() -> str | None:
    """task-spooler's client: ``tsp`` on Debian/Ubuntu, ``ts`` elsewhere (if it is ts's)."""
    for name in ("tsp", "ts"):
        path = shutil.which(name)
        if path is None:
            continue
        try:
            out = subprocess.run([path, "-V"], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if "spooler" in (out.stdout + out.stderr).lower():
            return path
    return None


TSP_ROW = re.compile(r"^(\d+)\s+(\S+)\s+\S+\s+(-?\d+)?")


def _tsp_finished(tsp: str, env: dict[str, str]) -> dict[int, int | None]:
    """Job id -> exit level of every finished job in ``tsp -l``."""
    out = subprocess.run([tsp, "-l"], env=env, capture_output=True, text=True, check=True)
    done: dict[int, int | None] = {}
    for line in out.stdout.splitlines()[1:]:
        match = TSP_ROW.match(line)
        if match and match.group(2) == "finished":
            level = match.group(3)
            done[int(match.group(1))] = int(level) if level is not None else None
    return done


def drain_tsp(tsp: str, n: int) -> dict[str, Any]:
    """The peer: a fresh task-spooler server with 2 slots runs N ``tsp true`` jobs.

    Its own ``TS_SOCKET`` and ``TMPDIR`` (output files) in a temp dir, so it neither sees
    nor disturbs a user's queue. Timed from the first submission until ``tsp -l`` lists
    all N as finished.
    """
    with tempfile.TemporaryDirectory(prefix="gpulayer-bench-tsp-", dir=common.TMP_BASE) as tmp:
        env = dict(os.environ, TS_SOCKET=f"{tmp}/ts.sock", TMPDIR=tmp, TS_MAXFINISHED=str(n + 100))
        env.pop("TS_SLOTS", None)
        subprocess.run([tsp, "-S", str(SLOTS)], env=env, check=True)  # starts its server
        try:
            for _ in range(2):  # warm-up, like the engine's
                subprocess.run([tsp, "true"], env=env, capture_output=True, check=True)
            while len(_tsp_finished(tsp, env)) < 2:
                time.sleep(0.005)
            subprocess.run([tsp, "-C"], env=env, check=True)  # clear the finished list
            meter = Meter()
            ids = []
            for _ in range(n):
                out = subprocess.run(
                    [tsp, "true"], env=env, capture_output=True, text=True, check=True
                )
                ids.append(int(out.stdout.strip()))
            calls = time.perf_counter() - meter.t0
            while True:
                done = _tsp_finished(tsp, env)
                if all(i in done for i in ids):
                    break
                time.sleep(0.005)
            figures = drain_figures(n, meter.stop())
        finally:
            subprocess.run([tsp, "-K"], env=env, capture_output=True, check=False)
    failed = [i for i in ids if done.get(i) != 0]
    if failed:
        raise BenchFailure(f"task-spooler: {len(failed)} of {n} jobs did not exit 0")
    return figures | {"calls_ms_per_job": ms(calls) / n}


# -- latency -------------------------------------------------------------------------------


def api_latency(srv: Server, m: int) -> dict[str, Any]:
    """Submit -> process running through the API on an idle slot: the request's round trip,
    since the answer comes once the decision is durable and the launcher reports the
    process's pid."""
    call, ids = [], []
    for _ in range(m):
        time.sleep(0.01)  # the previous job has ended: the slot is idle
        p0 = time.perf_counter()
        job = srv.client.submit({"command": ["true"]})
        call.append(time.perf_counter() - p0)
        if job.get("pid") is None:
            raise BenchFailure(f"API latency: job {job['id']} did not start at once")
        ids.append(job["id"])
        srv.client.wait(job["id"])
    check_jobs("API latency", wait_all(srv.client, ids), m)
    return {"submit_to_running": summary(call)}


def cli_latency(srv: Server, k: int) -> dict[str, Any]:
    """K x ``gpulayer-tui submit -- true`` interleaved with K x ``python -c pass``."""
    cli = [*cli_argv(), "submit", "--", "true"]
    bare = [sys.executable, "-c", "pass"]
    cli_t: list[float] = []
    bare_t: list[float] = []
    ids = []
    for _ in range(k):  # interleaved, so background load hits both alike
        t0 = time.perf_counter()
        res = subprocess.run(cli, env=srv.env, capture_output=True, text=True, check=False)
        cli_t.append(time.perf_counter() - t0)
        if res.returncode != 0:
            raise BenchFailure(f"CLI submit exited {res.returncode}: {res.stderr.strip()}")
        ids.append(int(res.stdout.split()[0]))
        t0 = time.perf_counter()
        subprocess.run(bare, env=srv.env, capture_output=True, check=True)
        bare_t.append(time.perf_counter() - t0)
    check_jobs("CLI latency", wait_all(srv.client, ids), k)
    return {
        "cli_submit": summary(cli_t),
        "python_c_pass": summary(bare_t),
        "cli_command": shlex.join(["gpulayer-tui", *cli[len(cli_argv()) :]]),
    }


IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")
MODULES_PROBE = (
    "import sys, json\n"
    "from gpulayer_tui.__main__ import main\n"
    "try:\n"
    "    main()\n"
    "except SystemExit:\n"
    "    pass\n"
    "print(json.dumps(sorted(sys.modules)))\n"
)


def import_cost(srv: Server) -> dict[str, Any]:
    """``python -X importtime`` of a real CLI submit: top costs, and what it loads."""
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpulayer_tui", "submit", "--", "true"],
        env=srv.env,
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise BenchFailure(f"CLI submit under -X importtime exited {res.returncode}")
    rows = []
    for line in res.stderr.splitlines():
        match = IMPORT_LINE.match(line)
        if match:
            depth = len(match.group(3)) // 2
            rows.append((match.group(4), int(match.group(1)), int(match.group(2)), depth))
    top_level = sorted((r for r in rows if r[3] == 0), key=lambda r: -r[2])
    own = sorted(rows, key=lambda r: -r[1])
    probe = subprocess.run(
        [sys.executable, "-c", MODULES_PROBE, "submit", "--", "true"],
        env=srv.env,
        capture_output=True,
        text=True,
        check=False,
    )
    import json

    loaded = json.loads(probe.stdout.strip().splitlines()[-1])
    heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
    engine = [m for m in loaded if m.startswith("gpulayer_tui.engine") and m not in ENGINE_ALLOWED]
    return {
        "total_us": sum(r[1] for r in rows),
        "top_cumulative": [{"module": r[0], "us": r[2]} for r in top_level[:10]],
        "top_self": [{"module": r[0], "us": r[1]} for r in own[:10]],
        "modules": len(loaded),
        "heavy_loaded": heavy,
        "engine_loaded": engine,
        "http_client_loaded": "http.client" in loaded,
    }


# -- report --------------------------------------------------------------------------------

ROWS = {
    "floor_sequential": "floor: `Popen(['true']).wait()` sequential",
    "floor_2": "floor: `Popen(['true'])`, 2 alive",
    "api": "(a) API: one `POST /v1/jobs` with N jobs",
    "cli_file": "(b) CLI: `gpulayer-tui submit --file FILE` (N lines)",
    "cli_each": "(c) CLI: N x `gpulayer-tui submit -- true`",
    "tsp": "peer: task-spooler, N x `tsp true`, `tsp -S 2`",
}
ROUNDED = ("floor_sequential", "floor_2", "api", "cli_file", "tsp")


def best(rounds: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The least disturbed round's figures of ``key`` (lowest wall ms/job)."""
    rows = [r[key] for r in rounds if r.get(key)]
    return min(rows, key=lambda f: f["ms_per_job"]) if rows else None


def headline(r: dict[str, Any]) -> dict[str, Any]:
    """Best-of-rounds figures, ratios and target verdicts."""
    rounds = r["rounds"]
    fig = {k: best(rounds, k) for k in ROUNDED}
    fig["cli_each"] = r.get("cli_each")
    per: dict[str, Any] = {k: (v["ms_per_job"] if v else None) for k, v in fig.items()}
    tsp = per["tsp"]
    ratios = {
        "api_vs_floor2": per["api"] / per["floor_2"],
        "cli_file_vs_floor2": per["cli_file"] / per["floor_2"],
        "api_vs_tsp": per["api"] / tsp if tsp else None,
        "cli_file_vs_tsp": per["cli_file"] / tsp if tsp else None,
        "cli_each_vs_tsp": per["cli_each"] / tsp if tsp and per["cli_each"] else None,
    }
    lat, cli = r["api_latency"], r["cli"]
    imp = r["imports"]
    cli_ratio = cli["cli_submit"]["p50_ms"] / cli["python_c_pass"]["p50_ms"]
    targets = [
        {
            "target": "(a) API batch drain within 2x the 2-alive Popen floor",
            "value": f"{ratios['api_vs_floor2']:.2f}x",
            "met": ratios["api_vs_floor2"] <= 2.0,
        },
        {
            "target": "(a) API batch drain faster than task-spooler",
            "value": f"{ratios['api_vs_tsp']:.2f}x tsp" if tsp else "tsp not installed",
            "met": ratios["api_vs_tsp"] < 1.0 if tsp else None,
        },
        {
            "target": "(b) CLI batch drain faster than task-spooler",
            "value": f"{ratios['cli_file_vs_tsp']:.2f}x tsp" if tsp else "tsp not installed",
            "met": ratios["cli_file_vs_tsp"] < 1.0 if tsp else None,
        },
        {
            "target": "submit -> process running through the API (HTTP included), p50 < 2 ms",
            "value": f"p50 {lat['submit_to_running']['p50_ms']:.2f} ms, "
            f"p95 {lat['submit_to_running']['p95_ms']:.2f} ms",
            "met": lat["submit_to_running"]["p50_ms"] < 2.0,
        },
        {
            "target": "CLI submit p50 < 2x bare `python -c pass` (the bench's own venv; "
            "bench_cli.py measures a plain install)",
            "value": f"{cli_ratio:.2f}x",
            "met": cli_ratio < 2.0,
        },
        {
            "target": "CLI submit imports no textual/aiohttp/pydantic/engine",
            "value": ", ".join(imp["heavy_loaded"] + imp["engine_loaded"]) or "none loaded",
            "met": not (imp["heavy_loaded"] or imp["engine_loaded"]),
        },
    ]
    return {"best": fig, "ratios": ratios, "cli_vs_python": cli_ratio, "targets": targets}


def render(r: dict[str, Any]) -> str:
    """The Markdown report."""
    h, p = r["headline"], r["params"]
    n = p["jobs"]
    lines = [
        "# Peers: drain and submit against task-spooler",
        "",
        f"Command: `{r['command']}`",
        "",
        common.machine_line(r["machine"]) + f" Run took {r['elapsed_s']:.1f} s.",
        "",
        f"N={n} `true` jobs per drain ((c): {p['cli_jobs']}), {SLOTS} slots everywhere "
        f"(engine `[cpu] slots = {SLOTS}`, `tsp -S {SLOTS}`), {p['rounds']} interleaved "
        "rounds of the floors, (a), (b) and task-spooler (best round shown, every round in "
        "the JSON); (c) runs once. Each drain is timed from the first submission until every "
        "job is seen terminal. CPU is the server's (or tsp's client calls for the peer).",
        "",
        "| what | best wall ms/job | every round | server CPU ms/job | note |",
        "|---|---:|---|---:|---|",
    ]
    tsp_missing = r.get("tsp_missing")
    for key, label in ROWS.items():
        fig = h["best"].get(key)
        if fig is None:
            note = tsp_missing or "not run"
            lines.append(f"| {label} | - | - | - | {note} |")
            continue
        every = ", ".join(
            f"{rd[key]['ms_per_job']:.3f}" for rd in r["rounds"] if rd.get(key) is not None
        )
        note = ""
        if "submit_call_s" in fig:
            note = f"submit call {ms(fig['submit_call_s']):.1f} ms"
        if "calls_ms_per_job" in fig:
            note = f"submit calls alone {fig['calls_ms_per_job']:.2f} ms/job"
        cpu = fig["self_cpu_ms_per_job"] if key in ("api", "cli_file", "cli_each") else None
        lines.append(
            f"| {label} | {fig['ms_per_job']:.3f} | {every or '-'} | "
            f"{'' if cpu is None else f'{cpu:.3f}'} | {note} |"
        )
    x = h["ratios"]

    def rx(key: str) -> str:
        return "n/a (no tsp)" if x[key] is None else f"{x[key]:.2f}x"

    lines += [
        "",
        "| ratio (best / best, same run) | value |",
        "|---|---:|",
        f"| (a) API batch / 2-alive floor | {rx('api_vs_floor2')} |",
        f"| (b) CLI batch / 2-alive floor | {rx('cli_file_vs_floor2')} |",
        f"| (a) API batch / task-spooler | {rx('api_vs_tsp')} |",
        f"| (b) CLI batch / task-spooler | {rx('cli_file_vs_tsp')} |",
        f"| (c) CLI per job / task-spooler | {rx('cli_each_vs_tsp')} |",
        "",
    ]
    if tsp_missing:
        lines += [f"task-spooler: {tsp_missing}", ""]
    lat, cli, imp = r["api_latency"], r["cli"], r["imports"]
    lines += [
        "## Submit latency",
        "",
        *common.LAT_HEADER,
        common.lat_row(
            "API: `POST /v1/jobs` -> answer with the running pid (idle slot)",
            lat["submit_to_running"],
        ),
        common.lat_row(f"CLI: `{cli['cli_command']}`", cli["cli_submit"]),
        common.lat_row("bare `python -c pass`", cli["python_c_pass"]),
        "",
        f"CLI submit p50 / `python -c pass` p50 = {h['cli_vs_python']:.2f}x.",
        "",
        "## CLI imports (`python -X importtime -m gpulayer_tui submit -- true`)",
        "",
        f"{imp['modules']} modules loaded; {imp['total_us'] / 1000:.1f} ms of imports in all "
        f"(interpreter start-up included). Heavy modules loaded: "
        f"{', '.join(imp['heavy_loaded']) or 'none'}; engine modules beyond `paths`: "
        f"{', '.join(imp['engine_loaded']) or 'none'}; `http.client`: "
        f"{'loaded' if imp['http_client_loaded'] else 'not loaded'}.",
        "",
        "| top-level import | cumulative ms |",
        "|---|---:|",
        *(f"| `{t['module']}` | {t['us'] / 1000:.2f} |" for t in imp["top_cumulative"][:8]),
        "",
        "## Targets",
        "",
        "| target | this run | verdict |",
        "|---|---|---|",
    ]
    for t in h["targets"]:
        verdict = "skipped" if t["met"] is None else common.met(t["met"])
        lines.append(f"| {t['target']} | {t['value']} | {verdict} |")
    return "\n".join(lines) + "\n"


# -- main ----------------------------------------------------------------------------------


def run_rounds(srv: Server, n: int, rounds: int, tsp: str | None, tmp: Path) -> list[Any]:
    """The floors, (a), (b) and the peer, interleaved ``rounds`` times."""
    out = []
    for i in range(rounds):
        common.step(f"round {i + 1}/{rounds}: floors, (a) API, (b) CLI --file, tsp")
        out.append(
            {
                "floor_sequential": floor_sequential(n),
                "floor_2": floor_concurrent(n),
                "api": drain_api(srv, n),
                "cli_file": drain_cli_file(srv, n, tmp),
                "tsp": drain_tsp(tsp, n) if tsp else None,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Run everything once and write the report; 1 if a job failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=None, help="N jobs per drain (500)")
    parser.add_argument("--cli-jobs", type=int, default=None, help="jobs for (c) (500)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (3)")
    parser.add_argument("--latency", type=int, default=None, help="latency samples (50)")
    parser.add_argument("--quick", action="store_true", help="small N for CI")
    parser.add_argument("--tmpdir", default=None, help="where temp state dirs go")
    parser.add_argument("--out", type=Path, default=common.ROOT / "bench" / "results-peers.md")
    parser.add_argument("--json", type=Path, default=common.ROOT / "bench" / "results-peers.json")
    args = parser.parse_args(argv)
    common.TMP_BASE = args.tmpdir
    n = args.jobs or (50 if args.quick else 500)
    n_cli = args.cli_jobs or (20 if args.quick else 500)
    rounds = args.rounds or (1 if args.quick else 3)
    m = args.latency or (10 if args.quick else 50)
    started = time.perf_counter()
    tsp = find_tsp()
    results: dict[str, Any] = {
        "command": shlex.join(["python", "bench/bench_peers.py", *(sys.argv[1:] or [])]),
        "params": {"jobs": n, "cli_jobs": n_cli, "rounds": rounds, "latency": m},
        "machine": machine(),
        "tsp": tsp,
        "tsp_missing": None
        if tsp
        else "not installed (`sudo apt-get install task-spooler`); its rows are skipped",
    }
    try:
        with (
            temp_home("peers") as home,
            serving(home / "home", SIMULATE, f"[cpu]\nslots = {SLOTS}\n") as srv,
        ):
            drain_api(srv, 4)  # warm-up: first forks, SQLite pages, code paths
            cli_latency(srv, 1)  # warm-up: writes the CLI's bytecode caches
            results["rounds"] = run_rounds(srv, n, rounds, tsp, home)
            common.step(f"(c) {n_cli} CLI calls, one per job")
            results["cli_each"] = drain_cli_each(srv, n_cli)
            common.step("latency: API, CLI, imports")
            results["api_latency"] = api_latency(srv, m)
            results["cli"] = cli_latency(srv, max(5, m // 2))
            results["imports"] = import_cost(srv)
    except BenchFailure as err:
        print(f"bench_peers: FAILED: {err}", file=sys.stderr)
        return 1
    common.finish(
        results,
        started,
        args.out,
        args.json,
        lambda r: r.update(headline=headline(r)),
        render,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
