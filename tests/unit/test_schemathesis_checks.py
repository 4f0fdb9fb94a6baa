"""The narrow exceptions for Schemathesis (tests/schemathesis/checks.py) refuse what they
should: a 422 to a schema-valid body passes only for the rules no schema can state."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

CHECKS = Path(__file__).resolve().parents[1] / "schemathesis" / "checks.py"


@pytest.fixture(scope="module")
def check() -> Any:
    pytest.importorskip("schemathesis")
    spec = importlib.util.spec_from_file_location("senddock_schemathesis_checks", CHECKS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.refusals_only_for_unstatable_rules


class Answer:
    def __init__(self, status: int, fields: dict[str, str]) -> None:
        self.status_code = status
        self._body = {"error": {"message": "x", "fields": fields}}
        self.text = str(self._body)

    def json(self) -> Any:
        return self._body


def case(label: str, positive: bool = True) -> Any:
    mode = SimpleNamespace(is_positive=positive)
    return SimpleNamespace(operation=SimpleNamespace(label=label),
                           meta=SimpleNamespace(generation=SimpleNamespace(mode=mode)))


def test_a_refusal_for_an_unstatable_rule_passes(check: Any) -> None:
    check(None, Answer(422, {"send_at": "in the past"}), case("POST /messages"))
    check(None, Answer(422, {"html": "line 1: unexpected '}'"}), case("POST /campaigns"))


def test_any_other_refusal_of_a_valid_body_fails(check: Any) -> None:
    with pytest.raises(AssertionError, match=r"data\.verify_url"):
        check(None, Answer(422, {"send_at": "x", "data.verify_url": "required"}),
              case("POST /messages"))
    with pytest.raises(AssertionError, match="user_id"):
        check(None, Answer(422, {"user_id": "required"}), case("POST /messages/resend"))
    with pytest.raises(AssertionError, match="no named field"):
        check(None, Answer(422, {}), case("POST /campaigns"))


def test_other_answers_and_invalid_bodies_are_not_its_business(check: Any) -> None:
    check(None, Answer(422, {"user_id": "required"}), case("POST /messages", positive=False))
    check(None, Answer(404, {"kind": "unknown"}), case("POST /messages"))
