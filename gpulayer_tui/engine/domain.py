"""A domain: one GPU (or the CPU pool) with exactly one owner (record 002).

Each :class:`Domain` is the single owner of its slots, its VRAM ledger and its service
state. It is an actor in the asyncio sense: only the engine's event loop touches it, one
call at a time, so its invariants need no locks, and nothing on one domain reads or writes
another's state. Multi-GPU placement across domains is the scheduler's job, done in one
synchronous step so holds are all or nothing.

VRAM accounting (one formula, everywhere; see docs/architecture.md):
    owned        = memory of processes that are running jobs or their descendants
    leaving      = memory of processes of jobs that left this domain since the sample
                   (it goes with the next one: not another user's)
    unregistered = memory of the other listed GPU processes
    unattributed = memory.used - all listed process memory (driver, other namespaces,
                   processes whose usage NVML reports as "not available")
    reservation  = max(declared vram (1 GiB if none), held now), per job
    free         = total - sum(reservations) - leaving - unregistered - unattributed
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..wire import DomainJSON
from .gpus import GIB, GpuReading
from .models import DomainHealth, DomainState, check_domain_transition
from .procs import ProcessInfo

__all__ = ["Domain", "DomainHealth", "DomainState", "ForeignProcess", "Holding", "VramAccount"]


@dataclass(slots=True)
class Holding:
    """One job's claim on a domain."""

    job_id: int
    declared_bytes: int | None
    exclusive: bool
    slots: int = 1  # a service's CPU replicas share the pool: one slot each
    adopted: bool = False  # a process adopted as it ran (it took its slot, free or not)


@dataclass(frozen=True, slots=True)
class ForeignProcess:
    """A GPU process the engine does not own."""

    pid: int
    used_bytes: int | None
    user: str
    command: str


@dataclass(frozen=True, slots=True)
class VramAccount:
    """The result of the VRAM formula for one domain and one sample (bytes).

    ``total`` is what jobs can have: the GPU's memory less ``driver_reserved``, what the
    driver keeps for itself (NVML's v2 memory info; 0 where the driver does not say, and
    then ``used`` and ``unattributed`` include it).
    """

    total: int
    used: int
    owned: int
    unregistered: int
    unattributed: int
    reserved_extra: int
    free: int
    held_by_job: dict[int, int] = field(default_factory=dict)
    leaving: int = 0
    foreign: tuple[ForeignProcess, ...] = ()
    driver_reserved: int = 0


SHARED_FLOOR = GIB
"""Free memory a job that declares no VRAM needs on a GPU other jobs already share."""

HOLDERS_SHOWN = 3
"""The holders of a GPU's memory a waiting job's reason names (the rest are counted)."""


def gib(value: int | float) -> str:
    """Bytes as ``18.0 GiB``."""
    return f"{value / GIB:.1f} GiB"


def _decimals(value: float, digits: int) -> str:
    return f"{value:.{digits}f}".rstrip("0").rstrip(".")


def gib_apart(asked: int | float, has: int | float) -> tuple[str, str]:
    """Two sizes as ``80 GiB`` / ``79.99 GiB``: with as many decimals (up to 6) as it takes
    to tell them apart when they differ ("requested 80 GiB, but it has 80 GiB" was said of
    80.04 GiB against 80); closer than that, in bytes."""
    texts = ("", "")
    for digits in range(1, 7):
        texts = (_decimals(asked / GIB, digits), _decimals(has / GIB, digits))
        if texts[0] != texts[1] or asked == has:
            break
    else:
        # (80.0000001 GiB against 80: "requested 80 GiB, but it has 80 GiB" again)
        return f"{int(asked):,} bytes", f"{int(has):,} bytes"
    return f"{texts[0]} GiB", f"{texts[1]} GiB"


MISSING_WARNING = " is not found by the driver"


def missing_warning(index: int) -> str:
    """What a running job's message adds while GPU ``index`` it runs on is missing."""
    return f"; warning: GPU {index}{MISSING_WARNING}"


def plural(count: int, word: str) -> str:
    """``1 GPU``, ``2 GPUs``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


class Domain:
    """One scheduling domain.

    Args:
        name: ``gpu0``, a configured name, or ``cpu``.
        gpu_index: NVML index, ``None`` for the CPU pool.
        gpu_uuid: GPU UUID, when known.
        slots: Concurrent jobs allowed.
    """

    def __init__(self, name: str, gpu_index: int | None, gpu_uuid: str | None, slots: int):
        self.name = name
        self.gpu_index = gpu_index
        # (None, not "", where it could not be read, a lost GPU: an empty UUID matched
        # every other lost GPU's stored state, and dropped it)
        self.gpu_uuid = gpu_uuid or None
        self.slots = slots
        self.state = DomainState.IN_SERVICE
        self.state_reason = ""
        # The operator's drain, kept while a quarantine is on top of it (a release lifts
        # the quarantine and the domain drains again); None: not drained.
        self.drain_reason: str | None = None
        self.health = DomainHealth.HEALTHY
        self.failures = 0  # consecutive failed reads of its GPU
        self.quarantines = 0  # times quarantined in this engine run (metrics)
        self.launch_failures = 0  # GPU jobs in a row that died of a device error
        self.failed_jobs: list[int] = []  # (whose runs those were, in order)
        self.last_error = ""
        # When an operator last released it (epoch s): a read begun before says nothing
        # of the GPU after (it would quarantine the domain again on a stale error).
        self.released_at = 0.0
        self.holdings: dict[int, Holding] = {}
        self._exclusive_held = False
        self._slots_held = 0
        self.reading: GpuReading | None = None
        # The GPU's memory as last read well: a GPU does not shrink when it stops
        # answering (lost, quarantined), and a job waiting for it stays a job waiting for
        # it, not one whose "GPU capacity" became unknown.
        self.size_seen: int | None = None
        self.account: VramAccount | None = None
        self._owners: dict[int, int | None] = {}
        self._info: dict[int, ProcessInfo] = {}
        # Jobs that left since the sample their processes are listed in: their memory is
        # still read as used until the next sample, but it is not someone else's (read
        # as unregistered, a reservation behind it lapsed for one sample, and jobs
        # queued after it took the GPUs it waited for).
        self._left: set[int] = set()

    @property
    def leaving_jobs(self) -> list[int]:
        """Jobs that left since the sample its processes are listed in (their memory is
        still theirs until the next one)."""
        return sorted(self._left)

    @property
    def is_gpu(self) -> bool:
        """False for the CPU pool."""
        return self.gpu_index is not None

    @property
    def used_slots(self) -> int:
        """Slots taken (an exclusive job takes them all)."""
        # Counted when the holdings change, not on each ask: a scheduling pass asks for
        # every domain of every request shape it tries.
        return self.slots if self._exclusive_held else self._slots_held

    def _count_slots(self) -> None:
        held = self.holdings.values()
        self._exclusive_held = any(h.exclusive for h in held)
        self._slots_held = sum(h.slots for h in held)

    @property
    def free_slots(self) -> int:
        """Slots available now."""
        return max(0, self.slots - self.used_slots)

    @property
    def capacity_bytes(self) -> int | None:
        """Memory of the GPU jobs can have (as last read well: all of it but the driver's
        own reserve), ``None`` until a good sample arrived."""
        reading = self.reading
        if reading is None or reading.lost or reading.memory_total is None:
            # (A GPU lost before this engine read it well may still say its size: after a
            # restart a job waiting for it read "GPU capacity unknown".)
            lost_says = reading.memory_usable if reading is not None else None
            return self.size_seen or lost_says or None
        return reading.memory_usable

    def observe(
        self,
        reading: GpuReading | None,
        degrade_after: int,
        quarantine_after: int,
        read_at: float | None = None,
    ) -> DomainState | DomainHealth | None:
        """Count one tick's read of this domain's GPU against its health.

        A GPU reported lost is quarantined at once; ``degrade_after`` consecutive failed
        reads (or missing from the device list) degrade it, ``quarantine_after`` quarantine
        it. A good read resets the count and clears ``degraded``; it never lifts a
        quarantine, which only an explicit release does. A read begun (``read_at``, epoch
        s) before the last release counts for nothing.

        Returns:
            The new state or health if this tick changed it, else ``None``.
        """
        if not self.is_gpu:
            return None
        if read_at is not None and read_at < self.released_at:
            return None
        if reading is None:
            failed, lost, error = True, False, "GPU missing from the driver's device list"
        else:
            failed, lost = reading.failed, reading.lost
            error = reading.error or ("GPU is lost" if lost else "read failed")
        if not failed and not lost:
            self.failures = 0
            # Good reads clear a degradation from failed reads, not one from jobs dying of
            # device errors (record_job_end): only a clean job run clears that.
            if self.health is DomainHealth.DEGRADED and self.launch_failures < degrade_after:
                self.health = DomainHealth.HEALTHY
                return DomainHealth.HEALTHY
            return None
        self.failures += 1
        self.last_error = error
        if self.state is DomainState.QUARANTINED:
            return None
        if lost or self.failures >= quarantine_after:
            why = error if lost else f"{self.failures} failed reads in a row: {error}"
            self.quarantine(why)
            return DomainState.QUARANTINED
        if self.failures >= degrade_after and self.health is DomainHealth.HEALTHY:
            self.health = DomainHealth.DEGRADED
            return DomainHealth.DEGRADED
        return None

    def record_job_end(
        self,
        device_error: str | None,
        degrade_after: int,
        quarantine_after: int,
        job_id: int | None = None,
    ) -> DomainState | DomainHealth | None:
        """Count a GPU job's end: one that died of a device error (``device_error``) counts
        against this GPU; any other end resets the count.

        Args:
            device_error: The device error the run died of, or ``None``.
            degrade_after: Runs in a row that mark it degraded.
            quarantine_after: Runs in a row that quarantine it.
            job_id: Whose run it was (a service's replica runs are its job's).

        Returns:
            The new state or health if this changed it, else ``None``.
        """
        if device_error is None:
            self.launch_failures = 0
            self.failed_jobs.clear()
            if self.health is DomainHealth.DEGRADED and self.state is not DomainState.QUARANTINED:
                if self.failures < degrade_after:
                    self.health = DomainHealth.HEALTHY
                    return DomainHealth.HEALTHY
            return None
        self.launch_failures += 1
        if job_id is not None:
            self.failed_jobs.append(job_id)
        self.last_error = device_error
        if self.state is DomainState.QUARANTINED:
            return None
        if self.launch_failures >= quarantine_after:
            self.quarantine(f"{self._failed_runs()} failed with: {device_error}")
            return DomainState.QUARANTINED
        if self.launch_failures >= degrade_after and self.health is DomainHealth.HEALTHY:
            self.health = DomainHealth.DEGRADED
            return DomainHealth.DEGRADED
        return None

    @property
    def failed_by_one_job(self) -> int | None:
        """The job whose runs alone make up the device-error count, if one's do."""
        jobs = set(self.failed_jobs)
        if len(jobs) == 1 and len(self.failed_jobs) == self.launch_failures:
            return jobs.pop()
        return None

    def _failed_runs(self) -> str:
        """The runs counted, as a quarantine reason says them ("5 jobs in a row" read as
        five jobs, for five exits of one service's replica: tester h93)."""
        count = self.launch_failures
        in_a_row = "" if count == 1 else " in a row"
        one = self.failed_by_one_job
        if one is not None and count > 1:
            return f"{count} runs of job {one}{in_a_row}"
        jobs = list(dict.fromkeys(self.failed_jobs))
        if len(jobs) < len(self.failed_jobs):
            return f"{count} runs{in_a_row} (jobs {', '.join(map(str, jobs))})"
        return f"{plural(count, 'job')}{in_a_row}"

    def set_state(self, new: DomainState, reason: str = "") -> None:
        """Move to ``new`` (checked against the domain transition table).

        Raises:
            IllegalTransition: The table does not allow it.
        """
        check_domain_transition(self.name, self.state, new)
        self.state = new
        self.state_reason = reason

    def restore_state(
        self, state: DomainState, reason: str, drain_reason: str | None = None
    ) -> None:
        """Take a state stored by an earlier engine run (at start, before any work)."""
        if state is DomainState.IN_SERVICE:
            return
        self.set_state(state, reason)
        if state is DomainState.QUARANTINED:
            self.health = DomainHealth.DEGRADED
            self.drain_reason = drain_reason
        else:
            self.drain_reason = reason

    def quarantine(self, reason: str) -> None:
        """Take no new work until released (running jobs are left alone); a drain under
        it is kept."""
        self.set_state(DomainState.QUARANTINED, reason)
        self.health = DomainHealth.DEGRADED
        self.quarantines += 1

    def drain(self, reason: str) -> None:
        """Take no new work (the operator's maintenance switch); work already here stays.
        Quarantined, it stays so and drains once the quarantine is released."""
        self.drain_reason = reason
        if self.state is not DomainState.QUARANTINED:
            self.set_state(DomainState.DRAINING, reason)

    def release(self) -> None:
        """Lift a quarantine (back to the operator's drain, if one is kept under it) or
        a drain: back to service, with a clean health count."""
        if self.state is DomainState.QUARANTINED and self.drain_reason is not None:
            self.set_state(DomainState.DRAINING, self.drain_reason)
        else:
            self.set_state(DomainState.IN_SERVICE)
            self.drain_reason = None
        self.health = DomainHealth.HEALTHY
        self.failures = 0
        # (and the jobs that died of a device error: the next one quarantined it again at
        # once, "3 jobs in a row failed", while it showed healthy: tester h72)
        self.launch_failures = 0
        self.failed_jobs.clear()
        self.released_at = time.time()

    @property
    def reason(self) -> str:
        """Why it is as it is, in words: its state's reason, else, while its health is not
        good, the last error (a released, healthy GPU is not explained by an old error)."""
        if self.state_reason:
            return self.state_reason
        return self.last_error if self.health is not DomainHealth.HEALTHY else ""

    def take_over(self, previous: Domain) -> None:
        """Become the owner of ``previous``'s GPU (a rename on reload): its reading, health,
        state and holdings move here, so the jobs running there stay accounted for."""
        self.holdings, previous.holdings = previous.holdings, {}
        self._count_slots()
        previous._count_slots()
        self.reading, self.account = previous.reading, previous.account
        self.size_seen = previous.size_seen
        self._owners, self._info = previous._owners, previous._info
        self._left = previous._left
        self.state, self.state_reason = previous.state, previous.state_reason
        self.drain_reason = previous.drain_reason
        self.health, self.failures = previous.health, previous.failures
        self.launch_failures = previous.launch_failures  # (a rename reset the count)
        self.released_at = previous.released_at
        self.last_error = previous.last_error

    def to_json(self) -> DomainJSON:
        """The domain's state as the API shows it."""
        return {
            "name": self.name,
            "gpu_index": self.gpu_index,
            "state": self.state.value,
            "state_reason": self.state_reason,
            "drain_reason": self.drain_reason,
            "health": self.health.value,
            "failures": self.failures,
            "last_error": self.last_error,
            "slots": self.slots,
            "used_slots": self.used_slots,
        }

    @property
    def answers(self) -> bool:
        """True if the latest read of its GPU succeeded (a release needs that)."""
        return self.failures == 0 and self.reading is not None and not self.reading.lost

    def hold(
        self,
        job_id: int,
        declared_bytes: int | None,
        exclusive: bool,
        slots: int = 1,
        adopted: bool = False,
    ) -> None:
        """Take ``slots`` slots for ``job_id`` and reserve its declared memory
        (``adopted``: a running process adopted, which may take more slots than are free)."""
        self.holdings[job_id] = Holding(job_id, declared_bytes, exclusive, slots, adopted)
        self._left.discard(job_id)
        self._count_slots()
        self._recount()

    def unhold(self, job_id: int) -> None:
        """Give back ``job_id``'s slot and reservation (idempotent)."""
        if self.holdings.pop(job_id, None) is not None:
            if self.is_gpu:
                # (a GPU's next sample takes it out again; the CPU pool has no samples,
                # and kept every job that ever left it)
                self._left.add(job_id)
            self._count_slots()
            self._recount()

    def apply_sample(
        self,
        reading: GpuReading,
        owners: dict[int, int | None],
        info: dict[int, ProcessInfo],
    ) -> None:
        """Take a new reading of this domain's GPU.

        Args:
            reading: The GPU's reading.
            owners: For each GPU pid, the job id owning it (``None``: not ours).
            info: Owner and command of foreign pids, for queued reasons and the UI.
        """
        self.reading = reading
        if not reading.lost and reading.memory_total is not None:
            self.size_seen = reading.memory_usable
        self._owners = owners
        self._info = info
        # (A sample read as a job ended may still list its processes as its own.)
        listed = {owners.get(proc.pid) for proc in reading.processes}
        self._left &= listed
        self._recount()

    def _recount(self) -> None:
        reading = self.reading
        if reading is None or reading.memory_total is None or reading.memory_used is None:
            self.account = None
            return
        owners, info = self._owners, self._info
        held: dict[int, int] = {}
        unregistered = leaving = 0
        listed = 0
        foreign: list[ForeignProcess] = []
        for proc in reading.processes:
            used = proc.used_bytes
            if used is not None:
                listed += used
            owner = owners.get(proc.pid)
            if owner is not None and owner in self.holdings:
                held[owner] = held.get(owner, 0) + (used or 0)
                continue
            if owner is not None and owner in self._left:
                leaving += used or 0
                continue
            if used is not None:
                unregistered += used
            pinfo = info.get(proc.pid)
            foreign.append(
                ForeignProcess(
                    proc.pid,
                    used,
                    pinfo.user if pinfo else "",
                    pinfo.command if pinfo else "",
                )
            )
        owned = sum(held.values())
        unattributed = max(0, reading.memory_used - listed)
        # reservation = max(declared, held)  =>  extra beyond what is held already; a job
        # that declares nothing reserves the floor it was placed for (SHARED_FLOOR): with
        # none, a burst of them was placed on 1.5 GiB free, each passing the floor before
        # the next sample saw the others' memory (tester h189)
        extra = sum(
            max(0, (h.declared_bytes or (0 if h.adopted else SHARED_FLOOR)) - held.get(h.job_id, 0))
            for h in self.holdings.values()
        )
        if not reading.processes_listed:
            # No process list (an NVML error, or not permitted, as in many containers):
            # memory no listed process explains is taken as our running jobs' declared
            # memory first. Counted both as their reservation and as unattributed, a job
            # using the 30 GiB it declared took 60 from the GPU (free = total - max(
            # declared, used) when nothing is listed).
            ours = min(unattributed, extra)
            owned, extra, unattributed = owned + ours, extra - ours, unattributed - ours
        total = reading.memory_total - (reading.memory_reserved or 0)
        # Declared beyond use is only what is left to hold it: a stray taking 50 GiB of the
        # 60 a 40 GiB job did not use yet left room for 4, and the parts came to 96 of 80
        # (tester h48). Free is what is left after that.
        extra = min(extra, max(0, total - owned - leaving - unregistered - unattributed))
        free = total - owned - leaving - extra - unregistered - unattributed
        foreign.sort(key=lambda p: -(p.used_bytes or 0))
        self.account = VramAccount(
            total=total,
            used=reading.memory_used,
            owned=owned,
            unregistered=unregistered,
            unattributed=unattributed,
            reserved_extra=extra,
            free=max(0, free),
            held_by_job=held,
            foreign=tuple(foreign),
            leaving=leaving,
            driver_reserved=reading.memory_reserved or 0,
        )

    # -- placement questions ----------------------------------------------------------------

    def blocker(self, vram_bytes: int | None, exclusive: bool, slots: int = 1) -> str | None:
        """Why this domain cannot take such a job now, or ``None`` if it can.

        The text names the blocker (a job, a pid and its command, a state).
        """
        if self.state is DomainState.QUARANTINED:
            return f"domain {self.name} quarantined: {self.state_reason or 'unhealthy'}"
        if self.state is DomainState.DRAINING:
            suffix = f": {self.state_reason}" if self.state_reason else ""
            return f"domain {self.name} draining{suffix}"
        if exclusive and self.holdings:
            held = sorted(self.holdings)
            jobs = f"job{'s' if len(held) > 1 else ''} {', '.join(map(str, held))}"
            # ("waiting for h200 is not empty (exclusive job): job 8 running" read garbled)
            return f"{self.name}: {jobs} running (an exclusive job needs it empty)"
        if slots > 1 and 0 < self.free_slots < slots:
            return f"needs {slots} {self.name} slots, {self.free_slots} free"
        if self.free_slots < 1:
            if not self.is_gpu:
                # CPU queues get long; a text that changes with every job id would be
                # rewritten for every queued row on every job end.
                if self.used_slots > self.slots:
                    # ("the only cpu slot is busy" of 3 jobs on a pool cut to 1: h136;
                    # "lowered" of a pool adoptions over-filled: tester h163)
                    return (
                        f"{self.name}: {self.used_slots} slots in use, more than its "
                        f"{plural(self.slots, 'slot')} ({self._overfilled_by()})"
                    )
                return busy_words(self.slots, "cpu")
            jobs = ", ".join(str(j) for j in sorted(self.holdings))
            if len(self.holdings) > self.slots:
                # (slots lowered while they ran, or an adoption: "slot held by jobs 49, 50,
                # 51" read as one slot shared by three: tester h129)
                have = f"{self.slots} slot{'s' if self.slots > 1 else ''}"
                return (
                    f"{self.name}: jobs {jobs} running, more than its {have} "
                    f"({self._overfilled_by()}){self.outside_shortfall(vram_bytes)}"
                )
            if self.slots == 1:
                return f"{self.name}: slot held by job {jobs}{self.outside_shortfall(vram_bytes)}"
            only = next(iter(self.holdings.values())) if len(self.holdings) == 1 else None
            if only is not None and only.exclusive:
                # ("all 2 slots busy (jobs 20)" of one exclusive job holding both: h189)
                return (
                    f"{self.name}: held whole by exclusive job {only.job_id}"
                    + self.outside_shortfall(vram_bytes)
                )
            noun = "job" if len(self.holdings) == 1 else "jobs"
            busy = f"{self.name}: all {self.slots} slots busy ({noun} {jobs})"
            return busy + self.outside_shortfall(vram_bytes)
        if not self.is_gpu:
            return None
        account = self.account
        if not vram_bytes:
            if account is not None and account.free < SHARED_FLOOR:
                # (Memory the jobs there, or processes not ours, hold or reserve: a job
                # that declares nothing was placed on 0 GiB free, and on a real GPU ran
                # out of memory at its first allocation; on a GPU filled by a stray it
                # was, whatever its slots: tester h129.)
                return (
                    f"{self.name}: {self._largest_holder()}; {gib(account.free)} free "
                    f"(a job that declares no VRAM waits for {gib(SHARED_FLOOR)})"
                )
            return None
        if account is None:
            return f"{self.name}: no memory reading yet"
        if account.free >= vram_bytes:
            return None
        holder = self._largest_holder()
        return f"{self.name}: {holder}; needs {gib(vram_bytes)}, {gib(account.free)} free"

    def _overfilled_by(self) -> str:
        """Why more slots are taken than it has: adopted processes (each takes its slot,
        free or not), or slots lowered while jobs ran."""
        if any(h.adopted for h in self.holdings.values()):
            return "adopted processes take slots, free or not"
        return "lowered while jobs ran"

    def outside_shortfall(self, vram_bytes: int | None) -> str:
        """What memory held outside our jobs would still keep ``vram_bytes`` out once
        every job here had ended (``""``: nothing would): named beside a slot's holder,
        which alone was named, as if that job's end (or its preemption) would do."""
        account = self.account
        if not vram_bytes or account is None:
            return ""
        left = account.total - account.unregistered - account.unattributed
        if left >= vram_bytes:
            return ""
        outside = [
            (p.used_bytes or 0, f"pid {p.pid}" + (f" ({p.command})" if p.command else ""))
            for p in account.foreign
            if p.used_bytes
        ]
        if account.unattributed:
            outside.append((account.unattributed, "unlisted processes"))
        outside.sort(key=lambda item: -item[0])
        named = ", ".join(f"{gib(b)} held by {who}" for b, who in outside[:HOLDERS_SHOWN])
        # (apart: "leaves 41.0 GiB, short of the 41.0 GiB asked" was said of 41.001: h80)
        asked, leaves = gib(vram_bytes), gib(max(0, left))
        if asked == leaves:
            asked, leaves = gib_apart(vram_bytes, max(0, left))
        return (
            f"; once it is free, {named or 'memory held outside gpulayer-tui'} still "
            f"leave{'s' if len(outside) == 1 else ''} {leaves}, short of the {asked} asked"
        )

    def _largest_holder(self) -> str:
        """Who holds the GPU's memory, largest first: ``30.0 GiB held by job 27, 30.0 GiB
        held by job 28`` (at most HOLDERS_SHOWN, then how many more and how much). Only the
        largest was named, and the figures did not add up: "30.0 GiB held by job 27;
        needs 30.0 GiB, 20.0 GiB free" of an 80 GiB GPU that two jobs shared."""
        account = self.account
        assert account is not None
        held: list[tuple[int, str]] = []
        for proc in account.foreign:
            if proc.used_bytes:
                who = ", ".join(
                    x for x in (proc.command, f"user {proc.user}" if proc.user else "") if x
                )
                named = f"held by pid {proc.pid}" + (f" ({who})" if who else "")
                held.append((proc.used_bytes, named))
        # A job's part as the account counts it: what it holds, then what it declared
        # beyond that, cut in proportion as the account cut it to what is left (named at
        # max(declared, held) each, the holders of an 80 GiB GPU came to 100: h189).
        extras = {
            h.job_id: max(
                0,
                (h.declared_bytes or (0 if h.adopted else SHARED_FLOOR))
                - account.held_by_job.get(h.job_id, 0),
            )
            for h in self.holdings.values()
        }
        wanted = sum(extras.values())
        share = account.reserved_extra / wanted if wanted else 0.0
        for h in self.holdings.values():
            has = account.held_by_job.get(h.job_id, 0)
            keeps = int(extras[h.job_id] * share)
            if has and keeps:
                held.append((has + keeps, f"held or reserved by job {h.job_id}"))
            elif has or keeps:
                held.append((has + keeps, f"{'held' if has else 'reserved'} by job {h.job_id}"))
        if account.unattributed:
            held.append((account.unattributed, "in use by unlisted processes"))
        if not held:
            return f"{gib(account.used)} in use"
        held.sort(key=lambda item: -item[0])  # (stable: equal amounts keep their order)
        shown = [f"{gib(amount)} {who}" for amount, who in held[:HOLDERS_SHOWN]]
        rest = held[HOLDERS_SHOWN:]
        if rest:
            shown.append(f"{len(rest)} more ({gib(sum(amount for amount, _ in rest))})")
        return ", ".join(shown)


def busy_words(slots: int, kind: str) -> str:
    """``all 4 GPU slots busy``; of one, ``the only cpu slot is busy`` ("all 1 cpu slots
    busy" read as a mistake)."""
    return f"the only {kind} slot is busy" if slots == 1 else f"all {slots} {kind} slots busy"
