"""The support console through real requests: search, the per-user history in plain words,
resend with the cooldown, the disposable-domain flag and the hold policy (release/drop)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import Browser, enqueue_verification, place_jobs
from webapp import create_app
from webapp.domain import queue_reads
from workers import queue
from workers.core.settings import Config

TEMPMAIL = {"user_id": "t-1", "email": "someone@mailinator.com",
            "verify_url": "https://app.example/v?t=x"}
NORMAL = {"user_id": "n-1", "email": "Linus@Example.org", "verify_url": "https://app.example/v"}


def app_for(engine: sa.Engine, config: Config) -> Any:
    application = create_app(config, engine=engine)
    application.config["TESTING"] = True
    return application


@pytest.fixture()
def hold_app(engine: sa.Engine, sink: Any, config_for: Callable[..., Config]) -> Any:
    return app_for(engine, config_for(sink.port, DISPOSABLE_POLICY="hold"))


def test_send_policy_flags_disposable_addresses_and_sends_them(api: Api) -> None:
    body = api.post("/verifications", TEMPMAIL).get_json()
    assert body["status"] == "pending" and body["flags"] == ["disposable_domain"]
    sub = api.post("/verifications", {**TEMPMAIL, "user_id": "t-2",
                                      "email": "x@sub.mailinator.com"}).get_json()
    assert sub["flags"] == ["disposable_domain"]
    assert api.post("/verifications", NORMAL).get_json()["flags"] == []


def test_hold_policy_holds_until_support_releases(hold_app: Any, engine: sa.Engine,
                                                 make_user: Callable[..., dict[str, Any]]
                                                 ) -> None:
    support = make_user("support")
    api = Api(hold_app.test_client(), support["token"])
    held = api.post("/verifications", TEMPMAIL).get_json()
    assert held["status"] == "held" and held["flags"] == ["disposable_domain"]
    assert api.post("/verifications", NORMAL).get_json()["status"] == "pending"
    with engine.begin() as conn:  # a held job is never claimed
        claimed = queue.claim_batch(conn, "test-worker", 10, "example.com")
        assert [j.email for j in claimed] == ["Linus@example.org"]
        queue.release(conn, claimed)
    # Asking again returns the held job; resending it is refused with a clear reason.
    assert api.post("/verifications", TEMPMAIL).get_json()["id"] == held["id"]
    refused = api.post("/verifications/resend", {"user_id": "t-1"})
    assert refused.status_code == 409 and "release or drop" in refused.get_json()["error"][
        "message"]

    browser = Browser(hold_app.test_client(), support)
    page = browser.get("/support/users/t-1").get_data(as_text=True)
    assert "Disposable address" in page and "mailinator.com is a throwaway-mail domain" in page
    assert "held until support releases or drops it" in page
    assert "Release: send it" in page and "held for support" in page
    done = browser.post(f"/support/jobs/{held['id']}/release", {"user_id": "t-1"})
    assert "Released" in done.get_data(as_text=True)
    with engine.connect() as conn:
        assert queue_reads.get_job(conn, held["id"])["status"] == "pending"  # type: ignore[index]
    again = browser.post(f"/support/jobs/{held['id']}/release", {"user_id": "t-1"})
    assert "no longer held" in again.get_data(as_text=True)
    with engine.connect() as conn:
        actions = conn.execute(sa.text("SELECT action, actor FROM audit_log "
                                       "WHERE action = 'verification.release'")).all()
    assert [(a, actor) for a, actor in actions] == [("verification.release", support["email"])]


def test_support_can_drop_a_held_email(hold_app: Any, engine: sa.Engine,
                                       make_user: Callable[..., dict[str, Any]]) -> None:
    support = make_user("support")
    held = Api(hold_app.test_client(), support["token"]).post("/verifications",
                                                              TEMPMAIL).get_json()
    browser = Browser(hold_app.test_client(), support)
    page = browser.post(f"/support/jobs/{held['id']}/drop", {"user_id": "t-1"})
    text = page.get_data(as_text=True)
    assert "Dropped" in text and f"dropped by {support['email']}" in text
    with engine.connect() as conn:
        job = queue_reads.get_job(conn, held["id"])
        assert job is not None and job["status"] == "cancelled" and job["finished_at"]
        assert conn.execute(sa.text("SELECT count(*) FROM audit_log "
                                    "WHERE action = 'verification.drop'")).scalar_one() == 1
    # A new request after the drop is a new job (the dropped one is terminal).
    again = Api(hold_app.test_client(), support["token"]).post("/verifications", TEMPMAIL)
    assert again.get_json()["id"] != held["id"]


def test_search_by_email_user_id_or_correlation_id(api: Api, client: Any, engine: sa.Engine,
                                                  make_user: Callable[..., dict[str, Any]]
                                                  ) -> None:
    job = api.post("/verifications", NORMAL).get_json()
    # The same address for another user (a request inside the cooldown would be a 429).
    with engine.begin() as conn:
        enqueue_verification(conn, "linus@example.org", "n-2")
    browser = Browser(client, make_user("support"))
    for q in ("n-1", job["correlation_id"], job["correlation_id"].upper()):
        r = browser.get("/support/", query_string={"q": q})
        assert r.status_code == 302 and r.headers["Location"].endswith("/support/users/n-1")
    both = browser.get("/support/", query_string={"q": "LINUS@example.ORG"})
    text = both.get_data(as_text=True)
    assert both.status_code == 200 and "2 users match" in text
    assert "/support/users/n-1" in text and "/support/users/n-2" in text
    none = browser.get("/support/", query_string={"q": "nobody@example.org"})
    assert "No match for" in none.get_data(as_text=True)


def test_history_explains_failures_in_plain_words_and_escapes_replies(
        api: Api, client: Any, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    job = api.post("/verifications", NORMAL).get_json()
    reply = "452 4.2.2 <script>alert(1)</script> mailbox full"
    with engine.begin() as conn:
        for n in range(1, 5):
            conn.execute(sa.text(
                "INSERT INTO job_attempts (job_id, attempt, outcome, smtp_code, enhanced_code, "
                "reply, stage) VALUES (:j, :n, 'transient', 452, '4.2.2', :r, 'rcpt')"),
                {"j": job["id"], "n": n, "r": reply})
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'failed', attempts = 4, "
                             "last_error = :r, last_error_class = 'transient', "
                             "finished_at = now() WHERE id = :j"), {"j": job["id"], "r": reply})
    browser = Browser(client, make_user("support"))
    page = browser.get("/support/users/n-1").get_data(as_text=True)
    assert "Gave up after 4 attempts: mailbox full" in page
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert job["correlation_id"] in page and "attempt 4" in page


def test_resend_button_shows_the_cooldown_and_the_form_resends(
        api: Api, client: Any, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    api.post("/verifications", NORMAL)
    support = make_user("support")
    browser = Browser(client, support)
    page = browser.get("/support/users/n-1").get_data(as_text=True)
    button = re.search(r'<button[^>]*id="resend-button"[^>]*>', page, re.S)[0]  # type: ignore[index]
    assert "disabled" in button and "data-countdown-until=" in button
    refused = browser.post("/support/users/n-1/resend").get_data(as_text=True)
    assert "you can resend in" in refused
    with engine.begin() as conn:
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'sent', "
                             "created_at = now() - interval '5 minutes', "
                             "finished_at = now() - interval '5 minutes', "
                             "cooldown_until = now() - interval '4 minutes'"))
    page = browser.get("/support/users/n-1").get_data(as_text=True)
    button = re.search(r'<button[^>]*id="resend-button"[^>]*>', page, re.S)[0]  # type: ignore[index]
    assert "disabled" not in button and "Accepted by the mail server at" in page
    done = browser.post("/support/users/n-1/resend").get_data(as_text=True)
    assert "Resent to" in done and "Waiting to be sent" in done
    with engine.connect() as conn:
        entry = conn.execute(sa.text("SELECT actor, target FROM audit_log "
                                     "WHERE action = 'verification.resend'")).one()
    assert tuple(entry) == (support["email"], "user:n-1")


def test_polling_fragment_and_access(api: Api, client: Any,
                                     make_user: Callable[..., dict[str, Any]]) -> None:
    api.post("/verifications", NORMAL)
    browser = Browser(client, make_user("support"))
    fragment = browser.get("/support/users/n-1?fragment=jobs").get_data(as_text=True)
    assert 'id="support-jobs"' in fragment
    assert 'hx-trigger="every 2s' in fragment and "<html" not in fragment
    assert browser.get("/support/users/nobody").status_code == 404
    marketer = Browser(client.application.test_client(), make_user("marketer"))
    assert marketer.get("/support/").status_code == 403


def test_states_are_described_for_people_who_are_not_engineers() -> None:
    from datetime import UTC, datetime

    from webapp.domain.verifications import describe

    now = datetime(2026, 5, 3, 14, 0, tzinfo=UTC)
    full = {"outcome": "transient", "smtp_code": 452, "enhanced_code": "4.2.2",
            "reply": "452 4.2.2 Mailbox full", "stage": "rcpt"}
    job = {"status": "retry", "attempts": 1, "available_at": datetime(2026, 5, 3, 14, 32,
                                                                       tzinfo=UTC),
           "finished_at": None, "last_error": "452 4.2.2 Mailbox full"}
    assert describe(job, [full], 4, now) == \
        "mailbox full; will retry at 14:32 UTC (attempt 2 of 4)"
    job.update(status="failed", attempts=4)
    assert describe(job, [full] * 4, 4, now) == "gave up after 4 attempts: mailbox full"
    job.update(status="sent", attempts=1, finished_at=datetime(2026, 5, 2, 9, 5, tzinfo=UTC))
    # Another day: the date as the page's language writes it (2026-05-02 / 02/05/2026).
    assert describe(job, [], 4, now) == "accepted by the mail server at 2026-05-02 09:05 UTC"
    hard = {"outcome": "hard_bounce", "smtp_code": 550, "enhanced_code": "5.1.1",
            "reply": "550 5.1.1 No such user", "stage": "rcpt"}
    job.update(status="bounced")
    assert describe(job, [hard], 4, now) == ("the address does not work (mailbox does not "
                                             "exist); it is now on the suppression list")
