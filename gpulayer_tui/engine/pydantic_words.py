"""pydantic's constraint errors in the words the rest of our errors use.

"restart: Input should be 'always' or 'on_failure'" stood beside our own "must be from 1
to 64, not 0", and "services.check_interval: Input should be greater than or equal to 0"
in a config rejection (tester h168): one voice for every refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TYPE_WORDS = {
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be text",
    "list_type": "must be a list",
    "dict_type": "must be an object",
}
"""pydantic's type errors in the words of the rest ("gpus: Input should be a valid
integer" of ``"gpus": true``: tester h86)."""


def _bound(value: Any) -> str:
    """A bound as written: ``0``, not ``0.0`` (a float field's bound: tester h170)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _count(length: object, kind: str) -> str:
    """``1 item``, ``2 characters`` ("at least 1 items": tester h193)."""
    unit = "character" if kind.startswith("string") else "item"
    return f"{length} {unit}" + ("" if length == 1 else "s")


def constraint_words(item: Mapping[str, Any]) -> str | None:
    """What a pydantic error ``item`` (one of ``ValidationError.errors()``) asks of its
    value, as ``must be ...``; ``None`` for an error type said otherwise (a type error, a
    validator of ours: its own words)."""
    ctx = item.get("ctx") or {}
    kind = str(item.get("type"))
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}"
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("more than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        return f"must be {words} {_bound(ctx.get(key))}"
    if kind == "finite_number":
        return "must be a finite number"
    if kind in ("string_too_long", "too_long"):
        return f"must have at most {_count(ctx.get('max_length'), kind)}"
    if kind in ("string_too_short", "too_short"):
        return f"must have at least {_count(ctx.get('min_length'), kind)}"
    return None
