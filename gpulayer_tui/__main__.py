"""``python -m gpulayer_tui`` and the ``gpulayer-tui`` console script."""

from __future__ import annotations

import sys


def main() -> None:
    """Run the command line and exit with its status."""
    from .cli.main import main as cli_main

    sys.exit(cli_main())


if __name__ == "__main__":
    main()
