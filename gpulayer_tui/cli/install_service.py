"""``gpulayer-tui install-service``: a systemd unit that runs this installation's
``gpulayer-tui --serve``.

The units are text templates shipped in the package (``gpulayer_tui/units/``); this fills
in the command line (the absolute path of the script or interpreter running now, so a
pipx or venv install works), the environment and, for the system-wide unit, ``User=``.
It writes the unit (never over a different one without ``--force``) and prints the
``systemctl`` commands; it runs none itself.
"""

from __future__ import annotations

import errno
import os
import sys

from ..fields import printable
from .exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:
    import argparse

    from ..engine.paths import Paths

UNIT_NAME = "gpulayer-tui.service"
SYSTEM_UNIT_DIR = "/etc/systemd/system"
_TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "units")


class UnitError(ValueError):
    """The unit cannot be made as asked (the message says why)."""


def _error(message: str) -> None:
    print(f"gpulayer-tui: {printable(message)}", file=sys.stderr)


def _check_text(what: str, text: str) -> str:
    # A newline would start a new line of the unit (a directive of someone's choosing).
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise UnitError(f"{what} {printable(text)} has a control character: not for a unit file")
    return text


def _escape_specifiers(text: str) -> str:
    return text.replace("%", "%%")  # systemd expands %h, %u, ... in most settings


def exec_word(word: str) -> str:
    """``word`` as one word of ``ExecStart=`` (quoted where systemd would split or expand
    it: spaces, quotes, backslashes, ``$``, ``%``)."""
    _check_text("the path", word)
    word = _escape_specifiers(word)
    if word and all(c.isalnum() or c in "/._-+,:@=" for c in word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$") + '"'


def environment_line(name: str, value: str) -> str:
    """``Environment="NAME=VALUE"``, quoted for systemd."""
    _check_text(name, value)
    value = _escape_specifiers(f"{name}={value}")
    return 'Environment="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def serve_command(
    config: str | None = None,
    simulate: str | None = None,
    simulate_if_no_gpu: str | None = None,
) -> list[str]:
    """The command line of this installation's engine: the ``gpulayer-tui`` script that
    is running, else this interpreter with ``-m gpulayer_tui`` (both absolute); with the
    ``--config`` and the simulated GPUs given (a box without a driver, a demo: the unit
    could not carry them, tester h152)."""
    script = sys.argv[0] if sys.argv else ""
    if (
        os.path.basename(script) == "gpulayer-tui"
        and os.path.isfile(script)
        and os.access(script, os.X_OK)
    ):
        words = [os.path.abspath(script)]
    else:
        words = [os.path.abspath(sys.executable), "-m", "gpulayer_tui"]
    if config is not None:
        words += ["--config", os.path.abspath(os.path.expanduser(config))]
    if simulate is not None:
        words += ["--simulate", simulate]
    if simulate_if_no_gpu is not None:
        words += ["--simulate-if-no-gpu", simulate_if_no_gpu]
    return [*words, "--serve"]


def python_path(command: list[str]) -> str | None:
    """The ``PYTHONPATH`` the unit's engine needs to import this code, or None.

    What this process ran with (made absolute: the unit runs in another directory), and
    for ``python -m gpulayer_tui`` the folder this package was imported from where the
    interpreter would not find it alone (a checkout run in place, an install made with
    ``pip install --target``): without it the unit's engine fails "No module named
    gpulayer_tui", or runs another installed copy.
    """
    import sysconfig

    entries = [os.path.abspath(e) for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if "-m" in command:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import site

        found = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
        if site.ENABLE_USER_SITE:
            found.add(site.getusersitepackages())
        known = {os.path.realpath(path) for path in found}
        if os.path.realpath(root) not in known and root not in entries:
            entries.insert(0, root)
    unique = list(dict.fromkeys(entries))
    return os.pathsep.join(unique) if unique else None


def render_unit(
    system: bool, command: list[str], environment: dict[str, str], user: str | None = None
) -> str:
    """The unit's text from its template."""
    name = "gpulayer-tui.system.service" if system else UNIT_NAME
    with open(os.path.join(_TEMPLATES, name), encoding="utf-8") as fh:
        text = fh.read()
    env = "\n".join(environment_line(k, v) for k, v in sorted(environment.items()))
    text = text.replace("@EXEC_START@", " ".join(exec_word(w) for w in command))
    text = text.replace("@ENVIRONMENT@\n", env + "\n" if env else "")
    if system:
        assert user is not None
        text = text.replace("@USER@", _escape_specifiers(_check_text("the user", user)))
    return text


def _invoking_user() -> str:
    import pwd

    if os.geteuid() == 0 and os.environ.get("SUDO_USER"):
        return os.environ["SUDO_USER"]  # `sudo gpulayer-tui install-service --system`
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        raise UnitError(f"uid {os.getuid()} has no user name: give --user NAME") from None


def _user_unit_dir() -> str:
    from ..engine.paths import xdg_dir

    config = xdg_dir("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(config, "systemd", "user")


def _write(target: str, text: str) -> None:
    """Write ``text`` to ``target`` through a temporary file and a rename (a unit is never
    seen half-written), mode 0644, never through a link."""
    temp = f"{target}.{os.getpid()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def run_install_service(args: argparse.Namespace, paths: Paths) -> int:
    """The ``install-service`` subcommand."""
    import pwd

    environment: dict[str, str] = {}
    if os.environ.get("GPULAYER_HOME"):
        environment["GPULAYER_HOME"] = paths.state_text  # the engine must serve this one
    try:
        if args.user is not None and not args.system:
            raise UnitError("--user applies to --system (a user unit runs as you)")
        user = None
        if args.system:
            user = args.user if args.user is not None else _invoking_user()
            try:
                account = pwd.getpwnam(user)
            except KeyError:
                raise UnitError(f"no user named {user!r} on this machine (--user)") from None
            if account.pw_uid == 0 and args.user is None:
                raise UnitError(
                    "the engine would run as root, and every job with it: give --user NAME "
                    "(the account jobs should run as), or --user root if you mean it"
                )
        command = serve_command(
            args.config,
            getattr(args, "simulate", None),
            getattr(args, "simulate_if_no_gpu", None),
        )
        path = python_path(command)
        if path is not None:
            environment["PYTHONPATH"] = path
        text = render_unit(args.system, command, environment, user)
    except UnitError as err:
        _error(str(err))
        return EXIT_USAGE
    if args.print_unit:
        sys.stdout.write(text)
        return EXIT_OK

    directory = args.unit_dir or (SYSTEM_UNIT_DIR if args.system else _user_unit_dir())
    target = os.path.join(os.path.abspath(os.path.expanduser(directory)), UNIT_NAME)
    shown = printable(target)
    try:
        if not args.system:
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        elif not os.path.isdir(os.path.dirname(target)):
            where = os.path.dirname(target)
            _error(f"{where} does not exist or is not a directory: is systemd installed here?")
            return EXIT_FAILED
        try:
            with open(target, encoding="utf-8", errors="replace") as fh:
                existing: str | None = fh.read()
        except FileNotFoundError:
            existing = None
        if existing == text:
            print(f"{shown} is already this unit (unchanged)")
        elif existing is not None and not args.force:
            _error(
                f"{target} exists and is a different unit: not replaced. --force replaces it "
                "(--print shows the one this would write)"
            )
            return EXIT_FAILED
        else:
            _write(target, text)
            print(f"{'replaced' if existing is not None else 'wrote'} {shown}")
    except OSError as err:
        if isinstance(err, BrokenPipeError):
            raise  # (stdout closed: the unit was written; main() says nothing of it)
        if isinstance(err, FileExistsError) or (
            os.path.exists(os.path.dirname(target)) and not os.path.isdir(os.path.dirname(target))
        ):
            _error(f"cannot write {target}: {printable(directory)} is not a directory")
            return EXIT_FAILED
        if not isinstance(err, PermissionError) and err.errno != errno.EROFS:
            _error(f"cannot write {target}: {err.strerror or err}")
            return EXIT_FAILED
        where = os.path.dirname(target)
        _error(
            f"no permission to write {where}: a system-wide unit needs root, e.g. "
            f"`sudo {printable(' '.join(serve_command()[:-1]))} install-service --system`; "
            "or --print it and install it yourself"
            if args.system
            else f"no permission to write {where}"
        )
        return EXIT_FAILED
    default = SYSTEM_UNIT_DIR if args.system else _user_unit_dir()
    if os.path.realpath(os.path.dirname(target)) != os.path.realpath(default):
        # (the steps below name systemctl, which never reads this folder)
        print(
            f"note: systemd reads units from {printable(default)}, not from "
            f"{printable(os.path.dirname(target))}: copy or link it there for the steps below"
        )
    _print_next_steps(args.system, user, paths, environment)
    return EXIT_OK


def _print_next_steps(
    system: bool, user: str | None, paths: Paths, environment: dict[str, str]
) -> None:
    import shutil

    if system:
        import pwd

        assert user is not None
        home = pwd.getpwnam(user).pw_dir
        state = environment.get("GPULAYER_HOME") or os.path.join(home, ".local/state/gpulayer")
        config = (
            os.path.join(state, "config.toml")
            if "GPULAYER_HOME" in environment
            else os.path.join(home, ".config/gpulayer/config.toml")
        )
        account = pwd.getpwnam(user)
        try:
            owner = os.stat(state).st_uid
        except OSError:
            owner = None  # (the engine makes it, where its user may)
        if owner is not None and owner != account.pw_uid:
            # (It wrote a unit for `--user nobody` serving root's 0700 state dir, which that
            # user cannot open: the engine would never start, and nothing said so: h49.)
            print(
                f"warning: {printable(state)} belongs to uid {owner}, not to "
                f"{printable(user)} (uid {account.pw_uid}): the engine, run as "
                f"{printable(user)}, cannot use it and will not start; chown it to "
                f"{printable(user)}, or set GPULAYER_HOME to a state dir of theirs",
                file=sys.stderr,
            )
        print("next, as root:")
        print("  systemctl daemon-reload")
        print(f"  systemctl enable --now {UNIT_NAME}")
        print(
            f"note: the engine runs as {printable(user)}, and so does every job, whoever "
            f"submits it. Other users can use it only once its config "
            f"({printable(config)}) lists them in [security] allowed_uids / allowed_groups; "
            f"they then set GPULAYER_HOME={printable(state)} (and must be able to enter its "
            "parent directories). See docs/security.md."
        )
    else:
        try:
            name = _invoking_user()
        except UnitError:
            name = "$USER"
        print("next, to start it now and at each login:")
        print("  systemctl --user daemon-reload")
        print(f"  systemctl --user enable --now {UNIT_NAME}")
        print("and to keep it (and its jobs) running while you are logged out, from boot:")
        print(f"  loginctl enable-linger {printable(name)}")
        print(f"its log: journalctl --user -u {UNIT_NAME}")
    if shutil.which("systemctl") is None:
        print("(systemctl was not found on this machine: the unit needs systemd)")
