"""Long-running services (record 000): replicas, ``$PORT``, endpoints, restarts, re-placement.

A service is one job of kind ``service``. Its status is ``running`` from placement until it
ends; underneath, each replica has its own state (:class:`~.models.ReplicaState`, with its
own transition table), stored with the job's row and published as ``job.replica`` events.

* Placement: all replicas at once, like a multi-GPU job (GPU replicas on distinct domains,
  CPU replicas one cpu slot each). The service holds its domains for as long as it runs,
  restarts and back-off included, so a restart never waits behind the queue.
* Ports: with ``port`` (the default) each start of a replica gets a free TCP port as
  ``$PORT``; the replica is ``starting`` until the port accepts a TCP connection on the
  configured host, then ``up`` with its endpoint ``host:port``.
* Restarts: ``always``, or ``on_failure`` (non-zero exit). Back-off 1 s doubling to 30 s;
  a run of ``[services] steady_after`` seconds (60 by default) resets it. ``max_restarts``
  per replica (unlimited by default). A replica that ends for good ends the service:
  ``completed`` if it exited 0, else ``failed``; the other replicas are stopped.
* Loss: a domain that is lost or quarantined stops the whole service and places it again
  (``running -> queued``), up to ``retry.max_attempts`` placements (10 by default).

Back-off timers use :class:`ServiceClock`, so tests can step time instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .lifecycle import Lifecycle, Reason, _Active, _signal_name, exit_verdict
from .models import (
    EventKind,
    JobKind,
    JobStatus,
    Replica,
    ReplicaState,
    TerminationReason,
    check_replica_transition,
)
from .supervisor import Exit, LaunchError, exit_path, read_exit_file

if TYPE_CHECKING:
    from .domain import Domain

R = ReplicaState
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
PROBE_TIMEOUT_S = 1.0
PROBE_INTERVAL_MAX_S = 1.0


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


def endpoint_of(host: str, port: int) -> str:
    """``host:port`` (IPv6 literals in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe_exit(code: int | None) -> str:
    """``exited with code 3`` / ``killed by SIGKILL`` / ``ended, exit status unknown``."""
    if code is None:
        return "ended, exit status unknown"
    if 128 < code <= 128 + 64:
        return f"killed by {_signal_name(code - 128)} (exit code {code})"
    return f"exited with code {code}"


class Services(Lifecycle):
    """Service replicas, mixed into the engine (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.service_clock: ServiceClock = LoopClock()

    # -- placement and launch -----------------------------------------------------------------

    def _start_service(self, act: _Active) -> None:
        """The service was placed (its holds are taken): mark it running, start replicas."""
        job, spec, request = act.job, act.spec, act.request
        assert spec is not None and request is not None
        job.attempt += 1
        per_replica = request.gpus // request.replicas
        old = {r.index: r for r in job.replicas}
        job.replicas = []
        for index in range(request.replicas):
            replica = old.get(index) or Replica(index)
            if replica.state is R.EXITED:
                replica.state = R.PENDING  # placed again: restart counts are kept
            replica.pid = replica.start_ticks = replica.port = None
            replica.endpoint = replica.next_restart_at = None
            if per_replica:
                mine = act.holds[index * per_replica : (index + 1) * per_replica]
            else:
                mine = act.holds
            replica.domains = [d.name for d in mine]
            replica.gpus = [d.gpu_index for d in mine if d.gpu_index is not None]
            job.replicas.append(replica)
        act.end = None
        act.stop_reason = None
        attempt = f" (placement {job.attempt} of {spec.max_attempts})" if job.attempt > 1 else ""
        where = ", ".join(job.domains)
        self._transition(act, JobStatus.RUNNING, message=f"starting on {where}{attempt}")
        for replica in job.replicas:
            if not self._launch_or_fail(act, replica, "start"):
                return

    def _ports_in_use(self) -> set[int]:
        return {
            r.port
            for a in self._active.values()
            if a.job.kind is JobKind.SERVICE
            for r in a.job.replicas
            if r.port is not None and r.state.has_process
        }

    def _launch_replica(self, act: _Active, replica: Replica) -> None:
        """Start one replica's process (raises :class:`LaunchError`)."""
        job, spec = act.job, act.spec
        assert spec is not None
        env = self._job_env(act, replica.gpus)
        env["GPULAYER_REPLICA"] = str(replica.index)
        port: int | None = None
        if spec.wants_port:
            port = free_port(self.config.services.host, self._ports_in_use())
            env["PORT"] = str(port)
        argv = spec.command if spec.command is not None else ["sh", "-c", spec.shell or ""]
        cwd = spec.cwd or os.path.expanduser("~")
        pid, ticks = self.supervisor.launch((job.id, replica.index), argv, cwd, env)
        replica.pid, replica.start_ticks, replica.port = pid, ticks, port
        replica.endpoint = None
        replica.next_restart_at = None
        replica.started_at = self.service_clock.now()
        self._roots[pid] = (job.id, ticks)
        if port is None:
            self._set_replica(act, replica, R.UP, f"running (pid {pid})")
            return
        self._set_replica(
            act, replica, R.STARTING, f"pid {pid} started; waiting for port {port} to accept"
        )
        self._watch_port(act, replica)

    def _launch_or_fail(self, act: _Active, replica: Replica, verb: str) -> bool:
        """Launch a replica; if it cannot start, fail the service with the reason."""
        try:
            if act.spec is None:  # restored from a row this version cannot parse
                raise LaunchError("its stored spec can no longer be read")
            self._launch_replica(act, replica)
        except LaunchError as err:
            self._set_replica(act, replica, R.EXITED, f"could not {verb}: {err}")
            self._end_service(
                act,
                JobStatus.FAILED,
                Reason.LAUNCH_FAILED,
                f"replica {replica.index} could not {verb}: {err}",
            )
            return False
        return True

    def _watch_port(self, act: _Active, replica: Replica) -> None:
        assert replica.pid is not None and replica.port is not None
        task = asyncio.get_running_loop().create_task(
            self._probe_port(act, replica, replica.pid, replica.port)
        )
        act.probes[replica.index] = task

    async def _probe_port(self, act: _Active, replica: Replica, pid: int, port: int) -> None:
        """Poll ``host:port`` until it accepts a connection, then mark the replica up."""
        host = self.config.services.host
        delay = 0.02
        while replica.pid == pid and replica.state is R.STARTING:
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    _, writer = await asyncio.open_connection(host, port)
            except (OSError, TimeoutError):
                await asyncio.sleep(delay)
                delay = min(PROBE_INTERVAL_MAX_S, delay * 1.5)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            if replica.pid == pid and replica.state is R.STARTING:
                replica.endpoint = endpoint_of(host, port)
                self._set_replica(act, replica, R.UP, f"up at {replica.endpoint} (pid {pid})")
            return

    # -- state --------------------------------------------------------------------------------

    def _set_replica(
        self,
        act: _Active,
        replica: Replica,
        state: ReplicaState,
        message: str,
        exit_code: int | None = None,
    ) -> None:
        """The one place a replica's state changes: check, update the summary, record."""
        job = act.job
        check_replica_transition(job.id, replica.index, replica.state, state)
        replica.state = state
        replica.message = message
        if job.status is JobStatus.RUNNING and act.end is None and act.replacing is None:
            job.message = self._service_summary(act)
        data = {
            "replica": replica.index,
            "state": state.value,
            "message": f"replica {replica.index}: {message}",
            "exit_code": exit_code,
            "restarts": replica.restarts,
            "endpoint": replica.endpoint,
            "next_restart_at": replica.next_restart_at,
        }
        self.store.save(job, [self._job_event(EventKind.REPLICA, job, data)])

    def _service_summary(self, act: _Active) -> str:
        replicas = act.job.replicas
        up = sum(r.state is R.UP for r in replicas)
        text = f"{up}/{len(replicas)} up on {', '.join(act.job.domains)}"
        endpoints = [r.endpoint for r in replicas if r.state is R.UP and r.endpoint]
        if endpoints:
            text += f" at {', '.join(endpoints)}"
        for r in replicas:
            if r.state is R.STARTING:
                text += f"; replica {r.index} starting (port {r.port} not answering yet)"
            elif r.state is R.BACKOFF:
                text += f"; replica {r.index} in back-off: {r.message}"
        return text

    # -- exits and restarts -------------------------------------------------------------------

    def _on_replica_exit(self, job_id: int, index: int, exit: Exit) -> None:
        """A replica's process ended: restart it, end the service, or finish stopping."""
        act = self._active.get(job_id)
        if act is None or index >= len(act.job.replicas):
            return
        replica = act.job.replicas[index]
        if replica.pid is not None:
            self._roots.pop(replica.pid, None)
        probe = act.probes.pop(index, None)
        if probe is not None:
            probe.cancel()
        code = exit.code
        replica.last_exit_code = code
        what = describe_exit(code)
        if replica.state is R.STOPPING or act.end is not None or act.replacing is not None:
            if replica.state.has_process:
                self._set_replica(act, replica, R.EXITED, f"stopped ({what})", code)
            self._settle_service(act)
            return
        now = self.service_clock.now()
        if replica.started_at is not None and now - replica.started_at >= (
            self.config.services.steady_after
        ):
            replica.backoff_step = 0  # it ran steadily: a fresh crash starts at 1 s again
        why = self._no_restart_because(act, replica, code)
        if why is None:
            delay = backoff_delay(replica.backoff_step)
            replica.backoff_step += 1
            replica.next_restart_at = now + delay
            self._set_replica(
                act,
                replica,
                R.BACKOFF,
                f"{what}; restart {replica.restarts + 1} in {delay:g} s",
                code,
            )
            act.restart_timers[index] = self.service_clock.call_later(
                delay, functools.partial(self._restart_replica, job_id, index)
            )
            return
        self._set_replica(act, replica, R.EXITED, f"{what}; not restarted ({why})", code)
        status, reason, _ = exit_verdict(code)
        others = " (the other replicas were stopped)" if len(act.job.replicas) > 1 else ""
        message = f"replica {index} {what}; not restarted ({why}){others}"
        self._end_service(act, status, reason, message, code)

    @staticmethod
    def _no_restart_because(act: _Active, replica: Replica, code: int | None) -> str | None:
        """Why the policy says this exit is final, or ``None`` to restart the replica."""
        spec = act.spec
        if spec is None:
            # Restored from a row this version cannot parse: no policy to apply.
            return "its stored spec can no longer be read"
        if spec.restart_policy != "always" and code == 0:
            return f"restart = {spec.restart_policy}"
        if spec.max_restarts is not None and replica.restarts >= spec.max_restarts:
            return f"max_restarts = {spec.max_restarts} reached"
        return None

    def _restart_replica(self, job_id: int, index: int) -> None:
        act = self._active.get(job_id)
        if act is None or act.end is not None or act.replacing is not None:
            return
        act.restart_timers.pop(index, None)
        replica = act.job.replicas[index]
        if replica.state is not R.BACKOFF:
            return
        replica.restarts += 1
        self._launch_or_fail(act, replica, "restart")

    # -- stopping -----------------------------------------------------------------------------

    def _stop_service(self, act: _Active, reason: TerminationReason, message: str) -> None:
        """Cancel or time out a running service: stop every replica, then end it."""
        status = JobStatus.CANCELLED if reason is Reason.CANCELLED else JobStatus.FAILED
        self._end_service(act, status, reason, message)

    def _end_service(
        self,
        act: _Active,
        status: JobStatus,
        reason: TerminationReason,
        message: str,
        exit_code: int | None = None,
    ) -> None:
        """Decide how the service ends; it does once no replica process is left."""
        if act.end is not None:
            return  # already ending; the first verdict stands
        act.end = (status, reason, message, exit_code)
        act.stop_reason = reason
        self._stop_replicas(act, f"stopping ({message})")
        self._settle_service(act)

    def _replace_service(self, act: _Active, why: str) -> None:
        """A domain of the service was lost: stop it and place it again (record 000)."""
        if act.end is not None or act.replacing is not None:
            return
        if act.job.status is not JobStatus.RUNNING:
            return
        act.replacing = why
        self._stop_replicas(act, f"placing again: {why}")
        self._settle_service(act)

    def _stop_replicas(self, act: _Active, summary: str) -> None:
        job = act.job
        for timer in act.restart_timers.values():
            timer.cancel()
        act.restart_timers.clear()
        grace = self.config.engine.grace_period
        stopping = False
        for replica in job.replicas:
            if replica.state.has_process and replica.state is not R.STOPPING:
                if self.supervisor.terminate((job.id, replica.index), grace):
                    stopping = True
                    self._set_replica(act, replica, R.STOPPING, "SIGTERM sent")
                    continue
            if replica.state in (R.PENDING, R.BACKOFF):
                replica.next_restart_at = None
                self._set_replica(act, replica, R.EXITED, "not started again")
        job.message = summary
        if stopping:
            job.kill_at = time.time() + grace
            job.message = f"{summary}: SIGTERM sent, SIGKILL after {grace:g} s"
        self.store.save(job, [self._job_event(EventKind.REASON, job, {"message": job.message})])

    def _settle_service(self, act: _Active) -> None:
        """Once no replica process is left, end the service or queue it again."""
        replicas = act.job.replicas
        if any(r.state.has_process for r in replicas):
            return
        act.job.kill_at = None
        if act.replacing is not None:
            self._requeue_service(act)
        elif act.end is not None:
            status, reason, message, code = act.end
            self._finish(act, status, reason, message, code)

    def _requeue_service(self, act: _Active) -> None:
        job, spec = act.job, act.spec
        assert spec is not None and act.replacing is not None
        why, act.replacing = act.replacing, None
        holds: list[Domain] = list(act.holds)
        for dom in holds:
            dom.release(job.id)
        act.holds = []
        if job.attempt >= spec.max_attempts:
            self._finish(
                act,
                JobStatus.FAILED,
                Reason.DOMAIN_LOST,
                f"{why}; gave up after {job.attempt} placements "
                f"(retry.max_attempts = {spec.max_attempts})",
            )
            return
        job.domains, job.gpus = [], []
        self._transition(
            act,
            JobStatus.QUEUED,
            message=f"placing again after {why} (placement {job.attempt + 1} "
            f"of {spec.max_attempts})",
        )
        self._ready(act)
        self._schedule_soon()

    def _drop_service_runtime(self, act: _Active) -> None:
        """The service ended: cancel its timers and port probes."""
        for timer in act.restart_timers.values():
            timer.cancel()
        act.restart_timers.clear()
        for task in act.probes.values():
            task.cancel()
        act.probes.clear()

    # -- restart recovery ---------------------------------------------------------------------

    def _reattach_service(self, act: _Active) -> None:
        """Take back a running service after an engine restart.

        Live replicas are watched again (pid + start time); replicas that ended while no
        engine ran go through the restart policy with the exit status their wrapper
        recorded; back-off timers are armed for what is left of their delay.
        """
        job = act.job
        domains = self.scheduler.domains
        self._hold(act, [domains[name] for name in job.domains if name in domains])
        if not job.replicas:
            # A row from before replicas were recorded: place the service afresh.
            for dom in act.holds:
                dom.release(job.id)
            act.holds = []
            job.domains, job.gpus = [], []
            self._transition(
                act, JobStatus.QUEUED, message="placing again: its replicas were not recorded"
            )
            self._ready(act)
            return
        now = self.service_clock.now()
        interrupted_stop = False
        for replica in job.replicas:
            key = (job.id, replica.index)
            if replica.state.has_process:
                pid = replica.pid
                if pid is not None and self.supervisor.attach(key, pid, replica.start_ticks):
                    self._roots[pid] = (job.id, replica.start_ticks)
                    if replica.state is R.STARTING:
                        self._watch_port(act, replica)
                    elif replica.state is R.STOPPING:
                        interrupted_stop = True
                    continue
                code = read_exit_file(exit_path(self.paths.jobs_dir, key))
                if replica.state is R.STOPPING:
                    interrupted_stop = True
                self._on_replica_exit(job.id, replica.index, Exit(code, code is not None))
            elif replica.state is R.BACKOFF:
                delay = max(0.0, (replica.next_restart_at or now) - now)
                act.restart_timers[replica.index] = self.service_clock.call_later(
                    delay, functools.partial(self._restart_replica, job.id, replica.index)
                )
            elif replica.state is R.PENDING and not self._launch_or_fail(act, replica, "start"):
                return
        if interrupted_stop and act.end is None:
            # The engine stopped while the service was stopping; the reason did not survive.
            self._end_service(
                act,
                JobStatus.CANCELLED,
                Reason.CANCELLED,
                "stopped: the engine restarted while the service was stopping",
            )
