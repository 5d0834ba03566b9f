"""The command line's grammar (argparse): every subcommand and option, with help.

Built only when needed (see :mod:`.main`): the common forms of ``submit``, ``status`` and
``jobs`` are read by :mod:`.quick` without argparse; and then only the running
subcommand's arguments are built.
"""

from __future__ import annotations

import argparse
import contextlib
import re  # (argparse's own import: free)
import sys

from .. import __version__

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:  # (annotations only; the wire rules load when an option needs one)
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn


TIMELINE_SHOWN = 40
"""The timeline entries ``status`` shows by default: its last ones (a crash-looping
service's ran to hundreds of lines a minute: tester h127)."""


def positive_int(text: str) -> int:
    """A whole number, 0 or more (replica numbers, how many to keep, a port)."""
    return _whole(text, 0)


def port_arg(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535 (refused in argparse's words, as every other
    flag is: it was a sentence of its own after parsing, tester h181)."""
    value = _whole(text, 0)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be at most 65535, got {value}")
    return value


def count_arg(text: str) -> int:
    """A whole number, 1 or more (rows per page, a page number, CPUs)."""
    return _whole(text, 1)


def _whole(text: str, low: int) -> int:
    from .. import fields as wire

    try:
        value = wire.parse_whole("value", text)
    except wire.FieldError as err:
        raise argparse.ArgumentTypeError(err.detail) from None
    if not low <= value <= wire.MAX_INT:
        lowest = "negative" if low == 0 else "less than 1"
        if value > wire.MAX_INT:
            raise argparse.ArgumentTypeError(f"must be at most {wire.MAX_INT}, got {value}")
        raise argparse.ArgumentTypeError(f"must not be {lowest}, got {value}")
    return value


def job_id_arg(text: str) -> int:
    """A job id."""
    return _field("job")(text)  # type: ignore[no-any-return]


def job_ids_arg(text: str) -> list[int]:
    """One job id or several, separated by commas (``--after 3,4``, as ``jobs --status``
    takes a list)."""
    from .. import fields as wire

    try:
        ids = wire.parse_job_ids(text, "job")
    except wire.FieldError as err:
        raise argparse.ArgumentTypeError(err.detail) from None
    if not ids:
        raise argparse.ArgumentTypeError(f"a job id is a number of 1 or more, got {text!r}")
    return ids


class JobIdsAction(argparse.Action):
    """Collects job ids from every word and every repeat of a flag, each id once: a
    repeat is told (``wait 5 5`` and ``--after 3 --after 3`` as ``5,5`` is), not dropped,
    since it is most often a slip for another id."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        words = values if isinstance(values, list) else [values]
        ids = list(getattr(namespace, self.dest, None) or [])
        for job in (i for w in words for i in (w if isinstance(w, list) else [w])):
            if job in ids:
                raise argparse.ArgumentError(self, f"job {job} is named twice")
            ids.append(job)
        setattr(namespace, self.dest, ids)


def _not_empty(what: str) -> Callable[[str], str]:
    """An argument that must not be empty (``--host "$UNSET"`` listened on every
    interface; ``--unit-dir "$UNSET"`` wrote into the default folder)."""

    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"needs {what} (it was empty)")
        if what == "an address" and text.startswith("[") and text.endswith("]"):
            return text[1:-1]  # ("[::1]", as in a URL: it could not be resolved)
        return text

    return check


def positive_number(text: str, zero: bool = False) -> float:
    """Seconds to wait, greater than 0 (``zero``: or 0): a number, or a duration as
    ``submit --timeout`` takes one (``90m``, ``2h``: ``wait --timeout 1m`` was "expected a
    number", tester h71)."""
    from .. import fields as wire

    try:
        value = wire.parse_duration("value", text)
    except wire.FieldError as err:
        raise argparse.ArgumentTypeError(err.detail) from None
    if value != value:  # (nan: "must be greater than 0, got nan" read as a range)
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text}")
    if not (value >= 0 if zero else value > 0):
        least = "0 or more" if zero else "greater than 0"
        raise argparse.ArgumentTypeError(f"must be {least}, got {text}")
    value += 0.0  # (-0 is 0: "still queued after -0 s": tester h73)
    # (inf and 1e300 ended `cancel --timeout` in an OverflowError; the engine's limit, not
    # one of the CLI's own: 10 years, where a --timeout the engine would refuse was taken)
    if not value <= wire.MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be at most {wire.MAX_SECONDS:.0f} (10 years), got {text}"
        )
    return value


def seconds_or_zero(text: str) -> float:
    """Seconds to wait, 0 included (``wait --timeout 0``: has it ended? at once)."""
    return positive_number(text, zero=True)


def memory_gb(text: str) -> float:
    """GB of memory, more than 0 and at most the engine's 1,000,000 (it was checked as
    seconds: "at most 1000000000 (about 31 years)", then the engine said 1000000)."""
    from .. import fields as wire

    try:
        value = wire.parse_number("value", text)
    except wire.FieldError as err:
        raise argparse.ArgumentTypeError(err.detail) from None
    if not 0 < value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 1000000 GB, got {text}")
    return value


def days_arg(text: str) -> float:
    """A number of days, 0 or more; or a duration with its unit (``30d``, ``2w``, ``12h``:
    ``--older-than 30d`` was "expected a number", tester h123)."""
    from .. import fields as wire

    if "m" in text.lower():
        # (minutes everywhere else, `1m` here removed every job that ended over a minute
        # ago from someone who meant a month: refused, not guessed; tester h145)
        raise argparse.ArgumentTypeError(
            f"got {text!r}: 'm' could be minutes or months; say 30d for days, 1h or 3600s "
            "for less than a day"
        )
    try:
        if text.strip()[-1:].lower() in ("s", "h", "d", "w"):
            value = wire.parse_duration("days", text) / 86400
        else:
            value = wire.parse_number("days", text)
    except wire.FieldError as err:
        # (a number of days, or one with a unit: "3x" was "expected a number": h131)
        raise argparse.ArgumentTypeError(
            f"{err.detail} (days, or with a unit: 12h, 30d, 2w)"
        ) from None
    if not 0 <= value <= 36500:
        raise argparse.ArgumentTypeError(f"must be from 0 to 36500 days, got {text}")
    return value


def _field(name: str) -> Callable[[str], Any]:
    """An argparse type that applies the wire contract's rule for ``name`` (the same one the
    engine and the TUI's form apply), so a bad value is refused here with the same words."""

    def parse(text: str) -> Any:
        from .. import fields as wire

        try:
            return wire.parse_field(name, text)
        except wire.FieldError as err:
            raise argparse.ArgumentTypeError(err.detail) from None

    parse.__name__ = name  # argparse names the type in "invalid <name> value"
    return parse


def completes(action: argparse.Action, kind: str) -> argparse.Action:
    """Mark what shell completion offers for ``action``'s value (``"domains"``,
    ``"dirs"``); job ids (a ``job_id_arg`` type) and files (metavar ``PATH``) need no
    mark. See :mod:`.completion`."""
    action.completes = kind  # type: ignore[attr-defined]
    return action


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, sized without importing :mod:`shutil` (~2 ms of every call:
    argparse builds a formatter for each argument it adds, and the stock one imports
    shutil for the terminal width)."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = _columns() - 2  # (as the stock formatter does)
        super().__init__(prog, indent_increment, max_help_position, width)


def _columns() -> int:
    """The terminal's width the way :func:`shutil.get_terminal_size` finds it."""
    import os
    import sys

    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose error messages show what was typed as text: an argument
    holding terminal escapes is written escaped (see :func:`printable`), never raw."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A value that starts with a minus and a digit is a value, as argparse already
        # takes -5 and -1.5 (no option here looks like one): `jobs --since -1h` was
        # "expected one argument" (its unit made it an unknown option), where
        # `--since=-1h` named the real problem. (argparse's own attribute: if a later
        # Python drops it, only that message goes back to what it was.)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        words = list(sys.argv[1:] if args is None else args)
        # (what the command line asks of its output, for a refusal: see error)
        self._json_asked = "--json" in (words[: words.index("--")] if "--" in words else words)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        from ..fields import printable

        if getattr(self, "_json_asked", False):
            # With --json, bad usage is a document on stdout too, as any refusal is: a
            # script reading stdout got nothing (tester h187).
            import json

            with contextlib.suppress(OSError):
                print(json.dumps({"error": printable(message)}, indent=2, sort_keys=True))
        super().error(printable(message))

    def print_usage(self, file: Any = None) -> None:
        """The usage, before an error: its first three lines, then where the rest is (the
        13 lines of submit's buried the one line that said what was wrong: h131)."""
        lines = self.format_usage().rstrip("\n").splitlines()
        if len(lines) > 4:
            lines = [*lines[:3], f"       ... (`{self.prog} --help` says every option)"]
        self._print_message("\n".join(lines) + "\n", file)


def did_you_mean(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """`` (did you mean --gpus?)`` for an unknown option close to one of ``parser``'s
    (``--gpu 1`` was only "unrecognized arguments": tester h131); ``""`` otherwise."""
    import difflib

    known = [o for action in parser._actions for o in action.option_strings]
    close = []
    for word in extra:
        if word.startswith("--"):
            name = word.partition("=")[0]
            close += difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    close = list(dict.fromkeys(close))
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def parser_for(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of subcommand ``command`` (its usage is what an error about its
    arguments should show), or ``parser`` itself."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            found: argparse.ArgumentParser = action.choices[command]
            return found
    return parser


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command-line grammar.

    Args:
        only: The subcommand being run: only its arguments are built (building all of
            them is ~5 ms of every CLI call); ``None`` builds everything.
    """
    parser = _Parser(
        prog="gpulayer-tui",
        formatter_class=_Formatter,
        # (no prefixes of options: `submit --cpu 4` was read as --cpus, and a prefix that
        # is an option today is another one's tomorrow: tester h66)
        allow_abbrev=False,
        description="A terminal workstation manager for GPU machines.",
        epilog="Without a subcommand it opens the TUI (attaching to a running engine, or "
        "starting one inside the TUI); --serve runs the engine headless. "
        "GPULAYER_HOME sets the state and config dir.",
    )
    parser.add_argument("--version", action="version", version=f"gpulayer-tui {__version__}")
    parser.add_argument("--serve", action="store_true", help="run the engine headless")
    parser.add_argument("--simulate", metavar="SPEC", help="simulated GPUs, e.g. 2xA100-80GB")
    parser.add_argument(
        "--simulate-if-no-gpu",
        metavar="SPEC",
        help="simulate SPEC only when no NVIDIA driver is present (demos)",
    )
    parser.add_argument("--config", metavar="PATH", help="config file (default: see README)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine activity")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    for name, (summary, description, add_args) in _SUBCOMMAND_TABLE.items():
        p = sub.add_parser(
            name,
            formatter_class=_Formatter,
            help=summary,
            # (its summary at least: `status --help` said nothing of what it does, nor
            # of its exit code: tester h94)
            description=description or summary[:1].upper() + summary[1:] + ".",
            allow_abbrev=False,
        )
        if only in (None, name):
            add_args(p)
    return parser


def _submit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name")
    p.add_argument("--project")
    p.add_argument(
        "--gpus",
        type=_field("gpus"),
        help="GPUs needed (0 = CPU pool; left out: 1 with --vram-gb or a GPU --domain, else 0)",
    )
    p.add_argument("--vram-gb", type=_field("vram_gb"), help="GiB needed on each GPU")
    completes(
        p.add_argument(
            "--domain", action="append", help="pin to a domain (repeat or a,b: a choice)"
        ),
        "domains",
    )
    p.add_argument("--exclusive", action="store_true", help="hold every slot of its domains")
    p.add_argument(
        "--notify", action="store_true", help="notify when it ends (as [notify] in the config says)"
    )
    p.add_argument("--cluster", metavar="NAME", help="run it on the [clusters.NAME] Slurm cluster")
    p.add_argument("--cpus", type=count_arg, metavar="N", help="CPUs (cluster jobs)")
    p.add_argument("--mem-gb", type=memory_gb, metavar="GB", help="memory (cluster jobs)")
    p.add_argument(
        "--preemptible",
        action="store_true",
        help="a higher-priority job that waited [scheduling] preempt_after may stop it",
    )
    p.add_argument(
        "--no-requeue",
        action="store_true",
        help="with --preemptible: fail when preempted instead of going back to the queue",
    )
    p.add_argument(
        "--snapshot",
        action="store_true",
        help="run a copy of the working directory made now (git: tracked + untracked files)",
    )
    p.add_argument(
        "--no-snapshot", action="store_true", help="run in place, whatever [snapshot] default says"
    )
    p.add_argument(
        "--after",
        type=job_ids_arg,
        action=JobIdsAction,
        default=[],
        metavar="ID",
        help="run after job ID completes (cancelled if it does not); ID,ID for more",
    )
    p.add_argument(
        "--after-any",
        type=job_ids_arg,
        action=JobIdsAction,
        default=[],
        metavar="ID",
        help="run after job ID ends, whatever its outcome",
    )
    p.add_argument(
        "--timeout",
        type=_field("timeout"),
        metavar="SECONDS",
        help="stop it this long after it starts: seconds, or 90m, 2h, 1h30m, 1d, 1w (each run "
        "of a preempted job anew; a service's from its first start)",
    )
    p.add_argument("--priority", type=_field("priority"), help="higher starts first (default 0)")
    completes(p.add_argument("--cwd", help="working directory (default: the current one)"), "dirs")
    p.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment variable"
    )
    p.add_argument(
        "--no-inherit-env",
        action="store_true",
        help="do not pass this shell's environment to the job",
    )
    p.add_argument(
        "--shell",
        action="store_true",
        help="run CMD as one shell line (sh -c); several words are joined with spaces, as "
        "ssh does: quote the line as one word to keep its own quoting",
    )
    p.add_argument(
        "--file",
        metavar="PATH",
        help="submit one job per line of PATH ('-' = stdin); lines with shell syntax run in sh",
    )
    p.add_argument(
        "--spec",
        metavar="PATH",
        help="submit the spec(s) in a TOML or JSON file (one spec, or a 'jobs' list); "
        "options given with it fill in what a spec leaves out",
    )
    p.add_argument(
        "--like",
        type=job_id_arg,
        metavar="ID",
        help="job ID's spec again (options and a command given here replace its own), with "
        "the vram_gb its usage suggests unless --vram-gb is given",
    )
    svc = p.add_argument_group("services")
    svc.add_argument(
        "--service", action="store_true", help="keep CMD running: restart it, give it $PORT"
    )
    svc.add_argument("--replicas", type=_field("replicas"), help="copies to run (default 1)")
    svc.add_argument(
        "--restart",
        choices=["always", "on_failure"],
        help="restart a replica after any exit (default) or a non-zero one only",
    )
    svc.add_argument("--max-restarts", type=_field("max_restarts"), metavar="N", help="per replica")
    svc.add_argument("--no-port", action="store_true", help="do not give replicas a $PORT")
    svc.add_argument(
        "--max-attempts",
        type=_field("max_attempts"),
        metavar="N",
        help="placements after a lost GPU",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the job as JSON (several, from --file or --spec: their rows, as jobs --json)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")


def _jobs_args(p: argparse.ArgumentParser) -> None:
    from ..wire import JOB_SORTS, JobStatus

    # (a,b takes no argparse choices: the words are offered all the same; tester h62)
    completes(
        p.add_argument(
            "--status",
            action="append",
            default=[],
            help="filter (repeat or a,b; active: pending, queued and running)",
        ),
        # (a comma list: `--status queued,<Tab>` offered nothing: tester h153)
        "list:active " + " ".join(s.value for s in JobStatus),
    )
    p.add_argument(
        "--filter",
        metavar="TEXT",
        default="",
        help=(
            "only jobs whose id, name, command, message, status, project, a domain name or "
            "owner's user name contains TEXT (any case)"
        ),
    )
    p.add_argument(
        "--since",
        type=_field("timeout"),
        metavar="AGO",
        help="only jobs submitted in the last AGO: seconds, or 90m, 12h, 2d",
    )
    p.add_argument("--limit", type=count_arg, default=50, help="rows per page (default 50)")
    paging = p.add_mutually_exclusive_group()
    paging.add_argument("--before", type=job_id_arg, metavar="ID", help="jobs older than ID")
    paging.add_argument(
        "--after", type=job_id_arg, metavar="ID", help="jobs newer than ID, oldest first"
    )
    paging.add_argument("--page", type=count_arg, metavar="N", help="page N of --limit rows")
    p.add_argument(
        "--sort",
        choices=JOB_SORTS,
        default="id",
        help="order (default id, newest first; name, status, user and kind ascend, the "
        "others start with the biggest)",
    )
    p.add_argument("--reverse", action="store_true", help="reverse the order")
    p.add_argument("--json", action="store_true", help="one JSON row per line, in a JSON list")


def _status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", type=job_id_arg)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", action="store_true", help="also plot each GPU's VRAM and utilisation")
    p.add_argument(
        "--last",
        type=positive_int,
        metavar="N",
        default=TIMELINE_SHOWN,
        help=f"the timeline's last N entries (default {TIMELINE_SHOWN}; 0: all of it)",
    )


def _logs_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", type=job_id_arg)
    p.add_argument("--replica", type=positive_int, help="a service's replica (default 0)")
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    p.add_argument(
        "-n",
        "--tail",
        type=positive_int,
        metavar="LINES",
        help="only the last LINES lines (with -f: then what comes; 0: only what comes)",
    )
    p.add_argument(
        "--raw",
        action="store_true",
        help="the output as it is on a terminal (default: another user's with its controls "
        "escaped; one's own less its title, clipboard, screen and mouse sequences)",
    )


def _wait_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "job",
        type=job_ids_arg,
        action=JobIdsAction,
        nargs="+",
        help="one or more job ids (or ids separated by commas): waits until every one has "
        "ended (exit 0 only if each completed)",
    )
    p.add_argument(
        "--timeout",
        type=seconds_or_zero,
        metavar="SECONDS",
        help="wait at most this long in all: seconds or 90m, 2h (exit 5 if a job has not "
        "ended by then; 0 only asks: a poll)",
    )
    p.add_argument("--json", action="store_true")


def _cancel_args(p: argparse.ArgumentParser) -> None:
    completes(
        p.add_argument(
            "job",
            type=job_ids_arg,
            action=JobIdsAction,
            nargs="+",
            help="one or more job ids (or ids separated by commas)",
        ),
        # (active jobs only: ended ones, which cancel refuses, were offered: tester h153)
        "jobs:active",
    )
    # (--timeout with --no-wait was taken and meant nothing: there is no wait to bound)
    waiting = p.add_mutually_exclusive_group()
    waiting.add_argument(
        "--no-wait", action="store_true", help="return without waiting for the end"
    )
    waiting.add_argument(
        "--timeout",
        type=positive_number,
        metavar="SECONDS",
        help="wait at most this long for the end, exit 5 if it runs out (default: until 60 s "
        "past its SIGKILL)",
    )
    p.add_argument("--json", action="store_true")


def _adopt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pid", type=_field("pid"), required=True, metavar="PID")
    p.add_argument("--name")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--vram-gb", type=_field("vram_gb"), help="declared GiB per GPU")
    group.add_argument(
        "--gpu",
        action="store_true",
        # (it said "on the GPUs where it holds memory", which adopt does by itself: h131)
        help="a GPU job though it holds no GPU memory yet: on the one GPU (else --domain)",
    )
    completes(
        p.add_argument(
            "--domain",
            action="append",
            help="adopt on this domain (repeat or a,b)",
        ),
        "domains",
    )
    p.add_argument("--json", action="store_true")


def _domain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action", nargs="?", default="list", choices=["list", "drain", "release", "forget"]
    )
    completes(
        p.add_argument(
            "name",
            nargs="?",
            help="the domain (for drain and release; for list, that one alone); for forget, "
            "the last domain (or UUID) of a GPU the driver no longer lists",
        ),
        # (those the action applies to: release offered domains in service: tester h153)
        "domains:by-action",
    )
    p.add_argument("--reason", help="why it is drained (shown to users)")
    p.add_argument("--json", action="store_true")


def _clean_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--older-than",
        type=days_arg,
        metavar="DAYS",
        help="finished jobs that ended more than DAYS ago: days, or 12h, 30d, 2w (not m)",
    )
    p.add_argument(
        "--keep",
        type=positive_int,
        metavar="N",
        # (it read as a floor beside --older-than, where either rule removes: tester h172)
        help="remove all but the N finished jobs that ended last (with --older-than, a job "
        "either one selects is removed)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="only say which jobs would go, and the space their files take; remove nothing",
    )
    p.add_argument("--json", action="store_true")


def _signal_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("pid", type=_field("pid"))
    p.add_argument(
        "--signal", default="TERM", metavar="NAME", help="TERM (default), INT, HUP, KILL, ..."
    )
    p.add_argument(
        "--start-ticks", type=_field("start_ticks"), help="only if the pid is still this process"
    )


CLEARED = {
    "timeout": "no time limit",
    "vram": "declare no VRAM",
    "project": "in no project",
}
"""What ``edit --no-X`` takes away (the TUI's form does it with an empty field)."""


def _edit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", type=job_id_arg)
    p.add_argument("--priority", type=_field("priority"), help="higher starts first")
    p.add_argument("--gpus", type=_field("gpus"), help="GPUs it needs (per replica)")
    p.add_argument("--vram-gb", type=_field("vram_gb"), help="GiB needed on each GPU")
    p.add_argument(
        "--timeout",
        type=_field("timeout"),
        metavar="SECONDS",
        help="stop it this long after it starts: seconds, or 90m, 2h, 1h30m, 1d, 1w",
    )
    p.add_argument("--name", help="its name")
    p.add_argument("--project", help="its project")
    p.add_argument(
        "--replicas",
        type=_field("replicas"),
        help="a service's copies; a running one is scaled: more start on what is free now, "
        "fewer stop (the highest-numbered)",
    )
    for what, help_text in CLEARED.items():
        p.add_argument(f"--no-{what.replace('_', '-')}", action="store_true", help=help_text)
    p.add_argument(
        "--after",
        type=job_ids_arg,
        action=JobIdsAction,
        metavar="ID",
        help="wait for job ID to complete (replaces what it waits for; repeat for more)",
    )
    p.add_argument(
        "--after-any",
        type=job_ids_arg,
        action=JobIdsAction,
        metavar="ID",
        help="wait for job ID to end, whatever its outcome (replaces, like --after)",
    )
    p.add_argument("--no-deps", action="store_true", help="wait for no other job")
    p.add_argument(
        "--json",
        action="store_true",
        help='the job as edited, with "changed": false when it had what was asked already',
    )


def _restart_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", type=job_id_arg)
    p.add_argument("--json", action="store_true")


def _users_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def _why_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", type=job_id_arg)
    p.add_argument("--json", action="store_true")


def _doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def _gpus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def _stop_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=positive_number,
        default=None,
        metavar="SECONDS",
        help="how long to wait for it to stop (default: GPULAYER_TIMEOUT, else 30)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="stop it even while its database cannot be written (what it has not stored "
        "yet is lost)",
    )


def _install_service_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--system",
        action="store_true",
        help="a system-wide unit (/etc/systemd/system) for a shared machine; needs root",
    )
    p.add_argument(
        "--user",
        metavar="NAME",
        help="with --system: the account the engine (and every job) runs as (default: the "
        "invoking user, $SUDO_USER under sudo)",
    )
    p.add_argument(
        "--print", dest="print_unit", action="store_true", help="print the unit, write nothing"
    )
    p.add_argument("--force", action="store_true", help="replace an existing, different unit")
    completes(
        p.add_argument(
            "--unit-dir",
            metavar="DIR",
            type=_not_empty("a folder"),
            help="write it into DIR (default: $XDG_CONFIG_HOME/systemd/user, or "
            "/etc/systemd/system with --system)",
        ),
        "dirs",
    )


def _web_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host",
        default="127.0.0.1",
        type=_not_empty("an address"),
        help="address to listen on (default 127.0.0.1: reach it through an SSH tunnel)",
    )
    p.add_argument(
        "--port", type=port_arg, default=8765, help="TCP port (default 8765; 0: any free)"
    )
    p.add_argument(
        "--max-sessions",
        type=count_arg,
        default=8,
        metavar="N",
        help="browser sessions served at once (default 8; each runs a TUI of its own, "
        "~70 MiB); one more is answered 503",
    )


def _completion_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=("bash", "zsh", "fish"), help="the shell to complete in")


_SUBCOMMAND_TABLE: dict[str, tuple[str, str, Callable[[argparse.ArgumentParser], None]]] = {
    "submit": (
        "submit a batch job or a service",
        "Submit a batch job, or with --service a long-running service.",
        _submit_args,
    ),
    "jobs": ("list jobs", "", _jobs_args),
    "status": ("show one job (exit 1 if it ended without completing)", "", _status_args),
    "pause": (
        "pause the queue: nothing new starts (running jobs go on)",
        "Pause the queue: waiting jobs stay waiting (they say so) and running jobs go on, "
        "until `gpulayer-tui resume`; kept across an engine restart.",
        lambda p: None,
    ),
    "resume": ("let the queue start jobs again", "", lambda p: None),
    "restart": (
        "submit an ended job again (same spec, a new id)",
        "Submit an ended job's spec again as a new job whose spec says restart_of; a "
        "snapshot is taken afresh from where the first was taken. A dependency that ended "
        "without completing is replaced by its newest restart (restart a chain from its "
        "first job down); with none the restart is refused.",
        _restart_args,
    ),
    "signal": (
        "signal a stray GPU process (one no job owns)",
        "Send a signal (default TERM) to a process the GPU view lists as unregistered: "
        "your own, or anyone's as root; never a job's (cancel the job), init, the engine.",
        _signal_args,
    ),
    "edit": (
        "change a waiting job (priority, GPUs, VRAM, timeout, name, project, dependencies), "
        "or scale a running service (--replicas)",
        "Change a job that has not started: it goes back into the queue under its new "
        "priority and needs. Refused (the job unchanged) if it could then never run. "
        "--after/--after-any/--no-deps replace the jobs it waits for as a whole. A running "
        "service takes --replicas alone: replicas added start at once on what is free "
        "(refused, nothing changed, if there is no room now), replicas removed are stopped "
        "and give their GPUs back once they have ended.",
        _edit_args,
    ),
    "users": (
        "fair share: each user's recent GPU use, running and waiting jobs, limits",
        "Users in fair-share order (least recent GPU use first: within a priority, their "
        "jobs start first), with what they run, what waits and their [users.*] limits.",
        _users_args,
    ),
    "why": (
        "say why a job waits",
        "Why a waiting job waits: its place in the queue and what is ahead of it, what it "
        "waits for, the reservation, its user's limits and the fair-share order.",
        _why_args,
    ),
    "logs": ("print a job's output", "", _logs_args),
    "wait": ("wait for jobs to end; exit 0 only if each completed", "", _wait_args),
    "cancel": ("cancel jobs (SIGTERM, then SIGKILL)", "", _cancel_args),
    "adopt": (
        "adopt a running process as a job",
        "Adopt a process started elsewhere (nohup, tmux, a notebook): it becomes a running "
        "job, its GPU memory counts as owned, and it can be waited on and cancelled. Its "
        "command is never run again by gpulayer-tui.",
        _adopt_args,
    ),
    "domain": ("list, drain or release domains; forget a GPU removed for good", "", _domain_args),
    "clean": (
        "remove old finished jobs (their rows, timelines and logs)",
        "Remove finished jobs that ended more than DAYS ago and/or all but the N "
        "that ended last: their rows, timelines and log files. Running and queued jobs are "
        "never touched; ids are never given again. [history] keep_days in the config does "
        "this every hour.",
        _clean_args,
    ),
    "doctor": (
        "check the driver, config, engine, domains, sampling, disk and clock",
        "",
        _doctor_args,
    ),
    "gpus": ("domains, GPU samples and unregistered VRAM", "", _gpus_args),
    "stop": (
        "stop the background engine (--serve); its running jobs go on",
        "Stop the engine serving this state dir (SIGTERM, as systemd would) and wait for "
        "it to end. Running jobs go on under the launcher; the next engine takes them "
        "back. An engine inside a TUI is stopped by quitting that TUI.",
        _stop_args,
    ),
    "install-service": (
        "write a systemd unit that runs the engine (--serve)",
        "Write a systemd user unit (or with --system a system-wide one) that runs this "
        "installation's `gpulayer-tui --serve` (Type=notify; stopping it leaves running "
        "jobs running), then print the systemctl commands that start it. An existing, "
        "different unit is replaced only with --force.",
        _install_service_args,
    ),
    "web": (
        "serve the TUI to a browser (token in the URL; 127.0.0.1 unless --host)",
        "Serve the TUI to web browsers (textual-serve) on 127.0.0.1:8765 until Ctrl+C or "
        "SIGTERM. It prints a URL with a random token; requests without it get 403. Each "
        "browser tab runs its own TUI attached to the engine already serving (it never starts "
        "one). From another machine: ssh -L 8765:127.0.0.1:8765 box, then open the URL.",
        _web_args,
    ),
    "completion": (
        "print a shell completion script (bash, zsh, fish)",
        'Print a completion script: add `eval "$(gpulayer-tui completion bash)"` to '
        '~/.bashrc, `eval "$(gpulayer-tui completion zsh)"` to ~/.zshrc (after compinit), '
        "or run `gpulayer-tui completion fish | source` in ~/.config/fish/config.fish. It "
        "completes subcommands, options, job ids and domain names (from a running engine).",
        _completion_args,
    ),
}
"""Each subcommand: its one-line help, its description, and what adds its arguments."""
SUBCOMMANDS = frozenset(_SUBCOMMAND_TABLE)
_GLOBAL_WITH_VALUE = frozenset(("--simulate", "--simulate-if-no-gpu", "--config"))


def subcommand_of(words: Sequence[str]) -> str | None:
    """The subcommand ``words`` name, found the way argparse will (global options come
    first); ``None`` if there is none or it is unknown (then the whole grammar is built,
    for the TUI, ``--help`` and argparse's own error)."""
    it = iter(words)
    for word in it:
        if word in _GLOBAL_WITH_VALUE:
            next(it, None)
        elif word == "--":
            return None
        elif not word.startswith("-"):
            return word if word in SUBCOMMANDS else None
    return None
