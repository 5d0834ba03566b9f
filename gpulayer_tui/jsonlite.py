"""JSON for the CLI's quick path, through the C accelerator the :mod:`json` package uses.

``import json`` costs a CLI call ~9 ms: ``json.decoder`` and ``json.encoder`` import
:mod:`re` (and with it :mod:`enum`, :mod:`functools`, :mod:`collections`), for the few
corner cases their pure-Python fallbacks handle. The scanner and encoder themselves are in
the builtin ``_json`` module, which imports nothing. This module drives them directly:
the same parser and encoder as ``json.loads``/``json.dumps`` (compact, ASCII), without the
imports. Where ``_json`` is missing (another Python implementation), it uses :mod:`json`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: importing typing costs ~2 ms of a CLI call)
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it
    _json = None  # type: ignore[assignment]


def _constant(name: str) -> float:
    return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


class _Context:
    """What ``_json.make_scanner`` reads from a decoder (json.JSONDecoder's defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_constant)
    memo: dict[str, str] = {}


def _fail(obj: object) -> Any:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


if _json is not None:
    _SCAN = _json.make_scanner(_Context())  # type: ignore[arg-type]  # (any object with the attributes)
    _ENCODE = _json.make_encoder(
        None, _fail, _json.encode_basestring_ascii, None, ":", ",", False, False, True
    )
    _ENCODE_SORTED = _json.make_encoder(
        None, _fail, _json.encode_basestring_ascii, None, ":", ",", True, False, True
    )


def loads(text: str) -> Any:
    """``json.loads(text)``.

    Raises:
        ValueError: ``text`` is not one JSON document.
    """
    if _json is None:  # pragma: no cover
        import json

        return json.loads(text)
    start = _skip_space(text, 0)
    try:
        value, end = _SCAN(text, start)
    except StopIteration:
        raise ValueError(f"not JSON at character {start}") from None
    if _skip_space(text, end) != len(text):
        raise ValueError(f"extra data after the JSON value at character {end}")
    return value


def dumps(value: Any, sort_keys: bool = False) -> str:
    """``json.dumps(value, separators=(",", ":"), sort_keys=sort_keys)``."""
    if _json is None:  # pragma: no cover
        import json

        return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys)
    return "".join((_ENCODE_SORTED if sort_keys else _ENCODE)(value, 0))


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\n\r":
        at += 1
    return at
