"""Small text formatters shared by the CLI and the TUI (stdlib only)."""

from __future__ import annotations

from .fields import (
    CPU_POOL,
    TERMINAL_STATUSES,
    printable,
    program_name,
    starting_why,
    wait_words,
    wanted_gpus,
)
from .wire import ENDING_DOWN, NOT_ACCEPTING, RESTARTING_DOWN

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:  # (the CLI imports this module: no wire, no typing at run time)
    from collections.abc import Iterable, Mapping
    from typing import Any

    from .wire import JobRowJSON, ReplicaJSON, UsageJSON, UsageSummaryJSON

GIB = 1024**3

UNSPOKEN_REASONS = frozenset({"exit_code", "cancelled", "dependency_failed"})
"""Termination reasons that a job's message already says (no words of their own):
"dependency failed · dependency job 2 cancelled" said "failed" of a cancelled job and took
the room of the words that named it (tester h91)."""


def reason_words(job: JobRowJSON | dict[str, Any]) -> str:
    """The job's termination reason in words (``over capacity``), or empty when its
    message already says it (``exited with code 3``, ``cancelled by user``)."""
    reason = job.get("termination_reason")
    if not reason or reason in UNSPOKEN_REASONS or reason == job.get("status"):
        return ""
    return str(reason).replace("_", " ")


EVENT_LABELS = {
    "job.replica": "replica",
    "job.preemption": "preemption",
    # (shown as "job.edited" beside "queued" and "running": tester h67)
    "job.edited": "edited",
    "job.log": "log cut",
    "job.idle": "idle",
    # (a domain's change that a run of this job caused: its device error quarantined it)
    "domain.state": "GPU",
}
"""A timeline entry without a status, in a word (its kind is the wire's name)."""


def event_label(event: Mapping[str, Any]) -> str:
    """What a timeline entry is: the status it moved to, else its kind in a word."""
    kind = str(event.get("kind") or "")
    return str(event.get("status") or EVENT_LABELS.get(kind, kind))


def event_words(event: Mapping[str, Any]) -> tuple[str, str]:
    """A timeline entry's reason in words, empty where its message says it already
    ("completed (exit_code): exited with code 0"), and its message on one line, less a
    lead its label says ("edited  edited: priority 0 -> 5": tester h94)."""
    reason = event.get("reason")
    spoken = reason and reason != event.get("status") and reason not in UNSPOKEN_REASONS
    reason_text = str(reason).replace("_", " ") if spoken else ""
    message = " ".join(str(event.get("message") or "").split())
    if not message and event.get("kind") == "job.submitted":
        message = "submitted"
    lead = f"{event_label(event)}: "
    if message.startswith(lead):
        message = message[len(lead) :]
    if reason_text and " ".join(reason_text.split()) in message:
        # (a quarantine's entry said its reason twice: "GPU (3 jobs in a row failed
        # with: X): domain train quarantined after this run's device error: 3 jobs in a
        # row failed with: X": tester h169)
        reason_text = ""
    return reason_text, message


def run_started_at(job: JobRowJSON | Mapping[str, Any]) -> float | None:
    """When its last run started; ``None`` if none did. A launch that failed is recorded
    running first (the decision is durable before the launcher is asked), but no process
    ran: it showed "started 15:44:52  runtime 0s"."""
    if job.get("termination_reason") == "launch_failed":
        return None
    started = job.get("started_at")
    return float(started) if started else None


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def live_message(job: JobRowJSON | dict[str, Any], now: float) -> str:
    """A job's message as of ``now``: a stop under way counts down to its SIGKILL (the
    stored "SIGKILL after 10 s" was true only when written: read later it still said 10 s)."""
    message = str(job.get("message") or "")
    kill_at = job.get("kill_at")
    if not kill_at or job.get("status") != "running":
        return message
    if "SIGTERM in " in message and " s after that" in message:
        return _preemption_countdown(message, float(kill_at), now)
    marker = "SIGKILL after "
    if marker not in message:
        return message
    head, _, rest = message.partition(marker)
    amount, unit, tail = rest.partition(" s")
    try:
        float(amount)
    except ValueError:
        return message
    if not unit:
        return message
    left = float(kill_at) - now
    said = f"SIGKILL in {left:.0f} s" if left >= 0.5 else "SIGKILL due"
    return f"{head}{said}{tail}"


def _preemption_countdown(message: str, kill_at: float, now: float) -> str:
    """A preemption's "SIGTERM in 30 s, SIGKILL 10 s after that" as of ``now``: the
    SIGTERM still to come, or sent and the SIGKILL counted down."""
    head, _, rest = message.partition("SIGTERM in ")
    _lead, _, rest = rest.partition(" s, SIGKILL ")
    grace_text, _, tail = rest.partition(" s after that")
    try:
        grace = float(grace_text)
    except ValueError:
        return message
    term_at = kill_at - grace
    if now < term_at - 0.5:
        said = f"SIGTERM in {term_at - now:.0f} s, SIGKILL {grace:g} s after that"
    elif now < kill_at - 0.5:
        said = f"SIGTERM sent, SIGKILL in {kill_at - now:.0f} s"
    else:
        said = "SIGTERM sent, SIGKILL due"
    return f"{head}{said}{tail}"


def dependencies_text(spec: dict[str, object]) -> str:
    """A spec's ``depends_on`` in words: ``12, 13 (any end)``; ``""`` for none."""
    out = []
    deps = spec.get("depends_on")
    for dep in deps if isinstance(deps, list) else []:
        if isinstance(dep, dict):
            out.append(f"{dep.get('job')}" + (" (any end)" if dep.get("any_exit") else ""))
        else:
            out.append(str(dep))
    return ", ".join(out)


def size_words(size: int) -> str:
    """Bytes in the largest unit that keeps a whole number before the point: ``512 B``,
    ``4.0 KiB``, ``1.5 GiB``."""
    amount = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def gib(value: int | None) -> str:
    """Bytes as GiB with one decimal; ``?`` when unknown."""
    return "?" if value is None else f"{value / GIB:.1f}"


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 job``, ``2 jobs`` (``words``: an irregular plural)."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def placement_words(job: Mapping[str, Any]) -> str:
    """``placement 2 of 10``: a service's placements (the CLI's status and the TUI's detail
    say it). A waiting one names the placement it waits for, as its timeline does: the
    header said "placement 1 of 10" under "placing again ... (placement 2 of 10)" (h98)."""
    spec = job.get("spec") or {}
    most = (spec.get("retry") or {}).get("max_attempts", 10)
    attempt = int(job.get("attempt") or 0)
    if job.get("status") in ("pending", "queued"):
        return f"waits for placement {attempt + 1} of {most}"  # ("... of 10 next": h168)
    if not attempt:  # (refused, or cancelled while waiting: "placement 0 of 10" was said)
        return "never placed"
    return f"placement {attempt} of {most}"


def still_on_domain(jobs: Iterable[Mapping[str, Any]], name: str) -> list[str]:
    """What still runs on domain ``name`` as it is drained, and when it leaves, a line per
    kind (``domain drain`` and the TUI's toast say it): batch jobs stay until they end; a
    service moves off when a replica there exits, unless pinned there (it starts again in
    place: "moves off" was said of a service pinned to it, tester h96)."""
    there = sorted(  # (in id order: "jobs 20, 19 run there": tester h169)
        (j for j in jobs if j.get("status") == "running" and name in (j.get("domains") or [])),
        key=lambda job: int(job["id"]),
    )
    batch = [str(job["id"]) for job in there if job.get("kind") != "service"]
    moving: list[str] = []
    pinned: list[str] = []
    for job in there:
        if job.get("kind") != "service":
            continue
        pins = (job.get("spec") or {}).get("domain")
        pins = [pins] if isinstance(pins, str) else list(pins or ())
        stuck = bool(pins) and set(pins) <= set(job.get("domains") or [])
        # (a CPU service has no elsewhere: the cpu pool is the only one; h98)
        stuck = stuck or not any(d != CPU_POOL for d in job.get("domains") or [])
        (pinned if stuck else moving).append(str(job["id"]))
    lines = []
    if batch:
        lines.append(
            f"job {batch[0]} runs there until it ends"
            if len(batch) == 1
            else f"jobs {', '.join(batch)} run there until they end"
        )
    if moving:
        noun = (
            f"service {moving[0]} moves"
            if len(moving) == 1
            else f"services {', '.join(moving)} move"
        )
        # (whether it fits elsewhere is known only then: "to where it fits" was said of
        # one that no free GPU could take, and it never left; h98)
        lines.append(
            f"{noun} off it when a replica there exits, with the whole service, if it fits "
            "elsewhere then; else that replica starts again in place (cancel to stop now)"
        )
    if pinned:
        noun = (
            f"service {pinned[0]} is" if len(pinned) == 1 else f"services {', '.join(pinned)} are"
        )
        held = "the cpu pool, the only one" if name == CPU_POOL else "the domains it holds"
        lines.append(
            f"{noun} pinned to {held}: a replica that exits starts again in place "
            "(cancel to stop it)"
        )
    return lines


def gpus_text(job: JobRowJSON) -> str:
    """Assigned GPUs by index (``#0``, ``#0,1``: a bare ``0`` read as "no GPUs"), else the
    requested count after a times sign (``\N{MULTIPLICATION SIGN}2``), else empty. The TUI's
    GPUS column and the CLI's ``jobs`` say it alike."""
    if job.get("gpus"):
        return "#" + ",".join(str(g) for g in job["gpus"])
    spec = job.get("spec")
    if not isinstance(spec, dict):
        return ""
    wanted = wanted_gpus(spec)
    replicas = spec.get("replicas")
    if isinstance(wanted, int) and isinstance(replicas, int) and replicas > 1:
        wanted *= replicas  # (a service's GPUs in all: each replica on its own)
    return f"\N{MULTIPLICATION SIGN}{wanted}" if wanted else ""


def gpus_named(indices: Iterable[int], state: Mapping[str, Any] | None) -> str:
    """GPUs by index with the domain that owns each, as a field asking for a domain
    takes it: ``GPU 1 (small)`` (``gpu1`` read as a domain's name, and was not one)."""
    names = {
        d.get("gpu_index"): d.get("name")
        for d in (state or {}).get("domains", [])
        if d.get("gpu_index") is not None
    }
    said = []
    for index in indices:
        name = names.get(index)
        said.append(f"GPU {index} ({name})" if name else f"GPU {index}")
    return ", ".join(said)


_USER_NAMES: dict[int, str] = {}


_SAFE_IN_WORD = frozenset("@%+=:,./_-")


def argv_text(words: list[str]) -> str:
    """An argv as a shell would need it typed: a word with a space, quote or other
    special character is single-quoted (``echo 'a b' c``), so word boundaries show; a
    plain join made ``["echo", "a b", "c"]`` read as four words. (``shlex.join``'s
    quoting, without importing ``re`` into a CLI call, and letting non-ASCII letters be.)
    """
    return " ".join(_quoted(str(word)) for word in words)


SHELL_LINE_MARK = "  (shell line)"
"""Follows a shell line where a job's command is shown (``status``, the TUI's detail):
it was ``sh -c '...'``, which read as a shell run a line without one (most run as an
argv: ``engine/commandline.py``), quoted past reading."""


def _quoted(word: str) -> str:
    if word and all(c.isalnum() or c in _SAFE_IN_WORD for c in word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def short_command(command: str) -> str:
    """A command line with its program's directory left out, arguments kept
    (``/opt/conda/envs/x/bin/python3 train.py`` -> ``python3 train.py``): a narrow table
    spends its width on what tells processes apart. On one line: an argument's line
    break or tab is written as an escape (``\\x0a``), as the CLI writes it; a table cell
    showed what came before the first line break alone, with no sign of the rest, so a
    process could hide its arguments from the views one picks a process to kill or adopt
    in (tester h190)."""
    program, sep, rest = command.partition(" ")
    return printable(program_name(program) + sep + rest)


def user_name(uid: int) -> str:
    """A uid as its user name (the number when it has none); cached: an NSS lookup is
    ~0.1 ms, and a table names a user on every row."""
    name = _USER_NAMES.get(uid)
    if name is None:
        import pwd

        try:
            name = pwd.getpwuid(uid).pw_name
        except (KeyError, OverflowError):
            name = str(uid)
        if len(_USER_NAMES) < 4096:
            _USER_NAMES[uid] = name
    return name


def user_text(job: JobRowJSON) -> str:
    """Who submitted the job (a shared box's jobs table says whose each job is)."""
    uid = job.get("owner_uid")
    return "" if uid is None else user_name(int(uid))


def domains_text(job: JobRowJSON) -> str:
    """Where it runs: its domains, or ``@NAME`` for a Slurm cluster's job (issue 16)."""
    spec = job.get("spec")
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    if cluster and not job.get("domains"):
        return f"@{cluster}"
    return ",".join(job.get("domains") or [])


def replica_health(job: JobRowJSON) -> str:
    """``2/2 up`` for a service's job JSON; ``""`` for other kinds."""
    replicas = job.get("replicas")
    if job.get("kind") != "service" or not replicas or job.get("status") in TERMINAL_STATUSES:
        return ""  # (an ended service's "0/2 up" says nothing its status does not)
    spec = job.get("spec")
    if isinstance(spec, dict):
        # (past the spec's count: replicas a scale-down is stopping, not the service's)
        count = spec.get("replicas") or 1
        replicas = [r for r in replicas if int(r.get("index") or 0) < count]
    up = sum(1 for r in replicas if r.get("state") == "up")
    return f"{up}/{len(replicas)} up"


def replica_state(replica: ReplicaJSON, now: float, *, placing: bool = False) -> str:
    """What a replica is doing, with live countdowns: ``backoff (restart in 4s)``,
    ``starting for 12s (port 41234 not answering)``, ``down for 40s (port 41234 not
    answering)``; in a rolling restart, where it is in it. ``placing``: its service waits
    to be placed (again)."""
    said = _replica_state(replica, now, placing=placing)
    roll = replica.get("roll") or ""
    state = replica.get("state")
    if roll == "stopping" and state == "stopping":
        return "stopping to restart (rolling restart, SIGTERM sent)"
    if roll == "restarting":
        return "restarting (rolling restart)"
    if roll == "waits":
        return f"{said}; rolling restart: waits its turn"
    if roll == "started":
        return f"{said}; rolling restart: restarted, the next waits for it"
    return said


def _replica_state(replica: ReplicaJSON, now: float, *, placing: bool = False) -> str:
    state = str(replica.get("state", "?"))
    if placing and state in ("exited", "pending"):
        # (each read "exited" while its service waited to be placed again, as if it had
        # given up: tester h98)
        return "waits for the service's placement"
    restart_at, started_at = replica.get("next_restart_at"), replica.get("started_at")
    down_since = replica.get("down_since")
    if state == "down" and down_since:
        port = replica.get("port")
        # (A hung server's port answers: its table said "not answering" beside a
        # message saying it stopped accepting connections.)
        hung = NOT_ACCEPTING in str(replica.get("message") or "")
        how = NOT_ACCEPTING if hung else "not answering"
        if RESTARTING_DOWN in str(replica.get("message") or ""):
            # (through the SIGTERM's grace it read "down for 12s ... 18s" as if nothing
            # was done, while cancel's said "stopping": tester h93)
            return f"stopping to restart (down for {duration(now - down_since)}, SIGTERM sent)"
        if ENDING_DOWN in str(replica.get("message") or ""):
            return f"stopping, not restarted (down for {duration(now - down_since)}, SIGTERM sent)"
        return f"down for {duration(now - down_since)} (port {port} {how})"
    if state == "backoff" and restart_at:
        # Rounded up, as a countdown is: "in 0s" was said a second before the restart.
        left = restart_at - now
        if left <= 0:
            # (due: "in 0s" stood for ever where no engine ran to restart it; h98)
            return "backoff (restart due)"
        return f"backoff (restart in {duration(-(-left // 1))})"
    if state == "starting" and started_at:
        waited = duration(now - started_at)
        port = replica.get("port")
        why = starting_why(port, str(replica.get("message") or "")) if port else ""
        return f"starting for {waited}" + (f" ({why})" if why else "")
    return state


def gpu_time(hours: float) -> str:
    """GPU time held: ``0.500 GPU-hours``; under a thousandth of one, in GPU-seconds (a
    half-second job "held 0.000 GPU-hours", as if nothing: tester h180)."""
    if hours <= 0 or hours >= 0.001:
        return f"{hours:.3f} GPU-hours"
    return f"{hours * 3600:.1f} GPU-seconds"


def usage_lines(summary: UsageSummaryJSON, active: bool = False) -> list[tuple[str, str]]:
    """What a job used, as ``(label, text)`` lines (``status`` and the job detail);
    ``active``: it has not ended."""
    util = summary.get("util_mean")
    p95 = summary.get("util_p95")
    mem = summary.get("mem_util_mean")
    idle = summary.get("idle_share")
    gpus = ",".join(f"#{g}" for g in summary.get("gpus", []))
    if not summary.get("samples") and active:
        # (one just started was said to have "ended before its GPUs were next sampled")
        return [
            (
                "GPU use",
                "not read yet: its GPUs are read every [engine] sample_interval"
                + (f" ({gpus})" if gpus else ""),
            )
        ]
    if not summary.get("samples"):
        # Ended between two readings of its GPUs: "util ?" and "energy 0 Wh" (not marked
        # as estimated) read as measured (tester h156).
        return [
            (
                "GPU use",
                "not read: it ended before its GPUs were next sampled ([engine] "
                "sample_interval)" + (f" ({gpus})" if gpus else ""),
            ),
            ("energy", f"not measured, {gpu_time(summary['gpu_hours'])} held"),
        ]
    lines = [
        (
            "GPU memory",
            f"peak {gib(summary['peak_vram'])} GiB, mean {gib(summary['mean_vram'])} GiB per GPU"
            + (f" ({gpus})" if gpus else ""),
        ),
        (
            "GPU use",
            ("util not read" if util is None else f"util mean {util:g}%")
            + ("" if p95 is None else f", p95 {p95}%")
            + ("" if mem is None else f", memory bandwidth {mem:g}%")
            + ("" if idle is None else f", idle {idle:.0%} of the time")
            + (" (GPU shared with other jobs)" if summary.get("shared") else ""),
        ),
        (
            "energy",
            f"{summary['energy_wh']:.3f} Wh"
            + (" (estimated from power)" if summary.get("energy_estimated") else "")
            + f", {gpu_time(summary['gpu_hours'])}",
        ),
    ]
    if summary.get("advice"):
        lines.append(("advice", str(summary["advice"])))
    if summary.get("idle_warning"):
        lines.append(("warning", str(summary["idle_warning"])))
    return lines


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], width: int, top: float | None = None) -> str:
    """``values`` as one line of block characters, ``width`` wide at most (neighbours
    are merged by their peak); a gap where a value is unknown."""
    if not values or width <= 0:
        return ""
    if len(values) > width:
        merged: list[float | None] = []
        for col in range(width):
            chunk = [
                v
                for v in values[col * len(values) // width : (col + 1) * len(values) // width]
                if v is not None
            ]
            merged.append(max(chunk) if chunk else None)
        values = merged
    known = [v for v in values if v is not None]
    high = top if top is not None else (max(known) if known else 0)
    if high <= 0:
        return "".join(" " if v is None else SPARK[0] for v in values)
    last = len(SPARK) - 1
    return "".join(
        " " if v is None else SPARK[max(0, min(last, round(v / high * last)))] for v in values
    )


def unobserved_note(usage: UsageJSON) -> str:
    """``; no readings for 40s while no engine ran`` where part of a job's GPU time has no
    points: an engine killed before it saved them (``[usage] save_interval``), or not
    running. The plot covered a few seconds of a job that ran a minute, with no word of
    what was missing (tester h168). Empty where nothing is missing."""
    totals = usage.get("totals") or {}
    # (only the time no engine ran: the time before a job's first reading and after its
    # last, under a sample interval, was said as such of every short job: tester h182)
    gpu_seconds = float(totals.get("offline_seconds", totals.get("unobserved_seconds")) or 0.0)
    gpus = max(1, len(usage.get("series") or ()))
    missing = gpu_seconds / gpus  # (booked per GPU held)
    if missing < 1:
        return ""
    # (not "while no engine ran": an engine killed loses the readings it had not saved,
    # up to [usage] save_interval of them, and 3 s down read "2m31s": tester h201)
    return (
        f"; no readings kept for {duration(missing)} (no engine ran, or one was killed "
        "before it saved them)"
    )


def usage_plot(usage: UsageJSON, width: int = 60, status: str | None = None) -> str:
    """Each GPU's VRAM and utilisation over the job's life, as labelled sparklines
    (``status``: the job's, for what to say when there is nothing to draw)."""
    summary = usage.get("summary")
    if summary is None and status in ("pending", "queued"):
        # (a waiting job was told it "held no GPU, or ended before ...": tester h182)
        return f"job {usage['job']}: not started yet: no GPU usage to plot"
    if summary is None and status == "running":
        return f"job {usage['job']}: no GPU usage read yet (it holds no GPU, or is not sampled yet)"
    if summary is None:
        return (
            f"job {usage['job']}: no GPU usage recorded (it held no GPU, or ended before "
            "its GPUs were first sampled)"
        )
    if not usage["series"]:
        # (a GPU job that ended between two readings has a record with no points: an
        # empty line was printed: tester h187)
        gpus = ", ".join(f"#{g}" for g in summary.get("gpus") or ())
        if status in ("pending", "queued", "running"):
            return f"job {usage['job']}: no GPU usage read yet ({gpus or 'no GPU'})"
        return (
            f"job {usage['job']}: no GPU usage read: it ended before its GPUs "
            f"({gpus or 'none'}) were first sampled ({gpu_time(summary['gpu_hours'])} held)"
        )
    lines = []
    gap = unobserved_note(usage)
    for series in usage["series"]:
        times = series["t"]
        span = duration(times[-1] if times else 0)
        vram: list[float | None] = [float(v) for v in series["vram_mib"]]
        peak = max((v for v in vram if v is not None), default=0.0)
        util: list[float | None] = [None if v is None else float(v) for v in series["util"]]
        over = f" over {span}" if len(times) > 1 else ""
        lines.append(f"GPU #{series['gpu']}  ({plural(len(times), 'point')}{over}{gap})")
        lines.append(f"  VRAM {sparkline(vram, width)}  peak {peak / 1024:.1f} GiB")
        lines.append(f"  util {sparkline(util, width, top=100)}  0-100%")
    return "\n".join(lines)


def why_lines(data: dict[str, Any]) -> list[str]:
    """``gpulayer-tui why``'s text (``GET /v1/jobs/ID/why``), one fact per line; the TUI's
    job detail shows the same facts (:func:`why_rows`)."""
    job = data["job"]
    if not data.get("waiting"):
        status = data.get("status")
        said = f"job {job} {status}" if status in TERMINAL_STATUSES else f"job {job} is {status}"
        reason = str(data.get("reason") or "")
        if data.get("kill_at"):  # (a stop under way: counted down as of now)
            import time

            reason = live_message({"message": reason, **data}, time.time())
        return [f"{said}: {reason}".rstrip(": ")]
    lines = [f"job {job} ({data['status']}, priority {data['priority']}, user {data['user']})"]
    lines += [f"  {label:<12}{text}" for label, text in why_rows(data)]
    return lines


def why_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    """A waiting job's facts as ``(label, text)``: reason, what it waits for, its place,
    the reservation, its user's limits, the fair-share order, whom it preempts."""
    job = data["job"]
    rows = [("reason", str(data.get("reason") or "-"))]
    # (what else it needs back in service: a user's limit as the reason hid them: h148)
    reason = str(data.get("reason") or "")
    out_of_service = [s for s in data.get("out_of_service") or () if s not in reason]
    if out_of_service:
        rows.append(("also needs", "; ".join(out_of_service) + " (back in service)"))
    if data.get("waiting_for"):
        # each with how it is doing (a chain took a `status` per link: tester h147)
        said = "; ".join(
            f"job {d['job']}"
            + (
                f" ({d['status']}{': ' + d['message'] if d.get('message') else ''})"
                if d.get("status")
                else ""
            )
            for d in data["waiting_for"]
        )
        rows.append(("waits for", said))
    elif data.get("waiting_for_jobs"):
        waited = data["waiting_for_jobs"]
        rows.append(("waits for", f"{_jobs_word(waited)} {', '.join(map(str, waited))}"))
    if data.get("capacity") and str(data["capacity"]) != reason:
        # (said once: the same words on both lines read as two facts: tester h169)
        rows.append(("capacity", str(data["capacity"])))
    held = data.get("held_by") or []
    if held:
        # (a service is said where it holds: after the last domain, its note read as of
        # the job named last: tester h108)
        said = "; ".join(
            f"{h['domain']}: {_jobs_word(h['jobs'])} "
            + ", ".join(
                f"{j} (a service: runs until stopped)" if j in (h.get("services") or ()) else str(j)
                for j in h["jobs"]
            )
            for h in held
        )
        rows.append(("held by", said))
    if data.get("place"):
        ahead = ", ".join(map(str, data.get("ahead") or [])) or "none"
        rows.append(("place", f"{data['place']} of {data['ready']} in line (ahead: {ahead})"))
    reservation = data.get("reservation")
    if reservation:
        mine = reservation["job"] == job
        whose = "for this job" if mine else f"for job {reservation['job']}"
        rows.append(
            ("reserved", f"{', '.join(reservation['domains'])} {whose} {reservation['when']}")
        )
    if "limits" not in data or data["limits"] is not None:  # (a cluster job's: null)
        rows += _limit_rows(data, data.get("limits") or {})
    if data.get("preempting"):
        stopped = data["preempting"]
        rows.append(("preempting", f"{_jobs_word(stopped)} {', '.join(map(str, stopped))}"))
    coming = data.get("may_preempt")
    if coming:
        ids = coming["jobs"]
        when = "now" if coming["in_s"] <= 0 else f"in {wait_words(coming['in_s'])}"
        rows.append(
            (
                "preempts",
                f"{_jobs_word(ids)} {', '.join(map(str, ids))} ({when}, once it has waited "
                "[scheduling] preempt_after, if it still cannot start)",
            )
        )
    return rows


def _limit_rows(data: dict[str, Any], limits: dict[str, Any]) -> list[tuple[str, str]]:
    """A waiting job's user's limits and the fair-share order, as :func:`why_rows` says
    them."""
    rows: list[tuple[str, str]] = []
    tables = limits.get("tables") or {}
    by_table: dict[str, list[str]] = {}
    for key in ("max_gpus", "max_vram_gb", "max_queued", "max_priority"):
        if limits.get(key) is not None:
            table = str(tables.get(key) or limits.get("from"))
            by_table.setdefault(table, []).append(f"{key} {figure(limits[key])}")
    set_ = "; ".join(f"{', '.join(keys)} ({table})" for table, keys in by_table.items())
    rows.append(
        (
            "limits",
            # Slots, not GPUs: max_gpus counts each job on a shared GPU's slot once, so
            # two jobs on one GPU read "2 GPUs" on a 2-GPU box with 3 (tester h87).
            f"{set_ or 'none'}; running jobs hold "
            f"{plural(limits.get('running_gpus', 0), 'GPU slot')}, "
            f"{figure(limits.get('running_vram_gb', 0))} GiB "
            f"declared; {plural(limits.get('waiting', 0), 'job')} waiting",
        )
    )
    order = data.get("fair_share") or []
    if order:
        shown = ", ".join(
            f"{row['user']} {row['gpu_hours']:g} GPU-h"
            + (f" (share {row['share']:g})" if row["share"] != 1 else "")
            for row in order
        )
        rows.append(("fair share", f"{shown} (least recent use first)"))
    return rows


def _jobs_word(ids: list[Any]) -> str:
    """``job`` or ``jobs``, for a list of ids."""
    return "job" if len(ids) == 1 else "jobs"


def drain_said(dom: Mapping[str, Any], action: str) -> str:
    """What a drain or release answer says after the domain's state: the drain's reason,
    and the one it replaced (a drain of a draining domain changes it, and said only
    "domain X: draining", as if nothing had changed; the TUI said nothing of another
    client's reason it replaced: tester h162)."""
    if action == "release" and dom.get("state") == "draining":
        # A release that leaves it draining lifted a quarantine: the drain under it stays
        # (said only "domain train: draining": tester h169).
        reason = dom.get("drain_reason") or dom.get("state_reason") or ""
        drained = f"still drained: {reason}" if reason else "still drained"
        return f" (quarantine lifted; {drained}; release again to end the drain)"
    previous = dom.get("previous_drain_reason")
    if action == "drain" and previous is not None and dom.get("state") == "quarantined":
        # (said only "(drained under it: x2; ...)": the reason it replaced went unsaid;
        # tester h170)
        return (
            f" (drained under it; reason changed: {previous} -> {dom.get('drain_reason')}; "
            "a release drains it again)"
        )
    if action != "drain" or dom.get("state") != "draining":
        return kept_drain(dom)
    reason = dom.get("drain_reason") or dom.get("state_reason") or ""
    previous = dom.get("previous_drain_reason")
    if previous is not None:
        return f" (reason changed: {previous} -> {reason})"
    return f" (reason: {reason})" if reason else ""


def kept_drain(dom: Mapping[str, Any]) -> str:
    """`` (drained under it: RMA; a release drains it again)`` for a quarantined domain
    the operator drained: the drain outlives the quarantine."""
    if dom.get("state") != "quarantined" or dom.get("drain_reason") is None:
        return ""
    return f" (drained under it: {dom['drain_reason']}; a release drains it again)"


USER_HEADS = (
    "USER",
    "GPU-H",
    "SHARE",
    "RUNNING",
    "GPUS/MAX",
    "VRAM GiB/MAX",
    "WAITING/MAX",
    "MAX PRIO",
)
"""The columns of a user's row, as ``gpulayer-tui users`` and the TUI's users view (``4``)
head them."""


def figure(value: float) -> str:
    """A configured or summed number as written: whole ones whole, others as Python writes
    them back (``999999.5``, ``12345.678``). ``:g`` said 1e+06 of a max_queued of 1000000
    (tester h167), and 12345.7 of a limit of 12345.678: more than it is (tester h170)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    number = float(value)
    if number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return repr(number)


def user_cells(user: Mapping[str, Any]) -> list[str]:
    """A user of ``GET /v1/users`` as the cells of :data:`USER_HEADS`: its
    name, recent GPU-hours, share, running jobs, then what it holds or queues beside its
    limit (``1/4``; ``-``: no limit)."""

    def limit(value: Any) -> str:
        return "-" if value is None else figure(value)

    return [
        str(user["user"]),
        f"{user['gpu_hours']:.4f}",  # (fixed: the digits shifted as it grew; h173)
        f"{user['share']:g}",
        str(user.get("running_jobs", "-")),  # (an older engine leaves it out)
        f"{user['running_gpus']}/{limit(user['max_gpus'])}",
        f"{figure(user['running_vram_gb'])}/{limit(user['max_vram_gb'])}",
        f"{user['waiting']}/{limit(user['max_queued'])}",
        limit(user.get("max_priority")),
    ]
