"""Run every benchmark and write one report: ``bench/results.md`` and ``bench/results.json``.

Usage::

    python bench/run_all.py            # the full run (a few minutes)
    python bench/run_all.py --quick    # every benchmark with small sizes (CI)
    python bench/run_all.py --only peers,scale --out /tmp/r.md --json /tmp/r.json

Each benchmark runs as its own process (one at a time, so they do not compete for the
cores) and writes its own section; this script puts the sections together under one table
of every target, followed by the hand-written before/after notes (``bench/before_after.md``).
It exits non-zero if any benchmark failed functionally (never because of a slow figure).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common

BENCH = common.ROOT / "bench"
# name -> (script, extra args for --quick)
BENCHES = {
    "drain": ("bench_drain.py", ["--quick"]),
    "peers": ("bench_peers.py", ["--quick"]),
    "scale": ("bench_scale.py", ["--quick"]),
    "sampling": ("bench_sampling.py", ["--quick"]),
    "tui": ("bench_tui.py", ["--quick"]),
    "cli": ("bench_cli.py", ["--quick"]),
    "sched": ("bench_sched.py", ["--quick"]),
    "cluster": ("bench_cluster.py", ["--quick"]),
}


def run_one(name: str, quick: bool, tmpdir: str | None, work: Path) -> dict[str, Any]:
    """Run one benchmark into ``work``; return its report text, JSON and exit status."""
    script, quick_args = BENCHES[name]
    out, js = work / f"{name}.md", work / f"{name}.json"
    argv = [sys.executable, str(BENCH / script), "--out", str(out), "--json", str(js)]
    if quick:
        argv += quick_args
    if tmpdir and name != "tui":  # bench_tui has no --tmpdir
        argv += ["--tmpdir", tmpdir]
    common.step(f"{name}: {shlex.join(argv[1:])}")
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=common.ROOT, capture_output=True, text=True, check=False)
    result: dict[str, Any] = {"rc": proc.returncode, "elapsed_s": time.perf_counter() - t0}
    if proc.returncode != 0 or not out.exists():
        result["error"] = (proc.stderr or proc.stdout)[-3000:]
        print(f"{name} FAILED (exit {proc.returncode}):\n{result['error']}", file=sys.stderr)
        return result
    result["report"] = out.read_text()
    result["data"] = json.loads(js.read_text()) if js.exists() else None
    return result


def drain_targets(d: dict[str, Any]) -> list[dict[str, Any]]:
    """Targets from ``bench_drain.py``'s JSON."""
    x = d["aggregate"]["ratios"]
    lat = d["latency"]["submit_to_started_event"]
    cpu = d["aggregate"]["median_cpu"]["self_cpu_ms_per_job"]["server"]
    return [
        {
            "target": "`--serve` drain (one API batch) within 2x the 2-alive floor",
            "value": f"{x['server_vs_floor2']['best_over_best']:.2f}x",
            "met": x["server_vs_floor2"]["best_over_best"] <= 2.0,
        },
        {
            "target": "engine CPU per trivial job (`--serve`, median) < 0.6 ms",
            "value": f"{cpu:.3f} ms (+ launcher "
            f"{d['aggregate']['median_cpu']['launcher_cpu_ms_per_job']['server']:.3f} ms)",
            "met": cpu < 0.6,
        },
        {
            "target": "engine side: submit -> process running, p50 < 1 ms",
            "value": f"p50 {lat['p50_ms']:.2f} ms, p95 {lat['p95_ms']:.2f} ms",
            "met": lat["p50_ms"] < 1.0,
        },
    ]


def targets_of(name: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target one benchmark reports."""
    if name == "drain":
        return drain_targets(data)
    if name == "peers":
        return list(data["headline"]["targets"])
    return list(data.get("targets", []))


def demote(report: str) -> str:
    """One heading level down, so each benchmark's report nests under the combined one."""
    return "\n".join("#" + ln if ln.startswith("#") else ln for ln in report.splitlines())


def render(runs: dict[str, Any], meta: dict[str, Any]) -> str:
    """The combined Markdown report."""
    lines = [
        "# gpulayer-tui benchmarks",
        "",
        f"Command: `{meta['command']}` (every benchmark below, one after another).",
        "",
        common.machine_line(meta["machine"]) + f" All together took {meta['elapsed_s']:.0f} s.",
        "",
        "Wall-clock figures on a shared machine drift with its load: compare ratios measured "
        "in the same run, not absolute times across runs. Raw figures: `bench/results.json` "
        "(not committed; written next to this file).",
        "",
        "## Targets",
        "",
        "| benchmark | target | this run | verdict |",
        "|---|---|---|---|",
    ]
    for name, run in runs.items():
        if run.get("data") is None:
            lines.append(f"| {name} | (benchmark failed: see its log) | - | FAILED |")
            continue
        for t in targets_of(name, run["data"]):
            verdict = "skipped" if t["met"] is None else common.met(t["met"])
            lines.append(f"| {name} | {t['target']} | {t['value']} | {verdict} |")
    notes = BENCH / "before_after.md"
    if notes.exists():
        lines += ["", demote(notes.read_text().strip())]
    for run in runs.values():
        if "report" in run:
            lines += ["", demote(run["report"].strip())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks, write the combined report; 1 if any failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    parser.add_argument("--only", default=None, help=f"comma-separated: {', '.join(BENCHES)}")
    parser.add_argument("--tmpdir", default=None, help="where temp state dirs go")
    parser.add_argument("--out", type=Path, default=BENCH / "results.md")
    parser.add_argument("--json", type=Path, default=BENCH / "results.json")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    started = time.perf_counter()
    meta: dict[str, Any] = {
        "command": shlex.join(["python", "bench/run_all.py", *sys.argv[1:]]),
        "machine": common.machine(),
    }
    with tempfile.TemporaryDirectory(prefix="gpulayer-bench-all-") as work:
        runs = {n: run_one(n, args.quick, args.tmpdir, Path(work)) for n in names}
    meta["machine"]["loadavg_end"] = os.getloadavg()
    meta["elapsed_s"] = time.perf_counter() - started
    report = render(runs, meta)
    raw = {"meta": meta} | {n: r.get("data") or {"error": r.get("error")} for n, r in runs.items()}
    common.write_outputs(args.out, args.json, report, raw)
    failed = [n for n, r in runs.items() if r["rc"] != 0]
    common.step(f"wrote {args.out} and {args.json}" + (f"; FAILED: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
