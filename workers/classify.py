"""Classify an SMTP reply into what the delivery engine must do with the job.

The enhanced status code (RFC 3463) decides when present; the reply text only
when it is absent. ``stage`` says which step of the SMTP conversation produced
the reply: ``connect``, ``greeting``, ``ehlo``, ``starttls``, ``auth``,
``mail``, ``noop`` (relay probe), ``rcpt``, ``data`` (the DATA command),
``data_end`` (the reply after the final dot) and ``send`` (while the message
itself was being transmitted). ``code is None`` means no reply at all: a
refused or timed-out connection, a TLS failure or a disconnect.

Rules, first match wins (SPEC section 2):

=====  ==========================================================  ============
order  reply                                                       class
=====  ==========================================================  ============
1      no reply (code None) at connect/greeting/ehlo/starttls/      relay
       auth/mail/noop
2      no reply (code None) at rcpt/data/send/data_end              transient
       (timeout or disconnect mid-message)
3      enhanced x.7.23 - x.7.30 or x.7.515 (SPF/DKIM/DMARC           relay
       alignment: our setup, not the recipient), any stage
4      421 at any stage (the relay closing the channel:              relay
       throttling or going down)
5      any other failure at connect/greeting/ehlo/starttls/auth/     relay
       mail/noop (incl. 530/534/535/538, MAIL FROM refused)
6      2xx at data_end (or noop)                                     sent
7      any other 1xx/2xx/3xx (a protocol violation by the relay)     relay
8      enhanced 4.2.2 / 5.2.2, or 452 / 552 without an enhanced      transient
       code or with an x.2.x one (mailbox full), even if 5xx
9      5xx with enhanced 5.1.1 / 5.1.2 / 5.1.3 / 5.1.6 / 5.1.10      hard_bounce
10     5xx with enhanced 5.2.1 whose text says disabled/inactive     hard_bounce
11     5xx without enhanced code whose text says the user or         hard_bounce
       mailbox does not exist ("user unknown", "no such user", ...)
12     other 4xx at rcpt/data/data_end                               transient
13     other 5xx at rcpt/data/data_end (5.7.x policy/spam, 5.3.x,    rejected
       5.6.x content, 552 5.3.4 too big, no enhanced code)
=====  ==========================================================  ============

What the engine does with each class: ``hard_bounce`` -> job ``bounced`` and
the address suppressed; ``rejected`` -> job ``failed``, address not
suppressed; ``transient`` -> retry on the schedule; ``relay`` -> job back to
``pending``, attempt not counted, delivery paused (P6); ``sent`` -> ``sent``.
"""

from __future__ import annotations

import re
from enum import StrEnum


class ReplyClass(StrEnum):
    """Outcome class of one delivery attempt."""

    SENT = "sent"
    HARD_BOUNCE = "hard_bounce"
    REJECTED = "rejected"
    TRANSIENT = "transient"
    RELAY = "relay"


RELAY_STAGES = frozenset({"connect", "greeting", "ehlo", "starttls", "auth", "mail", "noop"})
MESSAGE_STAGES = frozenset({"rcpt", "data", "data_end", "send"})
STAGES = RELAY_STAGES | MESSAGE_STAGES

_ENHANCED = re.compile(r"\s*([245])\.(\d{1,3})\.(\d{1,3})(?![\d.])")
_HARD_ENHANCED = frozenset({"5.1.1", "5.1.2", "5.1.3", "5.1.6", "5.1.10"})
_FULL_ENHANCED = frozenset({"4.2.2", "5.2.2"})
_DISABLED_TEXT = re.compile(r"\b(disabled|inactive|deactivated)\b", re.IGNORECASE)
_TEMPORARY_TEXT = re.compile(r"temporar", re.IGNORECASE)
_NO_SUCH_USER_TEXT = re.compile(
    r"\b(?:"
    r"user\s+unknown|unknown\s+(?:user|recipient|mailbox|address)|recipient\s+unknown"
    r"|no\s+such\s+(?:user|mailbox|recipient|account|address|person)"
    r"|(?:mailbox|user|recipient|account|address)\s+(?:not\s+found|not\s+exist)"
    r"|(?:does\s+not|doesn't|did\s+not)\s+exist"
    r"|invalid\s+(?:recipient|mailbox|user)"
    r"|not\s+a\s+valid\s+(?:mailbox|user|recipient)"
    r")",
    re.IGNORECASE,
)
_POLICY_TEXT = re.compile(
    r"spam|polic|block|blacklist|denylist|reputation|rbl|spamhaus", re.IGNORECASE
)


def parse_enhanced(text: str) -> str | None:
    """Return the RFC 3463 enhanced status code at the start of a reply text.

    Guarantees: the result is ``"c.s.d"`` with class 2, 4 or 5 and no leading
    zeros removed or added (as written by the server), or None when the text
    does not start (after whitespace) with such a code.
    """
    match = _ENHANCED.match(text)
    if match is None:
        return None
    return f"{match[1]}.{match[2]}.{match[3]}"


def _is_auth_alignment(enhanced: str | None) -> bool:
    if enhanced is None:
        return False
    _cls, subject, detail = enhanced.split(".")
    return subject == "7" and (23 <= int(detail) <= 30 or detail == "515")


def _is_mailbox_full(code: int, enhanced: str | None) -> bool:
    if enhanced in _FULL_ENHANCED:
        return True
    if code not in (452, 552):
        return False
    return enhanced is None or enhanced.split(".")[1] == "2"


def _is_hard_bounce(code: int, enhanced: str | None, text: str) -> bool:
    if code // 100 != 5:
        return False
    if enhanced in _HARD_ENHANCED:
        return True
    if enhanced == "5.2.1":
        return bool(_DISABLED_TEXT.search(text)) and not _TEMPORARY_TEXT.search(text)
    return enhanced is None and bool(_NO_SUCH_USER_TEXT.search(text))


def classify_reply(code: int | None, text: str, stage: str) -> ReplyClass:
    """Classify one SMTP reply (or the lack of one) per the module table.

    Guarantees: never raises for any ``code``/``text``; HARD_BOUNCE is only
    returned for a 5xx reply that says the address itself is dead (P5); every
    failure caused by our relay, credentials or sender is RELAY (P6).
    Raises ValueError only for an unknown ``stage`` (a programming error).
    """
    if stage not in STAGES:
        raise ValueError(f"unknown SMTP stage {stage!r}")
    if code is None:
        return ReplyClass.RELAY if stage in RELAY_STAGES else ReplyClass.TRANSIENT
    enhanced = parse_enhanced(text)
    if _is_auth_alignment(enhanced) or code == 421:
        return ReplyClass.RELAY
    success = 200 <= code < 300
    if stage in RELAY_STAGES:
        return ReplyClass.SENT if success and stage == "noop" else ReplyClass.RELAY
    if success and stage == "data_end":
        return ReplyClass.SENT
    if not 400 <= code < 600:
        return ReplyClass.RELAY
    if _is_mailbox_full(code, enhanced):
        return ReplyClass.TRANSIENT
    if _is_hard_bounce(code, enhanced, text):
        return ReplyClass.HARD_BOUNCE
    if code < 500:
        return ReplyClass.TRANSIENT
    return ReplyClass.REJECTED


def _humanize_relay(code: int | None, enhanced: str | None, stage: str | None) -> str:
    if _is_auth_alignment(enhanced):
        return "sender authentication (SPF/DKIM/DMARC) failed for our domain"
    if code == 421:
        return "mail server temporarily unavailable"
    if stage == "auth" or code in (530, 534, 535, 538):
        return "mail server refused our login"
    if stage == "starttls":
        return "secure connection (TLS) to the mail server failed"
    if stage == "mail" and code is not None:
        return "mail server refused our sender address"
    if code is None:
        return "mail server unreachable"
    return "mail server temporarily unavailable"


def _humanize_transient(code: int | None, enhanced: str | None) -> str:
    if code is None:
        return "connection lost while sending; will retry"
    if _is_mailbox_full(code, enhanced):
        return "mailbox full"
    if enhanced is not None and enhanced.startswith("4.7."):
        return "temporarily deferred by the receiving server (greylisting or rate limit)"
    return "temporarily deferred by the receiving server"


def _humanize_rejected(code: int | None, enhanced: str | None, text: str) -> str:
    if (enhanced is not None and enhanced.startswith("5.7.")) or _POLICY_TEXT.search(text):
        return "rejected by the receiving server as policy/spam"
    if enhanced == "5.3.4" or (code == 552 and enhanced is None):
        return "message too large"
    if enhanced is not None and enhanced.startswith("5.6."):
        return "message content rejected"
    return "rejected by the receiving server"


def humanize(
    reply_class: ReplyClass,
    code: int | None,
    enhanced: str | None,
    text: str,
    stage: str | None = None,
) -> str:
    """Return a short plain-English phrase for a classified reply.

    Guarantees: a lower-case phrase of a few words meant for marketers and
    support staff; it never contains the server's own text, so it is safe to
    show anywhere and stable enough to group errors by.
    """
    if reply_class is ReplyClass.SENT:
        return "accepted by the mail server"
    if reply_class is ReplyClass.HARD_BOUNCE:
        if enhanced == "5.2.1":
            return "mailbox disabled"
        if enhanced in ("5.1.2", "5.1.10"):
            return "recipient domain does not accept mail"
        if enhanced == "5.1.3":
            return "invalid address"
        return "mailbox does not exist"
    if reply_class is ReplyClass.TRANSIENT:
        return _humanize_transient(code, enhanced)
    if reply_class is ReplyClass.REJECTED:
        return _humanize_rejected(code, enhanced, text)
    return _humanize_relay(code, enhanced, stage)
