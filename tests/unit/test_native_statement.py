"""A hot statement's ``%(name)s`` placeholders turned once into PostgreSQL's ``$n``
(workers.core.pg.NativeStatement)."""

from __future__ import annotations

import pytest

from workers.core import pg
from workers.queue import enqueue_messages


def test_names_are_numbered_once_in_order_and_percent_signs_kept() -> None:
    statement = pg.NativeStatement("SELECT %(a)s, %(b)s, %(a)s WHERE x LIKE '50%%'")
    assert statement.text == "SELECT $1, $2, $1 WHERE x LIKE '50%'"
    assert statement.names == ["a", "b"]
    assert statement.args({"b": 2, "a": 1, "unused": 3}) == (1, 2)


def test_a_lone_percent_sign_is_refused() -> None:
    with pytest.raises(ValueError, match="lone %"):
        pg.NativeStatement("SELECT 5 % 2")


def test_a_missing_parameter_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        pg.NativeStatement("SELECT %(a)s").args({})


def test_the_enqueue_statements_take_the_parameters_enqueue_passes() -> None:
    passed = {"items", "kinds", "actor", "max_backlog", "notify"}
    for statement in (enqueue_messages._NATIVE, enqueue_messages._NATIVE_REPLACING):
        assert set(statement.names) == passed
        assert "%(" not in statement.text
