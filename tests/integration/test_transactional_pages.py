"""The Transactional page (admins) and the support page for every kind (docs/design.md §21)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import Browser

ONBOARDING = {"class": "lifecycle", "subject": "Hi {{ data.first_name }}",
              "text": "Welcome {{ data.first_name }} ({{ event.name }})\n",
              "html": "<p style=\"color: red\">Welcome {{ data.first_name }}</p>",
              "sample_data": {"first_name": "Ada"}, "dedupe_window": 3600}


def form(**overrides: str) -> dict[str, str]:
    return {"name": "onboarding", "class": "lifecycle", "subject": "Hi {{ data.first_name }}",
            "text": "Welcome {{ data.first_name }}\n", "html": "", "active": "on",
            "retry_schedule": "60, 600", "resend_cooldown": "120", "dedupe_window": "3600",
            "sample_data": json.dumps({"first_name": "Ada"}),
            "sample_event": json.dumps({"name": "signup", "id": "evt_1"}), **overrides}


def test_admin_defines_a_kind_in_the_editor(client: Any, engine: sa.Engine,
                                            make_user: Callable[..., dict[str, Any]]) -> None:
    admin = Browser(client, make_user("admin"))
    assert admin.get("/transactional/new").status_code == 200
    bad = admin.post("/transactional/kinds", form(text="one\ntwo {{ data.x }\n"))
    page = bad.get_data(as_text=True)
    assert bad.status_code == 422 and "line 2" in page and "two {{ data.x }" in page
    done = admin.post("/transactional/kinds", form())
    assert done.status_code == 200 and "Saved kind onboarding" in done.get_data(as_text=True)
    again = admin.post("/transactional/kinds", form())
    assert again.status_code == 422 and "already exists" in again.get_data(as_text=True)
    edit = admin.post("/transactional/kinds/onboarding", form(dedupe_window="60"))
    assert edit.status_code == 200
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT dedupe_window, retry_schedule, version FROM kinds "
                                   "WHERE name = 'onboarding'")).one()
    assert tuple(row) == (60, [60, 600], 2)
    index = admin.get("/transactional/").get_data(as_text=True)
    assert 'id="kind-onboarding"' in index and "lifecycle" in index and "verification" in index


def test_preview_renders_sample_data_in_a_sandbox(client: Any, api: Api,
                                                  make_user: Callable[..., dict[str, Any]]
                                                  ) -> None:
    api.client.put("/api/v1/kinds/onboarding", json=ONBOARDING, headers=api.headers)
    admin = Browser(client, make_user("admin"))
    saved = admin.get("/transactional/kinds/onboarding/preview")
    assert saved.headers["Content-Security-Policy"].startswith("sandbox")
    text = saved.get_data(as_text=True)
    assert "Hi Ada" in text and "Welcome Ada (signup)" in text
    unsaved = admin.post("/transactional/kinds/onboarding/preview",
                         form(subject="Hey {{ data.first_name }}!",
                              sample_data=json.dumps({"first_name": "<b>Linus</b>"})))
    body = unsaved.get_data(as_text=True)
    assert "Hey &lt;b&gt;Linus&lt;/b&gt;!" in body and "<b>Linus</b>" not in body
    broken = admin.post("/transactional/kinds/onboarding/preview",
                        form(subject="{{ data.first_name"))
    assert "Cannot render" in broken.get_data(as_text=True)


def test_test_send_is_a_test_job(client: Any, api: Api, engine: sa.Engine,
                                 make_user: Callable[..., dict[str, Any]]) -> None:
    api.client.put("/api/v1/kinds/onboarding", json=ONBOARDING, headers=api.headers)
    admin = Browser(client, make_user("admin"))
    r = admin.post("/transactional/kinds/onboarding/test", {"email": "me@example.com"})
    assert "Test message of onboarding queued" in r.get_data(as_text=True)
    with engine.connect() as conn:
        job = conn.execute(sa.text("SELECT kind, priority, payload FROM delivery_jobs")).one()
    assert job.kind == "test" and job.priority == 0
    assert job.payload["kind"] == "onboarding" and job.payload["data"] == {"first_name": "Ada"}


def test_only_admins_reach_the_transactional_page(client: Any,
                                                  make_user: Callable[..., dict[str, Any]]
                                                  ) -> None:
    support = Browser(client, make_user("support"))
    assert support.get("/transactional/").status_code == 403


def test_support_sees_every_kind_with_its_event(client: Any, api: Api,
                                                make_user: Callable[..., dict[str, Any]]
                                                ) -> None:
    api.client.put("/api/v1/kinds/onboarding", json=ONBOARDING, headers=api.headers)
    api.post("/verifications", {"user_id": "u-5", "email": "ada@example.org",
                                "verify_url": "https://app.example/v?t=1"})
    api.post("/messages", {"kind": "onboarding", "user_id": "u-5", "email": "ada@example.org",
                           "data": {"first_name": "Ada"},
                           "event": {"name": "signup", "id": "evt_77", "at":
                                     "2026-12-01T09:00:00Z", "source": "<i>ads</i>"}})
    support = Browser(client, make_user("support"))
    found = support.get("/support/?q=u-5")
    assert found.status_code == 302 and found.headers["Location"].endswith("/support/users/u-5")
    page = support.get("/support/users/u-5").get_data(as_text=True)
    assert 'id="kind-verification"' in page and 'id="kind-onboarding"' in page
    assert '<code class="event-name">signup</code>' in page
    assert '<code class="event-id">evt_77</code>' in page
    assert "&lt;i&gt;ads&lt;/i&gt;" in page and "<i>ads</i>" not in page
    assert 'id="resend-button-onboarding"' in page and 'id="resend-button"' in page
    assert "A user gets at most one onboarding email every 3600 s" in page  # its own cooldown
    refused = support.post("/support/users/u-5/resend", {"kind": "onboarding"})
    assert refused.status_code == 200
    assert "an email of kind onboarding was sent to this user moments ago" in refused.get_data(
        as_text=True)


def test_a_kinds_test_send_is_built_from_the_kind(api: Api, engine: sa.Engine,
                                                  config_for: Callable[..., Any]) -> None:
    """What the worker builds for a kind's test job: the kind's templates, "[Test]" first,
    the sample data, Auto-Submitted (transactional mail)."""
    from email import message_from_bytes, policy

    from webapp.domain import kinds
    from workers import queue
    from workers.building.compose import Composer

    api.client.put("/api/v1/kinds/onboarding", json=ONBOARDING, headers=api.headers)
    with engine.begin() as conn:
        kinds.test_send(conn, "onboarding", "me@example.com", {"first_name": "Grace"},
                        {"name": "signup"}, actor="tests")
        [job] = queue.claim_batch(conn, "w", 5, "example.com")
    envelope = Composer(engine, config_for()).build(job)
    mail = message_from_bytes(envelope.message, policy=policy.default)
    assert mail["Subject"] == "[Test] Hi Grace"
    assert mail["Auto-Submitted"] == "auto-generated"
    assert "Welcome Grace (signup)" in mail.get_body(("plain",)).get_content()  # type: ignore[union-attr]


def test_a_critical_kind_from_the_new_form_gets_critical_defaults(
        client: Any, api: Api, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    # The form came pre-filled with a lifecycle kind's values (retries up to 6 h,
    # a 1 h cooldown, a 24 h dedupe window), so a password reset asked again with a new
    # link answered the old one for a day.
    admin = Browser(client, make_user("admin"))
    page = admin.get("/transactional/new").get_data(as_text=True)
    for field in ("retry_schedule", "resend_cooldown", "dedupe_window"):
        assert f'name="{field}" value=""' in page, field
    assert 'id="class-defaults"' in page and "86400" in page
    done = admin.post("/transactional/kinds", form(
        name="password_reset", **{"class": "critical"}, retry_schedule="",
        resend_cooldown="", dedupe_window=""))
    assert done.status_code == 200, done.get_data(as_text=True)[:500]
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT retry_schedule, resend_cooldown, dedupe_window "
                                   "FROM kinds WHERE name = 'password_reset'")).one()
    assert tuple(row) == ([30, 120, 600], 60, 0)
    ask = {"kind": "password_reset", "user_id": "u-1", "email": "ada@example.org",
           "data": {"first_name": "Ada", "link": "https://app.example/reset?t=1"}}
    first = api.post("/messages", ask).get_json()
    second = api.post("/messages", {**ask, "data": {**ask["data"], "link": "…?t=2"}})
    assert second.status_code == 202 and second.get_json()["existing"] is False
    assert second.get_json()["id"] != first["id"]
    assert second.get_json()["data"]["link"].endswith("t=2")


def test_switching_the_class_in_the_form_applies_its_defaults_and_says_which(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """The editor re-posts the stored timings; switched from lifecycle
    to critical, the kind takes critical's defaults and the page names each change, in
    English and Spanish."""
    user = make_user("admin")
    admin = Browser(client, user)
    assert admin.post("/transactional/kinds", form(
        retry_schedule="300, 1800, 7200, 21600", resend_cooldown="3600",
        dedupe_window="86400")).status_code == 200
    page = admin.post("/transactional/kinds/onboarding", form(
        **{"class": "critical"}, retry_schedule="300, 1800, 7200, 21600",
        resend_cooldown="3600", dedupe_window="86400")).get_data(as_text=True)
    assert ("The class is now critical, so its defaults apply: Retry schedule: "
            "300, 1800, 7200, 21600 → 30, 120, 600; Resend cooldown: 3600 → 60; "
            "Dedupe window: 86400 → 0.") in page
    with engine.begin() as conn:
        row = conn.execute(sa.text("SELECT class, retry_schedule, resend_cooldown, "
                                   "dedupe_window FROM kinds WHERE name = 'onboarding'")).one()
        assert tuple(row) == ("critical", [30, 120, 600], 60, 0)
        conn.execute(sa.text("UPDATE users SET locale = 'es' WHERE id = :id"),
                     {"id": user["id"]})
    page = admin.post("/transactional/kinds/onboarding", form(
        **{"class": "lifecycle"}, retry_schedule="30, 120, 600", resend_cooldown="60",
        dedupe_window="0")).get_data(as_text=True)
    assert ("La clase ahora es ciclo de vida, así que se aplican sus valores por defecto: "
            "Calendario de reintentos: 30, 120, 600 → 300, 1800, 7200, 21600; ") in page
