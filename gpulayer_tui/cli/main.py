"""Command line: ``gpulayer-tui [--serve] [SUBCOMMAND ...]``.

Kept lean on purpose: parsing and the stdlib client only. The engine (pydantic, aiosqlite,
aiohttp) is imported for ``--serve`` alone, so a ``submit`` starts about as fast as Python.

Exit codes: 0 success; 1 the job did not complete / the engine refused; 2 bad usage or
invalid input; 3 no engine is running.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from .. import __version__, wire


def positive_int(text: str) -> int:
    """A whole number, 0 or more (limits, replica numbers)."""
    try:
        value = wire.parse_whole("value", text)
    except wire.FieldError as err:
        raise argparse.ArgumentTypeError(err.detail) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def job_id_arg(text: str) -> int:
    """A job id."""
    return _field("job")(text)  # type: ignore[no-any-return]


def positive_number(text: str) -> float:
    """A number greater than 0 (seconds to wait)."""
    try:
        value = wire.parse_number("value", text)
    except wire.FieldError as err:
        raise argparse.ArgumentTypeError(err.detail) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def days_arg(text: str) -> float:
    """A number of days, 0 or more."""
    try:
        value = wire.parse_number("days", text)
    except wire.FieldError as err:
        raise argparse.ArgumentTypeError(err.detail) from None
    if not 0 <= value <= 36500:
        raise argparse.ArgumentTypeError(f"must be from 0 to 36500 days, got {text}")
    return value


def _field(name: str) -> Callable[[str], Any]:
    """An argparse type that applies the wire contract's rule for ``name`` (the same one the
    engine and the TUI's form apply), so a bad value is refused here with the same words."""

    def parse(text: str) -> Any:
        try:
            return wire.parse_field(name, text)
        except wire.FieldError as err:
            raise argparse.ArgumentTypeError(err.detail) from None

    parse.__name__ = name  # argparse names the type in "invalid <name> value"
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The whole command-line grammar."""
    parser = argparse.ArgumentParser(
        prog="gpulayer-tui",
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

    p = sub.add_parser(
        "submit",
        help="submit a batch job or a service",
        description="Submit a batch job, or with --service a long-running service.",
    )
    p.add_argument("--name")
    p.add_argument("--project")
    p.add_argument("--gpus", type=_field("gpus"), help="GPUs needed (0 = CPU pool)")
    p.add_argument("--vram-gb", type=_field("vram_gb"), help="GiB needed on each GPU")
    p.add_argument("--domain", action="append", help="pin to a domain (repeat for a choice)")
    p.add_argument("--exclusive", action="store_true", help="hold every slot of its domains")
    p.add_argument(
        "--after",
        type=job_id_arg,
        action="append",
        default=[],
        metavar="ID",
        help="run after job ID completes (cancelled if it does not)",
    )
    p.add_argument(
        "--after-any",
        type=job_id_arg,
        action="append",
        default=[],
        metavar="ID",
        help="run after job ID ends, whatever its outcome",
    )
    p.add_argument("--timeout", type=_field("timeout"), metavar="SECONDS")
    p.add_argument(
        "--priority", type=_field("priority"), default=0, help="higher starts first (default 0)"
    )
    p.add_argument("--cwd", help="working directory (default: the current one)")
    p.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment variable"
    )
    p.add_argument(
        "--no-inherit-env",
        action="store_true",
        help="do not pass this shell's environment to the job",
    )
    p.add_argument("--shell", action="store_true", help="run CMD as one shell line (sh -c)")
    p.add_argument(
        "--file",
        metavar="PATH",
        help="submit one job per line of PATH ('-' = stdin); lines with shell syntax run in sh",
    )
    p.add_argument(
        "--spec",
        metavar="PATH",
        help="submit the spec(s) in a TOML or JSON file (one spec, or a 'jobs' list)",
    )
    svc = p.add_argument_group("services (record 000)")
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
    p.add_argument("--json", action="store_true", help="print the job(s) as JSON")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

    p = sub.add_parser("jobs", help="list jobs")
    p.add_argument("--status", action="append", default=[], help="filter (repeat or a,b)")
    p.add_argument("--limit", type=positive_int, default=50)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("status", help="show one job (exit 1 if it failed)")
    p.add_argument("job", type=job_id_arg)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("logs", help="print a job's output")
    p.add_argument("job", type=job_id_arg)
    p.add_argument("--replica", type=positive_int, help="a service's replica (default 0)")
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")

    p = sub.add_parser("wait", help="wait for a job; exit 0 only if it completed")
    p.add_argument("job", type=job_id_arg)
    p.add_argument("--timeout", type=positive_number, metavar="SECONDS")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("cancel", help="cancel a job (SIGTERM, then SIGKILL)")
    p.add_argument("job", type=job_id_arg)
    p.add_argument("--no-wait", action="store_true", help="return without waiting for the end")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "adopt",
        help="adopt a running process as a job",
        description="Adopt a process started elsewhere (nohup, tmux, a notebook): it "
        "becomes a running job, its GPU memory counts as owned, and it can be waited on "
        "and cancelled. Its command is never run again by gpulayer-tui.",
    )
    p.add_argument("--pid", type=_field("pid"), required=True, metavar="PID")
    p.add_argument("--name")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--vram-gb", type=_field("vram_gb"), help="declared GiB per GPU")
    group.add_argument("--gpu", action="store_true", help="on the GPUs where it holds memory")
    p.add_argument("--domain", action="append", help="adopt it on this domain (repeatable)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("domain", help="list, drain or release domains")
    p.add_argument("action", choices=["list", "drain", "release"])
    p.add_argument("name", nargs="?", help="the domain (for drain and release)")
    p.add_argument("--reason", help="why it is drained (shown to users)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "clean",
        help="remove old finished jobs (their rows, timelines and logs)",
        description="Remove finished jobs that ended more than DAYS ago and/or all but the "
        "newest N finished ones: their rows, timelines and log files. Running and queued jobs "
        "are never touched; ids are never given again. [history] keep_days in the config "
        "does this every hour.",
    )
    p.add_argument("--older-than", type=days_arg, metavar="DAYS")
    p.add_argument("--keep", type=positive_int, metavar="N", help="keep the newest N finished")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("doctor", help="check the driver, config, engine and domains")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("gpus", help="domains, GPU samples and unregistered VRAM")
    p.add_argument("--json", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpulayer-tui`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from ..engine.paths import resolve_paths

    paths = resolve_paths(args.config)
    if args.serve:
        if args.command:
            parser.error("--serve takes no subcommand")
        from ..engine.serve import run_serve

        return run_serve(paths, args.simulate, args.simulate_if_no_gpu, args.verbose)
    if args.simulate and args.simulate_if_no_gpu:
        parser.error("give --simulate or --simulate-if-no-gpu, not both")
    if args.command is None:
        from ..tui import run_tui

        return run_tui(paths, args.simulate, args.simulate_if_no_gpu)
    if args.simulate or args.simulate_if_no_gpu:
        parser.error("--simulate applies to --serve (the engine owns the GPUs)")
    if args.command == "doctor":
        from .doctor import run_doctor

        return run_doctor(paths, args.json)
    from . import commands

    return commands.run(args, paths, parser)
