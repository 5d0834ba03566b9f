"""The ``gpulayer-tui`` command line (lean: stdlib only until a subcommand needs more)."""
