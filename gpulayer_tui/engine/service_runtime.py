"""What a running service needs besides its row: the clock its restarts run on, back-off,
ports and endpoints, and its per-service runtime (pending restarts, port probes, how it
ends). Used by :mod:`.services`.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .. import wire
from .batch import signal_name
from .executor import LaunchError
from .models import JobStatus, TerminationReason

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
PROBE_TIMEOUT_S = 1.0
PROBE_INTERVAL_MAX_S = 1.0
# (a down replica's message says it: ``services._probe_port`` reads it back after a restart)
NOT_ACCEPTING = wire.NOT_ACCEPTING
RESTARTING_DOWN = wire.RESTARTING_DOWN
ENDING_DOWN = wire.ENDING_DOWN


class Cancellable(Protocol):
    """A scheduled callback (``asyncio.TimerHandle`` or a test clock's entry)."""

    def cancel(self) -> None:
        """Do not run it."""


class ServiceClock(Protocol):
    """Time as the restart logic sees it: wall time and delayed calls."""

    def now(self) -> float:
        """Epoch seconds."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        """Run ``callback`` on the event loop after ``delay`` seconds."""


class LoopClock:
    """The real clock: ``time.time`` and the running loop's timers."""

    def now(self) -> float:
        """Epoch seconds."""
        return time.time()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        """Schedule on the running event loop."""
        return asyncio.get_running_loop().call_later(delay, callback)


def backoff_delay(step: int) -> float:
    """Seconds before the next restart after ``step`` restarts without a steady run."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * float(1 << min(step, 16)))


def free_port(host: str, taken: set[int]) -> int:
    """A TCP port nothing listens on now (the kernel picks it), not in ``taken``.

    Raises:
        LaunchError: No port could be bound on ``host``.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(32):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port: int = sock.getsockname()[1]
        except OSError as err:
            raise LaunchError(f"cannot pick a port on {host}: {err.strerror or err}") from None
        if port not in taken:
            return port
    raise LaunchError(f"cannot pick a free port on {host}")


def host_problem(host: str) -> str | None:
    """Why services cannot listen on ``host`` (an address of no interface here, a name
    that does not resolve), or ``None`` (blocking: it may resolve a name)."""
    try:
        free_port(host, set())
    except LaunchError as err:
        return str(err)
    import ipaddress

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        found = socket.getaddrinfo(host, 0, family, socket.SOCK_STREAM)
    except OSError as err:
        return f"{host} does not resolve: {err}"
    for *_, address in found:
        ip = ipaddress.ip_address(str(address[0]).split("%", 1)[0])
        if ip.is_multicast or str(ip) == "255.255.255.255":
            # (A socket binds there, and nothing can ever connect: replicas stayed
            # "starting" for ever.)
            return (
                f"{host} is a multicast or broadcast address: no client can reach a service there"
            )
    return None


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]"})


def endpoint_of(host: str, port: int) -> str:
    """``host:port`` (IPv6 literals in brackets); a wildcard address (servers listening on
    every address) as this machine's host name, an address a client can use (it showed
    ``0.0.0.0:46265``)."""
    if host in WILDCARD_HOSTS:
        host = socket.gethostname() or "localhost"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe_exit(code: int | None) -> str:
    """``exited with code 3`` / ``killed by SIGKILL`` / ``ended, exit status unknown``."""
    if code is None:
        return "ended, exit status unknown"
    if 128 < code <= 128 + 64:
        return f"killed by {signal_name(code - 128)} (exit code {code})"
    return f"exited with code {code}"


@dataclass(slots=True)
class ServiceRuntime:
    """What a running service needs beyond its row: how it ends once its replicas are down,
    why it is being placed again, and its pending restarts and port probes by replica."""

    end: tuple[JobStatus, TerminationReason, str, int | None] | None = None
    ended_at: float | None = None  # when the replica whose exit decided the end ended
    replacing: str | None = None
    # Being placed again only to move off a drained domain (an operator's maintenance, not
    # a loss): such a move gives its placement back (``Job.attempt`` counts the others).
    moving: bool = False
    moves: int = 0  # (moves made: a placement after one keeps the service's first start)
    restart_timers: dict[int, Cancellable] = field(default_factory=dict)
    probes: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    # Replicas waiting in back-off because a domain they ran on is gone (started at once
    # when it is back: see ServiceRunner.domains_changed), by index: the back-off step of
    # their next wait. (The wait's own: a replica waiting out a removed domain has not
    # crashed again, and its next crash backs off from where its last one left it.)
    off_domain: dict[int, int] = field(default_factory=dict)
    # Replicas a restarted engine found ended (their exits applied in the order they
    # ended): not signalled by a stop another's exit decides first.
    ended_unseen: set[int] = field(default_factory=set)
    # A rolling restart's limit on the replica it restarted to be up again.
    roll_limit: Cancellable | None = None
    roll_check: Cancellable | None = None  # (when a portless one has run long enough)

    def cancel_restarts(self) -> None:
        """Forget every pending restart (and a rolling restart's limit)."""
        for timer in self.restart_timers.values():
            timer.cancel()
        self.restart_timers.clear()
        for pending in (self.roll_limit, self.roll_check):
            if pending is not None:
                pending.cancel()
        self.roll_limit = self.roll_check = None

    def close(self) -> None:
        """Cancel every timer and port probe."""
        self.cancel_restarts()
        for task in self.probes.values():
            task.cancel()
        self.probes.clear()
