"""Where an engine keeps its files. Imports nothing heavy: the CLI uses it to find the socket."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Paths:
    """Where an engine keeps its files.

    Attributes:
        state_dir: Database, socket, lock, logs (mode 0700).
        config_file: The TOML config (may not exist).
    """

    state_dir: Path
    config_file: Path

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
