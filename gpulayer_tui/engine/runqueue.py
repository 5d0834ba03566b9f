"""The run queue: jobs ready to start, grouped by what they ask for and whose they are.

Jobs with the same request shape (GPUs, memory, pins, exclusive) of the same user and
the same timeout are interchangeable for placement and for fairness: if one cannot
start, none of them can, and they wait for the same reason. (The timeout counts because
a job that surely ends before a reservation starts may use the reserved domains: a job
with a short timeout queued behind a same-shaped one without was never tried, and
waited.) So the queue keeps one priority-ordered list per (shape, user, timeout) group,
and a scheduling pass looks only at the head of each group. A pass then costs O(groups x
placements), not O(queued jobs), and a queued row is rewritten only when its group's
reason actually changes. With 500 jobs queued behind 2 slots, a job exit no longer
touches 500 rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from .scheduler import Request

Key = tuple[int, int]  # (-priority, id): higher priority first, then FIFO
Group = tuple[Request, int, float | None]  # (what it asks, the uid it counts against, timeout)


class RunQueue:
    """Ready jobs by group (shape, user, timeout), each group in priority order."""

    def __init__(self) -> None:
        self._shapes: dict[Group, list[Key]] = {}
        self._reasons: dict[Group, str] = {}
        self._fresh: set[int] = set()

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._shapes.values())

    def push(self, key: Key, group: Group) -> None:
        """Add a job; it will get its shape's reason at the end of the next pass."""
        bisect.insort(self._shapes.setdefault(group, []), key)
        self._fresh.add(key[1])

    def remove(self, key: Key, group: Group | None) -> bool:
        """Take a job out (it started, ended or became blocked); False if absent."""
        if group is None:
            return False
        keys = self._shapes.get(group)
        if not keys:
            return False
        index = bisect.bisect_left(keys, key)
        if index == len(keys) or keys[index] != key:
            return False
        del keys[index]
        if not keys:
            del self._shapes[group]
            self._reasons.pop(group, None)
        self._fresh.discard(key[1])
        return True

    def heads(self) -> list[tuple[Key, Group]]:
        """The first job of every shape, best first."""
        return sorted((keys[0], group) for group, keys in self._shapes.items())

    def items(self) -> Iterator[tuple[Key, Group]]:
        """Every queued job (a copy: callers may remove while iterating)."""
        return iter([(key, group) for group, keys in self._shapes.items() for key in keys])

    def jobs_of(self, group: Group) -> list[Key]:
        """The jobs of one shape, in order."""
        return list(self._shapes.get(group, ()))

    def update_reason(self, group: Group, reason: str) -> bool:
        """Record a shape's blocker; True if it differs from the last one recorded."""
        if self._reasons.get(group) == reason:
            return False
        self._reasons[group] = reason
        return True

    def take_fresh(self) -> set[int]:
        """Ids pushed since the last call (they still need their first reason)."""
        fresh, self._fresh = self._fresh, set()
        return fresh
