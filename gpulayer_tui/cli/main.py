"""Command line: ``gpulayer-tui [--serve] [SUBCOMMAND ...]``.

Kept lean on purpose: the common forms of ``submit``, ``status`` and ``jobs`` are read by
:mod:`.quick` (no argparse, no :mod:`re`), everything else by the argparse grammar in
:mod:`.grammar`; then the stdlib client. The engine (pydantic, aiosqlite, aiohttp) is
imported for ``--serve`` alone, so a ``submit`` starts about as fast as Python.

Exit codes: 0 success; 1 the job did not complete / the engine refused; 2 bad usage or
invalid input; 3 no engine is running.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ..engine.paths import Paths


class _ParserOnDemand:
    """Stands in for the parser on the quick path (see ``quick.py``): argparse is built
    only if a handler refuses the input (``error``: usage on stderr, exit 2)."""

    def __init__(self, words: Sequence[str]) -> None:
        self._words = words

    def error(self, message: str) -> None:
        from .grammar import build_parser, parser_for, subcommand_of

        command = subcommand_of(self._words)
        parser = parser_for(build_parser(only=command), command)
        words = list(self._words)
        parser._json_asked = "--json" in (words[: words.index("--")] if "--" in words else words)  # type: ignore[attr-defined]
        parser.error(message)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpulayer-tui`` command."""
    import os
    import sys

    global _stdout_closed
    _stdout_closed = sys.stdout is None
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:  # (started with it closed, `>&-`: as /dev/null)
            setattr(sys, name, open(os.devnull, "w"))
    try:
        return _main(argv)
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        # An answer of another shape than this version reads (an engine of another
        # version: it keeps its code until restarted) ended in a traceback (tester h149).
        from .. import __version__

        sys.stderr.write(
            f"gpulayer-tui: the engine's answer is not what gpulayer-tui {__version__} reads "
            f"({type(err).__name__}: {err}); an engine of another version? `gpulayer-tui "
            "doctor` names its version (stop it and start it again to run this one)\n"
        )
        return 1
    except BrokenPipeError:
        # Its reader went away (`| head`, `| :`): nothing more to say, and no traceback
        # (`completion`, `doctor` and `install-service --print` ended in one).
        _quiet_stdout()
        return 0
    except OSError as err:
        import errno

        if err.filename is not None or err.errno not in (errno.ENOSPC, errno.EIO, errno.EBADF):
            raise
        # Its output could not be written (`> /dev/full`, a full disk): said, no traceback,
        # and not as bad input (exit 2 says nothing changed, and the command had acted).
        _quiet_stdout()
        done = getattr(err, "done", None)  # (what it did, where the output would say it)
        ran = f"the command ran: {done}" if done else "the command ran"
        sys.stderr.write(
            f"gpulayer-tui: cannot write the output: {err.strerror} ({ran}; only its output "
            "was lost)\n"
        )
        return 1


_stdout_closed = False
"""Whether the command started with its standard output closed (``>&-``)."""


def _quiet_stdout() -> None:
    """Point stdout at /dev/null (no "Exception ignored" from its flush at exit)."""
    import os
    import sys

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _main(argv: Sequence[str] | None) -> int:
    import sys

    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] == "__complete":  # (hidden: the completion scripts' fast path)
        from .complete import run_complete

        return run_complete(words[1:])
    from .quick import parse

    quick = parse(words)
    if quick is not None:
        args: Any = quick
        parser: Any = _ParserOnDemand(words)
    else:
        from .grammar import build_parser, did_you_mean, parser_for, subcommand_of

        parser = build_parser(only=subcommand_of(words))
        args, extra = parser.parse_known_args(words)
        if extra:  # (told with the subcommand's usage, not the top level's)
            sub = parser_for(parser, args.command)
            sub.error(f"unrecognized arguments: {' '.join(extra)}{did_you_mean(sub, extra)}")
    from ..engine.paths import resolve_paths

    paths = resolve_paths(args.config)
    if args.config is not None:  # (a typo ran on the defaults, silently; a unit would too)
        import os

        if not args.config:
            parser.error("--config needs a file (it was empty)")
        if not os.path.exists(paths.config_file):
            parser.error(f"--config: no such file: {paths.config_file}")
        if not os.path.isfile(paths.config_file):
            parser.error(f"--config: not a regular file: {paths.config_file}")
    if args.command != "completion":  # (install-service too: it wrote a unit for it)
        from ..engine.paths import state_dir_problem

        problem = state_dir_problem(paths)
        if problem is not None:
            sys.stderr.write(f"gpulayer-tui: {problem}\n")
            return 2
    if args.simulate and args.simulate_if_no_gpu:
        # (checked before --serve too: it started with --simulate, the other ignored: h131)
        parser.error("give --simulate or --simulate-if-no-gpu, not both")
    if args.serve:
        if args.command:
            parser.error("--serve takes no subcommand")
        return _serve(paths, args.simulate, args.simulate_if_no_gpu, args.verbose)
    if args.command is None:
        from ..tui import run_tui

        return run_tui(paths, args.simulate, args.simulate_if_no_gpu)
    if (args.simulate or args.simulate_if_no_gpu) and args.command != "install-service":
        # (not "applies to --serve": the TUI takes it too, for the engine it starts: h94;
        # and the unit install-service writes, for the engine it runs: h152)
        flag = "--simulate" if args.simulate else "--simulate-if-no-gpu"
        parser.error(
            f"{flag} applies to an engine the command starts (--serve, the TUI with no "
            "subcommand, or the unit of install-service): the engine owns the GPUs"
        )
    if _stdout_closed:
        # (a submission's id, a status, went nowhere and it exited 0: refused before it
        # acts; `> /dev/null` discards the output on purpose)
        sys.stderr.write(
            "gpulayer-tui: standard output is closed (>&-): nothing was done; give "
            ">/dev/null to discard the output\n"
        )
        return 2
    if quick is None:  # (errors about a subcommand's arguments show its usage)
        parser = parser_for(parser, args.command)
    if args.command == "install-service":
        from .install_service import run_install_service

        return run_install_service(args, paths)
    if args.command == "completion":
        from .completion import completion_script

        sys.stdout.write(completion_script(args.shell))
        return 0
    if args.command == "web":
        from ..web import run_web  # (textual-serve, jinja2: loaded for `web` alone)

        return run_web(paths, args.host, args.port, args.max_sessions)
    if args.command == "doctor":
        from .doctor import run_doctor

        return run_doctor(paths, args.json, config_given=args.config is not None)
    from . import commands

    return commands.run(args, paths, parser)


def _serve(
    paths: Paths, simulate: str | None, simulate_if_no_gpu: str | None, verbose: bool
) -> int:
    """``--serve``: the state dir's lock is taken first, before the engine's modules are
    imported (most of a start's first second), so that a CLI call made meanwhile waits for
    this engine instead of saying none is serving (tester h113)."""
    import signal
    import sys

    from ..engine.errors import StoreError
    from ..engine.lock import EngineBusy, EngineLock
    from ..engine.statedir import claim_state_dir
    from ..fields import printable

    # Asked to stop before the engine's own handlers are in place (`stop` finds it by its
    # lock from the start): kept, and acted on as soon as it serves, with its usual
    # words ("engine stopped"); it died of the signal, silently, exit 143 (tester h117).
    stop_asked: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop_asked.append(signum))
    lock = EngineLock(paths.lock)
    try:
        claim_state_dir(paths, lock)
    except EngineBusy as err:
        sys.stderr.write(f"gpulayer-tui: {err}\n")
        from ..engine.simulate import simulate_problem

        bad = simulate_problem(simulate, simulate_if_no_gpu)
        if bad is not None:  # (said of the serving engine alone: tester h166)
            sys.stderr.write(f"gpulayer-tui: {printable(bad)} (not used: see above)\n")
        return 1
    except StoreError as err:
        sys.stderr.write(f"gpulayer-tui: {printable(str(err), keep=chr(10))}\n")
        return 2
    try:
        from ..engine.serve import run_serve

        return run_serve(
            paths, simulate, simulate_if_no_gpu, verbose, lock=lock, stop_asked=stop_asked
        )
    finally:
        lock.release()
