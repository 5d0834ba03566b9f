"""A small pub/sub: one bounded queue per subscriber.

Publishing never blocks the engine. A subscriber that falls more than ``maxsize`` events
behind is cut off with a final ``None`` (it must re-read state and subscribe again) rather
than letting its queue grow without bound or silently dropping events in the middle.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

from .models import Event, EventKind


class Subscription:
    """One subscriber's queue. Iterate it; iteration ends if the subscriber was cut off."""

    def __init__(self, bus: EventBus, maxsize: int) -> None:
        self._bus = bus
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize)
        self.overflowed = False

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        try:
            while True:
                event = await self.queue.get()
                if event is None:
                    return
                yield event
        finally:
            self.close()

    def ready(self) -> tuple[list[Event], bool]:
        """The events already queued (taken without waiting), and whether the end marker
        was among them (the subscriber was cut off, or the engine stops)."""
        out: list[Event] = []
        while True:
            try:
                event = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                return out, False
            if event is None:
                return out, True
            out.append(event)

    def close(self) -> None:
        """Stop receiving events."""
        self._bus.unsubscribe(self)


class EventBus:
    """Fan-out of engine events to any number of subscribers."""

    def __init__(self) -> None:
        self._subscribers: set[Subscription] = set()
        self._seq = itertools.count(1)
        self._published = itertools.count(1)
        self.last_seq = 0
        """The ``seq`` of the last event published (0: none yet): a new subscriber's first
        event is the one after it, unless some were missed."""

    def make(
        self,
        kind: EventKind,
        job_id: int | None,
        data: dict[str, Any],
        job: dict[str, Any] | None = None,
        at: float | None = None,
    ) -> Event:
        """Create an event with the next sequence number, stamped ``at`` (when it
        happened, if known and past) or now."""
        return Event(next(self._seq), time.time() if at is None else at, kind, job_id, data, job)

    @property
    def has_subscribers(self) -> bool:
        """True if anyone listens (lets publishers skip building costly payloads)."""
        return bool(self._subscribers)

    def subscribe(self, maxsize: int = 10_000) -> Subscription:
        """Start receiving every event published from now on."""
        sub = Subscription(self, maxsize)
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Remove a subscriber (idempotent)."""
        self._subscribers.discard(sub)

    def publish(self, event: Event) -> None:
        """Deliver ``event`` to every subscriber without waiting.

        Its ``seq`` is given here, in the order events are published (once durable): one
        made earlier may be committed later, and one made may never be published, so
        numbers given when made reached readers out of order and with gaps.
        """
        self.last_seq = next(self._published)
        object.__setattr__(event, "seq", self.last_seq)
        object.__setattr__(event, "_line", None)
        for sub in list(self._subscribers):
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                sub.overflowed = True
                self._subscribers.discard(sub)
                # Make room for the end marker so the reader learns it was cut off.
                sub.queue.get_nowait()
                sub.queue.put_nowait(None)

    def close(self) -> None:
        """End every subscription (engine shutdown)."""
        for sub in list(self._subscribers):
            self._subscribers.discard(sub)
            try:
                sub.queue.put_nowait(None)
            except asyncio.QueueFull:
                sub.queue.get_nowait()
                sub.queue.put_nowait(None)
