"""The bounce mailbox against a real, private Dovecot (IMAPS, IMAP, POP3S): DSNs and ARF
reports are matched by VERP address or Message-ID and applied once; processed mail is
moved (IMAP) or deleted (POP3); a worker killed mid-poll loses nothing and applies
nothing twice. Asserted through Dovecot's own record (what an IMAP login sees) and the
database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from harness.dovecot import Mailbox
from tests.conftest import settings, wait_for
from tests.helpers import accepted_campaign
from workers.after_acceptance.feedback import Thresholds
from workers.after_acceptance.mailbox import BouncePoller
from workers.building.links import bounce_address

SECRET = "test-secret-key-not-for-production"
BOUNCES = "bounces@senddock.test"
REPORTS = Path(__file__).resolve().parents[1] / "unit" / "reports"


def sent_jobs(engine: sa.Engine, emails: list[str]) -> dict[str, dict[str, Any]]:
    return accepted_campaign(engine, emails, domain="senddock.test")[1]


def dsn(job: dict[str, Any], *, verp: str | None, status: str = "5.1.1",
        diagnostic: str = 'X-Postfix; unknown user: "nobody"') -> bytes:
    """A Postfix-shaped DSN (tests/unit/reports/postfix_unknown_user.eml) for ``job``."""
    raw = (REPORTS / "postfix_unknown_user.eml").read_text()
    to = verp or "postmaster@senddock.test"
    raw = raw.replace("bounces+J1.abc@senddock.test", to)
    raw = raw.replace("nobody@example.test", job["email"]).replace("Nobody@Example.test",
                                                                   job["email"])
    raw = raw.replace("<1.0b4f5a6e-1111-2222-3333-444455556666@senddock.test>",
                      job["message_id"])
    raw = raw.replace("Status: 5.1.1", f"Status: {status}")
    raw = raw.replace('Diagnostic-Code: X-Postfix; unknown user: "nobody"',
                      f"Diagnostic-Code: {diagnostic}")
    return raw.replace("\n", "\r\n").encode()


def arf(job: dict[str, Any]) -> bytes:
    """RFC 5965's example complaint, about ``job``, matched only by its Message-ID."""
    raw = (REPORTS / "rfc5965_arf.eml").read_text()
    raw = raw.replace("bounces+J7.xyz@senddock.test", "news@senddock.test")
    raw = raw.replace("User@example.com", job["email"]).replace("user@example.com",
                                                                job["email"])
    raw = raw.replace("<7.abc@senddock.test>", job["message_id"])
    return raw.replace("\n", "\r\n").encode()


def poller(engine: sa.Engine, url: str, ca_file: Path) -> BouncePoller:
    return BouncePoller(engine, url, secret_key=SECRET, bounce_address=BOUNCES,
                        thresholds=Thresholds(), ca_file=str(ca_file))


def effects(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text(
            "SELECT coalesce(j.email, e.email) || ':' || e.type, e.effect FROM job_events e "
            "LEFT JOIN delivery_jobs j ON j.id = e.job_id")).all())


@pytest.mark.slow
def test_imaps_poll_applies_each_report_once_and_moves_it(engine: sa.Engine,
                                                          dovecot: Mailbox) -> None:
    jobs = sent_jobs(engine, ["dead@example.org", "angry@example.org", "full@example.org",
                              "fine@example.org"])
    verp = {e: bounce_address(BOUNCES, SECRET, j["id"]) for e, j in jobs.items()}
    forged = f"bounces+{jobs['fine@example.org']['id']:x}.aaaaaaaaaaaaaaaa@senddock.test"
    fine = {**jobs["fine@example.org"], "message_id": "<not-ours@elsewhere>"}
    dovecot.deliver(dsn(jobs["dead@example.org"], verp=verp["dead@example.org"]))
    dovecot.deliver(arf(jobs["angry@example.org"]))
    dovecot.deliver(dsn(jobs["full@example.org"], verp=verp["full@example.org"],
                        status="5.2.2", diagnostic="smtp; 552 5.2.2 mailbox full"))
    dovecot.deliver(dsn(fine, verp=forged))  # a forged token and a foreign Message-ID
    dovecot.deliver((REPORTS / "not_a_report.eml").read_bytes())
    assert dovecot.count() == 5

    result = poller(engine, dovecot.url("imaps"), dovecot.server.tls.ca_file).poll_once()
    assert result is not None
    assert (result.seen, result.applied, result.unmatched, result.ignored) == (5, 3, 1, 1)
    assert effects(engine) == {
        "dead@example.org:bounce": "bounced", "angry@example.org:complaint": "complaint",
        "full@example.org:bounce": "soft", "fine@example.org:bounce": "unmatched"}
    with engine.connect() as conn:
        statuses = dict(conn.execute(sa.text(
            "SELECT email, status FROM delivery_jobs")).all())
        suppressed = dict(conn.execute(sa.text("SELECT email, reason FROM suppressions")).all())
    assert statuses["dead@example.org"] == "bounced"
    assert statuses["fine@example.org"] == statuses["full@example.org"] == "sent"
    assert suppressed == {"dead@example.org": "bounced", "angry@example.org": "complaint"}
    # Dovecot's record: the INBOX is empty and every message sits in Processed.
    assert dovecot.count("INBOX") == 0
    assert dovecot.count("Processed") == 5
    again = poller(engine, dovecot.url("imaps"), dovecot.server.tls.ca_file).poll_once()
    assert again is not None and again.seen == 0


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["imap", "pop3s"])
def test_plain_imap_and_pop3s(engine: sa.Engine, dovecot: Mailbox, scheme: str) -> None:
    jobs = sent_jobs(engine, ["gone@example.org"])
    job = jobs["gone@example.org"]
    dovecot.deliver(dsn(job, verp=bounce_address(BOUNCES, SECRET, job["id"])))
    result = poller(engine, dovecot.url(scheme), dovecot.server.tls.ca_file).poll_once()
    assert result is not None and result.applied == 1
    assert effects(engine) == {"gone@example.org:bounce": "bounced"}
    assert dovecot.count("INBOX") == 0  # POP3: deleted at QUIT; IMAP: moved
    if scheme == "imap":
        assert dovecot.count("Processed") == 1


@pytest.mark.slow
def test_a_report_seen_again_after_a_crash_before_the_move_is_not_applied_twice(
        engine: sa.Engine, dovecot: Mailbox) -> None:
    jobs = sent_jobs(engine, ["twice@example.org"])
    job = jobs["twice@example.org"]
    raw = dsn(job, verp=bounce_address(BOUNCES, SECRET, job["id"]))
    dovecot.deliver(raw)
    box = poller(engine, dovecot.url("imaps"), dovecot.server.tls.ca_file)
    # The state a crash between the commit and the move leaves: applied, still in INBOX.
    from workers.after_acceptance.mailbox import PollResult

    box.process(raw, PollResult())
    assert dovecot.count("INBOX") == 1
    result = box.poll_once()
    assert result is not None and (result.duplicates, result.applied) == (1, 0)
    assert dovecot.count("INBOX") == 0
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM job_events")).scalar() == 1


@pytest.mark.slow
def test_worker_killed_mid_poll_loses_nothing_and_applies_nothing_twice(
        engine: sa.Engine, db_url: str, dovecot: Mailbox, spawn: Any) -> None:
    n = 300
    jobs = sent_jobs(engine, [f"u{i}@example.org" for i in range(n)])
    dovecot.append([dsn(j, verp=bounce_address(BOUNCES, SECRET, j["id"]))
                    for j in jobs.values()])
    values = settings(db_url, BOUNCE_ADDRESS=BOUNCES, BOUNCE_MAILBOX=dovecot.url("imaps"),
                      BOUNCE_MAILBOX_CA_FILE=str(dovecot.server.tls.ca_file),
                      BOUNCE_MAILBOX_INTERVAL="1", WORKERS="1")

    def events() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM job_events")).scalar() or 0)

    first = spawn(["worker"], values)
    wait_for(lambda: events() >= 20, timeout=60, interval=0.02, message="the poll to start")
    first.kill()  # SIGKILL mid-poll
    done = events()
    assert 0 < done < n, f"the kill came too late to test anything ({done} of {n})"
    # At most the message being moved when it died was applied and not moved.
    left = dovecot.count("INBOX")
    assert n - done <= left <= n - done + 1

    second = spawn(["worker"], values)
    wait_for(lambda: dovecot.count("INBOX") == 0, timeout=90, interval=0.5,
             message="the restarted worker to drain the mailbox")
    second.terminate()
    with engine.connect() as conn:
        per_job = conn.execute(sa.text(
            "SELECT job_id, count(*) FROM job_events GROUP BY job_id")).all()
        bounced = conn.execute(sa.text(
            "SELECT count(*) FROM delivery_jobs WHERE status = 'bounced'")).scalar()
        suppressed = conn.execute(sa.text("SELECT count(*) FROM suppressions")).scalar()
    assert len(per_job) == n and all(c == 1 for _j, c in per_job)  # each once
    assert bounced == suppressed == n
    # Dovecot's record: nothing left behind. A kill in the middle of the IMAP MOVE can
    # leave one extra copy in Processed (the server copied it, then the expunge of the
    # original was lost with the session); it was still applied once, as checked above.
    assert n <= dovecot.count("Processed") <= n + 1
