"""Transactional kinds through the public API (docs/design.md §21): define a kind, send with an
event, dedupe per (user, kind, window) under concurrency, schedule and cancel, and the P9 answers
that name the field."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import place_jobs

ONBOARDING = {
    "class": "lifecycle", "description": "Day-3 reminder",
    "subject": "{{ data.first_name }}, finish setting up",
    "text": "Hi {{ data.first_name }},\nyou signed up ({{ event.name }} {{ event.id }}).\n",
    "html": "<p>Hi {{ data.first_name }}</p>",
    "retry_schedule": [60, 600], "resend_cooldown": 120, "dedupe_window": 3600,
    "sample_data": {"first_name": "Ada"},
}
EVENT = {"name": "signup", "id": "evt_9f2", "at": "2026-12-01T09:00:00Z", "plan": "pro"}


def put_kind(api: Api, name: str, body: dict[str, Any]) -> Any:
    return api.client.put(f"/api/v1/kinds/{name}", json=body, headers=api.headers)


def message(**overrides: Any) -> dict[str, Any]:
    return {"kind": "onboarding", "user_id": "u-42", "email": "ada@example.org",
            "data": {"first_name": "Ada"}, "event": EVENT, **overrides}


def jobs(engine: sa.Engine, kind: str = "onboarding") -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM delivery_jobs WHERE kind = :k ORDER BY id"), {"k": kind}).mappings()]


def test_define_list_and_edit_a_kind(api: Api, engine: sa.Engine) -> None:
    created = put_kind(api, "onboarding", ONBOARDING)
    assert created.status_code == 201, created.get_json()
    body = created.get_json()
    assert body["class"] == "lifecycle" and body["priority"] == 5 and body["version"] == 1
    assert body["dedupe_window"] == 3600 and body["retry_schedule"] == [60, 600]
    edited = put_kind(api, "onboarding", {"subject": "Welcome back, {{ data.first_name }}"})
    assert edited.status_code == 200 and edited.get_json()["version"] == 2
    assert edited.get_json()["dedupe_window"] == 3600  # left out: kept
    listed = api.get("/kinds").get_json()["kinds"]
    # The built-in first, then by name (subscription_confirmation: migration 0027_marketers).
    assert [k["name"] for k in listed] == ["verification", "onboarding",
                                           "subscription_confirmation"]
    assert listed[0]["builtin"] and listed[0]["class"] == "critical"
    with engine.connect() as conn:
        actions = list(conn.execute(sa.text(
            "SELECT action FROM audit_log WHERE target = 'kind:onboarding' ORDER BY id"))
            .scalars())
    assert actions == ["kind.create", "kind.update"]


def test_template_errors_at_put_name_the_template_and_line(api: Api) -> None:
    r = put_kind(api, "churn", {**ONBOARDING, "text": "Hello\n\n{{ data.name }\n"})
    assert r.status_code == 422
    error = r.get_json()["error"]
    assert error["fields"]["text"].startswith("line 3:") and error["line"] == 3
    # Compiles, but cannot render with the sample data: refused when defined, not mid-send.
    r = put_kind(api, "churn", {**ONBOARDING, "html": "<p>\n{{ 1 // data.zero }}</p>",
                                "sample_data": {"zero": 0}})
    assert r.status_code == 422 and "html" in r.get_json()["error"]["fields"]
    r = put_kind(api, "churn", {**ONBOARDING, "html": "{{ ''.__class__ }}"})
    assert r.status_code == 422 and "html" in r.get_json()["error"]["fields"]
    assert api.get("/kinds/churn").status_code == 404  # nothing was stored


def test_kind_input_answers_name_the_field(api: Api) -> None:
    cases = [
        ("Bad Name", ONBOARDING, "name"), ("broadcast", ONBOARDING, "name"),
        ("churn", {**ONBOARDING, "class": "urgent"}, "class"),
        ("churn", {**ONBOARDING, "retry_schedule": [30, "x"]}, "retry_schedule"),
        ("churn", {**ONBOARDING, "dedupe_window": -1}, "dedupe_window"),
        ("churn", {**ONBOARDING, "colour": "red"}, "colour"),
    ]
    for name, body, field in cases:
        r = put_kind(api, name, body)
        assert r.status_code == 422, (name, body, r.get_json())
        assert field in r.get_json()["error"]["fields"], (name, r.get_json())
    # A well-formed body the built-in kind cannot take: 409 naming the field.
    for name, body, field in (("verification", {"class": "lifecycle"}, "class"),
                              ("verification", {"active": False}, "active"),
                              ("churn", {**ONBOARDING, "text": None, "html": None}, "text")):
        r = put_kind(api, name, body)
        assert r.status_code == 409, (body, r.get_json())
        assert field in r.get_json()["error"]["fields"], r.get_json()


def test_null_schedule_and_cooldown_are_the_class_defaults(api: Api) -> None:
    """As the OpenAPI document says: null for retry_schedule or resend_cooldown is the
    class's default (for the built-in kind, the setting's)."""
    r = put_kind(api, "churn", {**ONBOARDING, "retry_schedule": None,
                                "resend_cooldown": None})
    assert r.status_code == 201, r.get_json()
    assert r.get_json()["retry_schedule"] == [300, 1800, 7200, 21600]
    assert r.get_json()["resend_cooldown"] == 3600
    r = put_kind(api, "churn", {"class": "critical", "retry_schedule": None})
    assert r.status_code == 200 and r.get_json()["retry_schedule"] == [30, 120, 600]


def test_resend_names_an_unknown_field(api: Api) -> None:
    put_kind(api, "onboarding", ONBOARDING)
    r = api.post("/messages/resend", {"kind": "onboarding", "user_id": "u-42", "usr": "x"})
    assert r.status_code == 422 and r.get_json()["error"]["fields"] == {"usr": "unknown field"}


def test_send_with_an_event_and_read_it_back(api: Api, engine: sa.Engine) -> None:
    put_kind(api, "onboarding", ONBOARDING)
    r = api.post("/messages", message())
    assert r.status_code == 202, r.get_json()
    body = r.get_json()
    assert set(body) >= {"id", "status", "kind", "correlation_id", "flags"}
    assert body["kind"] == "onboarding" and body["status"] == "pending"
    assert body["existing"] is False and body["event"] == EVENT
    [row] = jobs(engine)
    assert row["priority"] == 5 and row["payload"]["event"] == EVENT
    assert row["payload"]["data"] == {"first_name": "Ada"}
    job = api.get(f"/jobs/{body['id']}").get_json()
    assert job["event"] == EVENT and job["data"] == {"first_name": "Ada"}


def test_unknown_kind_is_404_listing_the_known_ones(api: Api) -> None:
    put_kind(api, "onboarding", ONBOARDING)
    r = api.post("/messages", message(kind="onbording"))
    assert r.status_code == 404
    error = r.get_json()["error"]
    assert error["known_kinds"] == ["verification", "onboarding",
                                    "subscription_confirmation"]
    assert "onboarding" in error["fields"]["kind"]


def test_bad_message_input_names_the_field(api: Api) -> None:
    put_kind(api, "onboarding", ONBOARDING)
    cases = [
        (message(send_at="3000-01-01T00:00:00Z"), 422, "send_at"),
        (message(send_at="tomorrow"), 422, "send_at"),
        (message(send_at="2026-12-04T09:00:00"), 422, "send_at"),  # no zone
        (message(data=["a"]), 422, "data"), (message(event="signup"), 422, "event"),
        (message(event={"id": 1}), 422, "event.name"),
        (message(data={"blob": "x" * 70_000}), 413, "data"),
        (message(event={"name": "signup", "blob": "x" * 70_000}), 413, "event"),
        (message(email="not-an-address"), 422, "email"), (message(user_id=None), 422,
                                                         "user_id"),
        (message(colour="red"), 422, "colour"),
    ]
    for body, status, field in cases:
        r = api.post("/messages", body)
        assert r.status_code == status, (field, r.get_json())
        assert field in r.get_json()["error"]["fields"], (field, r.get_json())
    r = api.post("/messages", {"user_id": "u"})
    assert r.status_code == 422 and "kind" in r.get_json()["error"]["fields"]


def test_a_send_at_in_the_past_sends_at_once(api: Api) -> None:
    """As the OpenAPI document says (Schemathesis sent year 0471 and was refused
    a schema-valid request): a time in the past is now; far ahead is a schedule."""
    put_kind(api, "onboarding", ONBOARDING)
    now = datetime.now(UTC)
    for n, at in enumerate((now - timedelta(hours=1), datetime(471, 2, 13, tzinfo=UTC))):
        r = api.post("/messages", message(user_id=f"past-{n}", send_at=at.isoformat()))
        assert r.status_code == 202, r.get_json()
        assert r.get_json()["send_at"] is None  # not scheduled: sent at once
    far = "2999-12-31T23:59:59-10:00"
    r = api.post("/messages", message(user_id="far", send_at=far))
    assert r.status_code == 202 and r.get_json()["send_at"] == "3000-01-01T09:59:59+00:00"


def test_dedupe_window_returns_the_first_message(api: Api, engine: sa.Engine) -> None:
    put_kind(api, "onboarding", ONBOARDING)
    first = api.post("/messages", message()).get_json()
    again = api.post("/messages", message(event={**EVENT, "id": "evt_other"})).get_json()
    assert again["id"] == first["id"] and again["existing"] is True
    assert again["existing_because"] == "dedupe_window"
    other_user = api.post("/messages", message(user_id="u-43")).get_json()
    assert other_user["existing"] is False
    # The window is per kind: with no window (0), each request is a message of its own.
    put_kind(api, "onboarding", {"dedupe_window": 0})
    third = api.post("/messages", message()).get_json()
    assert third["existing"] is False and third["id"] != first["id"]
    # A window measured on the database clock: once it has passed, a new one opens.
    put_kind(api, "onboarding", {"dedupe_window": 3600})
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE delivery_jobs SET created_at = created_at - interval "
                             "'2 hours', dedupe_until = dedupe_until - interval '2 hours'"))
    fourth = api.post("/messages", message()).get_json()
    assert fourth["existing"] is False
    assert len(jobs(engine)) == 4


def test_dedupe_holds_under_parallel_requests(app: Any, api: Api, engine: sa.Engine) -> None:
    put_kind(api, "onboarding", ONBOARDING)
    answers: list[dict[str, Any]] = []
    start = threading.Barrier(8)

    def ask(i: int) -> None:
        client = app.test_client()
        start.wait()
        r = client.post("/api/v1/messages", json=message(event={**EVENT, "id": f"e{i}"}),
                        headers=api.headers)
        assert r.status_code == 202, r.get_json()
        answers.append(r.get_json())

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(answers) == 8
    assert len({a["id"] for a in answers}) == 1
    assert sum(not a["existing"] for a in answers) == 1
    assert len(jobs(engine)) == 1


def _insert(conn: sa.Connection, kind: str, priority: int) -> int | None:
    """A job inserted as the enqueue statement does, without its lookups: only the
    constraints stand in the way."""
    return conn.execute(sa.text("""
        INSERT INTO delivery_jobs (kind, priority, status, email, user_ref, payload,
                                   dedupe_until)
        VALUES (:kind, :priority, 'pending', 'a@x.org', 'u1', '{}',
                now() + interval '60 s')
        ON CONFLICT DO NOTHING RETURNING id"""), {"kind": kind, "priority": priority}
    ).scalar()


def test_the_database_refuses_overlapping_windows(api: Api, engine: sa.Engine) -> None:
    """Whatever the code path: the exclusion constraint, not only the request's lock."""
    put_kind(api, "onboarding", ONBOARDING)
    with engine.begin() as conn:
        first = _insert(conn, "onboarding", 5)
        second = _insert(conn, "onboarding", 5)
        other_kind = _insert(conn, "verification", 0)
    assert first is not None and second is None and other_kind is not None
    with engine.begin() as conn:  # a cancelled message frees its window
        conn.execute(sa.text("UPDATE delivery_jobs SET status = 'cancelled' WHERE id = :i"),
                     {"i": first})
        assert _insert(conn, "onboarding", 5)


def test_schedule_then_cancel_when_the_user_acts(api: Api, engine: sa.Engine) -> None:
    put_kind(api, "onboarding", ONBOARDING)
    at = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0)
    r = api.post("/messages", message(send_at=at.isoformat()))
    assert r.status_code == 202 and r.get_json()["send_at"] == at.isoformat()
    [row] = jobs(engine)
    assert row["available_at"] == at and row["status"] == "pending"
    cancelled = api.delete("/messages?user_id=u-42&kind=onboarding")
    assert cancelled.status_code == 200, cancelled.get_json()
    assert cancelled.get_json() == {"kind": "onboarding", "user_id": "u-42", "cancelled": 1,
                                    "ids": [row["id"]], "in_flight": 0}
    assert jobs(engine)[0]["status"] == "cancelled"
    again = api.delete("/messages?user_id=u-42&kind=onboarding").get_json()
    assert again["cancelled"] == 0
    # The cancelled message no longer holds the window: the user can be reminded again.
    assert api.post("/messages", message()).get_json()["existing"] is False
    bad = api.delete("/messages?kind=onboarding")
    assert bad.status_code == 422 and "user_id" in bad.get_json()["error"]["fields"]
    assert api.delete("/messages?user_id=u-42&kind=nope").status_code == 404


def test_idempotency_key(api: Api) -> None:
    put_kind(api, "onboarding", {**ONBOARDING, "dedupe_window": 0})
    headers = {**api.headers, "Idempotency-Key": "signup-evt_9f2"}
    first = api.client.post("/api/v1/messages", json=message(), headers=headers).get_json()
    again = api.client.post("/api/v1/messages", json=message(), headers=headers).get_json()
    assert again["id"] == first["id"] and again["existing_because"] == "idempotency_key"
    clash = api.client.post("/api/v1/messages", json=message(user_id="u-9"), headers=headers)
    assert clash.status_code == 409 and "Idempotency-Key" in clash.get_json()["error"]["fields"]


def test_verification_through_messages_and_unchanged_endpoint(api: Api,
                                                              engine: sa.Engine) -> None:
    old = api.post("/verifications", {"user_id": "u-1", "email": "a@example.org",
                                      "verify_url": "https://app.example/v?t=1"})
    assert old.status_code == 202 and old.get_json()["existing"] is False
    # The same user through /messages: the live job is returned (docs/design.md §21 still holds).
    r = api.post("/messages", {"kind": "verification", "user_id": "u-1",
                               "email": "a@example.org",
                               "data": {"verify_url": "https://app.example/v?t=2"}})
    assert r.status_code == 202 and r.get_json()["id"] == old.get_json()["id"]
    missing = api.post("/messages", {"kind": "verification", "user_id": "u-2",
                                     "email": "b@example.org"})
    assert missing.status_code == 422
    assert "data.verify_url" in missing.get_json()["error"]["fields"]


def test_resend_respects_the_kinds_cooldown(api: Api, engine: sa.Engine) -> None:
    put_kind(api, "onboarding", ONBOARDING)
    first = api.post("/messages", message()).get_json()
    with engine.begin() as conn:
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'sent', finished_at = now()"))
    r = api.post("/messages/resend", {"kind": "onboarding", "user_id": "u-42"})
    assert r.status_code == 429 and 0 < int(r.headers["Retry-After"]) <= 120
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE delivery_jobs SET created_at = now() - interval '1 h', "
                             "finished_at = now() - interval '1 h'"))
    r = api.post("/messages/resend", {"kind": "onboarding", "user_id": "u-42"})
    assert r.status_code == 202, r.get_json()
    assert r.get_json()["reused"] is False and r.get_json()["event"] == EVENT
    assert r.get_json()["id"] != first["id"]


def test_who_may_define_and_send(client: Any, make_user: Callable[..., dict[str, Any]],
                                 api: Api) -> None:
    put_kind(api, "onboarding", ONBOARDING)
    support = Api(client, make_user("support")["token"])
    marketer = Api(client, make_user("marketer")["token"])
    assert put_kind(support, "churn", ONBOARDING).status_code == 403
    assert support.get("/kinds").status_code == 200
    assert support.post("/messages", message()).status_code == 202
    assert marketer.post("/messages", message()).status_code == 403
    assert marketer.get("/kinds").status_code == 403


def test_a_class_change_takes_the_new_class_defaults_and_says_so(api: Api) -> None:
    """A lifecycle kind switched to critical does not keep lifecycle
    timings, whether the body leaves them out or sends the stored ones back; a timing
    given a new value keeps it; the answer names what changed."""
    lifecycle = {**ONBOARDING, "retry_schedule": None, "resend_cooldown": None,
                 "dedupe_window": 86400}
    assert put_kind(api, "reset", lifecycle).status_code == 201
    r = put_kind(api, "reset", {"class": "critical"})
    body = r.get_json()
    assert r.status_code == 200, body
    assert (body["retry_schedule"], body["resend_cooldown"], body["dedupe_window"]) == \
        ([30, 120, 600], 60, 0)
    assert body["class_defaults_applied"] == {
        "retry_schedule": {"from": [300, 1800, 7200, 21600], "to": [30, 120, 600]},
        "resend_cooldown": {"from": 3600, "to": 60},
        "dedupe_window": {"from": 86400, "to": 0}}
    # GET, change the class, PUT the whole thing back: the same.
    kind = api.get("/kinds/reset").get_json()
    sent_back = {k: kind[k] for k in ("subject", "text", "html", "retry_schedule",
                                      "resend_cooldown", "dedupe_window")}
    r = put_kind(api, "reset", {**sent_back, "class": "lifecycle"})
    assert r.get_json()["retry_schedule"] == [300, 1800, 7200, 21600]
    assert r.get_json()["dedupe_window"] == 86400
    assert set(r.get_json()["class_defaults_applied"]) == {
        "retry_schedule", "resend_cooldown", "dedupe_window"}
    # A timing given a new value with the class change keeps it.
    r = put_kind(api, "reset", {"class": "critical", "dedupe_window": 30})
    assert r.get_json()["dedupe_window"] == 30 and r.get_json()["resend_cooldown"] == 60
    assert "dedupe_window" not in r.get_json()["class_defaults_applied"]
    # No class change: nothing applied.
    r = put_kind(api, "reset", {"subject": "Hi"})
    assert r.get_json()["class_defaults_applied"] == {}
    # What the answer says of the class change is not a field to send (the document says).
    refused = put_kind(api, "reset", {"subject": "Hello", "class_defaults_applied": {}})
    assert refused.status_code == 422
    assert "class_defaults_applied" in refused.get_json()["error"]["fields"]
    assert r.get_json()["dedupe_window"] == 30
