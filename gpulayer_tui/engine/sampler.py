"""One hardware watcher for all domains: one query per tick, off the event loop.

Each tick first asks the probe for its inventory (driver up? how many GPUs?), then reads
every GPU, together with the /proc look-ups that attribute its processes to jobs, off the
loop in a daemon thread. A GPU whose read hangs (a wedged driver or a dying card) gets a
failed reading that counts against *its* domain's health only; the others' readings arrive
in the same tick, and the loop never blocks. A hung thread is not restarted: later ticks
report that GPU as still busy until the thread returns. The latest sample and a short
per-GPU history (for sparklines) are kept in memory only.

One thread reads the GPUs in turn (a *sweep*), each GPU under its own deadline counted
from the end of the previous one. Eight threads at once, one per GPU, cost 4-8x the CPU of
the reads themselves (thread start-up, and the GIL handed back and forth at every /proc
read: 9 ms of CPU per tick for 8 GPUs instead of about 1.5 ms). If a GPU does not answer in
time, the sweep is abandoned there and the GPUs after it are read in parallel, one thread
each, under one more deadline: a tick with hung GPUs still ends within two deadlines.

Why this module is longer than ~400 lines: the deadlines, the sweep and its parallel
fallback, and the per-process cache share one set of threads and futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import psutil

from . import procs
from .gpus import GpuProbe, GpuReading, ProbeResult, ProbeStatus
from .tasks import cancel_and_wait

T = TypeVar("T")

log = logging.getLogger(__name__)

CALLBACK_LOG_EVERY_S = 10.0  # the same failure of a sample's handling, logged this often

Roots = dict[int, tuple[int, int | None]]


@dataclass(frozen=True, slots=True)
class Sample:
    """One tick's view of the hardware.

    Attributes:
        result: What the probe returned.
        owners: GPU pid -> owning job id (``None``: not ours).
        info: User, command and start time of every GPU pid.
        host: Host CPU % and resident memory of every GPU pid, read this tick.
        taken_at: Epoch seconds at the start of the read.
        duration: Seconds the read took.
    """

    result: ProbeResult
    owners: dict[int, int | None] = field(default_factory=dict)
    info: dict[int, procs.ProcessInfo] = field(default_factory=dict)
    host: dict[int, procs.HostUse] = field(default_factory=dict)
    taken_at: float = 0.0
    duration: float = 0.0


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """One point of a GPU's history."""

    at: float
    utilization: int | None
    memory_used: int | None


@dataclass(frozen=True, slots=True)
class Seen:
    """One GPU process as attributed on one tick."""

    owner: int | None
    info: procs.ProcessInfo
    use: procs.HostUse


Attributed = tuple[GpuReading, dict[int, Seen]]

_GONE = procs.HostUse(None, None)


class _Known:
    """One process incarnation (pid + start time): what it looked like when first seen,
    the psutil handle its CPU % is measured through, and its latest tick's use."""

    __slots__ = ("comm", "info", "lineage", "process", "read_at", "start_ticks", "tick", "use")

    def __init__(
        self,
        stat: procs.ProcStat,
        lineage: tuple[tuple[int, int], ...],  # (pid, start ticks): itself, parent, ...
        process: psutil.Process | None,
    ) -> None:
        self.start_ticks = stat.start_ticks
        self.lineage = lineage
        self.process = process
        self.describe(stat)
        self.tick = -1
        self.read_at = -HOST_EVERY_S  # (monotonic) when its host use was last read
        self.use = _GONE

    def describe(self, stat: procs.ProcStat) -> None:
        """Read its user and command (again: an exec keeps pid and start time)."""
        self.comm = stat.comm
        info = (
            procs.describe_process(self.process, self.start_ticks)
            if self.process is not None
            else procs.ProcessInfo(stat.pid, "", "", self.start_ticks)
        )
        lineage = self.lineage
        self.info = replace(info, ppid=lineage[1][0] if len(lineage) > 1 else None)


HOST_EVERY_S = 2.0
"""A GPU process's host CPU % and memory are read at most this often (~27 us a process, a
figure from bench/bench_procstat.py: at every tick, 50 GPU processes took the engine's
tick from 1.7 to 4.1 ms of CPU); its CPU % is then over those seconds."""


class ProcessCache:
    """Attribution, description and host use of GPU processes, kept per incarnation.

    A GPU process stays on the GPU for many ticks, its ancestry seldom changes and its user
    and command seldom change, so only its /proc stat is read each tick (to check that the
    pid still names the same process); the ancestor walk happens once, and again when the
    stat names another parent (its parent ended: it no longer descends from a job's root),
    the status and cmdline reads again only when the stat's command name changed (an exec
    keeps the pid and the start time), or while it had no command line yet (read in the
    instant of its exec, it shows as ``[name]``). Matching a job's root still compares start times,
    so a recycled pid is never taken for a job's process. Each incarnation keeps one
    ``psutil.Process``, so its CPU % is over the time since the previous tick; a process
    on several GPUs is measured once per tick. Entries not seen in a tick are dropped.
    """

    def __init__(self) -> None:
        self._known: dict[int, _Known] = {}
        self._tick = 0
        self._lock = threading.Lock()  # a tick's GPUs may be read in parallel threads

    def next_tick(self) -> None:
        """A new tick begins: each process's host use is read again (once)."""
        self._tick += 1

    def attribute(self, pid: int, roots: Roots) -> Seen:
        """Owning job id (or None), description and this tick's host use of a GPU process."""
        stat = procs.read_stat(pid)
        if stat is None:  # gone already: nothing to keep
            return Seen(procs.find_owner(pid, roots), procs.describe(pid), _GONE)
        known = self._known.get(pid)
        if known is None or known.start_ticks != stat.start_ticks:
            process = procs.open_process(pid, stat.start_ticks)
            known = _Known(stat, _lineage(stat), process)
            self._known[pid] = known
        else:
            if _parent_of(known.lineage) != stat.ppid:
                # Its parent ended and it was given to init (or a subreaper): the ancestry
                # seen first kept it a job's that it no longer descends from, while adopt
                # and signal (which walk the live chain) called it a stray.
                known.lineage = _lineage(stat)
            if known.comm != stat.comm or known.info.command.startswith("["):
                # The same process ran exec (or renamed itself); or it was read in the
                # instant of its exec when its command line was not there yet (its name).
                known.describe(stat)
        with self._lock:
            now = time.monotonic()
            due = known.tick < 0 or now - known.read_at >= HOST_EVERY_S
            if known.tick != self._tick and known.process is not None and due:
                known.use = procs.host_use(known.process, first=known.tick < 0)
                known.tick, known.read_at = self._tick, now
        owner = None
        for ancestor, ticks in known.lineage:
            hit = roots.get(ancestor)
            if hit is not None and hit[1] in (None, ticks):
                owner = hit[0]
                break
        return Seen(owner, known.info, known.use)

    def keep_only(self, pids: set[int]) -> None:
        """Forget every process not in ``pids`` (the ones seen in the latest tick)."""
        # list(dict) copies without letting another thread in (a hung read may still be
        # adding entries); pop tolerates an entry that is already gone.
        for pid in list(self._known):
            if pid not in pids:
                self._known.pop(pid, None)


def _parent_of(lineage: tuple[tuple[int, int], ...]) -> int:
    """The parent pid a lineage was read with (1: none below init)."""
    return lineage[1][0] if len(lineage) > 1 else 1


def _lineage(stat: procs.ProcStat, max_depth: int = 64) -> tuple[tuple[int, int], ...]:
    """``stat``'s process and its ancestors below init, as ``(pid, start ticks)``."""
    chain = [(stat.pid, stat.start_ticks)]
    current: procs.ProcStat | None = stat
    while current is not None and current.ppid > 1 and len(chain) < max_depth:
        current = procs.read_stat(current.ppid)
        if current is not None:
            chain.append((current.pid, current.start_ticks))
    return tuple(chain)


def _read_device(probe: GpuProbe, index: int, roots: Roots, cache: ProcessCache) -> Attributed:
    reading = probe.read_device(index)
    seen: dict[int, Seen] = {}
    for proc in reading.processes:
        if proc.pid not in seen:
            # Users and commands of job processes too: the process table shows every one.
            seen[proc.pid] = cache.attribute(proc.pid, roots)
    return reading, seen


def _deliver(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Resolve ``future`` on the loop (unless the loop already gave up on it)."""
    if future.done():
        return
    if error is None:
        future.set_result(result)
        return
    future.set_exception(error)
    # A call that outlived its deadline has nobody awaiting it any more: mark the error
    # retrieved so asyncio does not log it as lost (sample_once logs it).
    future.exception()


def _deliver_threadsafe(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> bool:
    """From a probe thread: hand the outcome to the loop. False if the loop is gone."""
    try:
        loop.call_soon_threadsafe(_deliver, future, result, error)
    except RuntimeError:
        return False  # the loop is gone (engine stopped while this call hung)
    return True


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
        prepare: Called on the loop at the start of every tick, before the probe is
            read (the engine hands simulated GPUs its placements there).
    """

    def __init__(
        self,
        probe: GpuProbe,
        interval: float,
        deadline: float,
        history: int,
        roots: Callable[[], Roots],
        on_sample: Callable[[Sample], None],
        prepare: Callable[[], None] | None = None,
    ) -> None:
        self.probe = probe
        self.interval = interval
        self.deadline = deadline
        self.history_len = history
        self._roots = roots
        self._on_sample = on_sample
        self._prepare = prepare
        self._threads: dict[str, asyncio.Future[Any]] = {}  # per call key: the latest call
        # One sample at a time: a second caller (a test, the first sample at start-up)
        # waits for the one in flight, then takes its own, rather than finding the probe
        # busy and publishing a failed sample (no GPU processes) after a good one.
        self._one_at_a_time = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._retick = asyncio.Event()  # a new interval: sample now, then keep the new one
        self.latest: Sample | None = None
        self.history: dict[int, deque[HistoryPoint]] = {}
        self._processes = ProcessCache()
        self.timeouts = 0
        self.reads = 0  # completed reads, and their total duration (metrics)
        self.read_seconds = 0.0
        self.callback_error: str | None = None  # what handling the last sample raised
        self._callback_logged = -CALLBACK_LOG_EVERY_S

    def reconfigure(self, interval: float, deadline: float, history: int) -> None:
        """New ``[engine]`` timings: the tick, each read's deadline, the history length.

        A new tick takes effect now, not after the old one ran out: lowered from 600 s,
        the engine went unsampled (and not ready) for up to ten minutes.
        """
        if interval != self.interval:
            self._retick.set()
        self.interval = interval
        self.deadline = deadline
        if history != self.history_len:
            self.history_len = history
            self.history = {i: deque(points, maxlen=history) for i, points in self.history.items()}

    async def sample_once(self) -> Sample:
        """Take one sample now (respecting the deadline) and deliver it; with one in
        flight, after that one."""
        async with self._one_at_a_time:
            return await self._sample()

    async def _sample(self) -> Sample:
        started, t0 = time.time(), time.perf_counter()
        if self._prepare is not None:
            self._prepare()
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
        try:
            self._on_sample(sample)
        except Exception as err:
            # What the engine does with a sample (health, capacity, a scheduling pass)
            # failing must not end sampling: that would stop health checks and the GPU
            # view for good, silently. Said once per CALLBACK_LOG_EVERY_S, and kept for
            # readiness and doctor until a sample is handled again.
            self._callback_failed(err)
        else:
            self.callback_error = None
        return sample

    def _callback_failed(self, err: Exception) -> None:
        text = f"{type(err).__name__}: {err}"
        now = time.monotonic()
        if text != self.callback_error or now - self._callback_logged >= CALLBACK_LOG_EVERY_S:
            log.exception("handling a GPU sample failed (sampling goes on)")
            self._callback_logged = now
        self.callback_error = text

    def stalled(self, now: float | None = None) -> str | None:
        """Why sampling is not working, or ``None``: the ticking task ended, handling
        samples fails, or no sample was taken for longer than a tick can take (two read
        deadlines past the interval, and a second of slack). Readiness and ``doctor``
        report it."""
        if self._task is not None and self._task.done():
            error = None if self._task.cancelled() else self._task.exception()
            return f"GPU sampling stopped: {error!r}" if error else "GPU sampling stopped"
        if self.callback_error is not None:
            return f"handling GPU samples fails: {self.callback_error}"
        if self._task is None or self.latest is None:
            return None  # (not started: a test driving samples by hand)
        now = time.time() if now is None else now
        age = now - self.latest.taken_at
        if age > 2 * self.interval + 2 * self.deadline + 1.0:
            return f"no GPU sample for {age:.0f} s (one is taken every {self.interval:g} s)"
        return None

    async def _read_devices(self, inventory: ProbeResult, started: float, t0: float) -> Sample:
        roots = self._roots()
        self._processes.next_tick()
        readings: dict[int, GpuReading] = {}
        todo: list[int] = []
        for index in range(inventory.device_count):
            busy = self._threads.get(f"gpu{index}")
            if busy is not None and not busy.done():
                readings[index] = self._unanswered(index, "still busy with a read that timed out")
            else:
                todo.append(index)
        done: dict[int, Attributed] = {}
        rest = await self._sweep(todo, roots, done, readings) if len(todo) > 1 else todo
        if rest:
            await self._in_parallel(rest, roots, done, readings)
        owners: dict[int, int | None] = {}
        info: dict[int, procs.ProcessInfo] = {}
        host: dict[int, procs.HostUse] = {}
        for index, (reading, seen) in done.items():
            readings[index] = reading
            for pid, one in seen.items():
                owners[pid], info[pid], host[pid] = one.owner, one.info, one.use
        self._processes.keep_only(set(owners))
        result = ProbeResult(
            status=ProbeStatus.OK,
            gpus=tuple(readings[i] for i in sorted(readings)),
            backend=inventory.backend,
            driver_version=inventory.driver_version,
            device_count=inventory.device_count,
        )
        return Sample(result, owners, info, host, started, time.perf_counter() - t0)

    async def _sweep(
        self,
        indexes: list[int],
        roots: Roots,
        done: dict[int, Attributed],
        readings: dict[int, GpuReading],
    ) -> list[int]:
        """Read ``indexes`` one after another in one thread, each under its own deadline.

        Results go to ``done``, failures to ``readings``. Returns the GPUs left unread
        because one did not answer in time (the caller reads them in parallel).
        """
        loop = asyncio.get_running_loop()
        futures: dict[int, asyncio.Future[Attributed]] = {}
        for index in indexes:
            futures[index] = self._threads[f"gpu{index}"] = loop.create_future()
        abandoned = threading.Event()

        def work() -> None:
            for index in indexes:
                if abandoned.is_set():
                    return  # the loop gave the rest to other threads
                try:
                    outcome: tuple[Any, BaseException | None] = (
                        _read_device(self.probe, index, roots, self._processes),
                        None,
                    )
                except Exception as err:
                    outcome = (None, err)
                if not _deliver_threadsafe(loop, futures[index], *outcome):
                    return

        threading.Thread(target=work, name="gpu-probe-sweep", daemon=True).start()
        began = time.perf_counter()
        for position, index in enumerate(indexes):
            left = self.deadline - (time.perf_counter() - began)
            finished, _ = await asyncio.wait([futures[index]], timeout=max(0.0, left))
            if not finished:
                abandoned.set()
                self._timed_out(index, readings)
                rest = indexes[position + 1 :]
                for later in rest:
                    futures[later].cancel()  # never delivered: the sweep stops before them
                return rest
            self._collect(index, futures[index], done, readings)
            began = time.perf_counter()
        return []

    async def _in_parallel(
        self,
        indexes: list[int],
        roots: Roots,
        done: dict[int, Attributed],
        readings: dict[int, GpuReading],
    ) -> None:
        """Read ``indexes`` in one thread each, all under one deadline."""
        pending = {
            i: self._start(f"gpu{i}", _read_device, self.probe, i, roots, self._processes)
            for i in indexes
        }
        await asyncio.wait(list(pending.values()), timeout=self.deadline)
        for index, future in pending.items():
            if future.done():
                self._collect(index, future, done, readings)
            else:
                self._timed_out(index, readings)

    def _timed_out(self, index: int, readings: dict[int, GpuReading]) -> None:
        self.timeouts += 1
        readings[index] = self._unanswered(index, f"did not answer within {self.deadline:g} s")

    def _collect(
        self,
        index: int,
        future: asyncio.Future[Attributed],
        done: dict[int, Attributed],
        readings: dict[int, GpuReading],
    ) -> None:
        try:
            done[index] = future.result()
        except Exception as err:
            log.error("reading GPU %d failed: %r", index, err)
            readings[index] = self._unanswered(index, f"read failed: {err}")

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
        # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that
        # arrives just as the read completes, and the sampler task would never stop.
        async with asyncio.timeout(self.deadline):
            return await asyncio.shield(future)

    def _start(self, key: str, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        # A daemon thread per call rather than an executor: a call wedged in the driver
        # must not keep the process from exiting (executor threads are joined at exit).
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def work() -> None:
            try:
                result = fn(*args)
            except Exception as err:
                outcome: tuple[Any, BaseException | None] = (None, err)
            else:
                outcome = (result, None)
            _deliver_threadsafe(loop, future, *outcome)

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
            if gpu.lost or gpu.error:
                # (a gap: a failed read's figures are none, or the last good read's, and a
                # lost GPU's graph went on plotting them as live)
                points.append(HistoryPoint(sample.taken_at, None, None))
            else:
                points.append(HistoryPoint(sample.taken_at, gpu.utilization, gpu.memory_used))

    async def _run(self) -> None:
        while True:
            self._retick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retick.wait(), self.interval)
            await self.sample_once()

    def start(self) -> None:
        """Start ticking (the first sample should already have been taken)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gpu-sampler")

    async def stop(self) -> None:
        """Stop ticking and release the probe."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        # Never wait for a hung read: its daemon thread is abandoned.
        if all(f.done() for f in self._threads.values()):
            try:
                self.probe.close()
            except Exception:
                log.exception("closing the GPU probe failed")
