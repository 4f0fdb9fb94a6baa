"""Where people see bounces and complaints after acceptance (docs/design.md §18): the job's timeline
in the failed-jobs inbox, the support page and the jobs API (each event with its source
and raw payload, escaped), the campaign page (complaint rate, the pause reason), the
alarm banner, /metrics, and the admins' event-webhook endpoints page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import Browser, accepted_campaign
from workers.after_acceptance import event_queue, feedback
from workers.after_acceptance.reports import Feedback

T = feedback.Thresholds(complaint_min_sent=1)


def sent(engine: sa.Engine, emails: list[str]) -> tuple[dict[str, Any], dict[str, int]]:
    campaign, jobs = accepted_campaign(engine, emails)
    return campaign, {email: job["id"] for email, job in jobs.items()}


def test_bounce_shows_on_the_inbox_job_and_the_api(client: Any, engine: sa.Engine,
                                                   make_user: Callable[..., Any],
                                                   api: Api) -> None:
    _campaign, ids = sent(engine, ["x@example.com"])
    raw = "<script>alert(1)</script> 550 5.1.1 no such user"
    with engine.begin() as conn:
        feedback.apply_event(conn, "mailbox", Feedback("bounce", "x@example.com", "hard",
                                                       raw, "5.1.1"), ids["x@example.com"],
                             f"Subject: bounce\n\n{raw}", T)
    browser = Browser(client, make_user("admin"))
    page = browser.get(f"/inbox/{ids['x@example.com']}").get_data(as_text=True)
    assert 'id="job-events"' in page and "hard bounce" in page and "mailbox" in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    spanish = browser.get(f"/inbox/{ids['x@example.com']}",
                          headers={"Accept-Language": "es"}).get_data(as_text=True)
    assert "rebote definitivo" in spanish and "hard rebote" not in spanish
    assert "buzón de rebotes" in spanish
    assert "trabajo rebotado, dirección suprimida" in spanish
    job = api.get(f"/jobs/{ids['x@example.com']}").get_json()
    [event] = job["events"]
    assert (event["source"], event["type"], event["effect"]) == ("mailbox", "bounce",
                                                                 "bounced")
    assert "raw" not in event


def test_complaint_pause_reason_and_rate_on_the_campaign_page(
        client: Any, engine: sa.Engine, make_user: Callable[..., Any]) -> None:
    campaign, ids = sent(engine, ["a@example.com", "b@example.com", "c@example.com"])
    with engine.begin() as conn:
        applied = feedback.apply_event(conn, "generic", Feedback("complaint", "a@example.com"),
                                       ids["a@example.com"], {}, T)
    assert applied.campaign_paused == campaign["id"]
    browser = Browser(client, make_user("marketer"))
    page = browser.get(f"/campaigns/{campaign['id']}").get_data(as_text=True)
    assert 'id="pause-reason"' in page and "complaint rate 33.33%" in page
    assert 'id="campaign-paused-complaints"' in page
    assert 'id="campaign-complaints"' in page
    resumed = browser.post(f"/campaigns/{campaign['id']}/resume")
    assert resumed.status_code == 200
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT paused_reason FROM campaigns WHERE id = :c"),
                            {"c": campaign["id"]}).scalar() is None


def test_alarm_banner_and_metrics(client: Any, engine: sa.Engine,
                                  make_user: Callable[..., Any]) -> None:
    _campaign, ids = sent(engine, [f"m{i}@example.com" for i in range(10)])
    with engine.begin() as conn:
        feedback.apply_event(conn, "ses", Feedback("complaint", "m1@example.com",
                                                   event_id="f1"),
                             ids["m1@example.com"], {}, feedback.Thresholds())
        endpoint = event_queue.create_endpoint(conn, url="http://127.0.0.1:9/x",
                                               events=["sent"], secret="whsec_MTIzNDU2Nzg=")
        conn.execute(sa.text("UPDATE webhook_endpoints SET disabled_at = now(), "
                             "disabled_reason = 'disabled after 20 failed deliveries' "
                             "WHERE id = :e"), {"e": endpoint})
    admin = make_user("admin")
    browser = Browser(client, admin)
    from webapp.domain import health

    health._alarm_cache.clear()
    page = browser.get("/").get_data(as_text=True)
    assert "complaint rate of 10.00%" in page
    assert "Event webhook http://127.0.0.1:9/x was disabled" in page
    metrics = client.get("/metrics", headers={"Authorization": f"Bearer {admin['token']}"}
                         ).get_data(as_text=True)
    assert 'senddock_feedback_events{effect="complaint",source="ses",type="complaint"} 1.0' \
        in metrics
    assert "senddock_campaign_complaint_rate{campaign_id=" in metrics
    assert 'senddock_alarm{name="complaint_rate"} 1.0' in metrics
    assert 'senddock_alarm{name="event_webhook_disabled"} 1.0' in metrics


def test_admins_manage_event_webhook_endpoints(client: Any, engine: sa.Engine,
                                               make_user: Callable[..., Any]) -> None:
    browser = Browser(client, make_user("admin"))
    bad = browser.post("/admin/event-webhooks/", {"url": "ftp://x", "events": "sent"})
    assert "must be an http" in bad.get_data(as_text=True)
    page = browser.client.post("/admin/event-webhooks/", data={
        "url": "https://app.example.com/hooks", "events": ["bounced", "complained"],
        "csrf_token": browser.token}, follow_redirects=True).get_data(as_text=True)
    assert "https://app.example.com/hooks" in page and "whsec_" in page
    with engine.connect() as conn:
        [endpoint] = event_queue.endpoints(conn)
    assert endpoint["events"] == ["bounced", "complained"]
    browser.post(f"/admin/event-webhooks/{endpoint['id']}/disable")
    with engine.connect() as conn:
        assert event_queue.endpoints(conn)[0]["enabled"] is False
    marketer = Browser(client.application.test_client(), make_user("marketer"))
    assert marketer.get("/admin/event-webhooks/").status_code == 403
