"""The live campaign page tells the truth (issue 17): the rate is over a real recent window,
a stall is said as a stall, messages on retry backoff are stated with their next run
instead of being folded into an ETA, the percentage never reads 100 % before the end, and
a banner about the campaign's state goes once the state has changed."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC
from typing import Any

import sqlalchemy as sa

from tests.helpers import Browser, make_campaign, place_jobs
from webapp.domain import audit, progress
from webapp.domain.progress import percent_done
from workers.delivery import queue


def test_percentages_never_round_up_to_done() -> None:
    assert percent_done(9_993, 9_997) == 99.9
    assert percent_done(9_996, 9_997) == 99.9
    assert percent_done(1, 3) == 33.3
    assert percent_done(9_997, 9_997) == 100.0
    assert percent_done(0, 0) == 0.0


def _sending(engine: sa.Engine, n: int) -> dict[str, Any]:
    """A campaign of ``n`` recipients whose jobs exist and whose send began 5 min ago."""
    campaign = make_campaign(engine, [f"r{i}@example.org" for i in range(n)])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        conn.execute(sa.text("UPDATE broadcasts SET enqueued_at = now() - interval '5 min' "
                             "WHERE id = :b"), {"b": campaign["broadcast_id"]})
    return campaign


def _finish(engine: sa.Engine, campaign_id: int, n: int, seconds_ago: float,
            spread: float = 0.0, status: str = "sent") -> None:
    """Mark ``n`` pending jobs finished between ``seconds_ago`` and ``seconds_ago - spread``."""
    with engine.begin() as conn:
        place_jobs(conn, sa.text("""
            WITH picked AS (
                SELECT id, row_number() OVER (ORDER BY id) AS i FROM delivery_jobs
                 WHERE campaign_id = :c AND status = 'pending' ORDER BY id LIMIT :n)
            UPDATE delivery_jobs j SET status = :status, attempts = 1,
                   finished_at = now() - make_interval(
                       secs => :ago - :spread * (picked.i - 1) / greatest(:n - 1, 1))
              FROM picked WHERE j.id = picked.id"""),
            {"c": campaign_id, "n": n, "ago": seconds_ago, "spread": spread,
             "status": status})


def _retry(engine: sa.Engine, campaign_id: int, n: int, due_in: list[int]) -> None:
    with engine.begin() as conn:
        place_jobs(conn, sa.text("""
            WITH picked AS (
                SELECT id, row_number() OVER (ORDER BY id) AS i FROM delivery_jobs
                 WHERE campaign_id = :c AND status = 'pending' ORDER BY id LIMIT :n)
            UPDATE delivery_jobs j SET status = 'retry', attempts = 1,
                   last_error = '451 4.3.0 try later',
                   available_at = now() + make_interval(
                       secs => (CAST(:due AS int[]))[1 + (picked.i % cardinality(
                           CAST(:due AS int[])))])
              FROM picked WHERE j.id = picked.id"""),
            {"c": campaign_id, "n": n, "due": due_in})


def _live(engine: sa.Engine, campaign_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        return progress.live(conn, campaign_id)


def test_a_stall_is_said_as_a_stall_not_an_old_average(engine: sa.Engine) -> None:
    campaign = _sending(engine, 300)
    _finish(engine, campaign["id"], 150, seconds_ago=25, spread=8)  # busy, then quiet
    live = _live(engine, campaign["id"])
    assert live["rate"] is None and live["eta_seconds"] is None
    assert 16 <= live["stalled_for"] <= 30


def test_rate_is_over_the_last_30_seconds(engine: sa.Engine) -> None:
    campaign = _sending(engine, 300)
    _finish(engine, campaign["id"], 100, seconds_ago=200, spread=60)  # long ago: not counted
    _finish(engine, campaign["id"], 60, seconds_ago=29, spread=29)  # 60 in the last 30 s
    live = _live(engine, campaign["id"])
    assert live["stalled_for"] is None
    assert 1.8 <= live["rate"] <= 2.2, live["rate"]
    assert live["due"] == 140
    assert 60 <= live["eta_seconds"] <= 80  # 140 due at ~2/s


def test_rate_starts_again_at_resume(engine: sa.Engine) -> None:
    campaign = _sending(engine, 300)
    _finish(engine, campaign["id"], 100, seconds_ago=20, spread=10)  # before the pause
    with engine.begin() as conn:
        audit.record(conn, "tests", "campaign.resume", f"campaign:{campaign['id']}")
    _finish(engine, campaign["id"], 10, seconds_ago=0.5, spread=0.5)
    with engine.begin() as conn:  # resumed 4 s ago
        conn.execute(sa.text("UPDATE audit_log SET at = now() - interval '4 s' "
                             "WHERE action = 'campaign.resume'"))
    live = _live(engine, campaign["id"])
    assert 2.0 <= live["rate"] <= 3.0, live["rate"]  # 10 over 4 s, not 110 over 30 s


def test_retries_on_backoff_are_stated_with_their_next_run(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = _sending(engine, 200)
    _finish(engine, campaign["id"], 76, seconds_ago=3, spread=3)
    _retry(engine, campaign["id"], 120, due_in=[30, 120])
    _finish(engine, campaign["id"], 4, seconds_ago=1)  # nothing due is left
    live = _live(engine, campaign["id"])
    assert live["due"] == 0 and live["eta_seconds"] is None
    assert live["retry_next_at"] < live["retry_last_at"]
    assert round((live["retry_last_at"] - live["retry_next_at"]).total_seconds()) == 90
    page = Browser(client, make_user("marketer")).get(
        f"/campaigns/{campaign['id']}?fragment=live").get_data(as_text=True)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))
    assert re.search(r"120 waiting to retry, next at \d\d:\d\d:\d\d UTC, last at "
                     r"\d\d:\d\d:\d\d UTC", text), text
    assert "Nothing else is left to send until then" in text
    assert "left for the" not in text  # no ETA pretends to cover the retries
    assert "80 of 200 done (40.0 %)" in text


def test_the_page_never_says_100_percent_before_the_end(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = _sending(engine, 2000)
    _finish(engine, campaign["id"], 1999, seconds_ago=2, spread=1)
    page = Browser(client, make_user("marketer")).get(
        f"/campaigns/{campaign['id']}?fragment=live").get_data(as_text=True)
    assert 'id="campaign-percent">99.9 %<' in page


def test_a_state_banner_goes_once_the_state_changed(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = make_campaign(engine, ["a@example.org"], send=False)
    browser = Browser(client, make_user("marketer"))
    shown = browser.post(f"/campaigns/{campaign['id']}/send", {"when": "now"})
    assert 'data-while-status="sending">Sending started' in shown.get_data(as_text=True)
    browser.post(f"/campaigns/{campaign['id']}/send", {"when": "now"},
                 follow_redirects=False)  # refused: already sending, but flashes an error
    browser.post(f"/campaigns/{campaign['id']}/pause", follow_redirects=False)
    with engine.begin() as conn:  # ...and it is resumed and finishes before the page loads
        conn.execute(sa.text("UPDATE campaigns SET status = 'sent' WHERE id = :c"),
                     {"c": campaign["id"]})
    page = browser.get(f"/campaigns/{campaign['id']}").get_data(as_text=True)
    assert "Paused: nothing new" not in page and "Sending started" not in page


def test_finish_time_is_the_first_completion_and_retries_are_shown_apart(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    from webapp.domain import inbox

    campaign = _sending(engine, 2)
    _finish(engine, campaign["id"], 1, seconds_ago=1)
    _finish(engine, campaign["id"], 1, seconds_ago=1, status="failed")
    with engine.begin() as conn:
        assert queue.complete_finished_campaigns(conn) == [campaign["id"]]
        conn.execute(sa.text("UPDATE campaigns SET finished_at = now() - interval '10 min' "
                             "WHERE id = :c"), {"c": campaign["id"]})
        first = conn.execute(sa.text("SELECT finished_at FROM campaigns WHERE id = :c"),
                             {"c": campaign["id"]}).scalar_one()
        failed = conn.execute(sa.text("SELECT id FROM delivery_jobs WHERE campaign_id = :c "
                                      "AND status = 'failed'"), {"c": campaign["id"]}
                              ).scalar_one()
        inbox.retry(conn, failed, actor="admin@example.org")
    browser = Browser(client, make_user("marketer"))
    reopened = browser.get(f"/campaigns/{campaign['id']}?fragment=live").get_data(as_text=True)
    assert "First finished at" in reopened and "retried since are being sent" in reopened
    with engine.begin() as conn:
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'sent', finished_at = now() "
                             "WHERE id = :j"), {"j": failed})
        assert queue.complete_finished_campaigns(conn) == [campaign["id"]]
        again = conn.execute(sa.text("SELECT finished_at FROM campaigns WHERE id = :c"),
                             {"c": campaign["id"]}).scalar_one()
    assert again == first  # the retry did not move the campaign's finish time
    page = browser.get(f"/campaigns/{campaign['id']}?fragment=live").get_data(as_text=True)
    assert f"Finished at {first.astimezone(UTC):%Y-%m-%d %H:%M} UTC" in page
    assert 'id="campaign-retried-finished">Messages retried later finished at' in page
