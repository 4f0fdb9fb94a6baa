"""Transactional kinds in the engine (docs/design.md §21): the claim serves critical → lifecycle →
campaigns and scheduled mail by ``available_at``; and the whole check through the public
API against a real Postfix: define a kind, send with an event, dedupe, schedule and cancel,
see it per kind in /metrics (checked by promtool)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from harness.postfix import Postfix
from tests.conftest import Api, wait_for
from tests.helpers import make_campaign
from workers import queue
from workers.core.settings import Config

ONBOARDING = {
    "class": "lifecycle", "subject": "{{ data.first_name }}, finish setting up",
    "text": "Hi {{ data.first_name }}, you joined with {{ event.name }} ({{ event.id }}).\n",
    "dedupe_window": 86400, "retry_schedule": [1, 1], "sample_data": {"first_name": "Ada"},
}
CHURN = {
    "class": "lifecycle", "subject": "We miss you",
    "text": "Your plan {{ event.plan }} ended {{ event.at }}.\n", "dedupe_window": 0,
}


def put(api: Api, name: str, body: dict[str, Any]) -> None:
    r = api.client.put(f"/api/v1/kinds/{name}", json=body, headers=api.headers)
    assert r.status_code in (200, 201), r.get_json()


def test_claim_serves_critical_then_lifecycle_then_campaigns(api: Api,
                                                            engine: sa.Engine) -> None:
    campaign = make_campaign(engine, [f"c{i}@example.org" for i in range(6)])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
    put(api, "onboarding", {**ONBOARDING, "dedupe_window": 0})
    put(api, "reset", {"class": "critical", "subject": "Reset", "text": "{{ data.url }}"})
    for i in range(3):
        assert api.post("/messages", {"kind": "onboarding", "user_id": f"o{i}",
                                      "email": f"o{i}@example.org"}).status_code == 202
        assert api.post("/messages", {"kind": "reset", "user_id": f"r{i}",
                                      "email": f"r{i}@example.org"}).status_code == 202
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert api.post("/messages", {"kind": "reset", "user_id": "later",
                                  "email": "later@example.org",
                                  "send_at": later}).status_code == 202
    order = []
    with engine.begin() as conn:
        for _ in range(5):
            order += [j.kind for j in queue.claim_batch(conn, "w", 3, "example.com")]
    # Scheduled mail waits for its time, whatever its class.
    assert order == ["reset"] * 3 + ["onboarding"] * 3 + ["broadcast"] * 6
    with engine.connect() as conn:
        waiting = conn.execute(sa.text("SELECT user_ref, status FROM delivery_jobs "
                                       "WHERE status = 'pending'")).all()
    assert [tuple(r) for r in waiting] == [("later", "pending")]


def test_a_batch_is_sent_in_class_order() -> None:
    """Within one claimed batch the worker sends in priority order, then by id."""
    def job(i: int, kind: str, priority: int) -> queue.ClaimedJob:
        return queue.ClaimedJob(id=i, kind=kind, email="a@b.c", claim_token="t", attempts=0,
                                correlation_id="c", message_id="m", campaign_id=None,
                                subscriber_id=None, broadcast_id=None, user_ref=None,
                                payload={}, suppressed=False, priority=priority)

    batch = [job(1, "broadcast", 10), job(2, "onboarding", 5), job(3, "verification", 0),
             job(4, "reset", 0)]
    batch.sort(key=lambda j: (j.priority, j.id))
    assert [j.id for j in batch] == [3, 4, 2, 1]


def scrape(client: Any, token: str) -> str:
    r = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200
    return str(r.get_data(as_text=True))


def value(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {name} {labels}")


@pytest.mark.slow
def test_define_send_dedupe_schedule_cancel_and_measure_through_postfix(
        relay: Postfix, engine: sa.Engine, config_for: Callable[..., Config],
        make_user: Callable[..., dict[str, Any]]) -> None:
    from webapp import create_app
    from workers.delivery.pool import Pool

    config = config_for(SMTP_URL=relay.smtp_url())
    app = create_app(config, engine=engine)
    admin = make_user("admin")
    api = Api(app.test_client(), admin["token"])
    put(api, "onboarding", ONBOARDING)
    put(api, "churn", CHURN)
    pool = Pool(engine, config, node="kinds-test")
    pool.start()
    try:
        signup = {"name": "signup", "id": "evt_signup_1", "at": "2026-12-01T09:00:00Z"}
        first = api.post("/messages", {"kind": "onboarding", "user_id": "u-7",
                                       "email": "ada@example.org",
                                       "data": {"first_name": "Ada"}, "event": signup})
        assert first.status_code == 202, first.get_json()
        again = api.post("/messages", {"kind": "onboarding", "user_id": "u-7",
                                       "email": "ada@example.org", "event": signup})
        assert again.get_json()["id"] == first.get_json()["id"]
        assert again.get_json()["existing_because"] == "dedupe_window"
        in_3_days = (datetime.now(UTC) + timedelta(days=3)).isoformat()
        scheduled = api.post("/messages", {"kind": "churn", "user_id": "u-8",
                                           "email": "bob@example.org", "send_at": in_3_days,
                                           "event": {"name": "trial_ended", "id": "evt_t1"}})
        assert scheduled.status_code == 202
        churn = api.post("/messages", {"kind": "churn", "user_id": "u-9",
                                       "email": "eve@example.org",
                                       "event": {"name": "subscription_cancelled",
                                                 "id": "evt_c1", "plan": "pro",
                                                 "at": "2026-11-30T12:00:00Z"}})
        assert churn.status_code == 202
        cancelled = api.delete("/messages?user_id=u-8&kind=churn").get_json()
        assert cancelled["cancelled"] == 1 and cancelled["ids"] == [scheduled.get_json()["id"]]
        delivered = {m.recipient: m for m in relay.wait_for_messages(2, timeout=60)}
    finally:
        pool.stop(timeout=30)
    # What Postfix delivered: rendered from the kind with the data and the event.
    assert set(delivered) == {"ada@example.org", "eve@example.org"}
    ada = delivered["ada@example.org"].message
    assert ada["Subject"] == "Ada, finish setting up"
    assert "you joined with signup (evt_signup_1)" in ada.get_content()
    assert ada["X-SendDock-Correlation-ID"] == first.get_json()["correlation_id"]
    assert "Your plan pro ended 2026-11-30T12:00:00Z" in \
        delivered["eve@example.org"].message.get_content()
    relay.wait_for_log(r"to=<ada@example.org>.*status=sent")  # logged after the mailbox
    assert relay.count(r"to=<ada@example.org>.*status=sent") == 1
    assert "bob@example.org" not in {m.recipient for m in relay.messages()}
    job = api.get(f"/jobs/{first.get_json()['id']}").get_json()
    assert job["status"] == "sent" and job["event"] == signup
    # Per kind in /metrics: onboarding is never averaged into verification.
    text = scrape(api.client, admin["token"])
    assert value(text, "senddock_messages_total", kind="onboarding", outcome="sent") == 1
    assert value(text, "senddock_messages_total", kind="churn", outcome="sent") == 1
    assert value(text, "senddock_messages_total", kind="churn", outcome="cancelled") == 1
    assert value(text, "senddock_messages_total", kind="verification", outcome="sent") == 0
    assert value(text, "senddock_time_to_sent_seconds_count", kind="onboarding",
                 **{"class": "lifecycle"}) == 1
    assert value(text, "senddock_time_to_sent_seconds_bucket", kind="onboarding",
                 le="60.0") == 1
    assert value(text, "senddock_retries_total", kind="onboarding") == 0
    promtool = shutil.which("promtool")
    if promtool:
        result = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                                capture_output=True, timeout=30)
        assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), \
            result.stdout + result.stderr


@pytest.mark.slow
def test_a_kinds_own_retry_schedule_and_retry_counter(
        relay: Postfix, engine: sa.Engine, config_for: Callable[..., Config],
        make_user: Callable[..., dict[str, Any]]) -> None:
    """Postfix answers 451 for one address: the kind's schedule (1 s, 1 s) is used, not
    the verification one (30, 120, 600), and each retry is counted for that kind."""
    from webapp import create_app
    from workers.delivery.pool import Pool

    relay.write_map("recipient_access", {"later@example.org": "451 4.3.0 try again later"})
    config = config_for(SMTP_URL=relay.smtp_url())
    app = create_app(config, engine=engine)
    admin = make_user("admin")
    api = Api(app.test_client(), admin["token"])
    put(api, "onboarding", ONBOARDING)
    pool = Pool(engine, config, node="kinds-retry-test")
    pool.start()
    try:
        r = api.post("/messages", {"kind": "onboarding", "user_id": "u-1",
                                   "email": "later@example.org"})
        job_id = r.get_json()["id"]
        wait_for(lambda: api.get(f"/jobs/{job_id}").get_json()["status"] == "failed",
                 timeout=30, message="the job to use up its schedule")
    finally:
        pool.stop(timeout=30)
    job = api.get(f"/jobs/{job_id}").get_json()
    assert job["attempts_made"] == 3 and [a["smtp_code"] for a in job["attempts"]] == [451] * 3
    assert relay.count(r"451 4.3.0 <later@example.org>") >= 3
    text = scrape(api.client, admin["token"])
    assert value(text, "senddock_retries_total", kind="onboarding") == 2
    assert value(text, "senddock_messages_total", kind="onboarding", outcome="failed") == 1
