"""Acting on a job or a GPU process from any screen: cancel, restart, edit, signal.

Each asks first (a dialog that names what it acts on, as text), then asks the engine in an
app-level worker, so leaving the screen does not abort the request; the outcome, or the
engine's refusal, is a notification, never an exception.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar

from textual import events
from textual.screen import Screen

from ..backend import BackendError, ConnectionLost
from ..fields import printable, replicas_said, status_phrase
from ..formatting import live_message, plural, user_text
from ..view import view_of
from ..widgets.job_columns import job_spec
from ..wire import ACTIVE_STATUSES, ADOPTED_NOT_RUN, JobJSON, JobRowJSON
from .dialogs import ConfirmScreen, SignalScreen
from .edit import EditScreen

WAITING = frozenset({"pending", "queued"})
"""The statuses of a job the engine still edits."""


def _run(
    ui: Any, work: Callable[[], Coroutine[None, None, None]], group: str, exclusive: bool = False
) -> None:
    """Run ``work`` in an app-level worker. The function, not a coroutine made now: an
    exclusive worker cancelled before it starts left that coroutine never awaited, a
    RuntimeWarning printed at exit."""
    ui.run_worker(work, group=group, exclusive=exclusive, exit_on_error=False)


def can_restart(job: JobRowJSON | None) -> bool:
    """True for a job that has ended (``R`` restarts it) and that gpulayer-tui started (an
    adopted process's command is never run), and for a running service (``R`` restarts
    its replicas one at a time)."""
    if job is None:
        return False
    if is_scalable(job):
        return True
    return job.get("status") not in ACTIVE_STATUSES and job.get("kind") != "adopted"


def can_edit(job: JobRowJSON | None) -> bool:
    """True for a job that waits to start, or a running service (``e`` edits it; a
    running service's form has its replicas alone: it is scaled)."""
    if job is None:
        return False
    return job.get("status") in WAITING or is_scalable(job)


def is_scalable(job: JobRowJSON) -> bool:
    """True for a running service (its replicas change while it runs)."""
    return job.get("kind") == "service" and job.get("status") == "running"


DIMMED_KEYS: dict[str, str] = {
    "R": "restart_job",
    "shift+r": "restart_job",
    "e": "edit_job",
    "c": "cancel_job",
}
"""Keys whose binding a screen dims on a job they do not apply to (``check_action`` says
``None``); pressed anyway, the action runs so that it says why (``ask_to_restart`` and
``ask_to_edit`` refuse in words), instead of the key doing nothing at all."""


class SaysWhyKeysAreDimmed:
    """A screen mixin: a dimmed job key, pressed, says why it does not apply; so does a
    key of ``HIDDEN_KEYS_SAY_WHY`` that the screen hides (``check_action`` says ``False``)
    on the job shown: its action runs, and says so."""

    HIDDEN_KEYS_SAY_WHY: ClassVar[dict[str, str]] = {}
    """Key -> action, for keys kept out of the footer where they do not apply (a
    service's keys on a plain job) but that should not do nothing when pressed."""

    def on_key(self, event: events.Key) -> None:
        screen = self
        if not isinstance(screen, Screen):
            return
        action = DIMMED_KEYS.get(event.key)
        if action is not None and screen.check_action(action, ()) is None:
            event.stop()
            event.prevent_default()
            getattr(screen, f"action_{action}")()
            return
        action = self.HIDDEN_KEYS_SAY_WHY.get(event.key)
        # (hidden, or dimmed: "]" on a service of one replica did nothing: tester h110)
        if action is not None and screen.check_action(action, ()) in (False, None):
            event.stop()
            event.prevent_default()
            getattr(screen, f"action_{action}")()


def ask_to_cancel(screen: Screen[Any], job: JobRowJSON) -> None:
    """Confirm, then cancel ``job``; the outcome (or the engine's refusal) is a notification."""
    app, ui = view_of(screen), screen.app
    job_id = int(job["id"])
    status = job.get("status", "")
    if status not in ACTIVE_STATUSES:
        ui.notify(f"job {job_id} already {status}", severity="warning")
        return
    refused = not_yours(app.backend.location, job)
    if refused:
        # (asked, confirmed, then refused by the engine in a toast: tester h75)
        ui.notify(f"job {job_id} {refused}", title=f"cancel job {job_id}", severity="warning")
        return
    stopping = _stopping_for(job)
    if stopping not in ("", "preempted"):
        # Asked as a fresh cancel ("It gets SIGTERM, and SIGKILL ...") of a job whose
        # SIGTERM was sent and whose SIGKILL was set (tester h192): a cancel changes
        # neither, nor how it ends (a timeout's stop stands). What is under way is said.
        ui.notify(
            f"job {job_id} is being stopped already: {live_message(job, time.time())}",
            title=f"cancel job {job_id}",
        )
        return

    async def cancel() -> None:
        try:
            result = await app.backend.cancel(job_id)
        except BackendError as err:
            ui.notify(str(err), title=f"cancel job {job_id}", severity="error")
            return
        if result.get("status") == "cancelled":
            ui.notify(f"job {job_id} cancelled")
        elif cluster:
            ui.notify(f"job {job_id}: stopping (scancel to cluster {cluster})")
        else:
            # (SIGKILL only if it still runs: "SIGTERM, then SIGKILL" was said of a job that
            # ended on the SIGTERM at once: tester h162)
            ui.notify(f"job {job_id}: stopping (SIGTERM sent; SIGKILL if it still runs)")

    def answered(yes: bool | None) -> None:
        if yes:
            _run(ui, cancel, f"cancel-{job_id}", exclusive=True)

    # (a Slurm job is stopped by scancel: it read "It gets SIGTERM, then SIGKILL": h150)
    cluster = printable(str(job_spec(job).get("cluster") or ""))
    if cluster:
        what = f"It is cancelled on cluster {cluster} (scancel)."
    elif status != "running":
        what = "It has not started yet."
    elif stopping:
        # (a cancel wins over a preemption: the job ends, not requeued)
        what = (
            f"It is being preempted ({live_message(job, time.time())}); cancelled, it ends "
            "and does not go back to the queue."
        )
    elif job.get("kind") == "service":
        # (a service's cancel said nothing of its replicas: 64 of them stop: tester h168)
        count = int(job_spec(job).get("replicas") or 1)
        who = "Its replica gets" if count == 1 else f"All {count} of its replicas get"
        what = (
            f"{who} SIGTERM, and SIGKILL if still running after the grace period; the "
            "service ends and is not restarted."
        )
    else:
        what = "It gets SIGTERM, and SIGKILL if it still runs after the grace period."
    dialog = ConfirmScreen(
        f"Cancel job {job_id}?",
        f"{job.get('name', '')} is {status}. {what}",
        "Cancel job",
    )
    ui.push_screen(dialog, answered)

    async def say_dependents() -> None:
        # (cancelling it cancelled the jobs waiting for it, unsaid: tester h83)
        try:
            detail = await app.backend.job(job_id)
        except BackendError:
            return  # (the cancel itself says what is wrong, if anything)
        dependents = detail["job"].get("cancels_dependents") or []
        if dependents:  # (before the dialog is shown too: it says it once composed)
            dialog.add_note(dependents_note(dependents, app.job_store.jobs))

    _run(ui, say_dependents, f"cancel-dependents-{job_id}", exclusive=True)


MARKED_SHOWN = 8
"""How many marked jobs the cancel dialog names (the rest are counted)."""


def ask_to_cancel_many(
    screen: Screen[Any], jobs: list[JobRowJSON], then: Callable[[list[int]], None]
) -> None:
    """Confirm, then cancel the marked ``jobs`` in one request (durable together, as
    ``gpulayer-tui cancel 1 2 3``); the outcome is one notification that counts them.
    ``then`` gets the ids the engine no longer has to cancel (cancelled, stopping, or
    ended already), to unmark them; those it refused stay marked."""
    app, ui = view_of(screen), screen.app
    active = [job for job in jobs if job.get("status") in ACTIVE_STATUSES]
    if not active:
        ui.notify("the marked jobs have all ended already", severity="warning")
        then([int(job["id"]) for job in jobs])
        return
    theirs = [job for job in active if not_yours(app.backend.location, job)]
    if theirs:
        # (asked, confirmed, then refused one by one: said before the question, as for one)
        shown = ", ".join(str(job["id"]) for job in theirs[:MARKED_SHOWN])
        more = f" and {len(theirs) - MARKED_SHOWN} more" if len(theirs) > MARKED_SHOWN else ""
        ui.notify(
            f"jobs {shown}{more} {not_yours(app.backend.location, theirs[0])}; unmark them "
            "(space) to cancel the others",
            title="cancel marked jobs",
            severity="warning",
        )
        return
    ids = [int(job["id"]) for job in active]
    title = f"cancel {len(ids)} marked job{'' if len(ids) == 1 else 's'}"  # ("1 jobs": h112)

    async def cancel() -> None:
        try:
            answers = await app.backend.cancel_many(ids)
        except BackendError as err:
            ui.notify(str(err), title=title, severity="error")
            return
        done: list[int] = []
        cancelled = stopping = went = ended = 0
        refused: list[str] = []
        for answer in answers:
            if "error" not in answer:
                done.append(int(answer["id"]))
                if answer.get("status") == "cancelled":
                    cancelled += 1
                else:
                    stopping += 1
            elif answer.get("status") == 409:
                done.append(int(answer["id"]))  # (nothing left to cancel)
                if (answer.get("job") or {}).get("status") == "cancelled":
                    # (with a marked job it waited for, in this very request: it was said
                    # to have "ended before the cancel": tester h112)
                    went += 1
                else:
                    ended += 1
            else:
                refused.append(str(answer.get("error", answer.get("id"))))
        said = [f"{cancelled} cancelled"] if cancelled else []
        if stopping:
            said.append(f"{stopping} stopping (SIGTERM sent; SIGKILL if still running)")
        if went:
            said.append(f"{went} cancelled already (with a job waited for, or before)")
        if ended:
            said.append(f"{ended} ended before the cancel")
        then(done)
        if refused:
            first = refused[0] + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else "")
            ui.notify(
                ", ".join([*said, f"{len(refused)} refused: {first}"]),
                title=title,
                severity="error",
            )
        else:
            ui.notify(", ".join(said), title=title)

    def answered(yes: bool | None) -> None:
        if yes:
            _run(ui, cancel, "cancel-marked", exclusive=True)

    named = [f"{job['id']} ({printable(job.get('name', ''))}, {job['status']})" for job in active]
    listed = ", ".join(named[:MARKED_SHOWN])
    if len(named) > MARKED_SHOWN:
        listed += f" and {len(named) - MARKED_SHOWN} more"
    # (one stopping already was said to get SIGTERM: it has had it: tester h112)
    running = sum(job.get("status") == "running" and not job.get("kill_at") for job in active)
    stopping = sum(job.get("status") == "running" and bool(job.get("kill_at")) for job in active)
    what = (
        f" The {running} running get SIGTERM, and SIGKILL if still running after the grace period."
        if running > 1
        else " The running one gets SIGTERM, and SIGKILL if it still runs after the grace period."
        if running
        else ""
    )
    if stopping:
        what += f" {stopping} {'is' if stopping == 1 else 'are'} stopping already."
    # (services: their replicas are said, as a single service's cancel says them; h170)
    services = [
        job
        for job in active
        if job.get("kind") == "service"
        and job.get("status") == "running"
        and not job.get("kill_at")
    ]
    if services:
        replicas = sum(int(job_spec(job).get("replicas") or 1) for job in services)
        what += (
            f" Of them, service {services[0]['id']} stops with its {plural(replicas, 'replica')}"
            if len(services) == 1
            else f" Of them, {len(services)} services stop with their {replicas} replicas"
        ) + ", not restarted."
    gone = len(jobs) - len(active)
    ended_note = f" ({gone} marked ended already.)" if gone else ""
    dialog = ConfirmScreen(
        f"Cancel {len(active)} marked jobs?" if len(active) > 1 else "Cancel 1 marked job?",
        f"{listed}.{what}{ended_note}",
        "Cancel jobs" if len(active) > 1 else "Cancel job",
    )
    ui.push_screen(dialog, answered)

    async def say_dependents() -> None:
        # (a cancel takes the jobs waiting for it along: said, as for one job)
        dependents: list[int] = []
        for job_id in ids[: MARKED_SHOWN * 4]:
            try:
                detail = await app.backend.job(job_id)
            except BackendError:
                return
            dependents += [i for i in detail["job"].get("cancels_dependents") or [] if i not in ids]
        if dependents:
            note = dependents_note(list(dict.fromkeys(dependents)), app.job_store.jobs, len(ids))
            dialog.add_note(note)

    _run(ui, say_dependents, "cancel-dependents-marked", exclusive=True)


def _stopping_for(job: JobRowJSON) -> str:
    """Why a running job is being stopped (``cancelled``, ``timeout``, ``preempted``...),
    ``""`` if it is not: the whole job's ``stop_reason``; a row's message ("stopping
    (cancelled by user): SIGTERM sent, ...", "stopping (preempted by job 9) ...")."""
    if job.get("status") != "running" or not job.get("kill_at"):
        return ""
    reason = job.get("stop_reason")
    if isinstance(reason, str) and reason:
        return reason
    message = str(job.get("message") or "")
    if message.startswith("stopping (preempted"):
        return "preempted"
    return "stopping"


def dependents_note(ids: list[int], rows: dict[int, JobRowJSON], cancelled: int = 1) -> str:
    """What the cancel dialog says of the waiting jobs a cancel takes with it (of
    ``cancelled`` jobs: with several, "one of them", not "it": tester h112)."""
    shown = [f"{i} ({rows[i]['name']})" if i in rows else str(i) for i in ids[:8]]
    more = f" and {len(ids) - 8} more" if len(ids) > 8 else ""
    noun, verb = ("Job", "waits") if len(ids) == 1 else ("Jobs", "wait")
    pronoun = "it is" if len(ids) == 1 else "they are"
    # (those waiting through another were said to wait for it: tester h103)
    chain = " (directly or through one another)" if len(ids) > 1 else ""
    whom = "it" if cancelled == 1 else "one of them"
    return (
        f"{noun} {', '.join(shown)}{more} {verb}{chain} for {whom} to complete: {pronoun} "
        "cancelled too."
    )


def my_uid() -> int:
    """The uid this TUI runs as (the engine sees it through ``SO_PEERCRED``)."""
    return os.geteuid()


def not_yours(location: str, job: JobRowJSON, verb: str = "cancel") -> str:
    """Why this user may not ``verb`` (cancel, restart, edit) ``job`` ("" if it may):
    another user's job, and this user neither the engine's (its socket's or state dir's
    owner) nor root. The engine judges the same (403); said here before the question or
    the form, not after the answer."""
    owner = job.get("owner_uid")
    me = my_uid()
    if owner is None or owner == me or me == 0:
        return ""
    try:
        engine_uid = os.stat(location).st_uid
    except OSError:
        return ""  # (the engine decides)
    if me == engine_uid:
        return ""
    return (
        f"belongs to {user_text(job)}: you may {verb} only your own jobs (the engine's "
        f"user and root may {verb} any)"
    )


def ask_to_restart(
    screen: Screen[Any], job: JobRowJSON, then: Callable[[JobJSON], None] | None = None
) -> None:
    """Confirm, then run an ended ``job`` again as a new job (the same spec, a new id);
    ``then`` gets the new job (the caller shows it)."""
    app, ui = view_of(screen), screen.app
    job_id = int(job["id"])
    status = job.get("status", "")
    if not can_restart(job):
        why = (
            ADOPTED_NOT_RUN
            if job.get("kind") == "adopted"
            else f"{status_phrase(status)}: only an ended job restarts"
            + (" (a running service: its replicas)" if job.get("kind") == "service" else "")
        )
        ui.notify(f"job {job_id} {why}", severity="warning")
        return
    refused = not_yours(app.backend.location, job, "restart")
    if refused:  # (asked, confirmed, then refused by the engine: tester h75)
        ui.notify(f"job {job_id} {refused}", title=f"restart job {job_id}", severity="warning")
        return
    rolling = [r for r in job.get("replicas") or () if r.get("roll")]
    if is_scalable(job) and rolling:
        # (asked, confirmed, then refused: the roll under way was said only after "y";
        # tester h177)
        now = next((r for r in rolling if r.get("roll") != "waits"), rolling[0])
        ui.notify(
            f"job {job_id} is restarting its replicas one at a time already (replica "
            f"{now['index']} now: {now.get('state', '')}): wait for it to end",
            title=f"restart job {job_id}",
            severity="warning",
        )
        return

    async def restart() -> None:
        try:
            answer = await app.backend.restart(job_id)
        except BackendError as err:
            ui.notify(str(err), title=f"restart job {job_id}", severity="error")
            return
        new = answer["job"]
        rolling = answer.get("rolling")
        if rolling is not None:  # (a running service, restarted in place)
            said = "\n".join(printable(w) for w in answer.get("warnings") or ())
            one_by_one = " one at a time" if len(rolling) > 1 else ""
            ui.notify(
                said or "each once the one before it is up again",
                title=f"job {job_id} restarts {replicas_said(rolling)}{one_by_one}",
                severity="warning" if said else "information",
            )
            return
        if new["id"] not in app.job_store.jobs:  # (the event stream may have brought it)
            app.job_store.apply(new)
        new_status = new.get("status", "")
        # What the CLI says on stderr, the toast says too (it said only the new id: a left
        # out dependency and a second run of the job went unsaid).
        notes = [printable(w) for w in answer.get("warnings") or ()]
        gone = answer.get("left_out") or []
        if gone:
            notes.append(
                f"it does not wait for job{'s' if len(gone) > 1 else ''} "
                f"{', '.join(map(str, gone))}, cleaned from the history"
            )
        if new.get("termination_reason") is not None:  # ended at admission (over capacity)
            ui.notify(
                "\n".join([str(new.get("message") or new_status), *notes]),
                title=f"job {job_id} restarted as job {new['id']}: {new_status}",
                severity="error",
            )
        elif notes:
            ui.notify(
                "\n".join(notes),
                title=f"job {job_id} restarted as job {new['id']} ({new_status})",
                severity="warning",
            )
        else:
            ui.notify(f"job {job_id} restarted as job {new['id']} ({new_status})")
        if then is not None:
            then(new)

    def answered(yes: bool | None) -> None:
        if yes:
            _run(ui, restart, f"restart-{job_id}", exclusive=True)

    if is_scalable(job):
        # (its spec's count: past it, replicas a scale-down is stopping, not restarted)
        count = int(job.get("spec", {}).get("replicas") or len(job.get("replicas") or ()) or 1)
        how = (
            "Its one replica is stopped (SIGTERM) and started again: the service serves "
            "nothing until it is up again."
            if count == 1
            else f"Its {count} replicas are stopped (SIGTERM) and started again one at a "
            "time, each once the one before it is up again: the others serve meanwhile."
        )
        question = ConfirmScreen(
            f"Restart job {job_id}'s {plural(count, 'replica')}?",
            f"{job.get('name', '')} runs. {how}",
            "Restart",
        )
    else:
        question = ConfirmScreen(
            f"Restart job {job_id}?",
            f"{job.get('name', '')} {status}. Its spec runs again as a new job (a new id; "
            f"job {job_id} stays as it is).",
            "Restart",
        )
    ui.push_screen(question, answered)


def ask_to_edit(screen: Screen[Any], job: JobRowJSON) -> None:
    """Open the edit form of a waiting ``job`` (its whole spec is fetched first: a table's
    row carries only part of it)."""
    app, ui = view_of(screen), screen.app
    job_id = int(job["id"])
    if not can_edit(job):
        ui.notify(
            f"job {job_id} {status_phrase(str(job.get('status', '')))}: only a waiting job "
            "is edited (and a running service scaled)",
            severity="warning",
        )
        return
    refused = not_yours(app.backend.location, job, "edit")
    if refused:  # (the form opened, then the engine refused its answer: tester h75)
        ui.notify(f"job {job_id} {refused}", title=f"edit job {job_id}", severity="warning")
        return

    async def open_form() -> None:
        try:
            detail = await app.backend.job(job_id)
        except BackendError as err:
            ui.notify(str(err), title=f"edit job {job_id}", severity="error")
            app.key_hold.release()  # (no form: what was typed after e goes on)
            return
        ui.push_screen(EditScreen(detail["job"]))

    app.key_hold.form_coming()  # (the keys typed after e wait for the form)
    _run(ui, open_form, f"edit-{job_id}", exclusive=True)


def ask_to_signal(screen: Screen[Any], process: dict[str, Any]) -> None:
    """Confirm (SIGTERM, or SIGKILL if chosen), then signal a stray GPU process through
    the engine; what the engine did, or why it refused, is a notification.

    Args:
        process: ``pid``, ``user``, ``command``, ``start_ticks`` (when known: the engine
            then signals only that very process, not a later one with its pid), ``gpus``,
            ``used_bytes``.
    """
    app, ui = view_of(screen), screen.app
    pid = int(process["pid"])
    ticks = process.get("start_ticks")

    async def send(name: str) -> None:
        try:
            done = await app.backend.signal_process(pid, name, ticks)
        except BackendError as err:
            # (no engine refused anything: "refused" was said of a signal never sent; h170)
            failed = "unanswered" if isinstance(err, ConnectionLost) else "refused"
            ui.notify(str(err), title=f"SIG{name} to pid {pid} {failed}", severity="error")
            return
        ui.notify(done, title=f"SIG{name}")

    def answered(name: str | None) -> None:
        if name:
            _run(ui, functools.partial(send, name), f"signal-{pid}")

    ui.push_screen(SignalScreen(process), answered)
