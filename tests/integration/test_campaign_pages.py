"""Campaigns from the marketer's side: compose with template errors shown by line, audience
summary, preview, test send, send/schedule, pause/resume/cancel against a real pool, and
the live fragment (real PostgreSQL, real SMTP sink)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from tests.conftest import wait_for
from tests.helpers import Browser, campaign_status, make_campaign
from webapp.domain import campaigns, lists, progress, queue_reads
from webapp.domain.suppressions import suppress
from workers import queue
from workers.core.settings import Config
from workers.delivery.pool import Pool


def _counts(engine: sa.Engine, campaign_id: int) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(campaigns.with_counts(conn, campaign_id)["counts"])


def _pool(engine: sa.Engine, config: Config) -> Pool:
    pool = Pool(engine, config, node="test-node")
    pool.start()
    return pool


def test_compose_shows_template_error_with_its_line_and_keeps_input(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    with engine.begin() as conn:
        list_id = lists.create_list(conn, "Readers")["id"]
    browser = Browser(client, make_user("marketer"))
    html = "<p>Hello</p>\n<p>{{ name }</p>\n"
    r = browser.post("/campaigns/new", {"name": "Broken", "list_id": str(list_id),
                                        "from": "", "subject": "Hi", "html": html, "text": ""})
    page = r.get_data(as_text=True)
    assert r.status_code == 422
    assert "Template error in html on line 2" in page
    assert "html, line 2:</span> &lt;p&gt;{{ name }&lt;/p&gt;" in page
    assert "&lt;p&gt;{{ name }&lt;/p&gt;\n</textarea>" in page  # nothing typed is lost
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM campaigns")).scalar() == 0
    r = browser.post("/campaigns/new", {"name": "Fixed", "list_id": str(list_id), "from": "",
                                        "subject": "Hi {{ name }}",
                                        "html": "<p>{{ name }}</p>", "text": ""})
    assert r.status_code == 200 and "Draft saved" in r.get_data(as_text=True)


def test_audience_counts_and_review_page(client: Any, engine: sa.Engine,
                                         make_user: Callable[..., dict[str, Any]]) -> None:
    emails = [f"r{i}@example.org" for i in range(10)]
    campaign = make_campaign(engine, emails, send=False)
    with engine.begin() as conn:
        suppress(conn, "R1@example.org", "bounced", actor="t")
        suppress(conn, "r2@example.org", "unsubscribed", actor="t")
        conn.execute(sa.text("UPDATE subscribers SET status = 'blocklisted' "
                             "WHERE email IN ('r3@example.org', 'r2@example.org')"))
        assert campaigns.audience(conn, campaign["list_id"]) == {
            "members": 10, "suppressed": 2, "inactive": 1, "will_receive": 7}
    page = Browser(client, make_user("marketer")).get(
        f"/campaigns/{campaign['id']}/send").get_data(as_text=True)
    assert re.search(r'id="audience-will-receive"><strong>7</strong>', page)
    assert "Send now to 7 recipients" in page


def test_preview_renders_a_real_subscriber_escaped(client: Any, engine: sa.Engine,
                                                   make_user: Callable[..., dict[str, Any]]
                                                   ) -> None:
    campaign = make_campaign(engine, ["a@example.org"], send=False)
    with engine.begin() as conn:
        lists.add_subscribers(conn, campaign["list_id"], [
            {"email": "evil@example.org", "name": "<script>x</script>"}])
        evil = conn.execute(sa.text("SELECT id FROM subscribers WHERE email = "
                                    "'evil@example.org'")).scalar_one()
    browser = Browser(client, make_user("marketer"))
    page = browser.get(f"/campaigns/{campaign['id']}/preview?subscriber={evil}")
    text = page.get_data(as_text=True)
    assert "Hello &lt;script&gt;x&lt;/script&gt;" in text  # subject, escaped
    assert "/u/" in text  # the text body's unsubscribe_url is a real link
    body = browser.get(f"/campaigns/{campaign['id']}/preview.html?subscriber={evil}")
    assert body.get_data(as_text=True) == "<p>Hi &lt;script&gt;x&lt;/script&gt;</p>"
    assert "sandbox" in body.headers["Content-Security-Policy"]
    by_search = browser.get(f"/campaigns/{campaign['id']}/preview?q=a%40example")
    assert "Hello a" in by_search.get_data(as_text=True)


def test_test_send_is_delivered_with_prefix_and_subscriber_fields(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config]) -> None:
    campaign = make_campaign(engine, ["ada@example.org"], send=False)
    with engine.begin() as conn:
        ada = conn.execute(sa.text("SELECT id FROM subscribers")).scalar_one()
        job_id = campaigns.test_send(conn, campaign["id"], "me@example.com",
                                     subscriber_id=ada, actor="tester")
        job = queue_reads.get_job(conn, job_id)
    assert job is not None and job["kind"] == "test"
    assert job["payload"] == {"campaign_id": campaign["id"], "subscriber_id": ada}
    pool = _pool(engine, config_for(sink.port))
    try:
        wait_for(lambda: sink.records(), timeout=30, message="test message")
    finally:
        pool.stop()
    record = sink.records()[0]
    assert record["rcpt_tos"] == ["me@example.com"]
    assert record["subject"] == "[Test] Hello ada"  # the subscriber's fields, the prefix
    assert campaign_status(engine, campaign["id"]) == "draft"
    assert _counts(engine, campaign["id"])["sent"] == 0  # tests count in no campaign figure


def test_pause_resume_cancel_with_a_real_pool(engine: sa.Engine, sink: Any,
                                              config_for: Callable[..., Config]) -> None:
    sink.set_rules({"rules": [], "delay": 0.02})
    campaign = make_campaign(engine, [f"p{i}@example.org" for i in range(400)])
    pool = _pool(engine, config_for(sink.port, WORKERS="2", CLAIM_BATCH="5"))
    try:
        wait_for(lambda: _counts(engine, campaign["id"])["sent"] >= 20, timeout=30,
                 message="some sent")
        with engine.begin() as conn:
            assert campaigns.pause(conn, campaign["id"], actor="t")["status"] == "paused"
        # In-flight messages finish; then nothing is sent or finished while paused. A claim
        # whose snapshot predates the pause may still take a job, and the send guard gives
        # it back: it moves between pending and sending, never further.
        wait_for(lambda: _counts(engine, campaign["id"])["sending"] == 0, timeout=10,
                 message="in-flight to finish")
        frozen = _counts(engine, campaign["id"])
        sent_before = len(sink.records())
        import time
        time.sleep(1.5)
        now = _counts(engine, campaign["id"])
        assert len(sink.records()) == sent_before
        assert now["pending"] + now["sending"] == frozen["pending"] + frozen["sending"]
        assert {k: v for k, v in now.items() if k not in ("pending", "sending")} == \
            {k: v for k, v in frozen.items() if k not in ("pending", "sending")}
        assert frozen["pending"] > 0
        with engine.begin() as conn:
            campaigns.resume(conn, campaign["id"], actor="t")
        wait_for(lambda: _counts(engine, campaign["id"])["sent"] > frozen["sent"] + 10,
                 timeout=30, message="sending to resume")
        with engine.begin() as conn:
            assert campaigns.cancel(conn, campaign["id"], actor="t")["status"] == "cancelled"
        # In-flight messages finish; the engine's settler cancels the waiting ones.
        wait_for(lambda: not any(_counts(engine, campaign["id"])[s]
                                 for s in ("sending", "pending", "retry")), timeout=30,
                 message="in-flight to finish and the rest settled after cancel")
    finally:
        pool.stop()
    counts = _counts(engine, campaign["id"])
    assert counts["cancelled"] > 0 and counts["pending"] == counts["retry"] == 0
    assert counts["sent"] + counts["cancelled"] == 400
    assert counts["sent"] == len(sink.records())  # cancelled ones were never handed over
    with engine.connect() as conn:
        assert counts == queue.broadcast_counts_slow(conn, campaign["broadcast_id"])
    assert campaign_status(engine, campaign["id"]) == "cancelled"


def test_scheduled_campaign_fires_and_live_fragment_follows_it(
        client: Any, engine: sa.Engine, sink: Any, config_for: Callable[..., Config],
        make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = make_campaign(engine, [f"s{i}@example.org" for i in range(25)], send=False)
    browser = Browser(client, make_user("marketer"))
    at = datetime.now(UTC) + timedelta(seconds=3)
    r = browser.post(f"/campaigns/{campaign['id']}/send", {
        "when": "later", "at": at.strftime("%Y-%m-%dT%H:%M:%S"), "tz_offset": "0"})
    assert "Scheduled for" in r.get_data(as_text=True)
    assert campaign_status(engine, campaign["id"]) == "scheduled"
    fragment = browser.get(f"/campaigns/{campaign['id']}?fragment=live").get_data(as_text=True)
    assert 'hx-trigger="every 2s' in fragment and "Will be sent at" in fragment
    assert "<html" not in fragment
    past = browser.post(f"/campaigns/{campaign['id']}/send", {
        "when": "later", "at": "2001-01-01T00:00", "tz_offset": "0"})
    assert "already passed" in past.get_data(as_text=True) or "already scheduled" in \
        past.get_data(as_text=True)
    pool = _pool(engine, config_for(sink.port))
    try:
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=40,
                 message="scheduled campaign to be sent")
    finally:
        pool.stop()
    with engine.connect() as conn:
        live = progress.live(conn, campaign["id"])
        actions = set(conn.execute(sa.text("SELECT action FROM audit_log")).scalars())
    assert live["done"] == live["total"] == 25 and live["remaining"] == 0
    assert {"campaign.schedule", "campaign.send"} <= actions
    final = browser.get(f"/campaigns/{campaign['id']}?fragment=live").get_data(as_text=True)
    assert "hx-trigger" not in final  # finished: polling stops
    assert 'data-state="sent"><div class="n">25<' in final


def test_live_page_rate_errors_and_inbox_link(client: Any, engine: sa.Engine, sink: Any,
                                              config_for: Callable[..., Config],
                                              make_user: Callable[..., dict[str, Any]]
                                              ) -> None:
    sink.set_rules({"rules": [
        {"match": "dead*@example.org", "reply": "550 5.1.1 <b>No such user</b>"}],
        "delay": 0.05})  # ~40 msgs/s with 2 workers: a few seconds to watch the rate in
    emails = [f"ok{i}@example.org" for i in range(150)] + [f"dead{i}@example.org"
                                                           for i in range(3)]
    campaign = make_campaign(engine, emails)
    pool = _pool(engine, config_for(sink.port, WORKERS="2", CLAIM_BATCH="5"))
    try:
        live = wait_for(lambda: (lambda c: c if c["rate"] and c["eta_seconds"] else None)(
            _live(engine, campaign["id"])), timeout=30, message="a sending rate and an ETA")
        assert live["rate"] > 0 and live["eta_seconds"] is not None
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=60,
                 message="campaign to finish")
    finally:
        pool.stop()
    live = _live(engine, campaign["id"])
    assert live["errors"] == [{"reply": live["errors"][0]["reply"], "n": 3}]
    page = Browser(client, make_user("marketer")).get(f"/campaigns/{campaign['id']}")
    text = page.get_data(as_text=True)
    assert "&lt;b&gt;No such user&lt;/b&gt;" in text and "<b>No such user" not in text
    # A marketer may not open the admin inbox: the link goes to the read-only failures page.
    assert f'href="/campaigns/{campaign["id"]}/failures"' in text
    assert 'id="campaign-done">153<' in text


def _live(engine: sa.Engine, campaign_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        return progress.live(conn, campaign_id)


def test_campaign_list_page_and_actions_from_the_page(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    browser = Browser(client, make_user("marketer"))
    empty = browser.get("/campaigns/").get_data(as_text=True)
    assert "Create a list" in empty  # the empty state says what to do first
    campaign = make_campaign(engine, ["x@example.org"], name="Shown")
    listing = browser.get("/campaigns/").get_data(as_text=True)
    assert "Shown" in listing and 'id="campaign-table"' in listing
    assert f"/campaigns/{campaign['id']}" in listing
    paused = browser.post(f"/campaigns/{campaign['id']}/pause")
    assert "Paused" in paused.get_data(as_text=True)
    again = browser.post(f"/campaigns/{campaign['id']}/pause")
    assert "Could not pause" in again.get_data(as_text=True)
    resumed = browser.post(f"/campaigns/{campaign['id']}/resume")
    assert "Resumed" in resumed.get_data(as_text=True)
