"""workers.core.fastjson writes and reads what ``json`` does, or says it cannot."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from workers.core import fastjson

SAMPLES: list[Any] = [
    {"b": 1, "a": [1, 2.5, "é", None, True], "c": {"z": "x\"y\\", "y": "\n\t"}},
    [], {}, "plain", 0, -1, 2**63 - 1, 1e-7, 1e100, 0.1, "\u2028", "😀",
]


@pytest.mark.parametrize("value", SAMPLES)
def test_dumps_is_what_json_reads_back(value: Any) -> None:
    text = fastjson.dumps(value)
    assert text is not None
    assert json.loads(text) == value
    assert fastjson.loads(text) == value
    assert fastjson.dumps(value, sort_keys=True) == (
        None if text is None else fastjson.dumps(json.loads(json.dumps(value,
                                                                       sort_keys=True)),
                                                 sort_keys=True))


@pytest.mark.parametrize("value", [float("nan"), {"x": [float("inf")]}, 2**64, 10**30,
                                   {1: "int key"}, {"x": {1, 2}}, "\ud800"])
def test_what_only_json_writes_is_left_to_it(value: Any) -> None:
    assert fastjson.dumps(value) is None


def test_default_sees_datetimes_as_json_would() -> None:
    when = datetime(2026, 12, 2, 16, 0, tzinfo=UTC)
    assert fastjson.dumps({"at": when}, default=str) == json.dumps(
        {"at": when}, default=str, separators=(",", ":"))


def test_sorted_keys_like_jsonify() -> None:
    value = {"b": {"d": 1, "c": 2}, "a": 0}
    assert fastjson.dumps(value, sort_keys=True) == json.dumps(
        value, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize("text", ['{"n": 123456789012345678901234567890}', "[NaN]",
                                  '{"a": 1.5, "b": [null, "é"]}'])
def test_loads_reads_what_json_reads(text: str) -> None:
    assert repr(fastjson.loads(text)) == repr(json.loads(text))


def test_size_is_the_compact_utf8_length() -> None:
    value = {"a": "é😀", "b": [1, None, True]}
    exact = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    assert fastjson.size(value) == exact
    assert fastjson.size({"x": 2**70}) is None


def test_loads_keeps_long_integers_exact_in_bytes_too() -> None:
    raw = b'{"id": 123456789012345678901234567890, "s": "x"}'
    assert fastjson.loads(raw) == {"id": 123456789012345678901234567890, "s": "x"}
    assert fastjson.loads(memoryview(raw)) == json.loads(raw)
