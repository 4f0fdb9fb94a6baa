"""docs/design.md §16: who a refusal is about, whatever stage it comes at (the replies real relays
give: Postfix, Exchange/M365, SES, Gmail, Outlook), and the same-refusal streak."""

from __future__ import annotations

import pytest

from workers.delivery.classify import (
    NOT_ABOUT_RECIPIENT,
    RefusalStreak,
    ReplyClass,
    classify_reply,
    is_login_refusal,
    refusal_key,
)

RELAY = ReplyClass.RELAY
SENDER = ReplyClass.SENDER
RELAY_THROTTLE = ReplyClass.RELAY_THROTTLE
DOMAIN_THROTTLE = ReplyClass.DOMAIN_THROTTLE


@pytest.mark.parametrize(
    ("code", "text", "stage", "expected"),
    [
        # Postfix reports client, HELO and sender restrictions at RCPT (smtpd_delay_reject)
        (554, "5.7.1 <news@example.com>: Sender address rejected: Access denied", "rcpt",
         SENDER),
        (553, "5.7.1 <news@example.com>: Sender address rejected: not owned by user "
              "alice@example.com", "rcpt", SENDER),
        (554, "5.7.1 <bob@example.org>: Relay access denied", "rcpt", RELAY),
        (504, "5.5.2 <localhost>: Helo command rejected: need fully-qualified hostname",
         "rcpt", RELAY),
        (554, "5.7.1 <unknown[192.0.2.1]>: Client host rejected: Access denied", "rcpt",
         RELAY),
        (530, "5.7.0 Must issue a STARTTLS command first", "mail", RELAY),
        (530, "5.7.0 Must issue a STARTTLS command first", "rcpt", RELAY),
        # M365 / Exchange
        (550, "5.7.60 SMTP; Client does not have permissions to send as this sender",
         "data_end", SENDER),
        (530, "5.7.57 Client not authenticated to send mail", "mail", RELAY),
        (550, "5.7.64 TenantAttribution; Relay Access Denied", "rcpt", RELAY),
        # the same refusals at MAIL (smtpd_delay_reject = no)
        (554, "5.7.1 <news@example.com>: Sender address rejected: Access denied", "mail",
         SENDER),
        (451, "4.3.0 Temporary lookup failure", "mail", RELAY),
        # throttling: slow down, never fail (relay-wide or for one recipient domain)
        (450, "4.7.1 Error: too many recipients from 127.0.0.1", "rcpt", RELAY_THROTTLE),
        (450, "4.7.1 Error: too much mail from 127.0.0.1", "mail", RELAY_THROTTLE),
        (421, "4.7.0 relay.example Error: too many connections from 127.0.0.1", "greeting",
         RELAY_THROTTLE),
        (454, "Throttling failure: Maximum sending rate exceeded.", "data_end",
         RELAY_THROTTLE),
        (454, "Throttling failure: Daily message quota exceeded.", "rcpt", RELAY_THROTTLE),
        (421, "4.7.28 Gmail has detected an unusual rate of unsolicited mail", "rcpt",
         DOMAIN_THROTTLE),
        (450, "4.7.28 Our system has detected an unusual rate of mail from your IP", "rcpt",
         DOMAIN_THROTTLE),
        (451, "4.7.650 The mail server has been temporarily rate limited", "rcpt",
         DOMAIN_THROTTLE),
        (450, "4.2.1 The user you are trying to contact is receiving mail at a rate that "
              "prevents additional messages", "rcpt", DOMAIN_THROTTLE),
        (451, "4.7.1 Too many messages, try again later", "rcpt", DOMAIN_THROTTLE),
        # still about the recipient
        (550, "5.1.1 <dead@example.org>: Recipient address rejected: User unknown", "rcpt",
         ReplyClass.HARD_BOUNCE),
        (450, "4.2.1 <busy@example.org>: Recipient address rejected: Mailbox busy", "rcpt",
         ReplyClass.TRANSIENT),
        (554, "5.7.1 <spam@example.org>: Recipient address rejected: refused as spam",
         "rcpt", ReplyClass.REJECTED),
        (451, "4.7.1 Greylisted, please retry", "rcpt", ReplyClass.TRANSIENT),
    ],
)
def test_who_the_refusal_is_about(code: int, text: str, stage: str,
                                  expected: ReplyClass) -> None:
    assert classify_reply(code, text, stage) is expected


def test_refusals_about_us_never_use_an_attempt() -> None:
    for cls in (RELAY, SENDER, RELAY_THROTTLE, DOMAIN_THROTTLE):
        assert cls in NOT_ABOUT_RECIPIENT
    for cls in (ReplyClass.HARD_BOUNCE, ReplyClass.REJECTED, ReplyClass.TRANSIENT):
        assert cls not in NOT_ABOUT_RECIPIENT


@pytest.mark.parametrize(("code", "text", "stage", "login"), [
    (535, "5.7.8 Error: authentication failed: authentication failure", "auth", True),
    (530, "5.7.0 Authentication required", "mail", True),
    (454, "4.7.0 Temporary authentication failure", "auth", False),
    (554, "5.7.1 Relay access denied", "rcpt", False),
])
def test_login_refusals(code: int, text: str, stage: str, login: bool) -> None:
    assert is_login_refusal(code, text, stage) is login


def test_refusal_key_takes_the_recipient_out() -> None:
    a = refusal_key(554, "5.7.1 <w1@example.org>: Recipient address rejected: policy",
                    "w1@example.org")
    b = refusal_key(554, "5.7.1 <w2@example.org>: Recipient address rejected: policy",
                    "w2@example.org")
    assert a == b
    assert a != refusal_key(554, "5.7.1 <w2@example.org>: other", "w2@example.org")


def test_streak_trips_on_the_nth_different_recipient_and_hands_back_the_rest() -> None:
    streak = RefusalStreak(threshold=3)
    text = "5.7.1 <{}>: Service unavailable; blocked by policy"
    seen = [streak.observe(i, f"r{i}@example.org", ReplyClass.REJECTED, 554,
                           text.format(f"r{i}@example.org")) for i in range(3)]
    assert [cls for cls, _ in seen] == [ReplyClass.REJECTED, ReplyClass.REJECTED, RELAY]
    assert seen[2][1] == [0, 1]


def test_streak_is_broken_by_a_success_and_ignores_repeats_of_one_recipient() -> None:
    streak = RefusalStreak(threshold=3)
    reply = "5.7.1 blocked"
    streak.observe(1, "a@example.org", ReplyClass.REJECTED, 554, reply)
    streak.observe(2, "a@example.org", ReplyClass.REJECTED, 554, reply)  # same recipient
    assert streak.observe(3, "b@example.org", ReplyClass.REJECTED, 554, reply)[0] is \
        ReplyClass.REJECTED
    streak.observe(4, "c@example.org", ReplyClass.SENT, 250, "ok")
    assert streak.observe(5, "d@example.org", ReplyClass.REJECTED, 554, reply)[0] is \
        ReplyClass.REJECTED


def test_hard_bounces_need_different_domains() -> None:
    """A dead company domain stays a bounce; the same 5.1.1 across domains is about us."""
    streak = RefusalStreak(threshold=3)
    for i in range(5):
        cls, _ = streak.observe(i, f"u{i}@dead.example", ReplyClass.HARD_BOUNCE, 550,
                                "5.1.1 User unknown")
        assert cls is ReplyClass.HARD_BOUNCE
    # dead.example counts once; two more domains make three different ones in a row
    results = [streak.observe(10 + i, f"u@d{i}.example", ReplyClass.HARD_BOUNCE, 550,
                              "5.1.1 User unknown")[0] for i in range(2)]
    assert results == [ReplyClass.HARD_BOUNCE, RELAY]


def test_streak_off() -> None:
    streak = RefusalStreak(threshold=0)
    for i in range(20):
        assert streak.observe(i, f"r{i}@x.example", ReplyClass.REJECTED, 554, "no")[0] is \
            ReplyClass.REJECTED
