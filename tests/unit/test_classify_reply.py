"""Every row of the reply classification table (docs/design.md §16, workers.delivery.classify)."""

from __future__ import annotations

import pytest

from workers.delivery.classify import (
    NOT_ABOUT_RECIPIENT,
    ReplyClass,
    classify_reply,
    humanize,
    parse_enhanced,
)

HARD = ReplyClass.HARD_BOUNCE
REJECTED = ReplyClass.REJECTED
TRANSIENT = ReplyClass.TRANSIENT
RELAY = ReplyClass.RELAY
SENT = ReplyClass.SENT
SENDER = ReplyClass.SENDER
RELAY_THROTTLE = ReplyClass.RELAY_THROTTLE


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5.1.1 User unknown", "5.1.1"),
        ("5.1.10 Null MX", "5.1.10"),
        ("  4.2.2 Mailbox full", "4.2.2"),
        ("2.0.0 Ok: queued as 123", "2.0.0"),
        ("5.7.515 Access denied", "5.7.515"),
        ("User unknown 5.1.1", None),
        ("3.1.1 nonsense class", None),
        ("5.1 short", None),
        ("5.1.1.1 too many parts", None),
        ("", None),
    ],
)
def test_parse_enhanced(text: str, expected: str | None) -> None:
    assert parse_enhanced(text) == expected


@pytest.mark.parametrize(
    ("code", "text", "stage", "expected"),
    [
        # hard bounce: the address is dead
        (550, "5.1.1 User unknown", "rcpt", HARD),
        (550, "5.1.2 Host unknown", "rcpt", HARD),
        (553, "5.1.3 Bad destination mailbox address syntax", "rcpt", HARD),
        (550, "5.1.6 Mailbox has moved", "rcpt", HARD),
        (556, "5.1.10 Recipient address has null MX", "rcpt", HARD),
        (550, "5.1.1 The email account does not exist", "data_end", HARD),
        (550, "5.2.1 The email account that you tried to reach is disabled.", "rcpt", HARD),
        (550, "5.2.1 The email account that you tried to reach is inactive.", "rcpt", HARD),
        (550, "User unknown in virtual mailbox table", "rcpt", HARD),
        (550, "No such user here", "rcpt", HARD),
        (550, "Mailbox not found", "rcpt", HARD),
        (550, "Requested action not taken: mailbox does not exist", "rcpt", HARD),
        (550, "unknown recipient", "data", HARD),
        # 5.2.1 without "disabled/inactive", or temporarily: not a dead address
        (550, "5.2.1 Mailbox unavailable", "rcpt", REJECTED),
        (550, "5.2.1 Account temporarily disabled", "rcpt", REJECTED),
        # an enhanced code that is not address-related wins over the text
        (550, "5.7.1 User unknown or blocked", "rcpt", REJECTED),
        # rejected: policy, content, everything else 5xx at rcpt/data
        (550, "5.7.1 Message rejected as spam", "rcpt", REJECTED),
        (554, "5.7.1 Service unavailable; client host blocked using Spamhaus", "rcpt", REJECTED),
        (550, "5.7.1 Relay access denied", "rcpt", RELAY),  # about us (docs/design.md §16)
        (554, "5.3.0 Other mail system problem", "data_end", REJECTED),
        (554, "5.6.0 Message content rejected", "data_end", REJECTED),
        (552, "5.3.4 Message size exceeds fixed limit", "data_end", REJECTED),
        (554, "Transaction failed", "data_end", REJECTED),
        (550, "Requested action not taken: mailbox unavailable", "rcpt", REJECTED),
        (554, "5.5.1 Error: no valid recipients", "data", REJECTED),
        # transient: 4xx at rcpt/data, mailbox full, mid-message loss
        (450, "4.2.1 Mailbox busy", "rcpt", TRANSIENT),
        (451, "4.3.0 Try later", "rcpt", TRANSIENT),
        (451, "4.7.1 Greylisted, please retry", "rcpt", TRANSIENT),
        (450, "Requested mail action not taken", "data_end", TRANSIENT),
        (451, "Local error in processing", "data", TRANSIENT),
        (452, "4.2.2 Mailbox full", "rcpt", TRANSIENT),
        (452, "Insufficient system storage", "rcpt", TRANSIENT),
        (552, "5.2.2 Mailbox full", "rcpt", TRANSIENT),
        (552, "Mailbox quota exceeded", "data_end", TRANSIENT),
        (550, "5.2.2 Over quota", "data_end", TRANSIENT),
        (None, "timed out", "send", TRANSIENT),
        (None, "Connection unexpectedly closed", "data_end", TRANSIENT),
        (None, "Connection unexpectedly closed", "rcpt", TRANSIENT),
        (None, "Connection unexpectedly closed", "data", TRANSIENT),
        # relay: our side of the conversation, never the recipient (P6)
        (None, "[Errno 111] Connection refused", "connect", RELAY),
        (None, "timed out", "connect", RELAY),
        (None, "TLS error: certificate verify failed", "starttls", RELAY),
        (554, "5.3.2 Service not available", "greeting", RELAY),
        (501, "Syntax error", "ehlo", RELAY),
        (454, "4.7.0 TLS not available", "starttls", RELAY),
        (530, "5.7.0 Authentication required", "mail", RELAY),
        (534, "5.7.9 Authentication mechanism is too weak", "auth", RELAY),
        (535, "5.7.8 Authentication credentials invalid", "auth", RELAY),
        (538, "5.7.11 Encryption required", "auth", RELAY),
        (550, "5.1.8 Sender address rejected", "mail", SENDER),
        (553, "5.1.1 Sender unknown", "mail", SENDER),
        (451, "4.3.0 Try later", "mail", RELAY),
        (None, "Connection unexpectedly closed", "mail", RELAY),
        (421, "4.7.0 Going down", "connect", RELAY_THROTTLE),
        (421, "4.7.0 Too many messages, slow down", "rcpt", RELAY_THROTTLE),
        (421, "4.4.2 Timeout", "data", RELAY_THROTTLE),
        (421, "Service not available", "data_end", RELAY_THROTTLE),
        (550, "5.7.26 Unauthenticated email is not accepted (DMARC)", "data_end", RELAY),
        (550, "5.7.23 SPF validation failed", "rcpt", RELAY),
        (550, "5.7.30 DKIM required", "data_end", RELAY),
        (421, "4.7.26 Unauthenticated email", "data_end", RELAY),
        (
            550,
            "5.7.515 Access denied, sending domain does not meet requirements",
            "data_end",
            RELAY,
        ),
        (250, "2.0.0 but DATA should have said 354", "data", RELAY),
        (None, "Connection unexpectedly closed", "noop", RELAY),
        # sent
        (250, "2.0.0 Ok: queued as 1234", "data_end", SENT),
        (250, "OK", "data_end", SENT),
        (250, "2.0.0 OK", "noop", SENT),
    ],
)
def test_classify_reply(code: int | None, text: str, stage: str, expected: ReplyClass) -> None:
    assert classify_reply(code, text, stage) is expected


@pytest.mark.parametrize("stage", ["connect", "greeting", "ehlo", "starttls", "auth", "mail"])
@pytest.mark.parametrize("code", [None, 421, 450, 454, 500, 530, 534, 535, 538, 550, 554])
def test_every_failure_before_rcpt_is_relay(code: int | None, stage: str) -> None:
    # Never about the recipient: relay, throttle or (at MAIL) our sender (P6).
    assert classify_reply(code, "5.1.1 User unknown", stage) in NOT_ABOUT_RECIPIENT


def test_unknown_stage_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown SMTP stage"):
        classify_reply(550, "x", "quit")


@pytest.mark.parametrize(
    ("reply_class", "code", "text", "stage", "phrase"),
    [
        (HARD, 550, "5.1.1 User unknown", "rcpt", "mailbox does not exist"),
        (HARD, 550, "No such user", "rcpt", "mailbox does not exist"),
        (HARD, 550, "5.2.1 account disabled", "rcpt", "mailbox disabled"),
        (TRANSIENT, 452, "4.2.2 Mailbox full", "rcpt", "mailbox full"),
        (TRANSIENT, 552, "5.2.2 Over quota", "rcpt", "mailbox full"),
        (TRANSIENT, None, "timed out", "send", "connection lost while sending; will retry"),
        (REJECTED, 550, "5.7.1 spam", "rcpt", "rejected by the receiving server as policy/spam"),
        (
            REJECTED,
            554,
            "Blocked by policy",
            "rcpt",
            "rejected by the receiving server as policy/spam",
        ),
        (REJECTED, 552, "5.3.4 too big", "data_end", "message too large"),
        (RELAY_THROTTLE, 421, "4.7.0 Going down", "mail",
         "the relay closed the connection (busy or going down)"),
        (RELAY, None, "Connection refused", "connect", "mail server unreachable"),
        (RELAY, 535, "5.7.8 bad credentials", "auth", "login refused - check the credentials"),
        (SENDER, 550, "5.1.8 bad sender", "mail", "the relay refuses this From address"),
        (SENT, 250, "2.0.0 OK", "data_end", "accepted by the mail server"),
    ],
)
def test_humanize(
    reply_class: ReplyClass, code: int | None, text: str, stage: str, phrase: str
) -> None:
    enhanced = parse_enhanced(text)
    assert humanize(reply_class, code, enhanced, text, stage=stage) == phrase


def test_humanize_never_echoes_server_text() -> None:
    text = "5.7.1 <script>alert(1)</script>"
    assert "<script>" not in humanize(REJECTED, 550, "5.7.1", text)
