"""Live configuration: the engine watches its config file and applies valid edits.

A valid edit (slots, a new domain for a GPU that exists, thresholds, timings) applies at
once and is recorded as an event; an invalid one is rejected with the message naming the
key, recorded too, and the running configuration stays in force. Running jobs are never
disturbed: a GPU whose domain is renamed carries its holdings over, and a job that loses
its only possible domain while *queued* fails as over capacity (record 003: capacity
changed), while one that is running keeps running.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from .config import Config, ConfigError, load_config, plan_domains
from .domain import Domain
from .health import DomainControl
from .models import EventKind, JobStatus, TerminationReason
from .spec import SpecError
from .tasks import cancel_and_wait

log = logging.getLogger(__name__)


class ConfigReload(DomainControl):
    """Watching and applying the config file, mixed into the engine."""

    _config_task: asyncio.Task[None] | None = None
    cpu_count: int

    def start_config_watch(self) -> None:
        """Follow the config file (its directory must exist; otherwise nothing to watch)."""
        folder = self.paths.config_file.parent
        if not folder.is_dir():
            log.info("not watching %s: its folder does not exist", self.paths.config_file)
            return
        self._config_task = asyncio.create_task(self._watch_config(), name="config-watch")

    async def stop_config_watch(self) -> None:
        """Stop following the config file."""
        if self._config_task is not None:
            await cancel_and_wait(self._config_task)
            self._config_task = None

    async def _watch_config(self) -> None:
        from watchfiles import awatch

        target = self.paths.config_file
        async for changes in awatch(target.parent, recursive=False, debounce=200):
            if any(path == str(target) for _, path in changes):
                await self.reload_config()

    async def reload_config(self) -> dict[str, Any]:
        """Read the config file again and apply it if valid.

        Returns:
            ``{"applied": bool, "changes": [...]}`` or ``{"applied": False, "error": ...}``.
        """
        source = str(self.paths.config_file)
        try:
            config = await asyncio.to_thread(load_config, self.paths.config_file)
            sample = self.sampler.latest
            gpus = sample.result.gpus if sample is not None else ()
            plans = plan_domains(config, gpus, self.cpu_count, source)
        except ConfigError as err:
            message = str(err)
            log.warning("config rejected, the running configuration stays: %s", message)
            self._config_event("rejected", {"error": message})
            await self.store.flush()
            return {"applied": False, "error": message}
        changes = self._apply(config, plans)
        self._config_event("applied", {"changes": changes})
        await self.store.flush()
        return {"applied": True, "changes": changes}

    def _config_event(self, outcome: str, data: dict[str, Any]) -> None:
        event = self.bus.make(EventKind.CONFIG, None, {"outcome": outcome, **data})
        self.store.save(None, [event])

    def _apply(self, config: Config, plans: list[Any]) -> list[str]:
        changes: list[str] = []
        old = self.config
        if config.engine != old.engine:
            changes.append("engine settings")
            sampler = self.sampler
            sampler.interval = config.engine.sample_interval
            sampler.deadline = config.engine.probe_timeout
            if config.engine.history != old.engine.history:
                sampler.history_len = config.engine.history
                sampler.history = {
                    i: deque(points, maxlen=config.engine.history)
                    for i, points in sampler.history.items()
                }
        if config.health != old.health:
            changes.append("health thresholds")
        if config.ui != old.ui:
            changes.append("ui")
        self.config = config
        current = self.scheduler.domains
        by_gpu = {d.gpu_index: d for d in current.values()}
        fresh: dict[str, Domain] = {}
        for plan in plans:
            existing = current.get(plan.name)
            if existing is not None and existing.gpu_index == plan.gpu_index:
                if existing.slots != plan.slots:
                    changes.append(f"{plan.name}: slots {existing.slots} -> {plan.slots}")
                    existing.slots = plan.slots
                fresh[plan.name] = existing
                continue
            dom = Domain(plan.name, plan.gpu_index, plan.gpu_uuid, plan.slots)
            previous = by_gpu.get(plan.gpu_index)
            if previous is not None:
                # The GPU changed owner by name: carry its reading, health and holdings so
                # the jobs running there stay accounted for.
                dom.holdings = previous.holdings
                dom.reading, dom.account = previous.reading, previous.account
                dom.state, dom.state_reason = previous.state, previous.state_reason
                dom.health, dom.failures = previous.health, previous.failures
                self._rehome(previous, dom)
                changes.append(f"GPU {plan.gpu_index}: domain {previous.name} -> {plan.name}")
            else:
                changes.append(f"new domain {plan.name}")
            fresh[plan.name] = dom
        for name in current:
            if name not in fresh and current[name].gpu_index not in {p.gpu_index for p in plans}:
                changes.append(f"domain {name} removed")
        self.scheduler.domains = fresh
        self._requeue_after_change()
        self._recheck_capacity()
        self._schedule_soon()
        return changes

    def _rehome(self, old: Domain, new: Domain) -> None:
        for job_id in old.holdings:
            act = self._active.get(job_id)
            if act is None:
                continue
            act.holds = [new if d is old else d for d in act.holds]
            act.job.domains = [new.name if n == old.name else n for n in act.job.domains]

    def _requeue_after_change(self) -> None:
        """Queued jobs are resolved against the new domains; ones that cannot be fail."""
        for key, _request in list(self._queue.items()):
            self._reresolve(self._active[key[1]])
        for act in list(self._capacity_wait.values()):
            self._reresolve(act)
        for act in list(self._active.values()):
            if act.waiting_on and act.spec is not None:
                self._reresolve(act)

    def _reresolve(self, act: Any) -> None:
        if act.spec is None or act.job.status is JobStatus.RUNNING:
            return
        try:
            request = self.scheduler.request_for(act.spec)
        except SpecError as err:
            self._finish(
                act,
                JobStatus.FAILED,
                TerminationReason.OVER_CAPACITY,
                f"can no longer run after a configuration change: {err}",
            )
            return
        if request != act.request:
            in_queue = self._queue.remove(act.key, act.request)
            act.request = request
            if in_queue:
                self._queue.push(act.key, request)
