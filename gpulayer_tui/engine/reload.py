"""Live configuration: the engine watches its config file and applies valid edits.

A valid edit (slots, a new domain for a GPU that exists, thresholds, timings) applies at
once and is recorded as an event; an invalid one is rejected with the message naming the
key, recorded too, and the running configuration stays in force. Each part is asked to
reconfigure itself (:meth:`ConfigReloader.reload` calls back the engine, which hands each
part its section). Running jobs are never disturbed: a GPU whose domain is renamed carries
its holdings over (jobs and service replicas follow it), and a job that loses its only
possible domain while *queued* fails as over capacity (record 003: capacity changed),
while one that is running keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..fields import printable
from .config import Config, ConfigError, DomainPlan, absent_words, load_engine_config, plan_domains
from .domain import Domain, DomainHealth, DomainState
from .errors import SpecError
from .fairness import owner_of
from .gpus import GpuReading
from .jobbook import JobBook, adopted_on
from .models import EventKind, JobKind, JobStatus
from .service_runtime import host_problem
from .services import service_summary
from .spec import parse_spec
from .tasks import cancel_and_wait

if TYPE_CHECKING:
    from .config import Paths
    from .events import EventBus
    from .jobqueue import JobQueue
    from .sampler import Sampler
    from .scheduler import Scheduler
    from .store import Store

log = logging.getLogger(__name__)


def _stat_of(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_size, info.st_mtime_ns


async def _settled(path: Path) -> bool:
    """Whether ``path`` has stopped changing: its size and mtime held for
    :data:`SETTLE_S` (:data:`EMPTY_SETTLE_S` when it is empty). False while a save is
    still under way: the change seen meanwhile is the watcher's next, and read then."""
    seen = _stat_of(path)
    await asyncio.sleep(EMPTY_SETTLE_S if seen is not None and seen[0] == 0 else SETTLE_S)
    return _stat_of(path) == seen


_VALUES_UNSAID = frozenset({"notify", "security"})
"""Sections whose values a change does not say (a webhook URL may hold a secret, and who
may use the engine is not for every reader of its log and events)."""


FileState = tuple[bytes, int, int]
"""A config file as a reload judges it: its bytes, mode and owner."""


def _read_state(path: Path) -> FileState | None:
    """The file's bytes, mode and owner (those a reload refuses a file for too: a file
    others may write), or ``None`` where it cannot be read. A ``chmod go-w`` of a file
    refused for its mode changed no byte, and the watcher took it for a touch: the fix
    the refusal asked for was never applied (tester h193)."""
    try:
        with open(path, "rb") as fh:
            info = os.fstat(fh.fileno())
            return fh.read(), info.st_mode, info.st_uid
    except OSError:
        return None


def _jobs_words(ids: list[int], shown: int = 10) -> str:
    """``job 3`` / ``jobs 3, 4 and 9 more``."""
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ("job " if len(ids) == 1 else "jobs ") + ", ".join(map(str, ids[:shown])) + more


def _section_changes(name: str, old: Any, new: Any) -> list[str]:
    """What changed in section ``name``: ``logs.max_bytes: 1073741824 -> 65536`` for each
    plain setting (the log said only "history" of a new keep_jobs: tester h81), the
    setting's name alone where its value is a table or not to be said, the section's name
    where it is not a table of settings. A table of named tables (``[users.NAME]``) is
    said table by table: added, removed, or its settings as above (a new limit read
    "users" alone: tester h111)."""
    if isinstance(old, dict) and isinstance(new, dict) and name not in _VALUES_UNSAID:
        out = []
        for key in sorted(set(old) | set(new), key=str):
            label = f"{name}.{printable(str(key))}"
            if key not in old:
                out.append(f"{label} added")
            elif key not in new:
                out.append(f"{label} removed")
            elif old[key] != new[key]:
                out += _section_changes(label, old[key], new[key])
        return out or [name]
    if not isinstance(old, BaseModel) or not isinstance(new, BaseModel):
        return [name]
    said = []
    for field in type(new).model_fields:
        before, after = getattr(old, field), getattr(new, field)
        if before == after:
            continue
        plain = all(v is None or isinstance(v, (bool, int, float, str)) for v in (before, after))
        if plain and name not in _VALUES_UNSAID:
            unset = _UNSET_WORDS.get(f"{name}.{field}", "unset")
            said.append(f"{name}.{field}: {_value(before, unset)} -> {_value(after, unset)}")
        else:
            said.append(f"{name}.{field}")
    return said or [name]


_UNSET_WORDS = {
    # ("unset" read as "back to its default, SIGUSR1": it means no signal is sent, h154)
    "scheduling.checkpoint_signal": '"" (none sent)',
}
"""What a setting's ``None`` means where "unset" would mislead."""


def _value(value: object, unset: str = "unset") -> str:
    """A setting's value as TOML writes it (``unset``, or what none means, for none)."""
    if value is None:
        return unset
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return printable(repr(value))
    return str(value)


def rebuild_domains(
    current: dict[str, Domain],
    plans: list[DomainPlan],
    retired: dict[int, Domain] | None = None,
) -> tuple[list[Domain], list[tuple[Domain, Domain]], list[str]]:
    """The domains ``plans`` describe, reusing today's where a GPU keeps its domain.

    A GPU that moves to a new domain name hands its reading, health and holdings over to
    the new domain, so the work running there stays accounted for. A GPU left with no
    domain while jobs still run on it keeps its last domain in ``retired`` (by GPU index;
    updated here): a domain for that GPU in a later edit takes its holdings over, so
    nothing new is placed on top of the jobs still running there.

    Returns:
        The new domains, the ``(old, new)`` pairs of renamed GPUs, and the changes in words.
    """
    retired = {} if retired is None else retired
    by_gpu: dict[int | None, Domain] = {g: d for g, d in retired.items()}
    by_gpu.update({d.gpu_index: d for d in current.values()})
    fresh: list[Domain] = []
    moved: list[tuple[Domain, Domain]] = []
    changes: list[str] = []
    for plan in plans:
        existing = current.get(plan.name)
        if existing is not None and existing.gpu_index == plan.gpu_index:
            if existing.slots != plan.slots:
                changes.append(f"{plan.name}: slots {existing.slots} -> {plan.slots}")
                existing.slots = plan.slots
            fresh.append(existing)
            continue
        dom = Domain(plan.name, plan.gpu_index, plan.gpu_uuid, plan.slots)
        previous = by_gpu.get(plan.gpu_index)
        if previous is not None:
            dom.take_over(previous)
            moved.append((previous, dom))
            # (its slots too, when they change with it: "dev -> gpu1" hid 2 -> 1: h125)
            slots = ""
            if previous.slots != plan.slots:
                slots = f", slots {previous.slots} -> {plan.slots}"
            changes.append(
                f"GPU {plan.gpu_index}: domain {previous.name} -> {plan.name}{slots}"
                if previous.name != plan.name
                # (it was "gpu1 -> gpu1")
                else f"domain {plan.name} back (GPU {plan.gpu_index}){slots}"
            )
        else:
            changes.append(f"new domain {plan.name}")
        fresh.append(dom)
    kept = {p.gpu_index for p in plans}
    names = {p.name for p in plans}
    reused = {id(d) for d in fresh}
    for name, dom in current.items():
        # (By the domain, not its name: a name given to another GPU in the same edit left
        # its old GPU's running jobs unaccounted, and a later domain there was handed out
        # on top of them.)
        if id(dom) not in reused and dom.gpu_index not in kept:
            changes.append(
                f"domain {name} removed"
                if name not in names
                else f"GPU {dom.gpu_index}: no domain now ({name} is another GPU's)"
            )
            if _still_matters(dom) and dom.gpu_index is not None:
                # Its jobs run on (the GPU is not free), or it was drained, quarantined
                # or unhealthy: a domain for the GPU in a later edit takes that over (a
                # quarantine was lifted by taking the domain out and back in).
                retired[dom.gpu_index] = dom
    for gpu in [gpu for gpu, dom in retired.items() if gpu in kept or not _still_matters(dom)]:
        del retired[gpu]  # (taken over by a new domain, or nothing runs there any more)
    return fresh, moved, changes


def _still_matters(dom: Domain) -> bool:
    """Whether a domain the config no longer has is kept for its GPU (see
    :func:`rebuild_domains`): jobs run there, or its state or health is not the default."""
    return bool(
        dom.holdings
        or dom.state is not DomainState.IN_SERVICE
        or dom.health is not DomainHealth.HEALTHY
        or dom.launch_failures
    )


HOST_CHECK_S = 10.0

SETTLE_S = 0.5
"""A changed config file is read once its size and mtime have held this long: a save that
truncates and then writes was read in between, and its empty or half-written file
applied (the defaults, for a moment: a user's open streams were cut off). A writer that
paused 0.4 s between two writes (a script, a network filesystem) had its first half
applied at 0.1 (notifications turned off and on again, dropping those waiting: tester
h79); a human's edit takes no notice of half a second."""

EMPTY_SETTLE_S = 1.0
"""An empty file is applied by the watcher only once it has stayed empty this long: a
writer held up between its truncation and its write (a loaded machine) leaves it empty
for longer than :data:`SETTLE_S`. SIGHUP and ``POST /v1/config/reload`` apply at once."""
"""How long a reload waits for ``[services] host`` to resolve before refusing it."""


async def _load_checked(path: Path, source: str) -> Config | None:
    """The config at ``path`` (None: there is no file), refused (ConfigError) where
    another user could write or replace it (see :func:`.config.load_engine_config`), and
    where services could not listen on its ``[services] host``: taken, every service
    failed at its next replica start."""
    config = await asyncio.to_thread(load_engine_config, path)
    if config is None:
        return None
    host = config.services.host
    try:
        async with asyncio.timeout(HOST_CHECK_S):
            problem = await asyncio.to_thread(host_problem, host)
    except TimeoutError:
        problem = f"{host} did not resolve within {HOST_CHECK_S:g} s"
    if problem is not None:
        raise ConfigError(f"{source}: services.host: {problem} (services listen there)")
    return config


class ConfigReloader:
    """Follows the config file and applies valid edits.

    Args:
        paths: Where the config file is.
        cpu_count: Size of the default CPU pool (for domain planning).
        sampler: The latest sample (planning needs the real GPU list).
        scheduler: The domains to rebuild.
        book: Running jobs follow a GPU whose domain was renamed.
        queue: Waiting jobs are resolved again against the new domains.
        store: Outcomes are recorded as ``engine.config`` events.
        bus: Makes those events.
        current: The configuration in force now.
        apply: Hands a new configuration to every part (the engine's wiring).
        domains_changed: Told once the new domains are in place (services restart the
            replicas that waited off a domain that is back).
    """

    def __init__(
        self,
        paths: Paths,
        cpu_count: int,
        sampler: Sampler,
        scheduler: Scheduler,
        book: JobBook,
        queue: JobQueue,
        store: Store,
        bus: EventBus,
        current: Callable[[], Config],
        apply: Callable[[Config], None],
        domains_changed: Callable[[], None] = lambda: None,
    ) -> None:
        self._paths = paths
        self._cpu_count = cpu_count
        self._sampler = sampler
        self._scheduler = scheduler
        self._book = book
        self._queue = queue
        self._store = store
        self._bus = bus
        self._current = current
        self._apply_config = apply
        self._domains_changed = domains_changed
        self._task: asyncio.Task[None] | None = None
        self._missing_removed: list[str] = []  # (set by _plan, said by _apply)
        # The file's bytes as the last reload (or the start) read them: the watcher
        # seeing the same again applies nothing (an edit then `POST /config/reload` was
        # applied, then again by the watcher, "nothing changed": tester h125).
        self._last_read: FileState | None = _read_state(paths.config_file)
        self.changes_handled = 0
        """Settled changes of the file the watcher has handled (applied or not)."""

    def start(self) -> None:
        """Follow the config file (its directory must exist; otherwise nothing to watch)."""
        folder = self._paths.config_file.parent
        if not folder.is_dir():
            log.info("not watching %s: its folder does not exist", self._paths.config_file)
            return
        self._task = asyncio.create_task(self._watch(), name="config-watch")

    async def stop(self) -> None:
        """Stop following the config file."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _watch(self) -> None:
        """Reload on each change of the config file.

        A config that is a symlink (a dotfile manager's) is followed into the folder of
        the file it names too, and watched again there when it is pointed elsewhere. A
        removed file is not applied: the running configuration stays (a save that moves
        the old file away first, or a moment's removal, reverted to the defaults and
        failed every waiting job pinned to a configured domain); SIGHUP or ``POST
        /v1/config/reload`` applies its absence (the defaults) on purpose.
        """
        from watchfiles import awatch

        target = self._paths.config_file
        while True:
            chain = _link_chain(target)
            folders = {path.parent for path in chain}
            watched = {str(path) for path in chain}
            async for changes in awatch(
                *(f for f in folders if f.is_dir()), recursive=False, debounce=200
            ):
                if not any(path in watched for _, path in changes):
                    continue
                if not await _settled(target):
                    continue  # (its next change, the save's end, is on its way)
                if not target.exists():
                    gone = absent_words(target)
                    said = (
                        f"{target} {'was removed' if gone == 'absent' else f'is {gone}'}: the "
                        "running configuration stays (SIGHUP or POST /v1/config/reload "
                        "applies the defaults)"
                    )
                    log.warning("%s", printable(said))
                    # (told to the TUIs too: in the engine's log alone, nobody at a
                    # screen knew their file was gone: tester h193)
                    self._event("kept", {"message": said})
                    await self._store.flush()
                    continue
                if await asyncio.to_thread(_read_state, target) == self._last_read:
                    self.changes_handled += 1
                    continue  # (read and applied already: by a reload asked for, or a touch)
                await self.reload(absent_keeps=True)
                self.changes_handled += 1
                if _link_chain(target) != chain:
                    break  # (a link names another file now: watch its folders instead)

    async def reload(self, absent_keeps: bool = False) -> dict[str, Any]:
        """Read the config file again and apply it if valid; a file that is not there is
        the defaults, unless ``absent_keeps`` (the watcher's: it saw a file, gone again by
        the read, and the running configuration stays).

        Returns:
            ``{"applied": bool, "changes": [...]}`` or ``{"applied": False, "error": ...}``.
        """
        source = str(self._paths.config_file)
        self._last_read = await asyncio.to_thread(_read_state, self._paths.config_file)
        try:
            found = await _load_checked(self._paths.config_file, source)
            if found is None and absent_keeps:
                log.warning("%s was removed: the running configuration stays", source)
                return {"applied": False, "error": f"{source} was removed"}
            config = found if found is not None else Config()
            sample = self._sampler.latest
            gpus = sample.result.gpus if sample is not None else ()
            plans = self._plan(config, gpus, source)
        except ConfigError as err:
            message = str(err)
            # (Escaped: a rejected name's escape sequences went to the journal raw.)
            # One line (a second error went to the log bare, no time or level: tester h90),
            # and what a restart would do (the next engine refuses the file: h90).
            log.warning(
                "config rejected, the running configuration stays (an engine started now "
                "would refuse this file): %s",
                printable("; ".join(line for line in message.splitlines() if line.strip())),
            )
            refused: dict[str, Any] = {"applied": False, "error": message}
            key = _key_named(message, source)
            if key is not None:  # (errors name their field: tester h71)
                refused["field"] = key
            # (the event too: it had the error alone, the API's answer its field: h193)
            self._event("rejected", {k: v for k, v in refused.items() if k != "applied"})
            await self._store.flush()
            return refused
        old_ui = self._current().ui
        changes = self._apply(config, plans)
        # [ui] is the TUI's: not the engine's change (a theme switched with `t` was logged
        # as one: tester h164), but told to the TUIs in the event, which apply it live.
        ui = [] if config.ui == old_ui else _section_changes("ui", old_ui, config.ui)
        if changes or not ui:
            log.info(
                "configuration applied: %s",
                printable("; ".join(changes), "\n") if changes else "nothing changed",
            )
        self._event("applied", {"changes": changes, **({"ui": ui} if ui else {})})
        await self._store.flush()
        return {"applied": True, "changes": changes}

    async def check_file(self) -> dict[str, str]:
        """The config file as a reload would find it now (read and bound to the GPUs,
        nothing applied): a doctor check ``{"check", "status", "detail"}``."""
        target = self._paths.config_file
        running_defaults = self._current() == Config()
        if not target.exists():
            gone = absent_words(target)
            gone = gone if gone == "absent" else f"is {gone}"
            if running_defaults:
                return _check("config", "ok", f"{target} {gone}: defaults")
            return _check(
                "config",
                "warn",
                f"{target} {gone}: the engine runs on the configuration it last read "
                "(SIGHUP or POST /v1/config/reload applies the defaults)",
            )
        try:
            config = await _load_checked(target, str(target)) or Config()
            sample = self._sampler.latest
            gpus = sample.result.gpus if sample is not None else ()
            self._plan(config, gpus, str(target), keep=False)
        except ConfigError as err:
            said = str(err).replace("\n", "; ")
            return _check(
                "config", "fail", f"{said} (the engine runs on the last valid configuration)"
            )
        if config != self._current():
            return _check(
                "config", "warn", f"{target} is valid but not applied yet (a reload is due)"
            )
        return _check("config", "ok", f"{target} is valid and applied")

    def _plan(
        self, config: Config, gpus: tuple[GpuReading, ...], source: str, keep: bool = True
    ) -> list[DomainPlan]:
        """:func:`plan_domains`, strict but for domains whose GPU was missing already at
        start (an edit while it is still gone was refused: every edit, so nothing else
        could be changed); ``keep``: remember which are still missing."""
        missing: dict[str, int | str] = {}
        plans = plan_domains(config, gpus, self._cpu_count, source, missing)
        known = self._scheduler.configured_missing
        # A GPU this machine had and the driver does not list now is not a typo either
        # (an edit naming it was refused, the same file taken at the next start: h48).
        away = self._scheduler.missing_known
        had = {u for u in away} | {g.index for g in away.values() if g.index is not None}
        new = [
            name
            for name, gpu in missing.items()
            if known.get(name) != gpu
            and gpu not in had
            # (its index unknown: one remembered from before indices were kept, by name)
            and not any(g.index is None and g.name == name for g in away.values())
        ]
        if new:
            plan_domains(
                config.model_copy(
                    update={"domains": {n: d for n, d in config.domains.items() if n in new}}
                ),
                gpus,
                self._cpu_count,
                source,
            )  # (raises, naming the first)
        if keep:
            # (a missing GPU's table taken out was no change in the log's words: "nothing
            # changed", as the jobs pinned to it failed; tester h102)
            self._missing_removed = sorted(set(known) - set(missing))
            self._scheduler.configured_missing = missing
        return plans

    def _event(self, outcome: str, data: dict[str, Any]) -> None:
        event = self._bus.make(EventKind.CONFIG, None, {"outcome": outcome, **data})
        self._store.save(None, [event])

    def _apply(self, config: Config, plans: list[DomainPlan]) -> list[str]:
        old = self._current()
        # Every section that changed is named (the event said [] for [logs], [limits],
        # [users], [security] ...); domains and cpu slots are said below, one by one.
        # [ui] is the TUI's own, said apart (see reload).
        changes = [
            said
            for name in type(config).model_fields
            if name not in ("domains", "cpu", "ui") and getattr(config, name) != getattr(old, name)
            for said in _section_changes(name, getattr(old, name), getattr(config, name))
        ]
        # Waiting work the new configuration may fail or edit: said with the changes (a
        # lowered max_gpus failed queued jobs, and the reply said only "max_gpus: 1 -> 0":
        # tester h125).
        waiting = [
            act.job.id
            for act in self._book
            if not act.job.status.is_terminal and act.job.status is not JobStatus.RUNNING
        ]
        self._apply_config(config)
        before = dict(self._scheduler.domains)
        fresh, moved, domain_changes = rebuild_domains(
            self._scheduler.domains, plans, self._scheduler.retired
        )
        for previous, dom in moved:
            self._rehome(previous, dom)
        live = {id(d) for d in self._scheduler.domains.values()}
        self._scheduler.replace_domains(fresh)
        # Pins follow the GPU, as the running jobs and the GPU's state do: also where the
        # old name now names another GPU (a shift a->b, b->c, or a swap). A domain removed
        # by an earlier edit whose GPU a new one takes over moves only the pins of the
        # jobs running there: its name may mean another GPU by now (a waiting job pinned
        # to it was moved to the other GPU).
        moved = [(gone, dom) for gone, dom in moved if gone.name != dom.name]  # (pins stand)
        self._follow_pins({gone.name: dom.name for gone, dom in moved if id(gone) in live})
        for gone, dom in moved:
            if id(gone) not in live:
                self._follow_pins({gone.name: dom.name}, only=set(dom.holdings))
        handed_on = {id(gone) for gone, _ in moved} | {id(d) for d in fresh}
        self._leave_out_of_choices(
            {
                n
                for n, d in before.items()
                if id(d) not in handed_on and n not in self._scheduler.domains
            }
        )
        for dom in self._scheduler.gpu_domains:  # (names by GPU, for the next engine)
            if dom.gpu_uuid is not None:
                self._store.save_domain_state(
                    dom.name, dom.state.value, dom.state_reason, dom.gpu_uuid, dom.drain_reason
                )
        # (a missing GPU the edit gives a domain again is no longer missing)
        self._store.save_known_gpus(self._scheduler.know_gpus({}, None))
        lowered = self._cap_priorities()
        self._queue.reresolve(self._scheduler.request_for)
        self._queue.recheck_capacity()
        self._queue.schedule_soon()
        if domain_changes:
            self._domains_changed()
        removed = [f"domain {n} removed (its GPU was not found)" for n in self._missing_removed]
        self._missing_removed = []
        failed = [
            i for i in waiting if (act := self._book.get(i)) is None or act.job.status.is_terminal
        ]
        jobs_said = []
        if failed:
            jobs_said.append(
                f"{_jobs_words(failed)} failed: {'it' if len(failed) == 1 else 'they'} can no "
                "longer run (see the job's message)"
            )
        if lowered:
            jobs_said.append(f"{_jobs_words(lowered)} edited: priority lowered to max_priority")
        return changes + domain_changes + removed + jobs_said

    def _cap_priorities(self) -> list[int]:
        """Waiting jobs whose priority is above what their user may have now (a reload
        lowered ``[users] max_priority``) go down to it, stored as an edit with a
        ``job.edited`` entry: they kept their rank, and preempted others with it (tester
        h47). Running jobs keep theirs (they are placed already). Returns their ids."""
        limits = self._queue.limits
        lowered = []
        for act in list(self._book):
            if act.spec is None or act.job.status is JobStatus.RUNNING:
                continue
            if act.job.status.is_terminal:
                continue
            uid = owner_of(act.job.owner_uid)
            most = limits.of(uid).max_priority
            if most is None or act.job.priority <= most:
                continue
            was = act.job.priority
            spec = parse_spec({**act.job.spec, "priority": most})
            try:
                self._queue.edit(act, spec, self._scheduler.request_for(spec))
            except SpecError:
                pass  # (a pin gone: the reresolve below fails the job, saying so)
            act.spec = spec
            act.job.priority = most
            act.job.spec = spec.stored()
            self._store.save_edit(act.job)
            where = limits.where(uid, "max_priority")
            message = f"edited: priority {was} -> {most} ({where} max_priority lowered)"
            self._book.record(act, EventKind.EDITED, {"message": message})
            lowered.append(act.job.id)
        return lowered

    def _follow_pins(self, renamed: dict[str, str], only: set[int] | None = None) -> None:
        """Jobs pinned to a domain the edit renamed (the same GPU, a new name) are pinned to
        the new name, as running jobs and the GPU's drain or quarantine follow it; stored
        as an edit with a ``job.edited`` entry. (Waiting ones failed "can no longer run":
        a rename lost every job queued for that GPU; running ones did when placed again,
        a service after a lost GPU or a preempted job.)"""
        if not renamed:
            return
        for act in list(self._book):
            if act.spec is None or act.job.status.is_terminal:
                continue
            if only is not None and act.job.id not in only:
                continue
            pins = act.spec.pinned_domains
            if not set(pins) & renamed.keys():
                continue
            now = [renamed.get(pin, pin) for pin in pins]
            spec = parse_spec(
                {**act.job.spec, "domain": now[0] if isinstance(act.spec.domain, str) else now}
            )
            try:
                request = self._scheduler.request_for(spec)
                if act.job.status is JobStatus.RUNNING:
                    act.spec = spec  # (its holds stay; it is placed by this spec next time)
                else:
                    self._queue.edit(act, spec, request)
            except SpecError:
                # Another of its pins is gone: it fails as it resolves again, naming that
                # one (it named the renamed one, the spec unchanged).
                act.spec = spec
            act.job.spec = spec.stored()
            self._store.save_edit(act.job)
            said = ", ".join(f"{old} -> {renamed[old]}" for old in pins if old in renamed)
            message = f"edited: pinned domain renamed with its GPU ({said})"
            self._book.record(act, EventKind.EDITED, {"message": message})

    def _leave_out_of_choices(self, removed: set[str]) -> None:
        """Domains the edit removed (their GPU has no domain now) are left out of the
        choices that name them, stored as an edit with a ``job.edited`` entry. A choice
        kept a removed name, and a domain a later edit gave that name, on another GPU, was
        then one of its choices: the job ran on a GPU it never named (tester h55). A job
        with nothing left to run on is failed as it resolves again, naming the domain."""
        if not removed:
            return
        for act in list(self._book):
            if act.spec is None or act.job.status.is_terminal:
                continue
            pins = act.spec.pinned_domains
            gone = [pin for pin in pins if pin in removed]
            now = [pin for pin in pins if pin not in removed]
            if not gone or len(now) < max(act.spec.gpus or 1, 1):
                continue
            spec = parse_spec({**act.job.spec, "domain": now[0] if len(now) == 1 else now})
            try:
                if act.job.status is JobStatus.RUNNING:
                    act.spec = spec  # (its holds stay; it is placed by this spec next time)
                else:
                    self._queue.edit(act, spec, self._scheduler.request_for(spec))
            except SpecError:
                act.spec = spec  # (another pin is gone too: it fails as it resolves again)
            act.job.spec = spec.stored()
            self._store.save_edit(act.job)
            message = (
                f"edited: domain {', '.join(gone)} removed from the configuration, "
                f"left out of its choice (now {', '.join(now)})"
            )
            self._book.record(act, EventKind.EDITED, {"message": message})

    def _rehome(self, old: Domain, new: Domain) -> None:
        """Jobs (and their service replicas) on ``old`` now run on ``new``: same GPU."""
        # The GPU's drained or quarantined state is stored under its new name (and its old
        # name's row dropped): by name alone, a restart brought it back in service.
        self._store.save_domain_state(
            new.name, new.state.value, new.state_reason, new.gpu_uuid, new.drain_reason
        )
        for job_id in new.holdings:
            act = self._book.get(job_id)
            if act is None:
                continue
            summary = act.job.kind is JobKind.SERVICE and act.job.message == service_summary(
                act.job
            )
            said = act.job.message == f"running on {', '.join(act.job.domains)}"
            # (with a quarantine's warning, both named the old domain ever after: h148)
            old_where = f"running on {', '.join(act.job.domains)}"
            sick = f"; warning: domain {old.name} quarantined"
            warned = act.job.message.startswith(old_where + sick)
            adopted = act.job.kind is JobKind.ADOPTED
            said_adopted = adopted and act.job.message == adopted_on(act.job)
            act.holds = [new if d is old else d for d in act.holds]
            act.job.domains = [new.name if n == old.name else n for n in act.job.domains]
            if said:  # (a batch job's "running on gpu0" named the old domain ever after)
                act.job.message = f"running on {', '.join(act.job.domains)}"
            elif warned:
                rest = act.job.message[len(old_where + sick) :]
                act.job.message = (
                    f"running on {', '.join(act.job.domains)}; warning: domain {new.name} "
                    f"quarantined{rest}"
                )
            if adopted:
                # (its message and status named the old domains ever after: tester h102;
                # an adopted job has no parsed spec for the pin renames above)
                if said_adopted:
                    act.job.message = adopted_on(act.job)
                pins = act.job.spec.get("domain")
                if pins == old.name or (isinstance(pins, list) and old.name in pins):
                    renamed = (
                        new.name
                        if isinstance(pins, str)
                        else [new.name if p == old.name else p for p in pins]
                    )
                    act.job.spec = {**act.job.spec, "domain": renamed}
                    self._store.save_edit(act.job)
            for replica in act.job.replicas:
                replica.domains = [new.name if n == old.name else n for n in replica.domains]
            # Stored now: an engine restarted before the job's next change read the old
            # name, found no such domain, and left the GPU free for a second job.
            if summary:  # (a service's message says where it runs: "1/1 up on gpu0")
                self._book.note(act, service_summary(act.job))
            else:
                self._book.save(act)


def _check(name: str, status: str, detail: str) -> dict[str, str]:
    return {"check": name, "status": status, "detail": detail}


def _link_chain(path: Path) -> list[Path]:
    """``path``, each symlink on the way to the file it names (the links it leads through,
    a dotfile manager's chain, and folders on the way that are links, "current ->
    release", themselves maybe links to links), and that file: any of them changing is an
    edit of the config."""
    chain: list[Path] = []
    todo = [path]
    while todo and len(chain) < 200:  # (a loop of links ends here; the kernel's limit is 40)
        current = todo.pop()
        if current in chain:
            continue
        chain.append(current)
        todo.extend(folder for folder in current.parents if folder.is_symlink())
        if current.is_symlink():
            with contextlib.suppress(OSError):
                todo.append(Path(os.path.normpath(current.parent / os.readlink(current))))
    with contextlib.suppress(OSError, RuntimeError):
        chain.append(path.resolve())
    # (Each also as its folder resolves: a change is reported under the folder watched.)
    return list(dict.fromkeys([*chain, *(p.parent.resolve() / p.name for p in chain)]))


def _key_named(message: str, source: str) -> str | None:
    """The config key a rejection names (``cpu.slots`` of "FILE: cpu.slots: must be ..."),
    or ``None`` where it names none (the file unreadable, not TOML). An unknown key is
    named too (``engine.bogus`` of "FILE: unknown key 'engine.bogus'": it had no field,
    tester h105)."""
    rest = message.removeprefix(f"{source}: ")
    unknown = re.match(r"unknown key '([^']+)'", rest)
    if unknown is not None:
        return unknown.group(1)
    # (a part may be quoted, as TOML writes it: domains."a b" had no field: tester h145)
    head = re.match(
        r'((?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*")(?:\.(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"))*): ', rest
    )
    return None if head is None else head.group(1)
