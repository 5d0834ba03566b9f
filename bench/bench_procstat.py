"""Raw /proc/PID/stat read + parse vs psutil for the sampler's per-tick check.

Each tick the sampler checks, for every GPU process, that its pid still names the same
process (pid + start ticks). This times N of those checks, one way after the other, in one
run: ``procs.read_stat`` (one open/read/split of /proc/PID/stat) against psutil's
equivalents (a new ``psutil.Process(pid)``, which reads the stat file for its create time,
and ``Process.ppid()``/``status()`` on a kept one, which read it again each call); then
what the host facts the sampler adds cost (``procs.host_use``: CPU % and RSS).

Usage::

    python bench/bench_procstat.py [-n 10000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from gpulayer_tui.engine import procs


def _time(label: str, n: int, fn: Callable[[], object]) -> float:
    fn()  # warm up (imports, caches)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    per = (time.perf_counter() - t0) / n * 1e6
    print(f"{label:<48} {per:8.2f} µs per call")
    return per


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10_000, help="calls per variant (10000)")
    args = parser.parse_args(argv)
    pid, n = os.getpid(), args.n
    kept = psutil.Process(pid)
    print(f"N={n}, pid {pid}, psutil {psutil.__version__}")
    raw = _time("raw: procs.read_stat(pid)", n, lambda: procs.read_stat(pid))
    new = _time("psutil: Process(pid) (create time checked)", n, lambda: psutil.Process(pid))

    def stat_fields() -> object:
        with kept.oneshot():
            return kept.ppid(), kept.status(), kept.create_time()

    one = _time("psutil: kept Process, oneshot ppid+status+ctime", n, stat_fields)
    print(f"psutil / raw: {new / raw:.1f}x (new Process), {one / raw:.1f}x (kept, oneshot)")
    # What the sampler adds per GPU process per tick on top of the identity check.
    _time("added: procs.host_use (cpu_percent + RSS)", n, lambda: procs.host_use(kept, False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
