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

import re
import time
from pathlib import Path
from typing import Any

from .adoption import Adoption
from .domain import Domain, DomainHealth, DomainState
from .models import EventKind, Job, JobKind, JobStatus, TerminationReason
from .spec import SpecError

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


class DomainRefused(RuntimeError):
    """A domain operation does not apply now (the message says why)."""


class DomainControl(Adoption):
    """Health bookkeeping and drain/release, mixed into the engine."""

    def _observe_health(self, readings: dict[int, Any]) -> None:
        """Count one OK sample against every GPU domain's health."""
        settings = self.config.health
        for dom in self.scheduler.gpu_domains:
            change = dom.observe(
                readings.get(dom.gpu_index if dom.gpu_index is not None else -1),
                settings.degrade_after,
                settings.quarantine_after,
            )
            if change is not None:
                self._domain_changed(dom, str(change))

    def _domain_changed(self, dom: Domain, what: str) -> None:
        """Record and publish a domain's change, then let the queue see it."""
        self.store.save_domain_state(dom.name, dom.state.value, dom.state_reason)
        event = self.bus.make(
            EventKind.DOMAIN,
            None,
            {
                "domain": dom.name,
                "change": what,
                "state": dom.state.value,
                "health": dom.health.value,
                "reason": dom.state_reason or dom.last_error,
            },
        )
        self.store.save(None, [event])
        if dom.state is DomainState.QUARANTINED:
            for job_id in sorted(dom.holdings):
                act = self._active.get(job_id)
                if act is None or act.job.status is not JobStatus.RUNNING:
                    continue
                if act.job.kind is JobKind.SERVICE:
                    # Record 000: a service that lost a domain is placed again elsewhere.
                    self._replace_service(act, f"domain {dom.name} quarantined: {dom.state_reason}")
                    continue
                warning = f"running on {', '.join(act.job.domains)}; warning: domain "
                self._set_reason(act, f"{warning}{dom.name} quarantined: {dom.state_reason}")
        self._schedule_soon()

    def _job_ended_on(self, domains: list[Domain], job: Job) -> None:
        """A GPU job that died of a device error counts against its GPUs' health."""
        gpu_domains = [d for d in domains if d.is_gpu]
        if not gpu_domains or job.kind is not JobKind.COMMAND:
            return
        error = None
        if job.status is JobStatus.FAILED and job.termination_reason in (
            TerminationReason.EXIT_CODE,
            TerminationReason.SIGNAL,
        ):
            error = device_error_in(self.supervisor.log_path(job.id))
        settings = self.config.health
        for dom in gpu_domains:
            change = dom.record_job_end(error, settings.degrade_after, settings.quarantine_after)
            if change is not None:
                self._domain_changed(dom, str(change))

    def refuse_quarantined_pins(self, pins: list[str]) -> None:
        """Refuse a submission whose every pinned domain is quarantined.

        Raises:
            SpecError: Naming the domain and why.
        """
        doms = [self.scheduler.domains[p] for p in pins if p in self.scheduler.domains]
        if doms and all(d.state is DomainState.QUARANTINED for d in doms):
            dom = doms[0]
            raise SpecError(
                f"domain {dom.name} is quarantined: {dom.state_reason} "
                f"(release it with `gpulayer-tui domain release {dom.name}` once its GPU "
                "answers again)"
            )

    def _domain(self, name: str) -> Domain:
        dom = self.scheduler.domains.get(name)
        if dom is None:
            known = ", ".join(self.scheduler.domains)
            raise SpecError(f"unknown domain '{name}' (known: {known})")
        return dom

    async def drain_domain(self, name: str, reason: str = "") -> dict[str, Any]:
        """Stop new placements on a domain (maintenance); running work is left alone.

        Raises:
            SpecError: Unknown domain.
            DomainRefused: It is quarantined (release it first) or already draining.
        """
        dom = self._domain(name)
        if dom.state is DomainState.QUARANTINED:
            raise DomainRefused(f"domain {name} is quarantined; release it first")
        if dom.state is DomainState.DRAINING:
            raise DomainRefused(f"domain {name} is already draining")
        dom.state = DomainState.DRAINING
        dom.state_reason = reason or "drained by the operator"
        self._domain_changed(dom, "draining")
        await self.store.flush()
        return self.domain_json(dom)

    async def release_domain(self, name: str) -> dict[str, Any]:
        """Return a drained or quarantined domain to service.

        Raises:
            SpecError: Unknown domain.
            DomainRefused: It is in service already, or its GPU still fails.
        """
        dom = self._domain(name)
        if dom.state is DomainState.IN_SERVICE:
            raise DomainRefused(f"domain {name} is in service already")
        if dom.state is DomainState.QUARANTINED and dom.is_gpu and not dom.answers:
            raise DomainRefused(
                f"domain {name} cannot be released: its GPU still fails ({dom.last_error})"
            )
        dom.state = DomainState.IN_SERVICE
        dom.state_reason = ""
        dom.health = DomainHealth.HEALTHY
        dom.failures = 0
        self._domain_changed(dom, "released")
        await self.store.flush()
        return self.domain_json(dom)

    def domain_json(self, dom: Domain) -> dict[str, Any]:
        """A domain's state as the API shows it."""
        return {
            "name": dom.name,
            "gpu_index": dom.gpu_index,
            "state": dom.state.value,
            "state_reason": dom.state_reason,
            "health": dom.health.value,
            "failures": dom.failures,
            "last_error": dom.last_error,
            "slots": dom.slots,
            "used_slots": dom.used_slots,
        }

    def readiness(self) -> tuple[bool, str]:
        """Ready when every domain is in service and GPU capacity is known."""
        problems = [
            f"domain {d.name} {d.state.value}" + (f": {d.state_reason}" if d.state_reason else "")
            for d in self.scheduler.domains.values()
            if d.state is not DomainState.IN_SERVICE
        ]
        if self.scheduler.capacity.value == "unknown":
            problems.append(f"GPU capacity unknown: {self.scheduler.capacity_message}")
        if self.store.failure:
            problems.append(f"not accepting work: {self.store.failure}")
        return (not problems, "; ".join(problems) or "every domain is ready")

    async def doctor_checks(self) -> list[dict[str, str]]:
        """The engine's own checks: each domain's health, and queued jobs that no domain
        in service could ever take. Each check is ``{"check", "status", "detail"}`` with
        status ``ok``, ``warn`` or ``fail``."""
        checks: list[dict[str, str]] = []
        for dom in self.scheduler.domains.values():
            if dom.state is DomainState.QUARANTINED:
                status, detail = "fail", f"quarantined: {dom.state_reason}"
            elif dom.state is DomainState.DRAINING:
                status, detail = "warn", f"draining: {dom.state_reason}"
            elif dom.health is DomainHealth.DEGRADED:
                status, detail = "warn", f"degraded: {dom.failures} failed reads ({dom.last_error})"
            else:
                what = f"GPU {dom.gpu_index}" if dom.is_gpu else "cpu pool"
                status, detail = "ok", f"{what}, {dom.used_slots}/{dom.slots} slots used"
            checks.append({"check": f"domain {dom.name}", "status": status, "detail": detail})
        stuck = []
        for key, request in self._queue.items():
            candidates = (
                [self.scheduler.domains[p] for p in request.pins if p in self.scheduler.domains]
                if request.pins
                else (
                    self.scheduler.gpu_domains if request.gpus else [self.scheduler.domains["cpu"]]
                )
            )
            usable = [d for d in candidates if d.state is DomainState.IN_SERVICE]
            if len(usable) < max(1, request.gpus):
                stuck.append(key[1])
        if stuck:
            ids = ", ".join(map(str, sorted(stuck)[:20]))
            checks.append(
                {
                    "check": "queued jobs",
                    "status": "fail",
                    "detail": f"{len(stuck)} queued job(s) can only run on domains out of service: "
                    f"{ids}",
                }
            )
        else:
            checks.append(
                {
                    "check": "queued jobs",
                    "status": "ok",
                    "detail": f"{len(self._queue)} ready to run, all placeable",
                }
            )
        checks.append(
            {
                "check": "database writes",
                "status": "fail" if self.store.failure else "ok",
                "detail": self.store.failure or f"{self.paths.database} is being written",
            }
        )
        newest = (await self.store.newest_job_time()) or 0.0
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

    async def _restore_domain_states(self) -> None:
        for name, state, reason in await self.store.domain_states():
            dom = self.scheduler.domains.get(name)
            if dom is None or state == DomainState.IN_SERVICE.value:
                continue
            dom.state = DomainState(state)
            dom.state_reason = reason
            if dom.state is DomainState.QUARANTINED:
                dom.health = DomainHealth.DEGRADED
