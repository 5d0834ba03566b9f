"""Textual screens, one per area (the TUI lands in a later change)."""
