"""Placement: queued reasons and over-capacity verdicts (record 003).

Two different questions, never mixed:

* :meth:`Scheduler.capacity_verdict` asks whether a request could *ever* run on this
  machine as configured, ignoring current use. "No" is terminal (``failed`` /
  ``over_capacity``); "cannot tell" (capacity unreadable) keeps the job queued.
* :meth:`Scheduler.place` asks whether it can run *now*, and if so where. If not, it
  returns the blocker as a human reason for the ``queued`` row.

Multi-GPU requests take slots on several domains in one synchronous step: all or nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..wire import Capacity
from .config import CPU_DOMAIN
from .domain import Domain, DomainState, busy_words, gib, gib_apart, plural
from .errors import SpecError, UnknownDomain
from .gpus import GIB, GpuReading, ProbeResult, ProbeStatus
from .models import KnownGpu
from .procs import ProcessInfo
from .spec import JobSpec

__all__ = ["Capacity", "Request", "Scheduler", "Verdict"]


@dataclass(frozen=True, slots=True)
class Request:
    """What a job needs, resolved against the known domains.

    Attributes:
        gpus: GPUs (one per domain); 0 means the CPU pool.
        vram_bytes: Memory needed on each GPU, if declared.
        pins: Domains the job may use (empty: any GPU domain).
        exclusive: Needs its domains empty.
        replicas: A service's replicas: ``gpus`` is then the total, one GPU replica per
            ``gpus // replicas`` domains; CPU replicas take one cpu slot each.
    """

    gpus: int
    vram_bytes: int | None
    pins: tuple[str, ...]
    exclusive: bool
    replicas: int = 1
    # Hashed once: a request is a dict key in every scheduling pass, many times over.
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        key = (self.gpus, self.vram_bytes, self.pins, self.exclusive, self.replicas)
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash

    @property
    def cpu_slots(self) -> int:
        """Slots taken in the cpu pool (0 for a GPU request)."""
        return self.replicas if self.gpus == 0 else 0

    def slots_on(self, dom: Domain) -> int:
        """Slots this request holds on ``dom``: one per GPU domain, ``cpu_slots`` in the pool."""
        return 1 if dom.is_gpu else max(1, self.cpu_slots)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Answer to "could this ever run?"."""

    possible: bool | None  # None: cannot tell now
    message: str = ""


class Scheduler:
    """The domains (GPU domains plus the ``cpu`` pool), what the machine's capacity is, and
    placement over them: the one owner of every domain's holds."""

    def __init__(self, domains: dict[str, Domain] | None = None) -> None:
        self._domains: dict[str, Domain] = dict(domains or {})
        # GPUs with no domain in the config while jobs still run there, by GPU index: the
        # domain they ran on, holding those jobs, so a later edit that gives the GPU a
        # domain again hands it their holdings (see reload.rebuild_domains).
        self.retired: dict[int, Domain] = {}
        # Domains the config names whose GPU the driver did not list at start (name: the
        # GPU it names): left out, jobs pinned to them wait for the GPU.
        self.configured_missing: dict[str, int | str] = {}
        # GPUs that had a domain here before (engine start: the known_gpus table) and that
        # the driver did not list at start, by UUID: the name of their last domain. Capacity
        # that may come back: a job needing more GPUs than are here waits for them (a GPU
        # that did not come up after a reboot destroyed every queued multi-GPU job), until
        # the operator forgets one removed for good (`domain forget`).
        self.missing_known: dict[str, KnownGpu] = {}
        # domain name -> the UUID of its GPU, forgotten by `domain forget` (said to the jobs
        # that waited for it)
        self.forgotten: dict[str, str] = {}
        self._capacity = Capacity.UNKNOWN
        self._capacity_message = "no GPU sample yet"
        self._gpus_seen = 0  # GPUs in the last good sample (more than domains: some unused)
        self._gpu_indices: frozenset[int] | None = None  # their indices (None: no sample yet)

    def missing_gpus(self) -> dict[int, list[int]]:
        """GPUs that jobs still run on but the last good sample did not list (gone while
        no engine ran: the next engine took the jobs back with no domain for them), by
        GPU index: the ids of those jobs."""
        seen = self._gpu_indices
        if seen is None:
            return {}
        return {
            index: sorted(dom.holdings)
            for index, dom in sorted(self.retired.items())
            if dom.holdings and index not in seen
        }

    @property
    def domains(self) -> dict[str, Domain]:
        """Every domain by name (GPU domains in index order, then ``cpu``); read-only use."""
        return self._domains

    @property
    def gpu_domains(self) -> list[Domain]:
        """GPU domains in index order."""
        return [d for d in self._domains.values() if d.is_gpu]

    @property
    def capacity(self) -> Capacity:
        """Whether the GPU capacity is known, known to be none, or unknown."""
        return self._capacity

    @property
    def capacity_message(self) -> str:
        """Why capacity is what it is (empty when known)."""
        return self._capacity_message

    def replace_domains(self, domains: Iterable[Domain]) -> None:
        """Take a new set of domains (at start, or after a config reload)."""
        self._domains = {d.name: d for d in domains}

    def domain(self, name: str) -> Domain:
        """One domain by name.

        Raises:
            UnknownDomain: No such domain (the message lists the known ones).
        """
        dom = self._domains.get(name)
        if dom is None:
            raise UnknownDomain(self.unknown_domain(name), "domain")
        return dom

    def unknown_domain(self, name: str) -> str:
        """Why ``name`` is no domain now: unknown, or configured but its GPU missing (it
        was called unknown while ``doctor`` said its GPU was not found)."""
        gpu = self.configured_missing.get(name)
        if gpu is not None:
            shown = f"GPU {gpu}" if isinstance(gpu, int) else f"GPU {gpu!r}"
            return (
                f"domain {name!r}: its {shown} is not found by the driver (the domain is left "
                "out until it is)"
            )
        away = self.missing_named(name)
        if away:
            return (
                # ("jobs queued for it before wait for it" was said right after a config
                # edit had failed them all: tester h136)
                f"domain {name!r}: its GPU ({away[0]}) is not found by the driver now "
                f"(`gpulayer-tui domain forget {name}` if it was removed for good)"
            )
        known = ", ".join(self._domains) or "none"
        shown = name if len(name) <= 100 else name[:100] + "..."
        if name in self.forgotten:
            # (a job that waited for it failed "unknown domain 'gpu2'", which said nothing
            # of what happened: tester h148)
            return (
                f"domain {shown!r}: its GPU ({self.forgotten[name]}) was forgotten "
                f"(`gpulayer-tui domain forget`), and no domain goes by that name (known: {known})"
            )
        return f"unknown domain {shown!r} (known: {known})"

    def capacity_signature(self) -> tuple[object, ...]:
        """What over-capacity verdicts depend on: changes mean "decide again"."""
        sizes = tuple((d.name, d.capacity_bytes) for d in self.gpu_domains)
        return (self._capacity, sizes, tuple(sorted(self.missing_known)))

    def know_gpus(
        self, known: dict[str, KnownGpu], listed: Iterable[str] | None
    ) -> dict[str, KnownGpu]:
        """Take the GPUs that had a domain here before (by UUID): those the driver does not
        list (``listed``: the UUIDs it does; ``None`` when it could not be read, and then
        none is taken for missing) and that no domain has now are :attr:`missing_known`.

        Returns:
            The GPUs the domains have now (by UUID), to be stored as known.
        """
        here = {
            d.gpu_uuid: KnownGpu(
                d.name,
                d.gpu_index,
                d.capacity_bytes or (known[d.gpu_uuid].memory if d.gpu_uuid in known else None),
            )
            for d in self.gpu_domains
            if d.gpu_uuid is not None
        }
        if listed is not None:
            seen = set(listed)
            self.missing_known = {
                uuid: gpu for uuid, gpu in known.items() if uuid not in seen and uuid not in here
            }
        else:
            self.missing_known = {u: g for u, g in self.missing_known.items() if u not in here}
        return here

    def missing_named(self, name: str) -> list[str]:
        """The UUIDs of the missing known GPUs whose last domain was ``name`` (or whose
        UUID is ``name``), the earliest seen first."""
        return [uuid for uuid, gpu in self.missing_known.items() if name in (gpu.name, uuid)]

    def missing_text(self, uuids: Iterable[str] | None = None) -> str:
        """Missing known GPUs as ``gpu1`` (with the UUID where the name alone does not say
        which: another GPU's domain has it now, the driver having numbered the GPUs it
        lists anew, or two missing GPUs had it)."""
        chosen = list(self.missing_known if uuids is None else uuids)
        every = [gpu.name for gpu in self.missing_known.values()]
        return ", ".join(
            sorted(
                name if name not in self._domains and every.count(name) == 1 else f"{name} ({uuid})"
                for uuid in chosen
                if (name := self.missing_known[uuid].name)
            )
        )

    def _waiting_for_missing(self, uuids: list[str]) -> Verdict:
        """ "Cannot tell": the job waits for these missing known GPUs."""
        gpus = "the GPUs" if len(uuids) > 1 else "the GPU"
        here = len(self.gpu_domains)
        names = [self.missing_known[u].name for u in uuids]
        forget = names[0] if len(set(names)) == 1 else "NAME"
        return Verdict(
            None,
            f"waiting for {gpus} of {self.missing_text(uuids)}: not found by the driver "
            f"({here} here, {len(self.missing_known)} missing; `gpulayer-tui domain forget "
            f"{forget}` if removed for good)",
        )

    def observe(
        self,
        result: ProbeResult,
        owners: dict[int, int | None],
        info: dict[int, ProcessInfo],
    ) -> dict[int, GpuReading]:
        """Take one sample: the capacity it implies and each GPU domain's reading.

        Returns:
            The readings by GPU index (empty unless the probe answered).
        """
        if result.status is ProbeStatus.OK:
            self._capacity = Capacity.KNOWN if result.gpus else Capacity.NO_GPUS
            self._gpus_seen = len(result.gpus)
            self._gpu_indices = frozenset(g.index for g in result.gpus)
            self._capacity_message = "" if result.gpus else "the GPU driver reports no devices"
            by_index = {g.index: g for g in result.gpus}
            for dom in self.gpu_domains:
                reading = by_index.get(dom.gpu_index or 0)
                if reading is not None:
                    dom.apply_sample(reading, owners, info)
            return by_index
        if result.status is ProbeStatus.NO_DRIVER:
            self._capacity = Capacity.NO_GPUS
            self._capacity_message = result.message or "no NVIDIA driver"
            # (known: none is listed; GPUs that had a domain here may come back, as after
            # a driver upgrade whose library does not load until the next reboot)
            self._gpus_seen = 0
            self._gpu_indices = frozenset()
        else:
            self._capacity = Capacity.UNKNOWN
            self._capacity_message = result.message or "GPU probe failed"
        return {}

    # -- holds ------------------------------------------------------------------------------

    @staticmethod
    def hold(job_id: int, request: Request | None, domains: list[Domain]) -> None:
        """Take a job's slots (and declared memory) on ``domains``, all in one step.

        ``request`` is ``None`` for a restored job whose spec can no longer be read: it
        holds one slot and no memory, so the running process stays accounted for.
        """
        for dom in domains:
            if request is None:
                dom.hold(job_id, None, False)
            else:
                dom.hold(job_id, request.vram_bytes, request.exclusive, request.slots_on(dom))

    @staticmethod
    def release(job_id: int, domains: list[Domain]) -> None:
        """Give back what ``job_id`` holds on ``domains`` (idempotent)."""
        for dom in domains:
            dom.unhold(job_id)

    def request_for(self, spec: JobSpec, keep_gone: bool = False) -> Request:
        """Resolve a spec's GPU needs against the configured domains.

        Args:
            spec: The job's spec.
            keep_gone: A job taken back (after a restart or a reload) keeps pins to domains
                that are gone: :meth:`capacity_verdict` judges them (the others of a choice
                may do; a GPU the driver no longer lists may come back). A new submission
                naming an unknown domain is refused.

        Raises:
            SpecError: For unknown domains or contradictory pins.
        """
        pins = spec.pinned_domains
        for name in pins:
            # (a domain the config names whose GPU is missing: the job waits for the GPU,
            # as those pinned to it before do; a name nothing configures is a typo)
            if name not in self.domains and not keep_gone and name not in self.configured_missing:
                raise SpecError(f"domain: {self.unknown_domain(name)}", "domain")
        if len(set(pins)) != len(pins):
            twice = next(name for name in pins if pins.count(name) > 1)
            raise SpecError(f"domain: {twice} is named twice", "domain")
        # (a pin that is gone was a GPU domain: the cpu pool is always there)
        gpu_pins = [p for p in pins if p not in self.domains or self.domains[p].is_gpu]
        if gpu_pins and len(gpu_pins) != len(pins):
            raise SpecError(
                f"domain: cannot mix the '{CPU_DOMAIN}' pool with GPU domains", "domain"
            )
        if spec.gpus is None:
            # Several pins are a choice (as `--domain` says: "repeat for a choice"): one
            # GPU from any of them unless `gpus` says more (it asked for all of them, and
            # waited while one was busy or lost with the others idle).
            gpus = 1 if gpu_pins or spec.vram_gb is not None else 0
        else:
            gpus = spec.gpus
        if gpus == 0 and gpu_pins:
            raise SpecError(
                f"gpus is 0 but domain {', '.join(gpu_pins)} is a GPU domain; "
                "drop the pin or ask for a GPU",
                "gpus",
            )
        if gpus > 0 and pins == [CPU_DOMAIN]:
            raise SpecError(
                f"asks for {plural(gpus, 'GPU')} but is pinned to the cpu pool", "domain"
            )
        vram = None if spec.vram_gb is None else int(spec.vram_gb * GIB)
        replicas = spec.replica_count
        return Request(gpus * replicas, vram, tuple(pins), spec.exclusive, replicas)

    # -- could it ever run? -----------------------------------------------------------------

    def candidates(self, req: Request) -> list[Domain]:
        """The domains ``req`` may use: its pins that still exist, or every GPU domain.

        A request resolved before a live reload renamed or removed a pinned domain names
        a domain that is gone; it is left out here (so such a request never fits), and
        :meth:`capacity_verdict` says which.
        """
        if not req.pins:
            return self.gpu_domains
        return [self.domains[p] for p in req.pins if p in self.domains]

    def may_keep_gone_pins(self, spec: JobSpec) -> bool:
        """Whether a job taken back (after a restart or a reload) whose pins name domains
        that are gone may wait on: the others of a choice can hold it, or a gone one is a
        GPU the driver no longer lists (it may come back). Otherwise it can no longer run."""
        pins = spec.pinned_domains
        left = [p for p in pins if p in self.domains]
        if left and len(left) >= max(spec.gpus or 1, 1):
            return True
        return any(self._missing_gpu(p) is not None for p in pins if p not in self.domains)

    def _missing_gpu(self, name: str) -> int | None:
        """The GPU index of a GPU domain name (``gpuN``, as the config names them by
        itself) whose GPU the last sample did not list: a GPU gone from the driver, maybe
        for a while (a reboot that did not bring it up), not a domain the config
        removed."""
        configured = self.configured_missing.get(name)
        if isinstance(configured, int):
            index = configured
        elif not (name.startswith("gpu") and name[3:].isascii() and name[3:].isdigit()):
            return None
        elif not any(gpu.name == name for gpu in self.missing_known.values()):
            return None  # (never had here, or forgotten: no GPU to wait for)
        else:
            index = int(name[3:])
        seen = self._gpu_indices
        return index if seen is not None and index not in seen and index < 1024 else None

    @staticmethod
    def could_hold(dom: Domain, req: Request) -> bool:
        """Whether ``dom``'s GPU is large enough for ``req``'s memory per GPU (or its size
        is not known: then it may be)."""
        size = dom.capacity_bytes
        return req.vram_bytes is None or size is None or size >= req.vram_bytes

    def _waiting_without_driver(self, req: Request) -> Verdict | None:
        """With no GPU driver now: the job waits for GPUs that had a domain here (a queued
        job was failed for good when an engine started without the driver: tester h140),
        where they could hold it; ``None`` when its pins are judged as such (below);
        otherwise it can never run here."""
        away = [
            uuid
            for uuid, gpu in self.missing_known.items()
            if req.vram_bytes is None or gpu.memory is None or gpu.memory >= req.vram_bytes
        ]
        if req.pins:
            if any(p not in self.domains and self._missing_gpu(p) is not None for p in req.pins):
                return None  # (judged by its pins: a GPU it names may come back)
        elif away and req.gpus <= len(away):
            return self._waiting_for_missing(away)
        return Verdict(
            False,
            f"requested {plural(req.gpus, 'GPU')}, but this machine has no GPUs "
            f"({self.capacity_message})",
        )

    def capacity_verdict(self, req: Request) -> Verdict:
        """Decide whether ``req`` fits this machine at all (ignoring current use)."""
        verdict = self._capacity_verdict(req)
        if req.replicas > 1 and verdict.possible is not True and req.gpus:
            per = req.gpus // req.replicas
            own = "its own GPU" if per == 1 else "GPUs of its own"
            what = f"{req.replicas} replicas x {plural(per, 'GPU')}, each on {own}"
            return Verdict(verdict.possible, f"{what}: {verdict.message}")
        return verdict

    def _capacity_verdict(self, req: Request) -> Verdict:
        if req.gpus == 0:
            cpu = self.domains.get(CPU_DOMAIN)
            if cpu is not None and req.cpu_slots > cpu.slots:
                return Verdict(
                    False,
                    f"requested {req.replicas} replicas on the cpu pool, but it has "
                    f"{plural(cpu.slots, 'slot')}",
                )
            return Verdict(True)
        if self.capacity is Capacity.NO_GPUS:
            waits = self._waiting_without_driver(req)
            if waits is not None:
                return waits
        all_gpu = self.gpu_domains
        away = [
            uuid
            for uuid, gpu in self.missing_known.items()
            if req.vram_bytes is None or gpu.memory is None or gpu.memory >= req.vram_bytes
        ]
        if (
            away
            and req.gpus > len(all_gpu)
            and req.gpus <= len(all_gpu) + len(away)
            and self.capacity is Capacity.KNOWN
            and not req.pins
        ):
            # GPUs this machine had are not listed now (one that did not come up after a
            # reboot, fallen off the bus): the job waits for them rather than fail.
            return self._waiting_for_missing(away)
        if req.gpus > len(all_gpu) and self.capacity is Capacity.KNOWN and not req.pins:
            # (A pinned request is told by its pins, below.)
            has = f"this machine has {len(all_gpu)}"
            if req.gpus > self._gpus_seen:
                has = f"this machine has {self._gpus_seen}"  # (no config could help)
            elif self._gpus_seen > len(all_gpu):  # ("has 2" of a machine with 4 read false)
                have = "has" if len(all_gpu) == 1 else "have"
                has = (
                    f"{len(all_gpu)} of this machine's {self._gpus_seen} GPUs {have} a "
                    "domain in the config"
                )
            return Verdict(False, f"requested {plural(req.gpus, 'GPU')}, but {has}")
        gone = [p for p in req.pins if p not in self.domains]
        candidates = self.candidates(req)
        if gone and len(candidates) < max(req.gpus, 1):
            # (a choice whose others can still hold it goes on without them)
            missing = [p for p in gone if self._missing_gpu(p) is not None]
            remembered = {g.name: g.memory or 0 for g in self.missing_known.values()}
            held = [p for p in missing if req.vram_bytes is None or not remembered.get(p)
                    or remembered[p] >= req.vram_bytes]  # fmt: skip
            if missing and not held and req.vram_bytes is not None:
                # (its size is remembered: a job it can never hold waited for it, once its
                # edit was let through: tester h118)
                asked, had = gib_apart(req.vram_bytes, max(remembered.get(p, 0) for p in missing))
                return Verdict(
                    False,
                    f"requested {asked} per GPU, but the GPU of {', '.join(missing)} (not "
                    f"found by the driver now) has {had}",
                )
            if missing:
                said = ", ".join(f"GPU {self._missing_gpu(p)} ({p})" for p in missing)
                return Verdict(None, f"waiting for {said}: not found by the driver")
            forgotten = [p for p in gone if p in self.forgotten]
            if forgotten:
                return Verdict(False, self.unknown_domain(forgotten[0]))
            return Verdict(False, f"unknown domain {', '.join(map(repr, gone))}")
        if req.pins and req.gpus > len(candidates):
            names = ", ".join(req.pins)
            return Verdict(
                False,
                f"requested {plural(req.gpus, 'GPU')}, but the pinned domain"
                f"{'s' if len(candidates) > 1 else ''} {names} "
                f"{'have' if len(candidates) > 1 else 'has'} {len(candidates)}",
            )
        if self.capacity is not Capacity.KNOWN:
            return Verdict(None, f"GPU capacity unknown: {self.capacity_message}")
        if req.vram_bytes is None:
            return Verdict(True)
        sizes = [d.capacity_bytes for d in candidates]
        if any(s is None for s in sizes):
            unknown = [d.name for d in candidates if d.capacity_bytes is None]
            big_known = [s for s in sizes if s is not None and s >= req.vram_bytes]
            if len(big_known) >= req.gpus:
                return Verdict(True)
            return Verdict(
                None, f"GPU capacity unknown: no memory reading from {', '.join(unknown)}"
            )
        big = [s for s in sizes if s is not None and s >= req.vram_bytes]
        if len(big) >= req.gpus:
            return Verdict(True)
        if away and not req.pins and len(big) + len(away) >= req.gpus:
            # (a missing GPU large enough for it may come back: the 60 GiB job waited
            # for the A100, not failed against the L4 left: tester h48)
            return self._waiting_for_missing(away[: req.gpus - len(big)])
        need = gib(req.vram_bytes).replace(".0 GiB", " GiB")
        if req.gpus == 1 or not big:
            if len(candidates) == 1:
                d = candidates[0]
                name = d.reading.name if d.reading else ""
                need, size = gib_apart(req.vram_bytes, d.capacity_bytes or 0)
                return Verdict(
                    False,
                    f"requested {need} per GPU, but {d.name}"
                    f"{f' ({name})' if name else ''} has {size}",
                )
            need, largest = gib_apart(req.vram_bytes, max(s or 0 for s in sizes))
            where = "the largest GPU" if not req.pins else "the largest pinned GPU"
            return Verdict(False, f"requested {need} per GPU, but {where} has {largest}")
        short = max((s for s in sizes if s is not None and s < req.vram_bytes), default=None)
        if short is not None and gib(short) == gib(req.vram_bytes):
            # (told apart from the GPUs just short of it: "24 GiB each, but only 6 GPUs
            # have that much" was said of 24.001 with two 24 GiB GPUs: tester h80)
            need = gib_apart(req.vram_bytes, short)[0]
        # (of the pinned ones: "only 1 GPU has that much" was said of a box with two
        # such, as g1 and g2 were pinned and one of them has: tester h129)
        which = f"of the pinned {', '.join(req.pins)} " if req.pins else ""
        return Verdict(
            False,
            f"requested {plural(req.gpus, 'GPU')} with {need} each, but only "
            f"{plural(len(big), 'GPU')} {which}{'has' if len(big) == 1 else 'have'} that much",
        )

    # -- can it run now? --------------------------------------------------------------------

    def place(self, req: Request, avoid: frozenset[str] = frozenset()) -> list[Domain] | str:
        """Return the domains to hold for ``req`` now, or the queued reason.

        Does not hold anything: the caller holds every returned domain in the same
        synchronous step, so a multi-GPU job never holds part of what it needs.

        Args:
            req: What the job needs.
            avoid: Domains it may not take (reserved for a better job).
        """
        if req.gpus == 0:
            cpu = self.domains[CPU_DOMAIN]
            why = cpu.blocker(None, req.exclusive, req.cpu_slots)
            if why is None and CPU_DOMAIN in avoid:
                return f"{CPU_DOMAIN} reserved"  # (said in full by the caller)
            return [cpu] if why is None else why
        candidates = self.candidates(req)
        # A GPU too small for it is never waited for: the reason names only those that
        # could take it ("gpu1 busy" about an L4 for a 100 GiB job told nothing true).
        large = [d for d in candidates if self.could_hold(d, req)]
        candidates = large or candidates
        if avoid:
            candidates = [d for d in candidates if d.name not in avoid]
        fitting: list[Domain] = []
        blocked: list[tuple[Domain, str]] = []
        for dom in candidates:
            why = dom.blocker(req.vram_bytes, req.exclusive)
            if why is None:
                fitting.append(dom)
            else:
                blocked.append((dom, why))
        if len(fitting) >= req.gpus:
            # For a job that says what memory it needs, the smallest GPU that has it first
            # (on a mixed box a 10 GiB job took the free A100 beside a free L4, and the
            # 40 GiB job after it waited; also where the L4 shares slots); then the least
            # loaded, then most free memory, then index: spreads work and keeps the
            # emptiest GPUs for whoever needs a whole one. (A job that declares nothing
            # may need any amount: not made smaller, and the GPU with the most memory free
            # first: by slots first, it went to a GPU of no jobs that a process not ours
            # filled to 87 %, beside one 75 GiB free: tester h189.)
            def order(d: Domain) -> tuple[int, ...]:
                free = d.account.free if d.account else 0
                if req.vram_bytes:
                    total = d.account.total if d.account else 0
                    return (total, d.used_slots, -free, d.gpu_index or 0)
                return (-free, d.used_slots, d.gpu_index or 0)

            fitting.sort(key=order)
            # The chosen ones in index order: a 2-GPU job saw CUDA_VISIBLE_DEVICES=1,0
            # (tester h84), and its rank 0 on the higher GPU.
            return sorted(
                fitting[: req.gpus],
                key=lambda d: d.gpu_index if d.gpu_index is not None else 0,
            )
        return self._reason(req, candidates, fitting, blocked)

    def _reason(
        self,
        req: Request,
        candidates: list[Domain],
        fitting: list[Domain],
        blocked: list[tuple[Domain, str]],
    ) -> str:
        if not candidates:
            return f"GPU capacity unknown: {self.capacity_message}"
        if len(candidates) == 1 and blocked:
            # (None blocked: the others were left out as reserved for a job ahead; a
            # 2-GPU job pinned to two domains, one of them reserved, ended the submission
            # with an IndexError here)
            return f"waiting for {blocked[0][1]}"
        # Domains that are only busy are named, not their jobs: with many domains a text
        # naming jobs changes with every job end, and each change rewrites the row of
        # every job waiting for this shape (hundreds). `why` and the GPU view say who.
        # (One whose memory held outside our jobs would still keep the job out once its
        # slot is free is named with that: "gpu0 busy" of a GPU a 70 GiB stray held read as
        # if job 9's end would let a 4-GPU job start; tester h55.)
        busy = [
            d.name
            for d, _ in blocked
            if d.state is DomainState.IN_SERVICE
            and d.free_slots < 1
            and not req.exclusive
            and not d.outside_shortfall(req.vram_bytes)
        ]
        if len(busy) == len(blocked) and not fitting:
            total = sum(d.slots for d in candidates)
            return busy_words(total, "GPU")
        others = [w for d, w in blocked if d.name not in busy]
        details = "; ".join(([f"{', '.join(busy)} busy"] if busy else []) + others)
        if req.gpus == 1:
            return f"waiting for a GPU: {details}"
        needs = f"needs {plural(req.gpus, 'GPU')}, {len(fitting)} available now"
        return f"{needs}; {details}" if details else needs
