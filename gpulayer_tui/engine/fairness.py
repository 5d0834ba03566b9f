"""A shared box: fair share between users, per-user limits, reservations (issue 18).

Three questions the scheduling pass asks, each answered here:

* **Whose turn?** Within a priority, the user with the least recent GPU use goes first:
  :class:`FairShare` keeps each user's GPU-seconds with a half-life (Slurm's decay), plus
  what their running jobs have used so far. A user's ``share`` divides their usage.
* **May this user start more?** :class:`UserLimits` from ``[users.NAME]`` (falling back to
  ``[users.default]``): GPUs and declared VRAM of running jobs, jobs queued.
* **Who keeps what for the best waiting job?** :func:`reservation` picks the domains the
  best blocked job will get first and when; other jobs may use them only if they end
  before (backfill).

Users are uids (``SO_PEERCRED``; the engine's own uid for in-process callers).
"""

from __future__ import annotations

import functools
import math
import os
import pwd
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..fields import wait_words
from .config import SchedulingSettings, UserLimits, toml_key, uid_of_table
from .domain import Domain, DomainState, plural
from .errors import SpecError
from .gpus import GIB

# A user's usage, by uid: decayed GPU-seconds and when it was last decayed.
_Usage = tuple[float, float]


@functools.lru_cache(maxsize=1024)
def user_label(uid: int) -> str:
    """A uid as its user name (the number when it has none). Cached: a lookup costs
    ~0.1 ms (NSS), and reasons name users on every scheduling pass."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def clock_and_wait(at: float, now: float) -> str:
    """``14:05 (in 12 min)``; with the day when it is not today's (``Thu 03 Dec 12:01
    (in 25 h)``: a start a day away read as one within the hour)."""
    wait = wait_words(at - now)
    when, today = time.localtime(at), time.localtime(now)
    same_day = (when.tm_year, when.tm_yday) == (today.tm_year, today.tm_yday)
    clock = time.strftime("%H:%M" if same_day else "%a %d %b %H:%M", when)
    return f"{clock} (in {wait})"


def owner_of(owner_uid: int | None) -> int:
    """The user a job counts against: its submitter, or the engine's own user."""
    return owner_uid if owner_uid is not None else os.geteuid()


class FairShare:
    """Each user's recent GPU use: GPU-seconds, halved every ``half_life`` seconds."""

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self._usage: dict[int, _Usage] = {}
        self.on_change: Callable[[int, float, float], None] | None = None
        """Told ``(uid, gpu_seconds, at)`` after each charge (the engine stores it)."""

    def restore(self, uid: int, gpu_seconds: float, at: float) -> None:
        """Take a user's use as stored (GPU-seconds as of ``at``)."""
        self._usage[uid] = (gpu_seconds, at)

    def _decayed(self, uid: int, now: float) -> float:
        value, at = self._usage.get(uid, (0.0, now))
        if now <= at or not value:
            return value
        return value * math.pow(0.5, (now - at) / self.half_life)

    def charge(self, uid: int, gpu_seconds: float, at: float | None = None) -> None:
        """Book ``gpu_seconds`` of use (a job that ended) at ``at``."""
        if gpu_seconds <= 0:
            return
        now = time.time() if at is None else at
        value = self._decayed(uid, now) + gpu_seconds
        self._usage[uid] = (value, now)
        if self.on_change is not None:
            self.on_change(uid, value, now)

    def usage(self, uid: int, now: float) -> float:
        """The user's decayed GPU-seconds (finished jobs only)."""
        return self._decayed(uid, now)

    def users(self) -> list[int]:
        """Every user with recorded use."""
        return list(self._usage)


def gpu_seconds(gpus: int, started_at: float | None, until: float) -> float:
    """GPU-seconds of a job holding ``gpus`` GPUs from ``started_at`` to ``until``."""
    if not gpus or started_at is None:
        return 0.0
    return gpus * max(0.0, until - started_at)


class Limits:
    """``[users.*]`` resolved per uid (names looked up once)."""

    def __init__(self, users: dict[str, UserLimits]) -> None:
        self._by_uid: dict[int, UserLimits] = {}
        self._table_of: dict[int, str] = {}  # (as written: [users.1003] is not [users.ana])
        self._merged: dict[int, UserLimits] = {}
        self._default = users.get("default", UserLimits())
        for name, limits in users.items():
            if name == "default":
                continue
            uid = uid_of_table(name)
            if uid is None:
                continue  # (the config check refuses unknown names; a user deleted since)
            self._by_uid[uid] = limits
            self._table_of[uid] = name

    @property
    def any(self) -> bool:
        """True if some running or queue limit is set for someone."""
        limits = [self._default, *self._by_uid.values()]
        return any(
            x.max_gpus is not None or x.max_vram_gb is not None or x.max_queued is not None
            for x in limits
        )

    def of(self, uid: int) -> UserLimits:
        """The user's limits, each unset one taken from ``[users.default]``."""
        merged = self._merged.get(uid)
        if merged is None:
            merged = self._merged[uid] = self._merge(uid)
        return merged

    def _merge(self, uid: int) -> UserLimits:
        own = self._by_uid.get(uid)
        if own is None:
            return self._default
        base = self._default
        return UserLimits(
            max_gpus=own.max_gpus if own.max_gpus is not None else base.max_gpus,
            max_vram_gb=own.max_vram_gb if own.max_vram_gb is not None else base.max_vram_gb,
            max_queued=own.max_queued if own.max_queued is not None else base.max_queued,
            share=own.share if own.share is not None else base.share,
            max_priority=own.max_priority if own.max_priority is not None else base.max_priority,
        )

    def check_priority(self, uid: int, priority: int) -> None:
        """Refuse a priority above the user's ``max_priority``.

        Raises:
            SpecError: It is above (naming the limit and where it is set).
        """
        most = self.of(uid).max_priority
        if most is not None and priority > most:
            raise SpecError(
                f"priority {priority} is above {most}, the most user {user_label(uid)} may "
                f"ask for ({self.where(uid, 'max_priority')} max_priority)",
                "priority",
            )

    def share(self, uid: int) -> float:
        """The user's fair-share weight (1 unless set)."""
        return self.of(uid).share or 1.0

    def where(self, uid: int, key: str | None = None) -> str:
        """Which table a user's limits come from, for messages: the one that sets ``key``
        (a limit the user's own table leaves unset is ``[users.default]``'s)."""
        own = self._by_uid.get(uid)
        if own is None or (key is not None and getattr(own, key) is None):
            return "[users.default]"
        # (the table as the config names it: one written [users.1003] was named by the
        # user's name, a table the file does not have: tester h179)
        name = self._table_of.get(uid)
        return f"[users.{user_label(uid) if name is None else toml_key(name)}]"


@dataclass(slots=True)
class Running:
    """What one user's running jobs hold (for limits and fair share)."""

    gpus: int = 0
    vram_bytes: int = 0
    gpu_seconds: float = 0.0


def limit_blocker(
    limits: Limits, uid: int, held: Running, gpus: int, vram_bytes: int | None
) -> str | None:
    """Why ``uid`` may not start a job of ``gpus`` x ``vram_bytes`` now, or ``None``."""
    own = limits.of(uid)
    if own.max_gpus is not None and gpus and held.gpus + gpus > own.max_gpus:
        return (
            f"user {user_label(uid)}'s limit: {plural(own.max_gpus, 'GPU')} running at once "
            f"({limits.where(uid, 'max_gpus')} max_gpus), {held.gpus} running now"
        )
    if own.max_vram_gb is not None and vram_bytes and gpus:
        wanted = held.vram_bytes + vram_bytes * gpus
        if wanted > own.max_vram_gb * GIB:
            table = limits.where(uid, "max_vram_gb")
            return (
                f"user {user_label(uid)}'s limit: {own.max_vram_gb:g} GiB of declared VRAM running "
                f"({table} max_vram_gb), {held.vram_bytes / GIB:g} GiB now"
            )
    return None


def never_within_limits(limits: Limits, uid: int, gpus: int, vram_bytes: int | None) -> str | None:
    """Why a job of ``gpus`` x ``vram_bytes`` can never start while ``uid``'s limits stand
    (it alone is past them), or ``None``."""
    own = limits.of(uid)
    if own.max_gpus is not None and gpus > own.max_gpus:
        return (
            f"needs {plural(gpus, 'GPU')} and user {user_label(uid)} may run "
            f"{plural(own.max_gpus, 'GPU')} at once ({limits.where(uid, 'max_gpus')} max_gpus)"
        )
    if own.max_vram_gb is not None and vram_bytes and gpus:
        wanted = vram_bytes * gpus
        if wanted > own.max_vram_gb * GIB:
            return (
                f"declares {wanted / GIB:g} GiB of VRAM and user {user_label(uid)} may run "
                f"{own.max_vram_gb:g} GiB at once ({limits.where(uid, 'max_vram_gb')} max_vram_gb)"
            )
    return None


@dataclass(frozen=True, slots=True)
class Reservation:
    """Domains kept for the best waiting job, and when it should be able to start."""

    job_id: int
    domains: frozenset[str]
    start: float | None  # None: not known (a holder has no time limit)
    # Out of service, counted as coming back (a service placed again: see reservation())
    back: frozenset[str] = frozenset()

    def when(self, now: float) -> str:
        """``from ~14:05`` or ``until it can start`` (``now``: the queue's clock)."""
        if self.back:
            verb = "is" if len(self.back) == 1 else "are"
            return f"until {', '.join(sorted(self.back))} {verb} back in service"
        if self.start is None:
            return "until it can start"  # (not "they free up": one may be idle: h141)
        if self.start <= now:
            return "now"
        return f"from ~{clock_and_wait(self.start, now)}"

    def allows(self, now: float, timeout: float | None) -> bool:
        """Whether a job with ``timeout`` may backfill the reserved domains: only one that
        is sure to end before the reservation starts."""
        return timeout is not None and self.start is not None and now + timeout <= self.start


def reservation(
    job_id: int,
    gpus: int,
    vram_bytes: int | None,
    exclusive: bool,
    candidates: Iterable[Domain],
    ends_at: Callable[[int], float | None],
    now: float,
    comeback: frozenset[str] = frozenset(),
) -> Reservation | None:
    """The domains the job will get first, and when: free ones now, then those whose
    holders (our own jobs, never foreign processes) end soonest. ``None`` when fewer than
    ``gpus`` domains can ever free up for it without someone else leaving the GPU.

    ``comeback``: domains a service ran on before one of them was lost (it is being
    placed again): out of service now, they count as coming back at an unknown time, so
    the service keeps its healthy ones rather than see them go to the next job.

    ``ends_at`` says when a running job ends at the latest: ``None`` if not known (no
    timeout), ``math.inf`` if never by itself (a service): a domain only such holders keep
    is no more a candidate than one a foreign process holds, so a job that needs it does
    not keep free GPUs idle for ever."""
    timed: list[tuple[float, int, Domain]] = []
    for dom in candidates:
        if dom.state is not DomainState.IN_SERVICE or not dom.is_gpu:
            if dom.name in comeback and dom.is_gpu:
                timed.append((math.inf, dom.gpu_index or 0, dom))
            continue
        if dom.blocker(vram_bytes, exclusive) is None:
            timed.append((now, dom.gpu_index or 0, dom))
            continue
        if not frees_up(dom, vram_bytes):
            continue
        ends = [ends_at(j) for j in dom.holdings]
        if not ends:
            if dom.account is not None and dom.account.leaving:
                # (only the memory of jobs that just ended is in the way: it is read as
                # free at the next sample)
                timed.append((now, dom.gpu_index or 0, dom))
            continue
        if exclusive:  # every holder must go
            if math.inf in ends:
                continue
            known = None if any(e is None for e in ends) else max(e for e in ends if e)
        else:  # a slot frees when the first holder ends
            ending = [e for e in ends if e != math.inf]
            if not ending:
                continue
            known_ends = [e for e in ending if e is not None]
            known = min(known_ends) if known_ends else None
        timed.append((math.inf if known is None else known, dom.gpu_index or 0, dom))
    if len(timed) < gpus:
        return None
    timed.sort(key=lambda t: (t[0], t[1]))
    chosen = timed[:gpus]
    start = max(t[0] for t in chosen)
    back = frozenset(t[2].name for t in chosen if t[2].state is not DomainState.IN_SERVICE)
    return Reservation(
        job_id,
        frozenset(t[2].name for t in chosen),
        None if math.isinf(start) else start,
        back,
    )


def pool_reservation(
    job_id: int,
    pool: Domain,
    slots: int,
    exclusive: bool,
    ends_at: Callable[[int], float | None],
    now: float,
) -> Reservation | None:
    """The cpu pool kept for a job that needs several of its slots (a service's CPU
    replicas) or all of them (exclusive), and when they should be free: without it each
    slot that freed went to the next one-slot job, and such a job waited while any ran.
    ``None`` when the slots can never free up by themselves (a service holds them)."""
    if pool.state is not DomainState.IN_SERVICE:
        return None
    holders = [(ends_at(h.job_id), h.slots) for h in pool.holdings.values()]
    if exclusive:
        ends = [end for end, _ in holders]
        if math.inf in ends:
            return None
        last = now if not ends else None if None in ends else max(e for e in ends if e)
        return Reservation(job_id, frozenset({pool.name}), last)
    missing = slots - pool.free_slots
    if missing <= 0:
        return Reservation(job_id, frozenset({pool.name}), now)
    # Unknown ends (no timeout) after the known ones: the slots freed soonest first.
    finite = sorted(holders, key=lambda h: (h[0] is None, h[0] or 0.0))
    start: float | None = now
    for end, held in finite:
        if end == math.inf:
            continue
        start = None if end is None or start is None else max(start, end)
        missing -= held
        if missing <= 0:
            return Reservation(job_id, frozenset({pool.name}), start)
    return None


def frees_up(dom: Domain, vram_bytes: int | None) -> bool:
    """True if the domain could take the job once our own jobs there leave (foreign
    processes and unlisted memory stay)."""
    if not vram_bytes:
        return True
    account = dom.account
    if account is None:
        return False
    return account.total - account.unregistered - account.unattributed >= vram_bytes


def frees_for(
    dom: Domain, vram_bytes: int | None, exclusive: bool, gone: set[int], slots: int = 1
) -> bool:
    """True if the domain could take such a job (of ``slots`` slots: the cpu pool's may
    take several) once the jobs ``gone`` leave it (others may stay: a domain of several
    slots needs only one freed, not all of its jobs stopped). Memory freed counts what
    the leaving jobs declared (at least that)."""
    left = [h for h in dom.holdings.values() if h.job_id not in gone]
    if not left:
        return frees_up(dom, vram_bytes)
    if exclusive or any(h.exclusive for h in left):
        return False
    if sum(h.slots for h in left) + slots > dom.slots:
        return False
    if not vram_bytes:
        return True
    account = dom.account
    if account is None:
        return False
    freed = sum(h.declared_bytes or 0 for h in dom.holdings.values() if h.job_id in gone)
    return account.free + freed >= vram_bytes


def scheduling_defaults() -> SchedulingSettings:
    """The default ``[scheduling]`` section (for callers without a config)."""
    return SchedulingSettings()
