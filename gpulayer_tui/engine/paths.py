"""Where an engine keeps its files. Imports nothing heavy: the CLI uses it to find the socket.

Not even :mod:`pathlib` (~3.5 ms of a CLI call): the locations are kept as strings, and a
:class:`~pathlib.Path` is made only when the engine asks for one.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:
    from pathlib import Path


# A plain class, not a dataclass or NamedTuple: the CLI imports this module on every call,
# and ``dataclasses`` (inspect, ast, dis) costs ~6 ms there, a NamedTuple ~1 ms to build.
class Paths:
    """Where an engine keeps its files (immutable, compared by value).

    Args:
        state_dir: Database, socket, lock, logs (mode 0700).
        config_file: The TOML config (may not exist).
    """

    __slots__ = ("_config", "_state")
    _state: str
    _config: str

    def __init__(self, state_dir: str | os.PathLike[str], config_file: str | os.PathLike[str]):
        object.__setattr__(self, "_state", os.fspath(state_dir))
        object.__setattr__(self, "_config", os.fspath(config_file))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Paths is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Paths):
            return NotImplemented
        return (self._state, self._config) == (other._state, other._config)

    def __hash__(self) -> int:
        return hash((self._state, self._config))

    def __repr__(self) -> str:
        return f"Paths(state_dir={self._state!r}, config_file={self._config!r})"

    @staticmethod
    def _path(text: str) -> Path:
        from pathlib import Path

        return Path(text)

    @property
    def state_dir(self) -> Path:
        """Database, socket, lock, logs (mode 0700)."""
        return self._path(self._state)

    @property
    def config_file(self) -> Path:
        """The TOML config (may not exist)."""
        return self._path(self._config)

    @property
    def database(self) -> Path:
        """The SQLite database."""
        return self._path(os.path.join(self._state, "gpulayer.db"))

    @property
    def socket(self) -> Path:
        """The engine's Unix socket (mode 0600)."""
        return self._path(self.socket_file)

    @property
    def socket_file(self) -> str:
        """The engine's Unix socket, as a string (what the CLI's client needs)."""
        return os.path.join(self._state, "engine.sock")

    @property
    def state_text(self) -> str:
        """The state dir, as a string (for messages)."""
        return self._state

    @property
    def lock(self) -> Path:
        """The lock file that makes one engine per state dir."""
        return self._path(self.lock_file)

    @property
    def lock_file(self) -> str:
        """The lock file, as a string (the CLI's client looks at it without pathlib)."""
        return os.path.join(self._state, "engine.lock")

    @property
    def jobs_dir(self) -> Path:
        """Per-job directories (logs, exit status)."""
        return self._path(os.path.join(self._state, "jobs"))


def state_dir_problem(paths: Paths) -> str | None:
    """Why ``paths``' state dir cannot be one (it, or a folder on the way to it, is a
    file), or ``None``. A missing state dir is no problem: the engine makes it."""
    where = paths.state_text
    try:
        if os.stat(where).st_mode & 0o170000 == 0o040000:  # (S_ISDIR, without stat's import)
            return None
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        pass
    except OSError:
        return None  # (unreadable on the way: said by what then fails, with its path)
    named = " (GPULAYER_HOME)" if os.environ.get("GPULAYER_HOME") else ""
    return f"the state dir {where}{named} is not a directory"


def resolve_paths(config_file: str | os.PathLike[str] | None = None) -> Paths:
    """Work out the state dir and config file.

    ``GPULAYER_HOME`` sets both (``$GPULAYER_HOME/config.toml``); otherwise XDG:
    ``$XDG_STATE_HOME/gpulayer`` and ``$XDG_CONFIG_HOME/gpulayer/config.toml``.
    An explicit ``config_file`` wins for the config.
    """
    home = os.environ.get("GPULAYER_HOME")
    if home:
        state = os.path.expanduser(home)
        config = os.path.join(state, "config.toml")
    else:
        user = os.path.expanduser("~")
        xdg_state = xdg_dir("XDG_STATE_HOME") or os.path.join(user, ".local", "state")
        xdg_config = xdg_dir("XDG_CONFIG_HOME") or os.path.join(user, ".config")
        state = os.path.join(xdg_state, "gpulayer")
        config = os.path.join(xdg_config, "gpulayer", "config.toml")
    if config_file is not None:
        config = os.path.expanduser(os.fspath(config_file))
    return Paths(_absolute(state), _absolute(config))


def xdg_dir(name: str) -> str | None:
    """``$name`` (an XDG base directory) if set to an absolute path; the XDG spec says a
    relative one is ignored (and systemd ignores it: a unit written there was never read)."""
    value = os.environ.get(name)
    return value if value and os.path.isabs(value) else None


def _absolute(path: str) -> str:
    # Like Path.absolute(): joined to the working directory, not resolved or normalised
    # (beyond what Path itself drops: "." parts and doubled slashes).
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return "/" + "/".join(parts)
