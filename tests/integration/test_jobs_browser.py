"""The jobs browser (issue 17): an admin sees the queue by state with filters and exact
counts (waiting in claim order, retrying with its next run, in flight, held, scheduled,
failed = the inbox), retry and dismiss keep the filtered list, "retry all" says how many,
and the queue health numbers link into it."""

from __future__ import annotations

import re
from collections.abc import Callable
from html import unescape
from typing import Any

import sqlalchemy as sa

from tests.helpers import Browser, make_campaign, place_jobs
from tests.integration.security_fixtures import failed_job
from workers.delivery import queue


def _text(html: str) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def _tab_counts(page: str) -> dict[str, int]:
    return {t: int(n.replace(",", "")) for t, n in re.findall(
        r'data-tab="(\w+)">[^<]*<span class="count">([\d,]+)</span>', page)}


def _queue(engine: sa.Engine) -> dict[str, Any]:
    campaign = make_campaign(engine, [f"r{i:02d}@example.org" for i in range(60)],
                             name="Big")
    other = make_campaign(engine, ["x@example.org"], name="Other")
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        queue.enqueue_broadcast(conn, other["broadcast_id"])
        place_jobs(conn, sa.text("""
            UPDATE delivery_jobs SET status = 'retry', attempts = 2,
                   available_at = now() + make_interval(secs => 30 + id),
                   last_error = '451 4.7.1 greylisted'
             WHERE campaign_id = :c AND email < 'r10'"""), {"c": campaign["id"]})
        ids = [failed_job(conn, f"f{i}@example.org", "550 5.7.1 blocked") for i in range(3)]
    return {"campaign": campaign, "other": other, "failed": ids}


def test_tabs_count_exactly_and_list_in_order(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    made = _queue(engine)
    browser = Browser(client, make_user("admin"))
    page = browser.get("/jobs/").get_data(as_text=True)
    assert _tab_counts(page) == {"waiting": 51, "retrying": 10, "sending": 0, "held": 0,
                                 "scheduled": 0, "failed": 3}
    assert len(re.findall(r'<td class="email">', page)) == 50  # one page
    nxt = re.search(r'href="([^"]+)" rel="next"', page)
    rest = browser.get(unescape(nxt[1])).get_data(as_text=True)
    assert len(re.findall(r'<td class="email">', rest)) == 1
    retrying = _text(browser.get("/jobs/?state=retrying").get_data(as_text=True))
    runs = re.findall(r"r0\d@example.org broadcast · Big (\S+ \S+) UTC 2 451 4.7.1", retrying)
    assert len(runs) == 10 and runs == sorted(runs)  # next run first
    one = browser.get(f"/jobs/?state=waiting&campaign={made['other']['id']}")
    assert _tab_counts(one.get_data(as_text=True))["waiting"] == 1
    assert "x@example.org" in one.get_data(as_text=True)
    by_address = browser.get("/jobs/?state=retrying&q=R03@example.org").get_data(as_text=True)
    assert _tab_counts(by_address)["retrying"] == 1 and "r03@example.org" in by_address
    failed = browser.get("/jobs/?state=failed&kind=verification")
    assert failed.status_code == 302 and "/inbox/?kind=verification" in failed.location


def test_retry_keeps_the_filtered_list_and_retry_all_says_how_many(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    made = _queue(engine)
    browser = Browser(client, make_user("admin"))
    listing = browser.get("/inbox/?kind=verification").get_data(as_text=True)
    assert "Retry all 3 matching" in listing and "3 failed or bounced jobs match" in \
        _text(listing)
    assert 'data-tab="failed"' in listing  # the jobs browser's tabs, on the failed tab
    after = browser.post(f"/inbox/{made['failed'][0]}/retry",
                         {"back": "/inbox/?kind=verification"})
    assert after.request.path == "/inbox/" and after.request.args["kind"] == "verification"
    page = after.get_data(as_text=True)
    assert "Retried 1 job" in page and "Retry all 2 matching" in page
    dismissed = browser.post(f"/inbox/{made['failed'][1]}/dismiss",
                             {"back": "/inbox/?kind=verification"})
    assert dismissed.request.args["kind"] == "verification"
    assert "Retry all 1 matching" in dismissed.get_data(as_text=True)


def test_queue_health_numbers_link_into_the_browser(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    _queue(engine)
    admin = Browser(client, make_user("admin")).get("/health/").get_data(as_text=True)
    assert re.search(r'<a class="counter[^"]*" href="/jobs/\?state=waiting" id="health-due">'
                     r'\s*<div class="n">51</div>', admin)
    assert 'href="/jobs/?state=retrying" id="health-retry"' in admin
    assert 'href="/jobs/?state=retrying&amp;kind=broadcast">10</a>' in admin
    assert 'href="/inbox/?kind=verification">3</a>' in admin


def test_the_browser_is_for_admins(client: Any, make_user: Callable[..., dict[str, Any]]
                                   ) -> None:
    for role in ("marketer", "support"):
        assert Browser(client, make_user(role)).get("/jobs/").status_code == 403
