"""Transactional kinds without a database: class ordering, dedupe windows, what a template
sees, and the P9 checks of a message's fields (docs/design.md §21)."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from webapp.domain import kinds as kind_rules
from webapp.domain import messages
from webapp.domain.errors import Invalid, TooLarge
from workers.building import kinds
from workers.core import states

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


# --- class ordering ----------------------------------------------------------------------

def test_classes_are_served_critical_then_lifecycle_then_campaigns() -> None:
    order = sorted(states.CLASS_PRIORITY, key=states.CLASS_PRIORITY.__getitem__)
    assert order == ["critical", "lifecycle", "campaign"]
    # The engine's own kinds sit in those classes: verification with critical mail.
    assert states.PRIORITY["verification"] == states.CLASS_PRIORITY["critical"]
    assert states.PRIORITY["broadcast"] == states.CLASS_PRIORITY["campaign"]
    assert set(kinds.CLASSES) == set(states.CLASS_PRIORITY) - {"campaign"}


@pytest.mark.parametrize(("kind", "priority", "label"), [
    ("broadcast", 10, "campaign"), ("test", 0, "test"), ("verification", 0, "critical"),
    ("reset", 0, "critical"), ("onboarding", 5, "lifecycle")])
def test_class_label_of_a_job(kind: str, priority: int, label: str) -> None:
    assert kinds.class_of(kind, priority) == label


def test_a_kind_gets_its_class_priority() -> None:
    spec = kinds.KindSpec("onboarding", "lifecycle", "s", "t", None, (60,), 60, 0, True, 1)
    assert spec.priority == 5
    assert kinds.KindSpec("reset", "critical", "s", "t", None, None, None, 0, True, 1
                          ).priority == 0


# --- what a template sees ----------------------------------------------------------------

def test_message_context_has_data_and_event() -> None:
    ctx = kinds.message_context(email="a@b.c", user_ref="u1", kind="onboarding", payload={
        "data": {"first_name": "Ada"}, "event": {"name": "signup", "id": "e1"}})
    assert ctx["data"] == {"first_name": "Ada"} and ctx["event"]["id"] == "e1"
    assert ctx["user_id"] == "u1" and ctx["kind"] == "onboarding"


def test_verification_payload_from_before_kinds_still_renders() -> None:
    ctx = kinds.message_context(email="a@b.c", user_ref="u1", kind="verification",
                                payload={"verify_url": "https://x/v"})
    assert ctx["verify_url"] == "https://x/v" and ctx["data"] == {"verify_url": "https://x/v"}
    assert ctx["event"] == {}


def test_histogram_bounds_are_the_migrations() -> None:
    path = ROOT / "migrations" / "versions" / "0014_kinds.py"
    spec = importlib.util.spec_from_file_location("m0014", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.BOUNDS == kinds.TIME_TO_SENT_BOUNDS
    assert module.KIND_NAME == states.KIND_NAME
    assert list(kinds.TIME_TO_SENT_BOUNDS) == sorted(kinds.TIME_TO_SENT_BOUNDS)


# --- P9 checks ---------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "field"), [
    ("3000-01-01T00:00:00+00:00", "send_at"),
    ("2026-12-04T09:00:00", "send_at"), ("soon", "send_at"), (12, "send_at")])
def test_send_at_refusals(raw: Any, field: str) -> None:
    with pytest.raises(Invalid) as caught:
        messages.check_send_at(raw, T0)
    assert field in caught.value.fields


def test_send_at_accepted() -> None:
    assert messages.check_send_at(None, T0) is None
    assert messages.check_send_at((T0 - timedelta(seconds=30)).isoformat(), T0) is None
    # In the past: at once (the OpenAPI document says so, Schemathesis checks it).
    assert messages.check_send_at((T0 - timedelta(days=9999)).isoformat(), T0) is None
    far = messages.check_send_at("2999-12-31T23:00:00-10:00", T0)
    assert far is not None and far.year == 3000
    at = messages.check_send_at("2026-12-04T10:00:00+01:00", T0)
    assert at == datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
    assert messages.check_send_at((T0 + timedelta(days=364)).isoformat(), T0)


@pytest.mark.parametrize(("raw", "field"), [
    ("signup", "event"), ([1], "event"), ({"id": "e"}, "event.name"),
    ({"name": ""}, "event.name"), ({"name": "x", "id": [1]}, "event.id"),
    ({"name": "x", "at": "yesterday"}, "event.at")])
def test_event_refusals(raw: Any, field: str) -> None:
    with pytest.raises(Invalid) as caught:
        messages.check_event(raw)
    assert field in caught.value.fields


def test_size_limit_is_64_kb() -> None:
    assert kind_rules.check_object("data", {"a": "x" * 65_000}, limit=65_536)
    with pytest.raises(TooLarge) as caught:
        kind_rules.check_object("data", {"a": "x" * 65_600}, limit=65_536)
    assert caught.value.status == 413 and "data" in caught.value.fields


@pytest.mark.parametrize("name", ["Onboarding", "1st", "a b", "x" * 41, "", "broadcast",
                                  "test"])
def test_kind_name_refusals(name: str) -> None:
    with pytest.raises(Invalid):
        kind_rules.check_name(name)


def test_render_reports_the_line() -> None:
    spec = kinds.KindSpec("k", "lifecycle", "Hi", "one\ntwo {{ data.x + }}\n", None, (), 0, 0,
                          True, 1)
    with pytest.raises(Invalid) as caught:
        kind_rules.render(spec, {}, {})
    assert caught.value.fields["text"].startswith("line 2:")
