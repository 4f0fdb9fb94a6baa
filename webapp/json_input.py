"""Reading JSON request bodies without letting their shape hurt the server (P9).

Python's parser answers a body nested 100,000 levels deep with ``RecursionError``, which
is not the ``ValueError`` werkzeug expects of bad JSON, so it became a 500; a body nested a
few hundred levels would also overflow every recursive walk after parsing. Here a body that
cannot be parsed, or is nested deeper than :data:`MAX_JSON_DEPTH`, is bad JSON like any
other: a 400 JSON answer saying why.
"""

from __future__ import annotations

from typing import Any

from flask import Request
from flask.json.provider import DefaultJSONProvider

from webapp.domain.errors import DomainError

# Deeper than any request SendDock documents needs (its deepest is 4: body, subscribers,
# one subscriber, its attributes), shallow enough for every recursive walk.
MAX_JSON_DEPTH = 32


def depth_over(value: Any, limit: int) -> bool:
    """True when ``value`` nests lists/objects more than ``limit`` levels deep (checked
    without recursion, so any parsed value can be checked)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _number(text: str) -> float | int:
    """A JSON number with a fraction or exponent: an int when it is a whole number
    (JSON Schema's "integer" includes 5.0, so an id sent as 5.0 is the id 5)."""
    value = float(text)
    return int(value) if value.is_integer() else value


class JSONProvider(DefaultJSONProvider):
    """Flask's JSON, whose ``loads`` raises ``ValueError`` (bad JSON) for input nested too
    deeply instead of ``RecursionError`` or a value too deep to walk."""

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        kwargs.setdefault("parse_float", _number)
        try:
            value = super().loads(s, **kwargs)
        except RecursionError:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
        if depth_over(value, MAX_JSON_DEPTH):
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        return value


class JSONRequest(Request):
    """A request whose unparseable JSON body is a 400 saying why (not werkzeug's HTML)."""

    def on_json_loading_failed(self, e: ValueError | None) -> Any:
        if e is None:
            raise DomainError("the request body must be JSON (Content-Type: "
                              "application/json)")
        raise DomainError(f"the request body is not valid JSON: {e}")
