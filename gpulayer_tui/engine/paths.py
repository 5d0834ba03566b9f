"""Where an engine keeps its files. Imports nothing heavy: the CLI uses it to find the socket."""

from __future__ import annotations

import os
from pathlib import Path


# A plain class, not a dataclass or NamedTuple: the CLI imports this module on every call,
# and ``dataclasses`` (inspect, ast, dis) costs ~6 ms there, a NamedTuple ~1 ms to build.
class Paths:
    """Where an engine keeps its files (immutable, compared by value).

    Attributes:
        state_dir: Database, socket, lock, logs (mode 0700).
        config_file: The TOML config (may not exist).
    """

    __slots__ = ("config_file", "state_dir")
    state_dir: Path
    config_file: Path

    def __init__(self, state_dir: Path, config_file: Path) -> None:
        object.__setattr__(self, "state_dir", state_dir)
        object.__setattr__(self, "config_file", config_file)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Paths is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Paths):
            return NotImplemented
        return (self.state_dir, self.config_file) == (other.state_dir, other.config_file)

    def __hash__(self) -> int:
        return hash((self.state_dir, self.config_file))

    def __repr__(self) -> str:
        return f"Paths(state_dir={self.state_dir!r}, config_file={self.config_file!r})"

    @property
    def database(self) -> Path:
        """The SQLite database."""
        return self.state_dir / "gpulayer.db"

    @property
    def socket(self) -> Path:
        """The engine's Unix socket (mode 0600)."""
        return self.state_dir / "engine.sock"

    @property
    def lock(self) -> Path:
        """The lock file that makes one engine per state dir."""
        return self.state_dir / "engine.lock"

    @property
    def jobs_dir(self) -> Path:
        """Per-job directories (logs, exit status)."""
        return self.state_dir / "jobs"


def resolve_paths(config_file: str | os.PathLike[str] | None = None) -> Paths:
    """Work out the state dir and config file.

    ``GPULAYER_HOME`` sets both (``$GPULAYER_HOME/config.toml``); otherwise XDG:
    ``$XDG_STATE_HOME/gpulayer`` and ``$XDG_CONFIG_HOME/gpulayer/config.toml``.
    An explicit ``config_file`` wins for the config.
    """
    home = os.environ.get("GPULAYER_HOME")
    if home:
        state = Path(home).expanduser()
        config = state / "config.toml"
    else:
        xdg_state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        xdg_config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        state = Path(xdg_state) / "gpulayer"
        config = Path(xdg_config) / "gpulayer" / "config.toml"
    if config_file is not None:
        config = Path(config_file).expanduser()
    return Paths(state_dir=state.absolute(), config_file=config.absolute())
