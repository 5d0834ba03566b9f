"""Domain health and operator control (record 002): quarantine, drain, release, readiness.

Each sample's per-GPU outcome is counted by that GPU's domain alone
(:meth:`~gpulayer_tui.engine.domain.Domain.observe`): a lost GPU is quarantined at once,
repeated failed reads degrade and then quarantine it. A quarantined domain takes no new
work and submissions pinned only to it are refused at once; its running jobs are left
running (no failover) and carry a warning. Other domains notice nothing. Only an explicit
release, once the GPU answers again, returns it to service. Drain is the operator's
maintenance switch for a healthy domain. States survive an engine restart.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..fields import printable
from ..wire import DomainJSON
from .domain import (
    MISSING_WARNING,
    Domain,
    DomainHealth,
    DomainState,
    missing_warning,
    plural,
)
from .errors import DomainRefused, SpecError, UnknownDomain
from .events import EventBus
from .jobbook import ActiveJob, JobBook, adopted_on
from .models import EventKind, Job, JobKind, JobStatus, KnownGpu, TerminationReason
from .services import service_summary

REMOVED_WARNING = " is no longer in the configuration (it is let run to its end)"
"""What a running job's message adds while its domain is one a reload took out."""

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .config import HealthSettings
    from .executor import TaskKey
    from .gpus import GpuReading
    from .jobqueue import JobQueue
    from .scheduler import Scheduler
    from .store import Store

QuarantineListener = Callable[[Domain], None]

# What CUDA/NVML print when the *device* is at fault (not the program): no device, device
# busy/unavailable, ECC, a lost GPU. A program's own bug (an assert, out of memory) is not.
_DEVICE_ERROR = re.compile(
    r"(no CUDA-capable device|CUDA-capable device\(s\) (is|are) busy or unavailable|"
    r"cudaError(NoDevice|DevicesUnavailable|ECCUncorrectable|InitializationError)|"
    r"CUDA_ERROR_(NO_DEVICE|ECC_UNCORRECTABLE|NOT_INITIALIZED|DEVICE_UNAVAILABLE)|"
    r"uncorrectable ECC error|GPU is lost|fallen off the bus)",
    re.IGNORECASE,
)
TAIL_BYTES = 8192


def device_error_in(log: Path) -> str | None:
    """The device error a job's output ends with, if any (reads the last 8 KiB only)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, log.stat().st_size - TAIL_BYTES))
            tail = fh.read().decode(errors="replace")
    except OSError:
        return None
    match = _DEVICE_ERROR.search(tail)
    return match.group(0) if match else None


"""Ends a running job's warning that its GPU is missing (see ``DomainOps._warn_missing``)."""


DEFAULT_DRAIN_REASON = "drained by the operator"


def _missing(jobs: list[int]) -> str:
    """``not found by the driver; job 4 still runs there``."""
    ids = ", ".join(map(str, jobs))
    return (
        f"not found by the driver; job{'s' if len(jobs) > 1 else ''} {ids} still "
        f"run{'' if len(jobs) > 1 else 's'} there"
    )


class DomainOps:
    """Domain health, drain and release, readiness and the engine's ``doctor`` checks.

    Args:
        scheduler: The domains.
        book: Running jobs get a warning when their domain is quarantined.
        queue: A changed domain changes what can start (and what ``doctor`` reports).
        store: Domain states survive restarts; changes are history events.
        bus: Makes the ``domain.state`` events.
        settings: ``[health]`` thresholds.
        log_path: A job's log (read for device errors when a GPU job fails).
        sampling: Why GPU sampling is not working, or ``None`` (readiness, ``doctor``).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        book: JobBook,
        queue: JobQueue,
        store: Store,
        bus: EventBus,
        settings: HealthSettings,
        log_path: Callable[[TaskKey], Path],
        sampling: Callable[[], str | None] = lambda: None,
        gate: Callable[[], str | None] = lambda: None,
        disk: Callable[[], str | None] = lambda: None,
        launcher: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._scheduler = scheduler
        self._disk = disk
        self._launcher = launcher
        self._sampling = sampling
        self._gate = gate
        self._book = book
        self._queue = queue
        self._store = store
        self._bus = bus
        self._settings = settings
        self._log_path = log_path
        self._quarantine_listeners: list[QuarantineListener] = []
        # Jobs whose device errors alone quarantined a GPU: they count against none since.
        self._faults_follow: set[int] = set()

    def reconfigure(self, settings: HealthSettings) -> None:
        """Use new ``[health]`` thresholds from now on."""
        self._settings = settings

    def on_quarantine(self, listener: QuarantineListener) -> None:
        """Call ``listener(domain)`` when a domain is quarantined (before jobs are warned)."""
        self._quarantine_listeners.append(listener)

    # -- health -------------------------------------------------------------------------------

    def observe(self, readings: dict[int, GpuReading], read_at: float | None = None) -> None:
        """Count one OK sample (begun at ``read_at``, epoch s) against every GPU domain's
        health."""
        settings = self._settings
        for dom in self._scheduler.gpu_domains:
            change = dom.observe(
                readings.get(dom.gpu_index if dom.gpu_index is not None else -1),
                settings.degrade_after,
                settings.quarantine_after,
                read_at,
            )
            if change is not None:
                self._changed(dom, str(change))
        self._warn_missing()

    def _warn_missing(self) -> None:
        """Running jobs on a GPU the driver no longer lists (gone while no engine ran) say
        so in their message, as under a quarantine ("running on gpu1" read as all well,
        while ``gpus`` showed the GPU missing); the warning goes when the GPU is back."""
        warned: set[int] = set()
        missing = self._scheduler.missing_gpus()
        for index, dom in sorted(self._scheduler.retired.items()):
            if index in missing:
                continue
            # A GPU the config no longer gives a domain, jobs still running there (a
            # reload took it out): said too, as `gpus` says it ("running on gpu1" alone,
            # while `domain list` no longer listed gpu1: tester h125).
            for job_id in sorted(dom.holdings):
                act = self._book.get(job_id)
                if act is None or act.job.status is not JobStatus.RUNNING:
                    continue
                warned.add(job_id)
                said = f"; warning: domain {dom.name}{REMOVED_WARNING}"
                if act.job.kind is JobKind.SERVICE:
                    warning = service_summary(act.job) + said
                else:
                    warning = f"{_where(act)}{said}"
                if not act.job.message.startswith(warning):
                    self._book.set_reason(act, warning)
        for index, jobs in missing.items():
            for job_id in jobs:
                act = self._book.get(job_id)
                if act is None or act.job.status is not JobStatus.RUNNING:
                    continue
                warned.add(job_id)
                if act.job.kind is JobKind.SERVICE:
                    # (its replicas say where they are, and it went unsaid: "2/2 up on
                    # gpu2, gpu0" of a GPU gone; tester h58)
                    warning = service_summary(act.job) + missing_warning(index)
                else:
                    warning = f"{_where(act)}{missing_warning(index)}"
                if not act.job.message.startswith(warning):
                    self._book.set_reason(act, warning)
        # (every job looked at: a warning stored by the last engine goes too, once its GPU
        # is back; a substring test per active job, each sample)
        for act in self._book:
            if act.job.id in warned or act.job.status is not JobStatus.RUNNING:
                continue
            message = act.job.message
            if (MISSING_WARNING in message and "; warning: GPU " in message) or (
                REMOVED_WARNING in message and "; warning: domain " in message
            ):
                if act.job.kind is JobKind.SERVICE:
                    self._book.set_reason(act, service_summary(act.job))
                else:
                    # (back under a quarantine, it said all was well: the quarantine's
                    # warning, lost to the "no longer in the configuration" one: h148)
                    sick = [d for d in act.holds if d.state is DomainState.QUARANTINED]
                    said = "".join(
                        f"; warning: domain {d.name} quarantined: {d.state_reason}" for d in sick
                    )
                    self._book.set_reason(act, _where(act) + said)

    def quarantined(self, dom: Domain) -> None:
        """What runs on a quarantined domain reacts: its services are placed again (the
        quarantine listeners), its batch jobs say so. Also called once the jobs are
        restored at start: the first sample quarantines a GPU lost while no engine ran
        before any job is back, and a service there ran on, never placed again (tester
        h52)."""
        for listener in self._quarantine_listeners:
            listener(dom)
        for job_id in sorted(dom.holdings):
            act = self._book.get(job_id)
            if act is None or act.job.status is not JobStatus.RUNNING:
                continue
            if act.job.kind is JobKind.SERVICE:
                continue  # placed again by its runner (a quarantine listener)
            warning = f"{_where(act)}; warning: domain "
            self._book.set_reason(act, f"{warning}{dom.name} quarantined: {dom.state_reason}")

    def _changed(self, dom: Domain, what: str, caused_by: int | None = None) -> None:
        """Record and publish a domain's change, then let the queue see it.

        ``caused_by``: the job whose run's device error made the change; the event is
        then in that job's timeline too, with a message saying so (it was told nothing,
        its GPU quarantined behind it: tester h148)."""
        # In the engine's log too, without -v (a headless engine's journal had no line of
        # a quarantine, a lost GPU, a drain or a release: tester h125).
        healthy = dom.state is not DomainState.QUARANTINED and dom.health is DomainHealth.HEALTHY
        # (an operator's drain or release, or a GPU answering again, is no warning; a drain
        # under a quarantine was logged as one, with the quarantine's cause and no word of
        # the drain's reason: tester h170)
        news = what in ("healthy", "draining", "drain reason", "released")
        drained = dom.drain_reason if dom.drain_reason and dom.drain_reason != dom.reason else ""
        # (a GPU answering again under its quarantine read "health healthy (GPU is lost)":
        # the cause is the quarantine's, which stands until released: tester h185)
        cause = printable(dom.reason) if dom.reason else ""
        if cause and dom.state is DomainState.QUARANTINED and dom.health is DomainHealth.HEALTHY:
            cause = f"quarantined for: {cause}; `domain release` lifts it"
        log.log(
            logging.INFO if healthy or news else logging.WARNING,
            "domain %s, %s: state %s, health %s%s%s",
            dom.name,
            what,
            dom.state.value,
            dom.health.value,
            f" ({cause})" if cause else "",
            f"; drained: {printable(drained)}" if drained else "",
        )
        self._store.save_domain_state(
            dom.name, dom.state.value, dom.state_reason, dom.gpu_uuid, dom.drain_reason
        )
        data = {
            "domain": dom.name,
            "change": what,
            "state": dom.state.value,
            "health": dom.health.value,
            "reason": dom.reason,
            # (a drain under a quarantine: its reason is not the domain's reason)
            "drain_reason": dom.drain_reason,
        }
        if caused_by is not None:
            data["message"] = (
                f"domain {dom.name} {what} after this run's device error: {dom.reason}"
            )
        event = self._bus.make(EventKind.DOMAIN, caused_by, data)
        self._store.save(None, [event])
        if dom.state is DomainState.QUARANTINED:
            self.quarantined(dom)
        else:
            # Released (to service, or back to the drain it was under): the warning above
            # is past (it stayed, after restarts too; and under the name the domain had
            # when it was given, after a rename).
            for job_id in sorted(dom.holdings):
                act = self._book.get(job_id)
                if act is None or act.job.status is not JobStatus.RUNNING:
                    continue
                if any(d.state is DomainState.QUARANTINED for d in act.holds):
                    continue  # (another of its GPUs still is)
                message = act.job.message
                if message.startswith(_where(act)) and "; warning: domain " in message:
                    self._book.set_reason(act, _where(act))
        self._queue.schedule_soon()

    def job_ended_on(self, job: Job, domains: list[Domain]) -> None:
        """Process-end listener: a GPU job that died of a device error counts against its
        GPUs' health; any other end of a GPU job resets that count."""
        gpu_domains = [d for d in domains if d.is_gpu]
        if not gpu_domains or job.kind is not JobKind.COMMAND:
            return
        error = None
        if job.status is JobStatus.FAILED and job.termination_reason in (
            TerminationReason.EXIT_CODE,
            TerminationReason.SIGNAL,
        ):
            error = device_error_in(self._log_path(job.id))
        self._count_end(error, gpu_domains, job.id)

    def replica_ended_on(self, key: TaskKey, code: int | None, domains: list[Domain]) -> None:
        """A service replica's process ended by itself on GPUs: as a job's end (a crash
        loop on a broken GPU restarted for ever, the GPU "healthy")."""
        failed = code is not None and code != 0
        error = device_error_in(self._log_path(key)) if failed else None
        job_id = key if isinstance(key, int) else key[0]
        self._count_end(error, [d for d in domains if d.is_gpu], job_id)

    def _count_end(self, error: str | None, gpu_domains: list[Domain], job_id: int) -> None:
        if error is not None and job_id in self._faults_follow:
            return  # (its errors followed it off a GPU they quarantined: its own, not theirs)
        settings = self._settings
        for dom in gpu_domains:
            change = dom.record_job_end(
                error, settings.degrade_after, settings.quarantine_after, job_id
            )
            if change is DomainState.QUARANTINED and dom.failed_by_one_job == job_id:
                # One job's runs alone quarantined it. Placed again, the same errors on
                # the next GPU would quarantine that one, then every other: one
                # crash-looping service took every GPU of the box (tester h93). Its device
                # errors count against no GPU from now on; other jobs' still do.
                self._faults_follow.add(job_id)
            if change is not None:
                # (a clean end that restores health is the GPU's news, not the job's)
                self._changed(dom, str(change), job_id if error is not None else None)

    def refuse_quarantined_pins(self, pins: list[str]) -> None:
        """Refuse a submission whose every pinned domain is quarantined.

        Raises:
            SpecError: Naming the domain and why.
        """
        domains = self._scheduler.domains
        doms = [domains[p] for p in pins if p in domains]
        if doms and all(d.state is DomainState.QUARANTINED for d in doms):
            dom = doms[0]
            raise SpecError(
                f"domain {dom.name} is quarantined: {dom.state_reason} "
                f"(release it with `gpulayer-tui domain release {dom.name}` once its GPU "
                "answers again)",
                "domain",
            )

    def pins_out_of_service(self, jobs: list[tuple[int, list[str], int]]) -> list[str]:
        """What a submitter is told of the jobs it just queued that cannot start until a
        domain they are pinned to is back in service (``jobs``: each waiting job's id, pins
        and GPUs per placement): fewer of their pins are in service than they need, the
        rest draining or quarantined. Taken without a word, such a job waited as long as
        the maintenance (testers h194, h197); one whose every pin is quarantined is
        refused instead (:meth:`refuse_quarantined_pins`)."""
        domains = self._scheduler.domains
        said: dict[str, list[int]] = {}  # the words, and the jobs they are said of
        for job_id, pins, needed in jobs:
            doms = [domains[p] for p in pins if p in domains]
            usable = sum(1 for d in doms if d.state is DomainState.IN_SERVICE)
            out = [d for d in doms if d.state is not DomainState.IN_SERVICE]
            short = max(1, needed) - usable
            if not doms or short <= 0 or not out:
                continue
            parts = "; ".join(f"{d.name} is {d.state.value} ({d.state_reason})" for d in out)
            if short >= len(out):
                once = "it is" if len(out) == 1 else "they are"
            else:
                once = f"{short} of them {'is' if short == 1 else 'are'}"
            words = (
                f"{parts}: it starts once {once} back in service (`gpulayer-tui domain "
                f"release {out[0].name}`)"
            )
            said.setdefault(words, []).append(job_id)
        out_said = []
        for words, ids in said.items():
            shown = ", ".join(map(str, ids[:10])) + (
                f" and {len(ids) - 10} more" if len(ids) > 10 else ""
            )
            which = f"job {shown} waits" if len(ids) == 1 else f"jobs {shown} wait"
            out_said.append(f"{which} for the domains it is pinned to: {words}")
        return out_said

    # -- operator control ---------------------------------------------------------------------

    async def drain(self, name: str, reason: str | None = None) -> DomainJSON:
        """Stop new placements on a domain (maintenance); running work is left alone. A
        domain draining already takes a new reason (the only way to change it was a
        release and a drain again, and work queued for it started in between); an empty
        one puts back the default.

        Raises:
            SpecError: Unknown domain.
            DomainRefused: It is already draining (or drained under its quarantine), and
                no other reason is given.
        """
        dom = self._scheduler.domain(name)
        new = reason or DEFAULT_DRAIN_REASON
        if dom.state is DomainState.DRAINING or dom.drain_reason is not None:
            if reason is not None and new != dom.drain_reason:
                previous = dom.drain_reason or ""
                dom.drain_reason = new
                if dom.state is DomainState.DRAINING:
                    dom.state_reason = new
                self._changed(dom, "drain reason")
                await self._store.flush()
                # (the CLI said only "domain X: draining", the same as before: h-list)
                changed = dom.to_json()
                changed["previous_drain_reason"] = previous
                return changed
            under = "" if dom.state is DomainState.DRAINING else " under its quarantine"
            # (It said only "already draining": nothing said how to change or clear it.)
            raise DomainRefused(
                f"domain {name} is already draining{under} "
                f"(reason: {printable(dom.drain_reason or '')[:200]}); give another reason to "
                "change it, or an empty one for the default"
            )
        dom.drain(new)
        # (Quarantined, the drain is kept under it: a release goes back to draining.)
        self._changed(dom, "draining")
        await self._store.flush()
        return dom.to_json()

    async def release(self, name: str) -> DomainJSON:
        """Return a drained or quarantined domain to service.

        Raises:
            SpecError: Unknown domain.
            DomainRefused: It is in service already, or its GPU still fails.
        """
        dom = self._scheduler.domain(name)
        if dom.state is DomainState.IN_SERVICE:
            raise DomainRefused(f"domain {name} is in service already")
        if dom.state is DomainState.QUARANTINED and dom.is_gpu and not dom.answers:
            raise DomainRefused(
                f"domain {name} cannot be released: its GPU still fails ({dom.last_error})"
            )
        dom.release()
        self._changed(dom, "released")
        await self._store.flush()
        return dom.to_json()

    async def forget(self, name: str) -> dict[str, Any]:
        """Forget a GPU that had a domain here and that the driver no longer lists (one
        removed for good): jobs that waited for it are decided again (those that can never
        run without it fail ``over_capacity``), and the next engine does not wait for it.

        Args:
            name: Its last domain's name, or its UUID.

        Returns:
            ``{"name", "gpu_uuid"}`` of the GPU forgotten, and ``still_running``: the
            jobs recorded on it that still run (taken back by an engine started after it
            went missing); they are left to end by themselves, the GPU listed till then.

        Raises:
            UnknownDomain: No missing GPU goes by ``name``.
            DomainRefused: ``name`` is a domain here (or the cpu pool), two missing GPUs
                went by it, or the config still names the GPU.
        """
        scheduler = self._scheduler
        shown = printable(name)[:100]
        found = scheduler.missing_named(name)
        if not found:
            live = scheduler.domains.get(name) or next(
                (d for d in scheduler.gpu_domains if d.gpu_uuid == name), None
            )
            if live is not None and not live.is_gpu:
                raise DomainRefused(
                    f"domain {live.name} is the CPU pool: only a GPU the driver no longer "
                    "lists can be forgotten"
                )
            if live is not None:
                raise DomainRefused(
                    f"domain {live.name}'s GPU is listed by the driver: there is nothing to "
                    "forget (only a GPU this machine had and no longer lists can be forgotten)"
                )
            missing = scheduler.missing_text() or "none"
            said = f"no missing GPU goes by '{shown}' (missing now: {missing})"
            raise UnknownDomain(said, "domain")
        if len(found) > 1:
            raise DomainRefused(
                f"{len(found)} missing GPUs went by '{shown}': {', '.join(found)}; forget one "
                "by its UUID"
            )
        uuid = found[0]
        known = scheduler.missing_known[uuid]
        named = [
            domain
            for domain, gpu in scheduler.configured_missing.items()
            if domain == known.name or gpu in (uuid, known.index)
        ]
        if named:
            # (Forgotten, the next engine took [domains.train] for a typo and did not start:
            # tester h48.)
            raise DomainRefused(
                f"the config names the GPU of {known.name} ([domains.{named[0]}] in "
                "config.toml): take that domain out of the config first, then forget it"
            )
        # (they were not said: forgotten, the GPU still showed in `gpus` with a job on it,
        # and nothing told why: tester h148)
        # (the jobs taken back on a GPU gone while no engine ran are held by a stand-in
        # domain of its index, made without its UUID)
        still_running: list[int] = []
        if known.index is not None:
            retired = scheduler.retired.get(known.index)
            if retired is not None and retired.gpu_uuid in (None, uuid):
                still_running = scheduler.missing_gpus().get(known.index, [])
        del scheduler.missing_known[uuid]
        scheduler.forgotten[known.name] = uuid
        self._store.forget_gpu(uuid)
        await self._store.flush()
        self._queue.recheck_capacity()
        self._queue.schedule_soon()
        return {"name": known.name, "gpu_uuid": uuid, "still_running": still_running}

    def _missing_not_configured(self) -> list[tuple[str, KnownGpu]]:
        """The missing known GPUs the config does not name (those it names are said as
        its domains), by last domain name."""
        configured = self._scheduler.configured_missing
        return sorted(
            (
                (uuid, known)
                for uuid, known in self._scheduler.missing_known.items()
                if known.name not in configured
                and uuid not in configured.values()
                and known.index not in configured.values()
            ),
            key=lambda item: item[1].name,
        )

    async def restore_states(self) -> dict[str, str]:
        """Take back the drained and quarantined states stored by earlier runs.

        A GPU's state is found by its UUID, whatever its domain is called now (the config
        may have renamed it while no engine ran), and stored again under that name; a
        stored state whose GPU has no domain now is applied to none (not to a domain that
        took its old name). Rows without a UUID (the cpu pool, older rows) go by name.
        Every GPU domain's name is then stored with its GPU (:meth:`remember_names`).

        Returns:
            The GPU domains renamed since the last run: old name -> new name (waiting jobs
            pinned to an old name follow it; see :meth:`.Recovery.restore`).
        """
        domains = self._scheduler.domains
        by_uuid = {d.gpu_uuid: d for d in domains.values() if d.gpu_uuid is not None}
        renamed: dict[str, str] = {}
        for name, state, reason, uuid, drained in await self._store.domain_states():
            now = by_uuid.get(uuid) if uuid is not None else None
            if now is not None and now.name != name:  # (its GPU's name now, even swapped)
                renamed[name] = now.name
            dom = by_uuid.get(uuid) if uuid is not None else domains.get(name)
            if dom is None and uuid is not None:
                named = domains.get(name)
                if named is not None and named.is_gpu and named.gpu_uuid is None:
                    dom = named  # (its GPU's UUID unreadable now, a lost GPU: by name)
            if uuid is None and dom is not None and dom.gpu_uuid is not None:
                # (an older row: by name, then kept by UUID from now on)
                self._store.save_domain_state(dom.name, state, reason, dom.gpu_uuid, drained)
            if dom is None:
                continue
            dom.restore_state(DomainState(state), reason, drained)
            if dom.name != name:
                self._store.save_domain_state(dom.name, state, reason, dom.gpu_uuid, drained)
        self.remember_names()
        return renamed

    def remember_names(self) -> None:
        """Store every GPU domain's name with its GPU's UUID (and its state): the next
        engine finds the waiting jobs pinned to a domain the config renamed while no
        engine ran (only drained or quarantined GPUs had a row, by which they failed)."""
        for dom in self._scheduler.gpu_domains:
            if dom.gpu_uuid is not None:
                self._store.save_domain_state(
                    dom.name, dom.state.value, dom.state_reason, dom.gpu_uuid, dom.drain_reason
                )

    # -- reports ------------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """Ready when every domain is in service, GPU capacity is known, writes work, the
        state dir has room for new jobs (``[logs] min_free_mb``) and the launcher starts
        them."""
        problems = [
            f"domain {d.name} {d.state.value}" + (f": {d.state_reason}" if d.state_reason else "")
            for d in self._scheduler.domains.values()
            if d.state is not DomainState.IN_SERVICE
        ]
        problems += [
            f"GPU {index} {_missing(jobs)}"
            for index, jobs in self._scheduler.missing_gpus().items()
        ]
        problems += [
            f"domain {name}: GPU {gpu} is not found by the driver"
            for name, gpu in self._scheduler.configured_missing.items()
        ]
        problems += [  # (ready said yes while doctor warned: tester h48)
            f"GPU of {self._scheduler.missing_text([uuid])} is not found by the driver"
            for uuid, _ in self._missing_not_configured()
        ]
        if self._scheduler.capacity.value == "unknown":
            problems.append(f"GPU capacity unknown: {self._scheduler.capacity_message}")
        if self._store.failure:
            problems.append(f"not accepting work: {self._store.failure}")
        stalled = self._sampling()
        if stalled:
            problems.append(stalled)
        full = self._disk()
        if full:
            # (no job could start and /ready said ready: only doctor knew; tester h63)
            problems.append(f"new jobs are held: {full}")
        launcher = self._launcher()
        if launcher:
            # (a stopped spawner: jobs said running with no process, and /ready said
            # yes: tester h143)
            problems.append(f"no job starts: {launcher}")
        return (not problems, "; ".join(problems) or "every domain is ready")

    async def doctor_checks(self) -> list[dict[str, str]]:
        """The engine's own checks: each domain's health, and queued jobs that no domain
        in service could ever take. Each check is ``{"check", "status", "detail"}`` with
        status ``ok``, ``warn`` or ``fail``."""
        checks: list[dict[str, str]] = []
        domains = self._scheduler.domains
        for dom in domains.values():
            if dom.state is DomainState.QUARANTINED:
                status, detail = "fail", f"quarantined: {dom.state_reason}"
                # (as `domain list` says it: "quarantined: GPU is lost" alone, of a GPU that
                # answered again and had a drain under it: tester h170)
                if dom.health is DomainHealth.HEALTHY:
                    detail += "; the GPU answers again: release it when you trust it"
                if dom.drain_reason is not None:
                    detail += f"; drained under it ({dom.drain_reason}): a release drains it"
            elif dom.state is DomainState.DRAINING:
                status, detail = "warn", f"draining: {dom.state_reason}"
            elif dom.health is DomainHealth.DEGRADED:
                status, detail = "warn", f"degraded: {dom.failures} failed reads ({dom.last_error})"
            else:
                what = f"GPU {dom.gpu_index}" if dom.is_gpu else "cpu pool"
                status, detail = "ok", f"{what}, {dom.used_slots}/{dom.slots} slots used"
                if dom.used_slots > dom.slots:  # (a reload lowered its slots under use)
                    status = "warn"
                    detail += ": more than its slots; no new work until below"
            checks.append({"check": f"domain {dom.name}", "status": status, "detail": detail})
        for index, jobs in self._scheduler.missing_gpus().items():
            checks.append({"check": f"GPU {index}", "status": "fail", "detail": _missing(jobs)})
        for uuid, known in self._missing_not_configured():
            # (by its UUID where another GPU's domain has its name now: the same advice
            # as `domain list`'s, tester h166)
            forget = uuid if known.name in self._scheduler.domains else known.name
            checks.append(
                {
                    "check": f"GPU of {self._scheduler.missing_text([uuid])}",
                    "status": "warn",
                    "detail": f"{uuid} is not found by the driver (this machine had it): jobs "
                    f"needing it wait; `gpulayer-tui domain forget {forget}` if it was "
                    "removed for good",
                }
            )
        for name, gpu in self._scheduler.configured_missing.items():
            checks.append(
                {
                    "check": f"domain {name}",
                    "status": "fail",
                    "detail": f"GPU {gpu} is not found by the driver: left out until it is "
                    "(jobs pinned to it wait)",
                }
            )
        stuck = []
        ready = self._queue.ready_requests()
        for job_id, request in ready:
            if request.pins:
                candidates = [domains[p] for p in request.pins if p in domains]
            elif request.gpus:
                candidates = self._scheduler.gpu_domains
            else:
                candidates = [domains["cpu"]]
            # (In service and large enough: a 100 GiB job waits for the H200 out of
            # service, not for the 24 GiB L4 beside it.)
            usable = [
                d
                for d in candidates
                if d.state is DomainState.IN_SERVICE and self._scheduler.could_hold(d, request)
            ]
            if len(usable) < max(1, request.gpus):
                stuck.append(job_id)
        closed = self._gate()
        blocked = self._queue.capacity_blocked()

        def for_capacity() -> str:
            first = min(blocked)
            more = f" and {len(blocked) - 1} more" if len(blocked) > 1 else ""
            verb = "waits" if len(blocked) == 1 else "wait"
            return (
                f"{verb} for capacity that is not there now: job {first} ({blocked[first]}){more}"
            )

        if closed is not None and (ready or blocked or "paused" in closed):
            # (Paused is someone's choice; a disk below the floor is a fault to fix.)
            waiting = len({job_id for job_id, _ in ready} | set(blocked))
            verb = "waits" if waiting == 1 else "wait"
            detail = f"{waiting} {verb}: {closed}" if waiting else f"none waits; {closed}"
            if blocked:  # (it said "none waits" of jobs waiting for a missing GPU: h47)
                detail += f"; {len(blocked)} of them {for_capacity()}"
            checks.append(
                {
                    "check": "queued jobs",
                    "status": "warn" if "paused" in closed else "fail",
                    "detail": detail,
                }
            )
        elif stuck:
            ids = ", ".join(map(str, sorted(stuck)[:20]))
            checks.append(
                {
                    "check": "queued jobs",
                    "status": "fail",
                    "detail": f"{plural(len(stuck), 'queued job')} can only run on domains out "
                    "of service: "
                    f"{ids}",
                }
            )
        elif blocked:
            # (It said "0 ready to run, all placeable" while a job waited for a GPU the
            # driver no longer listed: tester h44.)
            checks.append(
                {
                    "check": "queued jobs",
                    "status": "warn",
                    # ("0 wait for a free place (nothing else); 2 wait for capacity ...": the
                    # part with none left out: tester h169)
                    "detail": f"{_turn(len(ready))}; {len(blocked)} {for_capacity()}"
                    if ready
                    else f"{len(blocked)} {for_capacity()}",
                }
            )
        else:
            checks.append(
                {
                    "check": "queued jobs",
                    "status": "ok",
                    "detail": f"{_turn(len(ready))}, all placeable",
                }
            )
        stalled = self._sampling()
        checks.append(
            {
                "check": "GPU sampling",
                "status": "fail" if stalled else "ok",
                "detail": stalled or "samples are taken and handled",
            }
        )
        checks.append(
            {
                "check": "database writes",
                "status": "fail" if self._store.failure else "ok",
                "detail": self._store.failure or f"{self._store.path} is being written",
            }
        )
        newest = (await self._store.newest_job_time()) or 0.0
        skew = newest - time.time()
        checks.append(
            {
                "check": "clock",
                "status": "fail" if skew > 5 else "ok",
                "detail": f"the clock is {skew:.0f} s behind the newest job"
                if skew > 5
                else "not behind the newest job",
            }
        )
        return checks


def _turn(count: int) -> str:
    """Jobs whose dependencies are met, waiting only for a place: "2 ready to run" was
    said of jobs waiting for busy slots, as if they could start now (tester h102)."""
    return f"{count} {'waits' if count == 1 else 'wait'} for a free place (nothing else)"


def _where(act: ActiveJob) -> str:
    """A running job's reason, before a warning is added or after it is taken away: an
    adopted process keeps saying so (it became "running on gpu0, gpu1", a batch job's
    words, after a GPU went missing and came back: tester h97)."""
    if act.job.kind is JobKind.ADOPTED and act.job.pid is not None:
        return adopted_on(act.job)
    return f"running on {', '.join(act.job.domains)}"
