"""What a bounce reason means (docs/design.md §17, P5): only address-level reasons suppress at once;
blocklist, reputation and rate reasons are about us; delay notices do nothing."""

from __future__ import annotations

import pytest

from workers.after_acceptance.bounces import reasons as rs


@pytest.mark.parametrize(("diagnostic", "status", "command", "reason", "effect"), [
    ("550 5.1.1 <a@b.example>: Recipient address rejected: User unknown", "5.1.1", "RCPT",
     "userunknown", rs.HARD),
    ("550 5.1.2 Host unknown", "5.1.2", "", "hostunknown", rs.HARD),
    ("552 5.2.2 Mailbox full", "5.2.2", "", "mailboxfull", rs.SOFT),
    ("554 5.7.1 Client host [192.0.2.1] blocked using zen.spamhaus.org", "5.7.1", "RCPT",
     "blocked", rs.SENDER),
    ("421 4.7.0 Try again later, closing connection: too many connections", "4.7.0", "",
     "toomanyconn", rs.SENDER),
    ("450 4.2.1 The user you are trying to contact is receiving mail at a rate that "
     "prevents additional messages from being delivered", "4.2.1", "", "speeding", rs.SENDER),
    ("550 5.7.26 Unauthenticated email from example.jp is not accepted due to domain's DMARC "
     "policy", "5.7.26", "DATA", "authfailure", rs.SENDER),
    ("550 5.7.1 Message rejected as spam by Content Filtering", "5.7.1", "DATA",
     "spamdetected", rs.SOFT),
    # "User unknown" after DATA, or without an address status: a filter's answer.
    ("550 : User unknown", "", "DATA", "filtered", rs.SOFT),
    ("550 5.2.1 <a@b.example>... User Unknown", "5.2.1", "", "filtered", rs.SOFT),
    # Refused at MAIL FROM: about our sender address, whatever it says.
    ("553 5.1.8 Domain of sender address does not exist", "5.1.8", "MAIL", "rejected",
     rs.SENDER),
    # An SES "unknown address" that quotes a 5.7.1 access refusal.
    ("5.1.0 - Unknown address error 550-'5.7.1 Access denied'", "5.1.0", "", "securityerror",
     rs.SENDER),
    # Exchange's own words for a dead address, no status, no command.
    ("The recipient name is not recognized", "", "", "userunknown", rs.HARD),
])
def test_reason_and_effect(diagnostic: str, status: str, command: str, reason: str,
                           effect: str) -> None:
    found = rs.find_reason(diagnostic, status or None, command=command)
    assert found == reason
    assert rs.effect_of(found, status) == effect


def test_notaccept_is_hard_only_when_permanent() -> None:
    assert rs.effect_of("notaccept", "5.1.10") == rs.HARD
    assert rs.effect_of("notaccept", "4.3.2") == rs.SOFT


def test_a_delay_notice_is_never_a_bounce() -> None:
    for reason in ("userunknown", "mailboxfull", "blocked", "expired"):
        assert rs.effect_of(reason, "4.4.7", delayed=True) == rs.DELAY


def test_complaints_and_auto_replies() -> None:
    assert rs.effect_of("feedback") == rs.COMPLAINT
    assert rs.effect_of("vacation") == rs.IGNORE == rs.effect_of("delivered")


def test_every_reason_has_a_label_and_an_effect() -> None:
    for name, entry in rs.REASONS.items():
        assert entry.label and entry.effect in (rs.HARD, rs.SOFT, rs.SENDER, rs.COMPLAINT,
                                                rs.IGNORE), name
    assert {r for r, e in rs.REASONS.items() if e.effect == rs.HARD} == {
        "userunknown", "hostunknown", "hasmoved", "notaccept"}
