"""CLI start: ``gpulayer-tui submit|status|jobs`` against a bare interpreter, both from a
plain (non-editable) install.

A CLI call is mostly interpreter start and imports, so the yardstick is ``python -c pass``
of the same interpreter, and the install must be a plain one: an editable install's import
finder adds its own imports (pathlib, re, fnmatch) to every start, the bare interpreter's
included, which hides the CLI's own cost. This benchmark makes a fresh venv, installs the
checkout into it with ``pip install --no-deps .`` (the CLI path imports nothing outside
the stdlib; pip fetches setuptools for the build as any install does), and runs the venv's
``gpulayer-tui`` script against a real ``--serve`` (run from this checkout).

Each command is timed paired with ``python -c pass``: A B A B ..., the ratio taken per
pair and the median of the ratios reported, so the machine's drift hits both alike.
Never fails on speed; exits non-zero only if the install or a command fails.

Usage::

    python bench/bench_cli.py [--pairs 40]
    python bench/bench_cli.py --quick    # 10 pairs (CI)
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common
from common import BenchFailure, machine, serving, summary, temp_home

SIMULATE = "1xA100-80GB"


def plain_install(venv: Path) -> Path:
    """A fresh venv with this checkout installed plainly; returns its bin directory."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps"]
    done = subprocess.run([*pip, str(common.ROOT)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchFailure(f"pip install . failed:\n{done.stderr[-2000:]}")
    return venv / "bin"


def paired(a: list[str], b: list[str], env: dict[str, str], pairs: int) -> dict[str, Any]:
    """Wall time of ``a`` and ``b`` run in turn ``pairs`` times, and their ratios."""
    run: dict[str, Any] = dict(env=env, stdin=subprocess.DEVNULL, capture_output=True)
    times: dict[str, list[float]] = {"a": [], "b": []}
    for n in range(pairs + 2):  # the first two pairs warm the page cache, not counted
        for key, argv in (("a", a), ("b", b)):
            t0 = time.perf_counter()
            done = subprocess.run(argv, **run, check=False)
            took = time.perf_counter() - t0
            if done.returncode != 0:
                raise BenchFailure(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr!r}")
            if n >= 2:
                times[key].append(took)
    ratios = [x / y for x, y in zip(times["a"], times["b"], strict=True)]
    return {
        "a": summary(times["a"]),
        "b": summary(times["b"]),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def run(pairs: int) -> dict[str, Any]:
    """Install, serve, submit one job to look at, then time each command."""
    with temp_home("cli") as tmp:
        common.step("a plain install into a fresh venv")
        t0 = time.perf_counter()
        bin_dir = plain_install(tmp / "venv")
        install_s = time.perf_counter() - t0
        cli, python = str(bin_dir / "gpulayer-tui"), str(bin_dir / "python")
        home = tmp / "home"
        with serving(home, SIMULATE, "[engine]\nsample_interval = 1.0\n") as srv:
            job = srv.client.submit({"command": ["true"]})
            srv.client.wait(job["id"])
            commands = {
                "submit -- true": [cli, "submit", "--", "true"],
                f"status {job['id']}": [cli, "status", str(job["id"])],
                "jobs": [cli, "jobs"],
                "jobs --json --limit 100": [cli, "jobs", "--json", "--limit", "100"],
            }
            figures = {}
            for label, argv in commands.items():
                common.step(f"{label} vs python -c pass, {pairs} pairs")
                figures[label] = paired(argv, [python, "-c", "pass"], srv.env, pairs)
    return {"install_s": install_s, "commands": figures}


def render(r: dict[str, Any]) -> str:
    """The Markdown report."""
    lines = [
        "# CLI start: plain install, against a bare interpreter",
        "",
        f"Command: `{r['command']}`",
        "",
        common.machine_line(r["machine"]) + f" Run took {r['elapsed_s']:.1f} s.",
        "",
        "The checkout installed with `pip install --no-deps .` into a fresh venv; each "
        f"command run in turn with that venv's `python -c pass`, {r['params']['pairs']} pairs, "
        "against a real `--serve`. Ratio: median of the per-pair ratios (min-max).",
        "",
        "| command | p50 ms | `python -c pass` p50 ms | ratio (median, min-max) |",
        "|---|---:|---:|---:|",
    ]
    for label, f in r["commands"].items():
        lines.append(
            f"| `gpulayer-tui {label}` | {f['a']['p50_ms']:.1f} | {f['b']['p50_ms']:.1f} "
            f"| {f['ratio_median']:.2f}x ({f['ratio_min']:.2f}-{f['ratio_max']:.2f}) |"
        )
    lines += [
        "",
        "`submit` waits for the engine's answer, which comes once the job runs (with its "
        "pid): its figure includes the request, the decision and the launch.",
    ]
    return "\n".join(lines) + "\n"


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Target verdicts for the combined report."""
    out = []
    for label, f in r["commands"].items():
        out.append(
            {
                "target": f"`gpulayer-tui {label}` < 2x `python -c pass` (plain install)",
                "value": f"{f['ratio_median']:.2f}x (p50 {f['a']['p50_ms']:.1f} ms)",
                "met": f["ratio_median"] < 2.0,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Run and write the report; 1 if the install or a command failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=None, help="pairs per command (40)")
    parser.add_argument("--quick", action="store_true", help="10 pairs (CI)")
    parser.add_argument("--tmpdir", default=None, help="where temp dirs go")
    parser.add_argument("--out", type=Path, default=common.ROOT / "bench" / "results-cli.md")
    parser.add_argument("--json", type=Path, default=common.ROOT / "bench" / "results-cli.json")
    args = parser.parse_args(argv)
    common.TMP_BASE = args.tmpdir
    pairs = args.pairs or (10 if args.quick else 40)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": shlex.join(["python", "bench/bench_cli.py", *sys.argv[1:]]),
        "params": {"pairs": pairs},
        "machine": machine(),
    }
    try:
        results.update(run(pairs))
    except BenchFailure as err:
        print(f"bench_cli: FAILED: {err}", file=sys.stderr)
        return 1
    common.finish(
        results, started, args.out, args.json, lambda r: r.update(targets=targets(r)), render
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
