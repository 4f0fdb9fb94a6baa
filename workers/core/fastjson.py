"""JSON on the hot paths through orjson, with the standard library's answer
whenever orjson would answer differently or not at all.

orjson refuses what ``json`` takes (integers beyond 64 bits, keys that are not strings,
types it does not know, ``NaN`` in text), reads integers beyond 64 bits as floats and
writes NaN and infinities as ``null`` where ``json`` writes ``NaN``: each of these falls
back to ``json``, so every value is written and read exactly as
before, only the common case is faster (a batch of 500 messages spent about a fifth of its
Python in ``json``, docs/performance.md).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import orjson

# Datetimes and dataclasses go to ``default`` as they would with ``json`` (orjson would
# write its own form of them).
_PASS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _finite(value: Any) -> bool:
    """False when ``value`` holds a float NaN or infinity anywhere (orjson writes them as
    ``null``, ``json`` as ``NaN``/``Infinity``)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return True


def dumps(value: Any, *, sort_keys: bool = False,
          default: Callable[[Any], Any] | None = None, nan_as_null: bool = False) -> str | None:
    """``value`` as compact JSON text (UTF-8 as it is, not ``\\u`` escapes), or None when
    only the standard library can write it the same way (the caller then uses ``json``).
    ``default`` as for ``json.dumps``. With ``nan_as_null`` a NaN or infinity is written
    ``null`` (valid JSON, where ``json`` writes ``NaN``), saving the walk that looks for
    them."""
    try:
        text = orjson.dumps(value, default=default,
                            option=_PASS | (orjson.OPT_SORT_KEYS if sort_keys else 0))
    except (TypeError, orjson.JSONEncodeError):
        return None
    if not nan_as_null and b"null" in text and not _finite(value):
        return None
    return text.decode()


def size(value: Any) -> int | None:
    """The length in bytes of ``value`` as orjson's compact UTF-8 JSON, or None when orjson
    cannot write it. It differs from ``json.dumps(value, separators=(",", ":"),
    ensure_ascii=False)`` only in how floats are spelt (``1e-7`` for ``1e-07``, ``1e100``
    for ``1e+100``; never by half), and NaN as ``null``."""
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        return None


# orjson reads an integer beyond 64 bits as a float; such a number has 19 digits or more.
_LONG_DIGITS = re.compile(r"\d{19}")
_LONG_DIGITS_BYTES = re.compile(rb"\d{19}")


def loads(text: str | bytes | bytearray | memoryview) -> Any:
    """Parse JSON text as ``json.loads`` does (integers of any size, NaN included)."""
    if isinstance(text, memoryview | bytearray):
        text = bytes(text)
    long_digits = _LONG_DIGITS.search(text) if isinstance(text, str) \
        else _LONG_DIGITS_BYTES.search(text)
    if long_digits is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)
