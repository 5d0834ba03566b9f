"""One hardware watcher for all domains: one query per tick, off the event loop.

Each tick first asks the probe for its inventory (driver up? how many GPUs?), then reads
every GPU in its own daemon thread, together with the /proc look-ups that attribute its
processes to jobs, all under one deadline. A GPU whose read hangs (a wedged driver or a
dying card) gets a failed reading that counts against *its* domain's health only; the
others' readings arrive as usual, and the loop never blocks. A hung thread is not
restarted: later ticks report that GPU as still busy until the thread returns. The latest
sample and a short per-GPU history (for sparklines) are kept in memory only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from . import procs
from .gpus import GpuProbe, GpuReading, ProbeResult, ProbeStatus

T = TypeVar("T")

log = logging.getLogger(__name__)

Roots = dict[int, tuple[int, int | None]]


@dataclass(frozen=True, slots=True)
class Sample:
    """One tick's view of the hardware.

    Attributes:
        result: What the probe returned.
        owners: GPU pid -> owning job id (``None``: not ours).
        info: User, command and start time of every GPU pid.
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


Attributed = tuple[GpuReading, dict[int, int | None], dict[int, procs.ProcessInfo]]


def _read_device(probe: GpuProbe, index: int, roots: Roots) -> Attributed:
    reading = probe.read_device(index)
    owners: dict[int, int | None] = {}
    info: dict[int, procs.ProcessInfo] = {}
    for proc in reading.processes:
        if proc.pid in owners:
            continue
        owners[proc.pid] = procs.find_owner(proc.pid, roots)
        # Users and commands of job processes too: the process table shows every one.
        info[proc.pid] = procs.describe(proc.pid)
    return reading, owners, info


class _Busy(Exception):
    """The previous call with this key is still running (it timed out earlier)."""


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
        self._threads: dict[str, asyncio.Future[Any]] = {}  # per call key: the latest call
        self._task: asyncio.Task[None] | None = None
        self.latest: Sample | None = None
        self.history: dict[int, deque[HistoryPoint]] = {}
        self.timeouts = 0
        self.reads = 0  # completed reads, and their total duration (metrics)
        self.read_seconds = 0.0

    async def sample_once(self) -> Sample:
        """Take one sample now (respecting the deadline) and deliver it."""
        started, t0 = time.time(), time.perf_counter()
        try:
            inventory = await self._call("inventory", self.probe.inventory)
        except _Busy:
            sample = self._failed("GPU probe still busy with a read that timed out")
        except TimeoutError:
            self.timeouts += 1
            sample = self._failed(f"GPU probe did not answer within {self.deadline:g} s")
        except Exception as err:  # a backend bug must not stop sampling
            log.error("GPU probe failed: %r", err)
            sample = self._failed(f"GPU probe failed: {err}")
        else:
            if inventory.status is ProbeStatus.OK:
                sample = await self._read_devices(inventory, started, t0)
            else:
                sample = Sample(inventory, taken_at=started, duration=time.perf_counter() - t0)
        if sample.duration:
            self.reads += 1
            self.read_seconds += sample.duration
        self._record(sample)
        self._on_sample(sample)
        return sample

    async def _read_devices(self, inventory: ProbeResult, started: float, t0: float) -> Sample:
        roots = self._roots()
        pending: dict[int, asyncio.Future[Attributed]] = {}
        readings: dict[int, GpuReading] = {}
        for index in range(inventory.device_count):
            key = f"gpu{index}"
            busy = self._threads.get(key)
            if busy is not None and not busy.done():
                readings[index] = self._unanswered(index, "still busy with a read that timed out")
                continue
            pending[index] = self._start(key, _read_device, self.probe, index, roots)
        if pending:
            await asyncio.wait(list(pending.values()), timeout=self.deadline)
        owners: dict[int, int | None] = {}
        info: dict[int, procs.ProcessInfo] = {}
        for index, future in pending.items():
            if not future.done():
                self.timeouts += 1
                readings[index] = self._unanswered(
                    index, f"did not answer within {self.deadline:g} s"
                )
                continue
            try:
                reading, dev_owners, dev_info = future.result()
            except Exception as err:
                log.error("reading GPU %d failed: %r", index, err)
                readings[index] = self._unanswered(index, f"read failed: {err}")
                continue
            readings[index] = reading
            owners.update(dev_owners)
            info.update(dev_info)
        result = ProbeResult(
            status=ProbeStatus.OK,
            gpus=tuple(readings[i] for i in sorted(readings)),
            backend=inventory.backend,
            driver_version=inventory.driver_version,
            device_count=inventory.device_count,
        )
        return Sample(result, owners, info, started, time.perf_counter() - t0)

    def _unanswered(self, index: int, why: str) -> GpuReading:
        """A failed reading for a GPU whose read did not come back (keeps its identity)."""
        last = None
        if self.latest is not None:
            last = next((g for g in self.latest.result.gpus if g.index == index), None)
        return GpuReading(
            index=index,
            uuid=last.uuid if last else "",
            name=last.name if last else "",
            memory_total=None,
            memory_used=None,
            error=f"GPU {index} {why}",
            failed=True,
        )

    async def _call(self, key: str, fn: Callable[[], ProbeResult]) -> ProbeResult:
        busy = self._threads.get(key)
        if busy is not None and not busy.done():
            raise _Busy(key)
        future = self._start(key, fn)
        return await asyncio.wait_for(asyncio.shield(future), self.deadline)

    def _start(self, key: str, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        # A daemon thread per call rather than an executor: a call wedged in the driver
        # must not keep the process from exiting (executor threads are joined at exit).
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def deliver(result: Any, error: BaseException | None) -> None:
            if future.done():
                return
            if error is None:
                future.set_result(result)
                return
            future.set_exception(error)
            # A call that outlived its deadline has nobody awaiting it any more: mark the
            # error retrieved so asyncio does not log it as lost (sample_once logs it).
            future.exception()

        def work() -> None:
            try:
                result = fn(*args)
            except Exception as err:
                outcome: tuple[Any, BaseException | None] = (None, err)
            else:
                outcome = (result, None)
            try:
                loop.call_soon_threadsafe(deliver, *outcome)
            except RuntimeError:
                pass  # the loop is gone (engine stopped while this call hung)

        self._threads[key] = future
        threading.Thread(target=work, name=f"gpu-probe-{key}", daemon=True).start()
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
        if all(f.done() for f in self._threads.values()):
            try:
                self.probe.close()
            except Exception:
                log.exception("closing the GPU probe failed")
