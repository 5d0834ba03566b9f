"""One hardware watcher for all domains: one probe read per tick, off the event loop.

Each tick runs the probe and the /proc look-ups that attribute GPU processes to jobs in a
dedicated worker thread, under a deadline. A read that hangs (a wedged driver) does not
block the loop or pile up threads: the tick reports a timeout, and later ticks are skipped
until that thread returns. The latest sample and a short per-GPU history (for sparklines)
are kept in memory only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from . import procs
from .gpus import GpuProbe, ProbeResult, ProbeStatus

log = logging.getLogger(__name__)

Roots = dict[int, tuple[int, int | None]]


@dataclass(frozen=True, slots=True)
class Sample:
    """One tick's view of the hardware.

    Attributes:
        result: What the probe returned.
        owners: GPU pid -> owning job id (``None``: not ours).
        info: User and command of pids that are not ours.
        taken_at: Epoch seconds at the start of the read.
        duration: Seconds the read took.
    """

    result: ProbeResult
    owners: dict[int, int | None] = field(default_factory=dict)
    info: dict[int, procs.ProcessInfo] = field(default_factory=dict)
    taken_at: float = 0.0
    duration: float = 0.0


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """One point of a GPU's history."""

    at: float
    utilization: int | None
    memory_used: int | None


def _read(probe: GpuProbe, roots: Roots) -> Sample:
    started = time.time()
    t0 = time.perf_counter()
    result = probe.read()
    owners: dict[int, int | None] = {}
    info: dict[int, procs.ProcessInfo] = {}
    for gpu in result.gpus:
        for proc in gpu.processes:
            if proc.pid in owners:
                continue
            owner = procs.find_owner(proc.pid, roots)
            owners[proc.pid] = owner
            if owner is None:
                info[proc.pid] = procs.describe(proc.pid)
    return Sample(result, owners, info, started, time.perf_counter() - t0)


class Sampler:
    """Reads the probe every ``interval`` seconds and hands samples to ``on_sample``.

    Args:
        probe: The GPU backend.
        interval: Seconds between ticks.
        deadline: Seconds one read may take before it counts as timed out.
        history: Points kept per GPU.
        roots: Returns ``{leader_pid: (job_id, start_ticks)}`` of running jobs.
        on_sample: Called on the loop with every sample (including failed ones).
    """

    def __init__(
        self,
        probe: GpuProbe,
        interval: float,
        deadline: float,
        history: int,
        roots: Callable[[], Roots],
        on_sample: Callable[[Sample], None],
    ) -> None:
        self.probe = probe
        self.interval = interval
        self.deadline = deadline
        self.history_len = history
        self._roots = roots
        self._on_sample = on_sample
        self._inflight: asyncio.Future[Sample] | None = None
        self._task: asyncio.Task[None] | None = None
        self.latest: Sample | None = None
        self.history: dict[int, deque[HistoryPoint]] = {}
        self.timeouts = 0
        self.reads = 0  # completed reads, and their total duration (metrics)
        self.read_seconds = 0.0

    async def sample_once(self) -> Sample:
        """Take one sample now (respecting the deadline) and deliver it."""
        if self._inflight is not None and not self._inflight.done():
            sample = self._failed("GPU probe still busy with a read that timed out")
        else:
            self._inflight = self._start_read()
            try:
                sample = await asyncio.wait_for(asyncio.shield(self._inflight), self.deadline)
            except TimeoutError:
                self.timeouts += 1
                sample = self._failed(f"GPU probe did not answer within {self.deadline:g} s")
            except Exception as err:  # a backend bug must not stop sampling
                log.error("GPU probe failed: %r", err)
                sample = self._failed(f"GPU probe failed: {err}")
        if sample.duration:
            self.reads += 1
            self.read_seconds += sample.duration
        self._record(sample)
        self._on_sample(sample)
        return sample

    def _start_read(self) -> asyncio.Future[Sample]:
        # A daemon thread per read rather than an executor: a read wedged in the driver
        # must not keep the process from exiting (executor threads are joined at exit).
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Sample] = loop.create_future()
        roots = self._roots()

        def deliver(result: Sample | None, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                assert result is not None
                future.set_result(result)

        def work() -> None:
            try:
                result = _read(self.probe, roots)
            except Exception as err:
                loop.call_soon_threadsafe(deliver, None, err)
            else:
                loop.call_soon_threadsafe(deliver, result, None)

        threading.Thread(target=work, name="gpu-probe", daemon=True).start()
        return future

    def _failed(self, message: str) -> Sample:
        return Sample(
            ProbeResult(ProbeStatus.ERROR, message=message, backend=self.probe.backend),
            taken_at=time.time(),
        )

    def _record(self, sample: Sample) -> None:
        self.latest = sample
        for gpu in sample.result.gpus:
            points = self.history.get(gpu.index)
            if points is None:
                points = self.history[gpu.index] = deque(maxlen=self.history_len)
            points.append(HistoryPoint(sample.taken_at, gpu.utilization, gpu.memory_used))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.sample_once()

    def start(self) -> None:
        """Start ticking (the first sample should already have been taken)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gpu-sampler")

    async def stop(self) -> None:
        """Stop ticking and release the probe."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        # Never wait for a hung read: its daemon thread is abandoned.
        if self._inflight is None or self._inflight.done():
            try:
                self.probe.close()
            except Exception:
                log.exception("closing the GPU probe failed")
