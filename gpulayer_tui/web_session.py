"""One browser session of ``gpulayer-tui web``: the TUI, attached to the running engine.

textual-serve runs ``python -m gpulayer_tui.web_session --config PATH`` once per browser
tab, with Textual's web driver selected in the environment (see :mod:`.web`). It attaches
to the engine serving the state dir and never starts one (without one the page says how
to start it).
"""

from __future__ import annotations

import signal
import sys


def main(argv: list[str] | None = None) -> int:
    """Run one session; return its exit code."""
    from .engine.paths import resolve_paths
    from .tui import run_tui

    # Ctrl+C at the terminal of `gpulayer-tui web` reaches its whole process group, these
    # sessions too; the server ends them itself (a quit message, then a kill). Once the app
    # runs, Textual's web driver takes SIGINT/SIGTERM over and exits cleanly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    words = sys.argv[1:] if argv is None else argv
    config = words[1] if len(words) == 2 and words[0] == "--config" else None
    return run_tui(resolve_paths(config), None, None, attach_only=True)


if __name__ == "__main__":
    sys.exit(main())
