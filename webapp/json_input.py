"""Reading JSON request bodies without letting their shape hurt the server (P9).

Python's parser answers a body nested 100,000 levels deep with ``RecursionError``, which
is not the ``ValueError`` werkzeug expects of bad JSON, so it became a 500; a body nested a
few hundred levels would also overflow every recursive walk after parsing. Here a body that
cannot be parsed, or is nested deeper than :data:`MAX_JSON_DEPTH`, is bad JSON like any
other: a 400 JSON answer saying why.
"""

from __future__ import annotations

import math
from typing import Any

from flask import Request
from flask.json.provider import DefaultJSONProvider

from webapp.domain.errors import DomainError, Invalid

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
        # Only containers go on the stack: a batch's scalars are most of its values.
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list))
    return False


class _NonFinite:
    """Where a body held ``NaN``, ``Infinity``, ``-Infinity`` or a number too large for a
    float (``1e400``): JSON has no such numbers, so the field naming it is refused."""


NON_FINITE = _NonFinite()


def _number(text: str) -> float | int | _NonFinite:
    """A JSON number with a fraction or exponent: an int when it is a whole number
    (JSON Schema's "integer" includes 5.0, so an id sent as 5.0 is the id 5)."""
    value = float(text)
    if not math.isfinite(value):
        return NON_FINITE
    return int(value) if value.is_integer() else value


def _constant(_name: str) -> _NonFinite:
    return NON_FINITE


def non_finite_field(value: Any) -> str | None:
    """The path (``a.b.0``; ``body`` for the whole body) of the first non-finite number
    in a parsed body, or None (checked without recursion)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if item is NON_FINITE:
            return path or "body"
        children: Any = item.items() if isinstance(item, dict) else enumerate(item) \
            if isinstance(item, list) else ()
        stack.extend((child, f"{path}.{key}" if path else str(key))
                     for key, child in children)
    return None


class JSONProvider(DefaultJSONProvider):
    """Flask's JSON, whose ``loads`` raises ``ValueError`` (bad JSON) for input nested too
    deeply instead of ``RecursionError`` or a value too deep to walk."""

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        found: list[_NonFinite] = []  # the body is walked for the field only when it has one

        def number(text: str) -> float | int | _NonFinite:
            value = _number(text)
            if value is NON_FINITE:
                found.append(NON_FINITE)
            return value

        def constant(name: str) -> _NonFinite:
            found.append(NON_FINITE)
            return _constant(name)

        kwargs.setdefault("parse_float", number)
        kwargs.setdefault("parse_constant", constant)
        try:
            value = super().loads(s, **kwargs)
        except RecursionError:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
        if depth_over(value, MAX_JSON_DEPTH):
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        field = non_finite_field(value) if found else None
        if field is not None:
            # A 422 naming the field (it is valid JSON to Python, not to the standard).
            raise Invalid(f"{field} must be a finite number (JSON has no NaN, Infinity "
                          "or numbers beyond 1.8e308)",
                          fields={field: "must be a finite number"})
        return value


class JSONRequest(Request):
    """A request whose unparseable JSON body is a 400 saying why (not werkzeug's HTML)."""

    def on_json_loading_failed(self, e: ValueError | None) -> Any:
        if e is None:
            raise DomainError("the request body must be JSON (Content-Type: "
                              "application/json)")
        raise DomainError(f"the request body is not valid JSON: {e}")
