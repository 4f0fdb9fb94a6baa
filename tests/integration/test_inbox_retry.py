"""The failed-jobs inbox: filters and keyset paging, retry one / retry all matching
(set-based, safe to click twice), dismiss, a bounced address still suppressed is said so,
support reads but cannot act. The end-to-end retry runs the real pool against the sink."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import wait_for
from tests.helpers import Browser, campaign_status, jobs_by_email, make_campaign
from webapp.domain import audit, inbox, queue_reads, suppressions
from webapp.domain.errors import Conflict
from workers import queue
from workers.core.settings import Config
from workers.delivery.pool import Pool


def add_job(conn: sa.Connection, email: str, status: str = "failed", *,
            kind: str = "verification", error_class: str = "rejected",
            finished: datetime | None = None, campaign_id: int | None = None) -> int:
    return int(conn.execute(sa.text("""
        INSERT INTO delivery_jobs (kind, priority, status, email, campaign_id, attempts,
                                   last_error, last_error_class, finished_at)
        VALUES (:kind, :priority, :status, :email, :campaign_id, 1,
                '550 5.7.1 <b>blocked</b>', :cls, :finished) RETURNING id"""),
        {"kind": kind, "priority": queue.PRIORITY[kind], "status": status, "email": email,
         "campaign_id": campaign_id, "cls": error_class,
         "finished": finished or datetime.now(UTC)}).scalar_one())


def test_filters_search_and_keyset_paging(engine: sa.Engine) -> None:
    base = datetime(2026, 5, 1, 12, tzinfo=UTC)
    with engine.begin() as conn:
        ids = [add_job(conn, f"u{i}@example.org", "bounced" if i % 3 == 0 else "failed",
                       kind="test" if i % 5 == 0 else "verification",
                       error_class="hard_bounce" if i % 3 == 0 else "rejected",
                       finished=base + timedelta(hours=i // 4)) for i in range(60)]
        corr = conn.execute(sa.text("SELECT correlation_id::text FROM delivery_jobs "
                                    "WHERE id = :id"), {"id": ids[7]}).scalar_one()
        everything: list[int] = []
        after = None
        while True:
            page = inbox.page(conn, inbox.parse_filter({}), after, limit=25)
            everything += [r["id"] for r in page.rows]
            if not (after := page.next_cursor):
                break

        def found(**args: str) -> set[int]:
            return {r["id"] for r in inbox.page(conn, inbox.parse_filter(args)).rows}

        assert everything == sorted(ids, key=lambda i: (ids.index(i) // 4, i), reverse=True)
        assert found(kind="test") == {ids[i] for i in range(0, 60, 5)}
        assert found(**{"class": "hard_bounce"}) == {ids[i] for i in range(0, 60, 3)}
        assert found(q="U7@Example.org") == {ids[7]}
        assert found(q=corr) == {ids[7]}
        assert found(q=str(ids[9])) == {ids[9]}
        assert found(**{"from": "2026-05-01", "to": "2026-05-01"}) == set(ids[:48])
        with pytest.raises(Exception, match="full email address"):
            found(q="u7")


def test_retry_one_and_the_still_suppressed_refusal(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        bounced = add_job(conn, "gone@example.org", "bounced", error_class="hard_bounce")
        failed = add_job(conn, "policy@example.org")
        suppressions.suppress(conn, "gone@example.org", "bounced", job_id=bounced,
                              actor="system")
    with engine.begin() as conn, pytest.raises(Conflict, match="still on the suppression"):
        inbox.retry(conn, bounced, actor="admin@x")
    with engine.begin() as conn:
        inbox.retry(conn, failed, actor="admin@x")
        job = queue_reads.get_job(conn, failed)
        assert job is not None
        # A fresh schedule (it restarts at retry_base); the attempt count goes on.
        assert (job["status"], job["attempts"], job["retry_base"], job["finished_at"]) == (
            "pending", 1, 1, None)
        with pytest.raises(Conflict, match="is pending"):
            inbox.retry(conn, failed, actor="admin@x")
        assert [e["target"] for e in audit.entries(conn, action="job.retry")] == [
            f"job:{failed}"]


def test_retry_all_twice_retries_each_job_once(engine: sa.Engine) -> None:
    shown_at = datetime.now(UTC)
    with engine.begin() as conn:
        old = [add_job(conn, f"r{i}@example.org", finished=shown_at - timedelta(minutes=1))
               for i in range(5)]
        add_job(conn, "s@example.org", "bounced", finished=shown_at - timedelta(minutes=1))
        suppressions.suppress(conn, "s@example.org", "bounced", actor="system")
        later = add_job(conn, "later@example.org", finished=shown_at + timedelta(seconds=5))
    where = inbox.parse_filter({"kind": "verification"})
    with engine.begin() as conn:
        first = inbox.retry_all(conn, where, shown_at, actor="admin@x")
    with engine.begin() as conn:
        second = inbox.retry_all(conn, where, shown_at, actor="admin@x")
        states = dict(conn.execute(sa.text("SELECT id, status FROM delivery_jobs")).all())
    assert (first["retried"], first["suppressed"]) == (5, 1)
    assert first["suppressed_examples"] == ["s@example.org"]
    assert "still suppressed (s@example.org)" in inbox.describe_retry(first)
    assert second["retried"] == 0
    assert [states[i] for i in old] == ["pending"] * 5
    assert states[later] == "failed"  # failed after the page was shown: not retried
    assert len(states) == 7  # nothing was duplicated


def test_dismiss_hides_the_job(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        job_id = add_job(conn, "d@example.org")
        inbox.dismiss(conn, job_id, actor="admin@x")
        assert inbox.page(conn, inbox.parse_filter({})).rows == []
        with pytest.raises(Conflict):
            inbox.dismiss(conn, job_id, actor="admin@x")
        assert queue_reads.get_job(conn, job_id)["status"] == "failed"  # type: ignore[index]


def test_support_reads_but_cannot_act(client: Any, engine: sa.Engine,
                                      make_user: Callable[..., dict[str, Any]]) -> None:
    with engine.begin() as conn:
        job_id = add_job(conn, "x@example.org")
    support = Browser(client, make_user("support"))
    page = support.get("/inbox/").get_data(as_text=True)
    assert "x@example.org" in page and "Retry" not in page
    assert "550 5.7.1 &lt;b&gt;blocked&lt;/b&gt;" in page  # the reply is escaped
    assert support.get(f"/inbox/{job_id}").status_code == 200
    assert support.post(f"/inbox/{job_id}/retry", follow_redirects=False).status_code == 403
    assert support.post("/inbox/retry-all", follow_redirects=False).status_code == 403
    assert support.post(f"/inbox/{job_id}/dismiss", follow_redirects=False).status_code == 403


def test_retry_all_of_a_campaign_sends_again(engine: sa.Engine, sink: Any, client: Any,
                                             config_for: Callable[..., Config],
                                             make_user: Callable[..., dict[str, Any]]) -> None:
    sink.set_rules({"rules": [
        {"match": "policy*@example.org", "reply": "550 5.7.1 Blocked by policy"},
        {"match": "hard@example.org", "reply": "550 5.1.1 User unknown"}]})
    emails = ["ok@example.org", "policy1@example.org", "policy2@example.org",
              "hard@example.org"]
    campaign = make_campaign(engine, emails)
    pool = Pool(engine, config_for(sink.port), node="inbox-test")
    pool.start()
    try:
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=60,
                 message="campaign to finish")
        sink.set_rules({"rules": []})
        admin = Browser(client, make_user("admin"))
        html = admin.get(f"/inbox/?campaign={campaign['id']}").get_data(as_text=True)
        assert html.count("550 5.7.1 Blocked by policy") == 2
        as_of = html.split('name="as_of" value="')[1].split('"')[0]
        form = {"campaign": str(campaign["id"]), "as_of": as_of}
        answer = admin.post("/inbox/retry-all", form).get_data(as_text=True)
        assert "Retried 2 jobs" in answer and "hard@example.org" in answer
        assert "still suppressed" in answer
        again = admin.post("/inbox/retry-all", form).get_data(as_text=True)
        assert "No job was retried" in again
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=30,
                 message="campaign to finish again")
    finally:
        pool.stop()
    jobs = jobs_by_email(engine, campaign["id"])
    assert {e: j["status"] for e, j in jobs.items()} == {
        "ok@example.org": "sent", "policy1@example.org": "sent",
        "policy2@example.org": "sent", "hard@example.org": "bounced"}
    delivered = [rcpt for r in sink.records() for rcpt in r["rcpt_tos"]]
    assert sorted(delivered) == sorted(
        ["ok@example.org", "policy1@example.org", "policy2@example.org"])


def _inbox_text(browser: Browser, query: str = "", lang: str = "en") -> str:
    return browser.get(f"/inbox/{query}", headers={"Accept-Language": lang}).get_data(
        as_text=True)


@pytest.mark.parametrize("lang", ["en", "es"])
def test_retry_all_is_not_offered_for_addresses_it_cannot_retry(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]],
        lang: str) -> None:
    """"Retry all 59" was offered for 59 suppressed addresses (it could only
    refuse them all); and the failed tab said 121 above a filtered list of 59."""
    with engine.begin() as conn:
        for i in range(3):
            add_job(conn, f"gone{i}@example.org", "bounced", error_class="hard_bounce")
            suppressions.suppress(conn, f"gone{i}@example.org", "bounced", actor="t")
        for i in range(2):
            add_job(conn, f"soft{i}@example.org", error_class="transient")
    browser = Browser(client, make_user("admin"))
    bounced = _inbox_text(browser, "?class=hard_bounce", lang)
    assert 'id="retry-all-button"' not in bounced
    assert 'id="retry-none"' in bounced
    tab = re.search(r'data-tab="failed">[^<]*<span class="count">(\d+)</span>', bounced)
    assert tab and tab[1] == "3"  # the tab counts the list below it, not all 5
    everything = _inbox_text(browser, "", lang)
    button = re.search(r'id="retry-all-button">([^<]+)<', everything)
    assert button and ("Retry all 2 matching" if lang == "en"
                       else "Reintentar los 2 que coinciden") in button[1]
    left_out = re.search(r'id="retry-left-out">([^<]+)<', everything)
    assert left_out and left_out[1].startswith("3 ")
    confirm = re.search(r'class="actions retry-all"\s+data-confirm="([^"]+)"', everything)
    assert confirm and (("Retry all 2 failed or bounced jobs in the inbox" in confirm[1])
                        if lang == "en" else ("¿Reintentar los 2 trabajos" in confirm[1]))


def test_retry_and_dismiss_the_chosen_jobs(
        client: Any, app: Any, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    with engine.begin() as conn:
        ids = [add_job(conn, f"pick{i}@example.org") for i in range(4)]
        suppressions.suppress(conn, "pick3@example.org", "bounced", actor="t")
    browser = Browser(client, make_user("admin"))
    page = _inbox_text(browser)
    assert 'form="inbox-chosen"' in page and 'id="chosen-retry"' in page
    retried = browser.post("/inbox/chosen", {"action": "retry", "back": "/inbox/",
                                             "job": [str(ids[0]), str(ids[3])]})
    assert retried.status_code == 200
    dismissed = browser.client.post("/inbox/chosen", data={
        "csrf_token": browser.token, "action": "dismiss", "job": [str(ids[1]), str(ids[2])]},
        headers={"Accept-Language": "es"}, follow_redirects=True)
    assert "2 trabajos descartados." in dismissed.get_data(as_text=True)
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.text(
            "SELECT id, status || coalesce(':' || (dismissed_at IS NOT NULL)::text, '') "
            "FROM delivery_jobs WHERE id = ANY(:ids)"), {"ids": ids}).all())
    assert rows[ids[0]] == "pending:false" or rows[ids[0]].startswith("pending")
    assert rows[ids[3]].startswith("failed")  # suppressed: left out, and said
    assert rows[ids[1]].endswith("true") and rows[ids[2]].endswith("true")
    support = Browser(app.test_client(), make_user("support"))
    assert 'form="inbox-chosen"' not in _inbox_text(support)  # read-only for support
    assert support.post("/inbox/chosen", {"action": "dismiss", "job": [str(ids[0])]},
                        follow_redirects=False).status_code == 403
