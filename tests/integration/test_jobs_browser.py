"""The jobs browser: an admin sees the queue by state with filters and exact
counts (waiting in claim order, retrying with its next run, in flight, held, scheduled,
failed = the inbox), retry and dismiss keep the filtered list, "retry all" says how many,
and the queue health numbers link into it."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from html import unescape
from typing import Any

import sqlalchemy as sa

from tests.helpers import Browser, make_campaign, place_jobs
from tests.integration.security_fixtures import failed_job
from workers import queue


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
                                 "scheduled": 0, "sent": 0, "failed": 3, "cancelled": 0}
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
    assert "Retry the one matching" in dismissed.get_data(as_text=True)


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


# --- Sent and Cancelled tabs, bulk actions -------------------------------------

def _finished(engine: sa.Engine, campaign_id: int, n: int, status: str) -> list[int]:
    """``n`` of the campaign's pending jobs finished as ``status``, one second apart."""
    with engine.begin() as conn:
        return list(place_jobs(conn, sa.text("""
            WITH picked AS (SELECT id, row_number() OVER (ORDER BY id) AS i FROM delivery_jobs
                             WHERE campaign_id = :c AND status = 'pending' ORDER BY id
                             LIMIT :n)
            UPDATE delivery_jobs j SET status = :s, attempts = 1,
                   finished_at = now() - make_interval(secs => 1000 - picked.i)
              FROM picked WHERE j.id = picked.id RETURNING j.id"""),
            {"c": campaign_id, "n": n, "s": status}).scalars())


def test_sent_and_cancelled_tabs_list_newest_first_in_keyset_pages(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = make_campaign(engine, [f"s{i:02d}@example.org" for i in range(70)])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
    sent = _finished(engine, campaign["id"], 45, "sent")
    cancelled = _finished(engine, campaign["id"], 6, "cancelled")
    browser = Browser(client, make_user("admin"))
    page = browser.get("/jobs/?state=sent").get_data(as_text=True)
    counts = _tab_counts(page)
    assert (counts["sent"], counts["cancelled"]) == (45, 6)
    shown = [int(i) for i in re.findall(r'<td class="num"><a href="/inbox/(\d+)', page)]
    assert shown == sorted(sent, reverse=True)  # newest first, all 45 on one page
    gone = browser.get("/jobs/?state=cancelled").get_data(as_text=True)
    assert [int(i) for i in re.findall(r'<td class="num"><a href="/inbox/(\d+)', gone)] == \
        sorted(cancelled, reverse=True)
    spanish = browser.get("/jobs/?state=sent", headers={"Accept-Language": "es"}).get_data(
        as_text=True)
    assert 'data-tab="sent">Enviados' in spanish and 'data-tab="cancelled">Cancelados' in spanish
    more = _finished(engine, campaign["id"], 8, "sent")  # 53: two pages
    first = browser.get("/jobs/?state=sent").get_data(as_text=True)
    nxt = re.search(r'href="([^"]+)" rel="next"', first)
    rest = browser.get(unescape(nxt[1])).get_data(as_text=True)
    both = re.findall(r'<td class="num"><a href="/inbox/(\d+)', first + rest)
    assert sorted(int(i) for i in both) == sorted(sent + more) and len(both) == 53


def test_the_sent_tab_reads_an_index_not_the_table(engine: sa.Engine) -> None:
    from webapp.domain import queue_reads

    with engine.connect() as conn:
        conn.execute(sa.text("SET enable_seqscan = off"))
        sql = str(conn.execute(sa.text("""
            EXPLAIN SELECT j.id FROM delivery_jobs j WHERE j.status = 'sent'
             ORDER BY j.finished_at DESC, j.id DESC LIMIT 51""")).scalars().all())
        assert "delivery_jobs_sent_idx" in sql and "Sort" not in sql, sql
        rows = queue_reads.jobs_in_state(conn, "sent", queue_reads.JobFilter(), limit=5)
    assert rows == []


def test_bulk_cancel_and_run_now_the_chosen_jobs(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    _queue(engine)
    browser = Browser(client, make_user("admin"))
    with engine.connect() as conn:
        waiting = list(conn.execute(sa.text(
            "SELECT id FROM delivery_jobs WHERE status = 'pending' ORDER BY id LIMIT 3")).scalars())
        retrying = list(conn.execute(sa.text(
            "SELECT id FROM delivery_jobs WHERE status = 'retry' ORDER BY id LIMIT 2")).scalars())
    page = browser.get("/jobs/?state=waiting").get_data(as_text=True)
    assert 'id="bulk-cancel"' in page and 'form="bulk-form"' in page
    answer = browser.post("/jobs/bulk", {"action": "cancel", "job": [str(i) for i in waiting],
                                         "back": "/jobs/?state=waiting"})
    assert "3 jobs cancelled." in _text(answer.get_data(as_text=True))
    again = browser.post("/jobs/bulk", {"action": "cancel", "job": [str(waiting[0])],
                                        "back": "/jobs/?state=waiting"})
    assert "had already moved on" in _text(again.get_data(as_text=True))
    now = browser.client.post("/jobs/bulk", data={
        "csrf_token": browser.token, "action": "retry_now", "job": [str(i) for i in retrying]},
        headers={"Accept-Language": "es"}, follow_redirects=True)
    assert "2 trabajos ya tocan." in _text(now.get_data(as_text=True))
    with engine.connect() as conn:
        states = dict(conn.execute(sa.text(
            "SELECT id, status FROM delivery_jobs WHERE id = ANY(:ids)"),
            {"ids": waiting + retrying}).all())
        due = conn.execute(sa.text("SELECT bool_and(available_at <= now()) FROM delivery_jobs "
                                   "WHERE id = ANY(:ids)"), {"ids": retrying}).scalar()
        audited = conn.execute(sa.text("SELECT count(*) FROM audit_log WHERE action IN "
                                       "('jobs.cancel', 'jobs.retry_now')")).scalar()
    assert [states[i] for i in waiting] == ["cancelled"] * 3 and due and audited == 3
    assert [states[i] for i in retrying] == ["retry", "retry"]


def test_bulk_actions_need_an_admin_and_the_csrf_token(
        client: Any, app: Any, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    _queue(engine)
    with engine.connect() as conn:
        job = conn.execute(sa.text("SELECT id FROM delivery_jobs WHERE status = 'pending' "
                                   "LIMIT 1")).scalar_one()
    for role in ("support", "marketer"):
        other = Browser(app.test_client(), make_user(role))
        refused = other.post("/jobs/bulk", {"action": "cancel", "job": [str(job)]},
                             follow_redirects=False)
        assert refused.status_code == 403, role
    admin = Browser(client, make_user("admin"))
    forged = admin.client.post("/jobs/bulk", data={"action": "cancel", "job": [str(job)]})
    assert forged.status_code in (400, 403)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT status FROM delivery_jobs WHERE id = :j"),
                            {"j": job}).scalar() == "pending"


def test_a_message_asked_for_later_is_scheduled_not_due(
        client: Any, api: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    """A verification scheduled two hours ahead is pending in the database, but nobody is
    waiting for a worker: the dashboard and Queue health do not count it as due, the
    waiting tab does not list it ("due since" a future time), the Scheduled tab does."""
    later = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    r = api.post("/messages", {"kind": "verification", "user_id": "later-1",
                               "email": "later@example.org", "send_at": later.isoformat(),
                               "data": {"verify_url": "https://app.example/v/1"}})
    assert r.status_code == 202 and r.get_json()["send_at"], r.get_json()
    now = api.post("/messages", {"kind": "verification", "user_id": "now-1",
                                 "email": "now@example.org",
                                 "data": {"verify_url": "https://app.example/v/2"}})
    assert now.status_code == 202
    browser = Browser(client, make_user("admin"))
    for lang in ("en", "es"):
        jobs = browser.get("/jobs/", headers={"Accept-Language": lang}).get_data(as_text=True)
        assert _tab_counts(jobs)["waiting"] == 1 and _tab_counts(jobs)["scheduled"] == 1
        assert "later@example.org" not in jobs and "now@example.org" in jobs
        scheduled = browser.get("/jobs/?state=scheduled",
                                headers={"Accept-Language": lang}).get_data(as_text=True)
        assert "later@example.org" in scheduled and "now@example.org" not in scheduled
        assert later.strftime("%H:%M:%S") in scheduled
        board = _text(browser.get("/", headers={"Accept-Language": lang}).get_data(as_text=True))
        due = re.search(r"(\d+) (?:due now, waiting for a worker|pendientes ahora)", board)
        assert due and due[1] == "1", board[:600]
        health = browser.get("/health/?fragment=status").get_data(as_text=True)
        assert re.search(r'id="health-due"><div class="n">1<', health), health[:800]
        assert re.search(r'id="health-scheduled"><div class="n">1<', health)


def test_a_kind_that_does_not_exist_is_said_not_shown_as_all_kinds(
        client: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    """?kind=zzz matched nothing while the filter read "all kinds": the filter shows what
    was asked for, and that no kind has that name."""
    browser = Browser(client, make_user("admin"))
    for path in ("/jobs/?kind=zzz", "/inbox/?kind=zzz"):
        page = browser.get(path).get_data(as_text=True)
        assert 'selected id="unknown-kind">zzz (no such kind)</option>' in page, path
        es = browser.get(path, headers={"Accept-Language": "es"}).get_data(as_text=True)
        assert "zzz (no existe ese tipo)" in es
    assert 'id="unknown-kind"' not in browser.get("/jobs/?kind=verification").get_data(
        as_text=True)


def test_a_dismissed_failure_is_counted_alike_on_the_campaign_page_the_inbox_and_the_tabs(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """After one dismiss the campaign page said 3 failed, the inbox and the
    Failed tab 2, and the tabs added to 496 of 497. Each says what it counts, and the
    numbers add up."""
    campaign = make_campaign(engine, [f"d{i:02d}@example.org" for i in range(10)],
                             name="Dismissals")
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
    failed = _finished(engine, campaign["id"], 3, "failed")
    _finished(engine, campaign["id"], 5, "sent")
    browser = Browser(client, make_user("admin"))
    browser.post(f"/inbox/{failed[0]}/dismiss", {"back": "/inbox/"})
    detail = f"/campaigns/{campaign['id']}"
    page = browser.get(detail).get_data(as_text=True)
    assert re.search(r'data-state="failed"><div class="n">3</div><div class="label">Failed'
                     r'</div><div class="muted dismissed" id="campaign-dismissed-failed">'
                     r'\(1 dismissed\)</div>', page), page
    assert "See the 2 failed and bounced messages" in page
    assert "1 failed or bounced message was dismissed from the failed-jobs inbox" in page
    spanish = browser.get(detail, headers={"Accept-Language": "es"}).get_data(as_text=True)
    assert "(1 descartado)" in spanish and "se descartó de la bandeja" in spanish
    inbox = browser.get(f"/inbox/?campaign={campaign['id']}").get_data(as_text=True)
    assert "2 failed or bounced jobs match" in _text(inbox)
    assert _tab_counts(inbox)["failed"] == 2 and ">+ 1 dismissed</span>" in inbox
    tabs_page = browser.get(f"/jobs/?campaign={campaign['id']}").get_data(as_text=True)
    counts = _tab_counts(tabs_page)
    assert counts["failed"] == 2 and ">+ 1 dismissed</span>" in tabs_page
    assert sum(counts.values()) + 1 == 10  # the tabs and the dismissed: every job
    assert "the ones dismissed there are counted beside it" in tabs_page
    es_tabs = browser.get(f"/jobs/?campaign={campaign['id']}",
                          headers={"Accept-Language": "es"}).get_data(as_text=True)
    assert ">+ 1 descartado</span>" in es_tabs and "las pestañas suman" in es_tabs
    everything = _tab_counts(browser.get("/jobs/").get_data(as_text=True))
    assert sum(everything.values()) + 1 == 10


def test_part_of_an_address_keeps_the_input_and_says_why_it_is_not_searched(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """A partial address in the inbox or jobs search answered a bare 422
    page with the input gone, while support search accepts partials. The page answers
    with its other filters, the input as typed, why, and a link to support search."""
    _queue(engine)
    browser = Browser(client, make_user("admin"))
    for path, scope in (("/jobs/?state=retrying&kind=broadcast&q=r03", "Every tab finds"),
                        ("/inbox/?kind=verification&q=f1", "This list finds")):
        answer = browser.get(path)
        page = answer.get_data(as_text=True)
        typed = path.rsplit("=", 1)[1]
        assert answer.status_code == 422, path
        assert f'name="q" value="{typed}"' in page and 'aria-invalid="true"' in page
        assert f"Not searched: “{typed}” is not a whole email address" in page
        assert scope in page and 'data-tab="failed"' in page  # the page, with its tabs
        assert f'href="/support/?q={typed}" id="search-in-support"' in page
        spanish = browser.get(path, headers={"Accept-Language": "es"}).get_data(as_text=True)
        assert f"No se buscó: «{typed}» no es una dirección de correo" in spanish
        assert "La búsqueda de soporte encuentra" in spanish
    jobs_page = browser.get("/jobs/?state=retrying&kind=broadcast&q=r03").get_data(
        as_text=True)
    assert _tab_counts(jobs_page)["retrying"] == 10  # the other filters still apply
    inbox_page = browser.get("/inbox/?kind=verification&q=f1").get_data(as_text=True)
    assert "3 failed or bounced jobs match" in _text(inbox_page)
    moved = browser.get("/jobs/?state=failed&q=f1")
    assert moved.status_code == 302 and "q=f1" in moved.location
