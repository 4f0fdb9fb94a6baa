"""Bounce reasons end to end (docs/design.md §17): what each reason does to the job, the
suppression list and the alarms; a poison message in a real Dovecot mailbox goes to the
"could not read" folder and the poll goes on; the reason is shown to people in English and
Spanish (support, inbox, suppression list, Queue health)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from harness.dovecot import Mailbox
from tests.conftest import Api
from tests.helpers import Browser, place_jobs
from tests.integration.test_bounce_mailbox import BOUNCES, SECRET, dsn, poller, sent_jobs
from webapp.domain import health
from workers.after_acceptance import feedback, mailbox
from workers.after_acceptance.mailbox import BouncePoller, PollResult
from workers.after_acceptance.reports import parse_report
from workers.building.links import bounce_address

UNREADABLE = "Could not read"


def local_poller(engine: sa.Engine) -> BouncePoller:
    """A poller used without a server: ``process`` reads one message into the database."""
    return BouncePoller(engine, "imaps://u:p@127.0.0.1/INBOX", secret_key=SECRET,
                        bounce_address=BOUNCES, thresholds=feedback.Thresholds())


def row(engine: sa.Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).mappings().first()


def blocklisted(job: dict[str, Any]) -> bytes:
    return dsn(job, verp=bounce_address(BOUNCES, SECRET, job["id"]), status="5.7.1",
               diagnostic="smtp; 554 5.7.1 Service unavailable; Client host [192.0.2.9] "
                          "blocked using zen.spamhaus.org")


def test_each_reason_does_what_it_means(engine: sa.Engine,
                                        config_for: Callable[..., Any]) -> None:
    jobs = sent_jobs(engine, ["gone@example.org", "listed@example.org", "later@example.org",
                              "full@example.org"])
    box = local_poller(engine)
    result = PollResult()
    gone, listed = jobs["gone@example.org"], jobs["listed@example.org"]
    box.process(dsn(gone, verp=bounce_address(BOUNCES, SECRET, gone["id"])), result)
    for _ in range(5):  # more than the soft threshold: a blocklist counts against nobody
        box.process(blocklisted(listed) + b"\r\n" * (_ + 1), result)
    later = jobs["later@example.org"]
    delayed = dsn(later, verp=bounce_address(BOUNCES, SECRET, later["id"]), status="4.4.7",
                  diagnostic="smtp; 451 4.4.7 delivery temporarily suspended")
    box.process(delayed.replace(b"Action: failed", b"Action: delayed"), result)
    full = jobs["full@example.org"]
    box.process(dsn(full, verp=bounce_address(BOUNCES, SECRET, full["id"]), status="5.2.2",
                    diagnostic="smtp; 552 5.2.2 Mailbox full"), result)
    assert result.effects == {"bounced": 1, "sender_alarm": 5, "soft": 1}
    assert result.ignored == 1  # the delay notice

    # A dead address: bounced, suppressed, the reason kept on the event and the suppression.
    assert row(engine, "SELECT status FROM delivery_jobs WHERE id = :i",
               i=gone["id"])["status"] == "bounced"
    assert row(engine, "SELECT reason, reason_code FROM suppressions WHERE email = :e",
               e="gone@example.org") == {"reason": "bounced", "reason_code": "userunknown"}
    assert row(engine, "SELECT reason_code, bounce FROM job_events WHERE job_id = :i",
               i=gone["id"]) == {"reason_code": "userunknown", "bounce": "hard"}
    # A blocklist: about us. Recorded five times, nobody suppressed, the job still sent.
    events = row(engine, "SELECT count(*) AS n, min(bounce) AS bounce, min(reason_code) AS code,"
                 " min(effect) AS effect FROM job_events WHERE job_id = :i", i=listed["id"])
    assert dict(events) == {"n": 5, "bounce": "sender", "code": "blocked",
                            "effect": "sender_alarm"}
    assert row(engine, "SELECT 1 FROM suppressions WHERE email = 'listed@example.org'") is None
    assert row(engine, "SELECT status FROM delivery_jobs WHERE id = :i",
               i=listed["id"])["status"] == "sent"
    # The delay notice did nothing; the full mailbox counted once.
    assert row(engine, "SELECT 1 FROM job_events WHERE job_id = :i", i=later["id"]) is None
    assert row(engine, "SELECT bounce, reason_code FROM job_events WHERE job_id = :i",
               i=full["id"]) == {"bounce": "soft", "reason_code": "mailboxfull"}
    # The sender alarm, with what the receivers said.
    with engine.connect() as conn:
        alarms = {a.name: a for a in health.compute_alarms(conn, config_for())}
    assert "sender_bounces" in alarms
    said = alarms["sender_bounces"].message.say(lambda s: s)
    assert "blocked: 5" in said and "spamhaus" in said


@pytest.mark.slow
def test_a_poison_message_goes_to_its_folder_and_the_poll_goes_on(
        engine: sa.Engine, dovecot: Mailbox, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = sent_jobs(engine, ["first@example.org", "last@example.org", "odd@example.org"])
    first, last, odd = (jobs[e] for e in ("first@example.org", "last@example.org",
                                          "odd@example.org"))
    # 1. a hard bounce; 2. a bounce in a charset Python does not know (it stalled the
    # mailbox: LookupError); 3. a bounce report naming no recipient (cannot be understood);
    # 4. a message whose processing fails (a reader bug, simulated below); 5. a hard bounce.
    dovecot.deliver(dsn(first, verp=bounce_address(BOUNCES, SECRET, first["id"])))
    dovecot.deliver(dsn(odd, verp=bounce_address(BOUNCES, SECRET, odd["id"]), status="5.2.2",
                        diagnostic="smtp; 552 5.2.2 Mailbox full \xe9")
                    .replace(b"charset=us-ascii", b"charset=ANSI_X3.110-1983"))
    dovecot.deliver(b"From: MAILER-DAEMON@mx.example.org\r\nTo: " + BOUNCES.encode() +
                    b"\r\nSubject: Undelivered Mail Returned to Sender\r\n"
                    b"Content-Type: multipart/report; report-type=delivery-status; "
                    b"boundary=b\r\n\r\n--b\r\nContent-Type: message/delivery-status\r\n\r\n"
                    b"Reporting-MTA: dns; mx.example.org\r\n\r\nAction: failed\r\n--b--\r\n")
    dovecot.deliver(b"From: MAILER-DAEMON@mx.example.org\r\nSubject: Returned mail\r\n"
                    b"X-Test-Poison: yes\r\n\r\nThis one breaks the reader.\r\n")
    dovecot.deliver(dsn(last, verp=bounce_address(BOUNCES, SECRET, last["id"])))
    real = mailbox.parse_report

    def reader_with_a_bug(raw: bytes) -> Any:
        if b"X-Test-Poison" in raw:
            raise RuntimeError("a bug in the reader")
        return real(raw)

    monkeypatch.setattr(mailbox, "parse_report", reader_with_a_bug)
    result = poller(engine, dovecot.url("imaps"), dovecot.server.tls.ca_file).poll_once()
    assert result is not None
    assert (result.seen, result.applied, result.unreadable) == (5, 3, 2)
    assert result.effects == {"bounced": 2, "soft": 1}
    # Dovecot's record: nothing left in the INBOX, the two in the "could not read" folder.
    assert dovecot.count("INBOX") == 0
    assert dovecot.count("Processed") == 3
    assert dovecot.count(f'"{UNREADABLE}"') == 2
    with engine.connect() as conn:
        listed = feedback.unreadable_mail(conn)
    assert sorted(m["error"].split(":")[0] for m in listed) == [
        "a bounce report that names no recipient the reader can find",
        "processing failed"]
    assert all(m["folder"] == UNREADABLE for m in listed)
    # The next poll finds nothing to do (the receipts hold).
    again = poller(engine, dovecot.url("imaps"), dovecot.server.tls.ca_file).poll_once()
    assert again is not None and again.seen == 0


def test_the_reason_is_shown_to_people(client: Any, engine: sa.Engine, api: Api,
                                       make_user: Callable[..., dict[str, Any]]) -> None:
    job = api.post("/verifications", {"user_id": "b-1", "email": "gone@example.org",
                                      "verify_url": "https://app.example/v"}).get_json()
    jobs = sent_jobs(engine, ["listed@example.org"])
    with engine.begin() as conn:
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'sent', finished_at = now() "
                             "WHERE id = :i"), {"i": job["id"]})
    box = local_poller(engine)
    box.process(dsn({"id": job["id"], "email": "gone@example.org",
                     "message_id": "<x@senddock.test>"},
                    verp=bounce_address(BOUNCES, SECRET, job["id"])), PollResult())
    box.process(blocklisted(jobs["listed@example.org"]), PollResult())
    with engine.begin() as conn:  # the unreadable list on Queue health
        feedback.record_unreadable(conn, "d" * 64, subject="<b>odd</b> bounce",
                                   sender="MAILER-DAEMON@x", error="names no recipient",
                                   folder=UNREADABLE)
    browser = Browser(client, make_user("admin"))
    support = browser.get("/support/users/b-1").get_data(as_text=True)
    assert "user unknown" in support and 'class="bounce-reason"' in support
    inbox = browser.get(f"/inbox/{job['id']}").get_data(as_text=True)
    assert "user unknown" in inbox
    listed = browser.get(f"/inbox/{jobs['listed@example.org']['id']}").get_data(as_text=True)
    assert "blocked by a blocklist" in listed and "counted against nobody" in listed
    suppressions = browser.get("/admin/suppressions").get_data(as_text=True)
    assert "gone@example.org" in suppressions and "user unknown" in suppressions
    queue_health = browser.get("/health/").get_data(as_text=True)
    assert 'id="mailbox-unreadable"' in queue_health and "names no recipient" in queue_health
    assert "&lt;b&gt;odd&lt;/b&gt;" in queue_health and "<b>odd</b>" not in queue_health
    spanish = {"Accept-Language": "es"}
    assert "usuario desconocido" in browser.get("/support/users/b-1",
                                                headers=spanish).get_data(as_text=True)
    assert "bloqueado por una lista de bloqueo" in browser.get(
        f"/inbox/{jobs['listed@example.org']['id']}", headers=spanish).get_data(as_text=True)
    assert "usuario desconocido" in browser.get("/admin/suppressions",
                                                headers=spanish).get_data(as_text=True)


def test_what_the_reader_says_about_a_report_is_what_is_applied() -> None:
    """parse_report's events carry the reason code the database keeps."""
    report = parse_report(blocklisted({"id": 1, "email": "a@example.org",
                                       "message_id": "<1@senddock.test>"}))
    [event] = report.events
    assert (event.bounce, event.code) == ("sender", "blocked")
