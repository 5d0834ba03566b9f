"""gpulayer-tui: a terminal workstation manager for GPU machines."""

__version__ = "0.2.0"
