"""The live campaign page tells the truth: the rate is over a real recent window,
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
from workers import queue


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


# --- The first and last seconds, and a cancelled campaign ----------------------

SPANISH = {"Accept-Language": "es"}


def _text(page: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))


def test_no_eta_while_the_rate_is_still_climbing(engine: sa.Engine) -> None:
    """A pool ramping up: 20 finishes over the first 20 s, then 100 in the last 10 s. The
    30-s rate (4/s) would promise far too long a wait; the page says it is estimating."""
    campaign = _sending(engine, 600)
    _finish(engine, campaign["id"], 20, seconds_ago=29, spread=18)
    _finish(engine, campaign["id"], 100, seconds_ago=9.5, spread=9)
    live = _live(engine, campaign["id"])
    assert live["rate"] is not None and live["eta_seconds"] is None


def test_steady_rate_gives_an_eta(engine: sa.Engine) -> None:
    campaign = _sending(engine, 600)
    _finish(engine, campaign["id"], 90, seconds_ago=29.5, spread=29)
    live = _live(engine, campaign["id"])
    assert live["eta_seconds"] is not None


def test_no_rate_once_the_queue_emptied(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """All finished a second ago but the campaign is not yet marked sent: no "164
    messages/s over the last 30 s" for a queue that is empty."""
    campaign = _sending(engine, 300)
    _finish(engine, campaign["id"], 300, seconds_ago=10, spread=9)
    live = _live(engine, campaign["id"])
    assert live["due"] == 0 and live["rate"] is None and live["eta_seconds"] is None
    page = Browser(client, make_user("marketer")).get(
        f"/campaigns/{campaign['id']}?fragment=live").get_data(as_text=True)
    assert "messages/s" not in page and 'id="campaign-eta' not in page


def test_a_retry_time_that_passed_reads_due_now(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = _sending(engine, 10)
    _finish(engine, campaign["id"], 8, seconds_ago=60)
    _retry(engine, campaign["id"], 2, due_in=[-50, -40])
    browser = Browser(client, make_user("marketer"))
    text = _text(browser.get(f"/campaigns/{campaign['id']}?fragment=live").get_data(
        as_text=True))
    assert "2 waiting to retry: the first are due now" in text, text
    assert "next at" not in text
    spanish = _text(browser.get(f"/campaigns/{campaign['id']}?fragment=live",
                                headers=SPANISH).get_data(as_text=True))
    assert "2 esperando reintento: los primeros ya tocan" in spanish, spanish


def test_one_retry_time_is_said_once(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """Two retries due in the same second: not "next at 01:02:44, last at 01:02:44."."""
    campaign = _sending(engine, 10)
    _finish(engine, campaign["id"], 8, seconds_ago=2)
    _retry(engine, campaign["id"], 2, due_in=[600])
    with engine.begin() as conn:  # the same second, different microseconds
        conn.execute(sa.text("UPDATE delivery_jobs SET available_at = date_trunc('second', "
                             "available_at) + make_interval(secs => id % 7 / 10.0) "
                             "WHERE campaign_id = :c AND status = 'retry'"),
                     {"c": campaign["id"]})
    text = _text(Browser(client, make_user("marketer")).get(
        f"/campaigns/{campaign['id']}?fragment=live").get_data(as_text=True))
    assert re.search(r"2 waiting to retry at \d\d:\d\d:\d\d UTC\. Nothing else", text), text
    assert "last at" not in text


def _cancelled(engine: sa.Engine) -> dict[str, Any]:
    """A campaign of 40: 10 sent, 2 failed, 1 bounced, 1 skipped, then cancelled (26)."""
    from webapp.domain import campaigns

    campaign = _sending(engine, 40)
    _finish(engine, campaign["id"], 10, seconds_ago=5)
    _finish(engine, campaign["id"], 2, seconds_ago=5, status="failed")
    _finish(engine, campaign["id"], 1, seconds_ago=5, status="bounced")
    _finish(engine, campaign["id"], 1, seconds_ago=5, status="skipped")
    with engine.begin() as conn:
        campaigns.cancel(conn, campaign["id"], actor="t")
    return campaign


def test_a_cancelled_campaign_is_not_read_as_done(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = _cancelled(engine)
    live = _live(engine, campaign["id"])
    assert live["processed"] == 14 and live["percent"] == 35.0
    browser = Browser(client, make_user("marketer"))
    page = browser.get(f"/campaigns/{campaign['id']}").get_data(as_text=True)
    text = _text(page)
    assert "40 of 40" not in text and "100.0 %" not in text
    assert ("Cancelled after 14 of 40 (35.0 %): sent 10, failed or bounced 3, skipped 1; "
            "26 never sent (cancelled).") in text, text
    assert 'aria-label="10 sent and 26 cancelled of 40"' in page
    assert re.search(r"Campaign cancelled at \d{4}-\d\d-\d\d \d\d:\d\d UTC\.", text)
    spanish = _text(browser.get(f"/campaigns/{campaign['id']}", headers=SPANISH)
                    .get_data(as_text=True))
    assert ("Cancelada tras 14 de 40 (35,0 %): enviados 10, fallidos o rebotados 3, "
            "omitidos 1; 26 nunca enviados (cancelados).") in spanish, spanish
    assert re.search(r"Campaña cancelada el \d\d/\d\d/\d{4} \d\d:\d\d UTC\.", spanish)
    assert "Cancelados a las" not in spanish


def test_the_campaigns_list_has_a_cancelled_column(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = _cancelled(engine)
    browser = Browser(client, make_user("marketer"))
    for headers, word in (({}, "Cancelled"), (SPANISH, "Cancelados")):
        page = browser.get("/campaigns/", headers=headers).get_data(as_text=True)
        assert f'<th class="num">{word}</th>' in page
        row = page[page.index(f'/campaigns/{campaign["id"]}"'):]
        row = row[:row.index("</tr>")]
        assert '<td class="num" data-col="cancelled">26</td>' in row
        assert '<progress max="40" value="14">' in row  # how far it got, not a full bar
