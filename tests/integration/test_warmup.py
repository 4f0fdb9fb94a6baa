"""Warm-up that the pacer enforces (docs/design.md §33): a real pool drains a campaign from a
domain in warm-up to the sink; beyond the day's cap the rest wait — pending, no attempt used,
not sent — until the next day (the database's day moved in the test), and past the end of
the schedule nothing is capped."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

import sqlalchemy as sa

from tests.conftest import wait_for
from tests.helpers import Browser, campaign_status, waiting_on_a_lock
from webapp.domain import campaigns, lists
from workers import queue
from workers.core.settings import Config
from workers.delivery import warmup
from workers.delivery.pool import Pool


def text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return html.unescape(response.get_data(as_text=True))


def _campaign(engine: sa.Engine, recipients: int) -> int:
    with engine.begin() as conn:
        lst = lists.create_list(conn, "Warm-up list")
        lists.add_subscribers(conn, lst["id"], [
            {"email": f"r{i}@example.org"} for i in range(recipients)])
        campaign = campaigns.create(conn, {"name": "Warm", "list_id": lst["id"],
                                           "subject": "Hello", "text": "Hi"},
                                    default_from="news@warm.example")
        campaigns.send(conn, campaign["id"])
    return int(campaign["id"])


def _jobs(engine: sa.Engine, campaign_id: int) -> dict[str, int]:
    with engine.connect() as conn:
        return {row.state: int(row.n) for row in conn.execute(sa.text("""
            SELECT CASE WHEN status = 'pending' AND available_at > now() THEN 'waiting'
                        ELSE status END AS state, count(*) AS n
              FROM delivery_jobs WHERE campaign_id = :c GROUP BY 1"""), {"c": campaign_id})}


def _wait_jobs(engine: sa.Engine, campaign_id: int, expected: dict[str, int],
               message: str) -> None:
    """Wait until the campaign's jobs are ``expected``; a timeout says what was seen last
    and what the warm-up counted (so a failure explains itself)."""
    seen: list[dict[str, int]] = []

    def reached() -> bool:
        seen[:] = [_jobs(engine, campaign_id)]
        return seen[0] == expected

    try:
        wait_for(reached, timeout=60, message=message)
    except AssertionError as exc:
        with engine.connect() as conn:
            sends = conn.execute(sa.text(
                "SELECT hour, sent FROM warmup_sends ORDER BY hour")).all()
            clock = conn.execute(sa.text("SELECT now()")).scalar_one()
        raise AssertionError(f"{exc}; jobs last seen {seen}, warm-up sends {sends}, "
                             f"database clock {clock}") from exc


def _next_day(engine: sa.Engine) -> None:
    """Move the warm-up one day on: everything dated a day earlier, as if the database's
    clock had passed midnight (UTC)."""
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE warmups SET started_on = started_on - 1"))
        conn.execute(sa.text("UPDATE warmup_sends SET hour = hour - interval '1 day'"))
        conn.execute(sa.text("""
            UPDATE delivery_jobs SET available_at = available_at - interval '1 day'
             WHERE status = 'pending' AND available_at > now()"""))
    warmup._seen.clear()


def test_caps_for_the_ramp_and_a_table() -> None:
    assert warmup.caps_for(1, None, 0.25) == (50, 13)
    assert warmup.caps_for(len(warmup.RAMP), None, 1.0) == (warmup.RAMP[-1],) * 2
    assert warmup.caps_for(len(warmup.RAMP) + 1, None, 0.25) == (None, None)
    assert warmup.caps_for(2, [3, 5], 0.5) == (5, 3)
    assert warmup.caps_for(0, [3, 5], 0.5) == (None, None)


def test_beyond_the_cap_mail_waits_until_the_next_day(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config]) -> None:
    with engine.begin() as conn:
        warmup.start(conn, "warm.example", caps=[3, 5], hour_share=1.0)
    warmup._seen.clear()
    campaign_id = _campaign(engine, 10)
    pool = Pool(engine, config_for(sink.port), node="warmup")
    pool.start()
    try:
        _wait_jobs(engine, campaign_id, {"sent": 3, "waiting": 7},
                   "day 1: three sent, the rest waiting")
        assert len(sink.raw_messages()) == 3
        with engine.connect() as conn:
            today = warmup.status(conn, "warm.example")
            attempts = conn.execute(sa.text("""
                SELECT count(*) FROM job_attempts a JOIN delivery_jobs j ON j.id = a.job_id
                 WHERE j.campaign_id = :c"""), {"c": campaign_id}).scalar_one()
            due = conn.execute(sa.text("""
                SELECT DISTINCT available_at = (date_trunc('day', now() AT TIME ZONE 'UTC')
                                                + interval '1 day') AT TIME ZONE 'UTC'
                  FROM delivery_jobs WHERE campaign_id = :c AND status = 'pending'"""),
                {"c": campaign_id}).scalars().all()
        assert today is not None and (today.day, today.daily_cap, today.sent_today) == (1, 3, 3)
        assert today.allowed == 0
        assert attempts == 3  # the waiting mail used no attempt
        assert due == [True]  # due at the start of the next (UTC) day
        assert campaign_status(engine, campaign_id) == "sending"

        _next_day(engine)
        _wait_jobs(engine, campaign_id, {"sent": 8, "waiting": 2},
                   "day 2: five more sent")
        with engine.connect() as conn:
            today = warmup.status(conn, "warm.example")
        assert today is not None and (today.day, today.sent_today) == (2, 5)

        _next_day(engine)  # past the schedule's end: no cap
        wait_for(lambda: campaign_status(engine, campaign_id) == "sent", timeout=60,
                 message="campaign to finish")
        assert len(sink.raw_messages()) == 10
    finally:
        pool.stop()


def test_the_domain_page_starts_shows_and_stops_a_warm_up(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    admin = Browser(app.test_client(), make_user("admin"))
    page = "/admin/domains/warm.example/deliverability"
    assert "Not in warm-up" in text(admin.get(page))
    refused = text(admin.client.post("/admin/domains/warm.example/warmup", data={
        "csrf_token": admin.token, "caps": "10, lots"}, follow_redirects=True))
    assert "Daily caps are whole numbers above 0, not “lots”." in refused
    assert "Not in warm-up" in refused
    started = text(admin.client.post("/admin/domains/warm.example/warmup", data={
        "csrf_token": admin.token, "caps": "40 80", "hour_share": "50"},
        follow_redirects=True))
    assert "Warm-up of warm.example started: day 1 today." in started
    with engine.begin() as conn:  # two messages already let out this hour
        conn.execute(sa.text("INSERT INTO warmup_sends VALUES "
                             "('warm.example', date_trunc('hour', now()), 2)"))
    shown = text(admin.get(page))
    assert re.search(r'id="warmup-day">1<.*id="warmup-cap">40<.*<td>20</td>'
                     r'.*id="warmup-sent">2<', shown, re.S)
    spanish = text(admin.get(page, headers={"Accept-Language": "es"}))
    assert "Calentamiento" in spanish and "Límite de hoy" in spanish
    # Queue health lists it; at its cap it says the rest waits.
    health = text(admin.get("/health/"))
    assert re.search(r'id="warmups".*warm\.example.*<td class="num">1</td>'
                     r'<td class="num">2</td><td class="num">40', health, re.S)
    assert "at its cap" not in health
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE warmup_sends SET sent = 20"))
    assert "at its cap: the rest waits" in text(admin.get("/health/"))
    assert "en su límite: el resto espera" in text(admin.get(
        "/health/", headers={"Accept-Language": "es"}))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE warmups SET started_on = started_on - 2"))
    assert "schedule finished: no cap" in text(admin.get(page))
    stopped = text(admin.client.post("/admin/domains/warm.example/warmup/stop", data={
        "csrf_token": admin.token}, follow_redirects=True))
    assert "Warm-up of warm.example stopped" in stopped and "Not in warm-up" in stopped
    assert admin.client.post("/admin/domains/warm.example/warmup", data={
        "caps": "1"}).status_code in (400, 403)  # no CSRF token


def test_other_roles_cannot_start_a_warm_up(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    marketer = Browser(app.test_client(), make_user("marketer"))
    for path in ("/admin/domains/warm.example/warmup",
                 "/admin/domains/warm.example/warmup/stop"):
        r = marketer.client.post(path, data={"csrf_token": marketer.token, "caps": "1"})
        assert r.status_code == 403
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM warmups")).scalar_one() == 0


def test_transactional_mail_is_counted_but_never_held(
        engine: sa.Engine, sink: Any, api: Any, config_for: Callable[..., Config]) -> None:
    with engine.begin() as conn:  # the tests' From address is tests@example.com
        warmup.start(conn, "example.com", caps=[1], hour_share=1.0)
    warmup._seen.clear()
    for user in ("u1", "u2", "u3"):
        r = api.post("/messages", {"kind": "verification", "user_id": user,
                                   "email": f"{user}@example.org",
                                   "data": {"verify_url": "https://app.example/v/1"}})
        assert r.status_code == 202, r.get_json()
    with engine.begin() as conn:
        lst = lists.create_list(conn, "Same domain")
        lists.add_subscribers(conn, lst["id"], [{"email": f"c{i}@example.org"}
                                                for i in range(4)])
        campaign = campaigns.create(conn, {"name": "Same", "list_id": lst["id"],
                                           "subject": "Hello", "text": "Hi"},
                                    default_from="news@example.com")
        campaigns.send(conn, campaign["id"])

    def verifications_sent() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(*) FROM delivery_jobs WHERE kind = 'verification' "
                "AND status = 'sent'")).scalar_one())

    pool = Pool(engine, config_for(sink.port), node="warmup-tx")
    pool.start()
    try:
        wait_for(lambda: verifications_sent() == 3
                 and sum(_jobs(engine, campaign["id"]).values()) == 4
                 and _jobs(engine, campaign["id"]).get("waiting", 0) >= 3,
                 timeout=60, message="verifications sent, the campaign held at its cap")
        with engine.connect() as conn:
            today = warmup.status(conn, "example.com")
        assert today is not None and today.sent_today >= 3  # over the cap of 1: counted
        assert _jobs(engine, campaign["id"]).get("sent", 0) <= 1
    finally:
        pool.stop()


def test_the_campaign_page_says_when_the_caps_let_the_rest_go(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """120 recipients under caps of 50, 50, 100: 50 today, 50 tomorrow, the last 20 on day
    3 — the page says so instead of a rate-based ETA; under the cap it says nothing."""
    campaign_id = _campaign(engine, 120)
    with engine.begin() as conn:  # the jobs made, as a worker makes them
        queue.enqueue_broadcast(conn, conn.execute(sa.text(
            "SELECT broadcast_id FROM campaigns WHERE id = :c"), {"c": campaign_id}).scalar())
    marketer = Browser(app.test_client(), make_user("marketer"))
    page = f"/campaigns/{campaign_id}"
    assert 'id="campaign-warmup"' not in text(marketer.get(page))
    with engine.begin() as conn:
        warmup.start(conn, "warm.example", [50, 50, 100])
        started = warmup.status(conn, "warm.example")
    assert started is not None
    shown = text(marketer.get(page))
    day3 = (started.started_on + timedelta(days=2)).isoformat()
    assert ("Warm-up of warm.example, day 1: at most 50 a day (0 sent today). The 120 left "
            f"go out as the schedule allows, by about {day3} (day 3)") in shown
    spanish = text(marketer.get(page, headers={"Accept-Language": "es"}))
    assert "Calentamiento de warm.example, día 1: como máximo 50 al día" in spanish
    assert f"hacia el {day3} (día 3)" in spanish
    with engine.begin() as conn:  # today's 50 went out: still day 3
        conn.execute(sa.text("INSERT INTO warmup_sends VALUES "
                             "('warm.example', date_trunc('hour', now()), 50)"))
    assert f"(50 sent today). The 120 left go out as the schedule allows, by about {day3}" \
        in text(marketer.get(page))
    with engine.begin() as conn:  # a bigger table: all 120 fit today
        warmup.start(conn, "warm.example", [500])
        conn.execute(sa.text("DELETE FROM warmup_sends"))
    assert 'id="campaign-warmup"' not in text(marketer.get(page))


def test_the_outlook_past_the_schedule() -> None:
    """Past the schedule's last day there is no cap: whatever is left goes that day."""
    today = warmup.Today("d.example", date(2026, 1, 1), 1, 10, 3, 0, 0, True)
    assert warmup.Outlook(today, 5, 1, date(2026, 1, 1)).held is False
    assert warmup.Outlook(today, 50, 2, date(2026, 1, 2)).held is True


def test_claims_that_wait_on_each_other_share_the_cap(engine: sa.Engine) -> None:
    """Two claims at once (two threads, two processes): the second waits on the first's
    lock on the warm-up row, and must then count what the first counted. A statement that
    waited on a lock still reads with the snapshot it started with, so the sends are read
    after the lock is held, in a statement of their own."""
    import threading

    with engine.begin() as conn:
        warmup.start(conn, "warm.example", caps=[3], hour_share=1.0)
    campaign_id = _campaign(engine, 6)
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, int(conn.execute(sa.text(
            "SELECT broadcast_id FROM campaigns WHERE id = :c"), {"c": campaign_id}).scalar_one()))
        first = queue.claim_batch(conn, "w1", 3, "example.org")
        second = queue.claim_batch(conn, "w2", 3, "example.org")
    assert len(first) == len(second) == 3
    went: dict[str, list[int]] = {}
    holder = engine.connect()
    holder.begin()
    went["first"] = [j.id for j in warmup.hold_over_cap(holder, first)]

    def other() -> None:
        with engine.begin() as conn:
            went["second"] = [j.id for j in warmup.hold_over_cap(conn, second)]

    thread = threading.Thread(target=other)
    thread.start()

    wait_for(lambda: waiting_on_a_lock(engine), timeout=30,
             message="the second claim to wait on the lock")
    holder.commit()
    holder.close()
    thread.join(30)
    assert len(went["first"]) == 3
    assert went["second"] == [], "the second claim sent past the day's cap of 3"
    with engine.connect() as conn:
        today = warmup.status(conn, "warm.example")
    assert today is not None and today.sent_today == 3
