"""DSN (RFC 3464) and ARF (RFC 5965) parsing, on reports written from the RFCs' examples and
what Postfix, qmail and feedback loops actually send."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.after_acceptance.reports import bounce_class, parse_report

HERE = Path(__file__).parent / "reports"


def read(name: str) -> bytes:
    return (HERE / name).read_bytes()


def test_postfix_unknown_user_is_a_hard_bounce_with_the_original_message_id() -> None:
    report = parse_report(read("postfix_unknown_user.eml"))
    assert report.kind == "dsn"
    [event] = report.events
    assert (event.type, event.email, event.bounce, event.status) == (
        "bounce", "nobody@example.test", "hard", "5.1.1")
    assert 'unknown user: "nobody"' in event.reason
    assert report.original_message_id == \
        "<1.0b4f5a6e-1111-2222-3333-444455556666@senddock.test>"
    assert event.message_id == report.original_message_id
    assert report.addresses[0] == "bounces+j1.abc@senddock.test"


def test_each_failed_recipient_block_is_classified_by_the_engines_rules() -> None:
    report = parse_report(read("rfc3464_multi.eml"))
    assert report.kind == "dsn"
    got = {e.email: (e.bounce, e.status) for e in report.events}
    # delayed and delivered blocks are not bounces; only "failed" ones are.
    assert got == {
        "louisl@larry.slip.umd.edu": ("soft", "4.0.0"),
        "full@example.org": ("soft", "5.2.2"),         # mailbox full: never suppressed
        "policy@example.org": ("soft", "5.7.1"),       # policy: about us, not the address
        # "user unknown" with neither a 5.1.x status nor RCPT TO named: a filter may say
        # that after DATA; Sisimai reads it as ``filtered`` (soft), and so does SendDock.
        "gone@example.org": ("soft", "5.0.0"),
    }
    assert report.original_message_id == "<2.orig@senddock.test>"


def test_rfc5965_complaint_names_the_recipient_and_our_bounce_address() -> None:
    report = parse_report(read("rfc5965_arf.eml"))
    assert report.kind == "arf"
    [event] = report.events
    assert (event.type, event.email, event.bounce) == ("complaint", "user@example.com", None)
    assert "abuse" in event.reason and "SomeGenerator" in event.reason
    assert report.original_message_id == "<7.abc@senddock.test>"
    assert report.addresses[0] == "bounces+j7.xyz@senddock.test"


def test_redacted_complaint_keeps_the_message_id_to_match_by() -> None:
    report = parse_report(read("arf_redacted.eml"))
    assert report.kind == "arf"
    assert report.original_message_id == "<9.def@senddock.test>"
    # The recipient is redacted ("[redacted]" is no address): the event names nobody, and
    # the job found by Message-ID says who it was.
    [event] = report.events
    assert (event.type, event.email, event.message_id) == ("complaint", "",
                                                           "<9.def@senddock.test>")


def test_not_spam_feedback_is_no_complaint() -> None:
    report = parse_report(read("arf_not_spam.eml"))
    assert report.kind == "arf"
    assert report.events == []


def test_non_standard_bounce_read_from_its_text() -> None:
    report = parse_report(read("qmail_bounce.eml"))
    assert report.kind == "bounce"
    [event] = report.events
    assert (event.email, event.bounce) == ("gone@example.org", "hard")
    assert "no mailbox here" in event.reason
    assert report.addresses == ["bounces+j3.qqq@senddock.test"]


def test_ordinary_mail_is_not_a_report() -> None:
    report = parse_report(read("not_a_report.eml"))
    # An out-of-office reply (RFC 3834's kind of mail): read, nothing to do.
    assert report.kind in ("other", "autoreply") and report.events == []


@pytest.mark.parametrize("raw", [b"", b"\x00\xff garbage", b"Content-Type: multipart/report;"
                                 b" report-type=delivery-status; boundary=x\r\n\r\n--x\r\n"
                                 b"Content-Type: message/delivery-status\r\n\r\nAction",
                                 b"Content-Type: message/feedback-report\r\n\r\n\xff\xfe"])
def test_malformed_mail_never_raises(raw: bytes) -> None:
    report = parse_report(raw)
    assert report.kind in ("other", "dsn", "arf", "bounce", "unreadable")
    assert report.events == []


@pytest.mark.parametrize(("status", "diagnostic", "expected"), [
    ("5.1.1", "smtp; 550 5.1.1 <a@b>: Recipient address rejected: User unknown", "hard"),
    ("5.1.1", None, "hard"),
    ("5.2.1", "smtp; 550 5.2.1 The email account that you tried to reach is disabled",
     "hard"),
    ("5.2.2", "smtp; 552 5.2.2 over quota", "soft"),
    ("5.7.1", "smtp; 554 5.7.1 Service unavailable; Client host blocked using Spamhaus",
     "soft"),
    ("5.0.0", "smtp; 550 No such user here", "hard"),
    ("4.4.7", "X-Postfix; delivery temporarily suspended", "soft"),
    (None, "smtp;550 5.1.10 RESOLVER.ADR.RecipientNotFound; Recipient not found", "hard"),
])
def test_bounce_class(status: str | None, diagnostic: str | None, expected: str) -> None:
    assert bounce_class(status, diagnostic)[0] == expected
