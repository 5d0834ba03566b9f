"""Widgets, one per module; messages are nested in the widget that sends them."""
