"""Bounce and complaint reports in the mail, as :class:`Feedback` events.

The mail is read by :mod:`workers.after_acceptance.bounces` (DSNs, broken ones too, bounces
in text from ~75 kinds of mail software, ARF and Microsoft JMRP complaints, Amazon SES
notifications by mail, auto-replies), which gives every recipient a *reason* from Sisimai's
vocabulary and what it means (:mod:`workers.after_acceptance.bounces.reasons`). Here that
becomes events:

- ``hard`` bounces (``userunknown``, ``hostunknown``, ``hasmoved``, ``notaccept`` 5xx):
  the address is dead (P5);
- ``sender`` bounces (a blocklist, our reputation, our rate, our authentication): about us,
  not the recipient: a sender alarm, counted against nobody;
- ``soft`` bounces (anything else failed): counted toward the soft threshold;
- complaints (ARF ``abuse``/``fraud``/``virus``/``other``/``opt-out``, JMRP, SES);
- delay notices, deliveries, auto-replies and RFC 6591 ``auth-failure`` reports are no
  events (``MailReport.ignored``).

:func:`bounce_class` classifies a provider's (webhook) status and text with the engine's
SMTP rules. Nothing here touches the database; :mod:`workers.after_acceptance.feedback`
applies the events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from workers.after_acceptance.bounces import Failure, read_safely
from workers.after_acceptance.bounces import reasons as rs
from workers.delivery.classify import ReplyClass, classify_reply, parse_enhanced

COMPLAINT_TYPES = frozenset({"abuse", "fraud", "virus", "other"})
_REPLY = re.compile(r"^\s*(?:smtp|x-postfix|x-unix|x-local)?\s*;?\s*(\d{3})\b[\s-]*(.*)$",
                    re.IGNORECASE | re.DOTALL)
_DIAG_TYPE = re.compile(r"^\s*[a-z0-9-]+\s*;\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Feedback:
    """One bounce or complaint about one recipient, from any source (mail or webhook).

    ``type`` is ``bounce`` or ``complaint``; ``bounce`` is ``hard`` (the address is dead:
    suppress), ``soft`` (counts toward the soft-bounce threshold) or ``sender`` (about us:
    a sender alarm, counts against nobody) for a bounce, None for a complaint. ``email``
    is lower-cased; empty when the report redacted it (the event is then about whoever the
    matched job was sent to). ``code`` is the reason (Sisimai's vocabulary) when known.
    ``message_id`` is the original message's Message-ID with its angle brackets, when the
    source gave it.
    """

    type: str
    email: str
    bounce: str | None = None
    reason: str = ""
    status: str | None = None
    message_id: str | None = None
    event_id: str | None = None  # the provider's id for this event (deduplication)
    code: str | None = None      # the reason (after_acceptance/bounces/reasons.py), if known


@dataclass
class MailReport:
    """What one mail in the bounce mailbox says. ``kind`` is ``dsn``, ``arf``, ``ses``,
    ``bounce`` (a bounce in text), ``autoreply``, ``other`` (not a report: nothing to do)
    or ``unreadable``. ``addresses`` are the report's envelope/header recipients (for the
    VERP token)."""

    kind: str
    events: list[Feedback] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    original_message_id: str | None = None
    report_message_id: str | None = None
    subject: str = ""
    error: str = ""                 # kind 'unreadable': why
    ignored: list[Failure] = field(default_factory=list)  # delays, deliveries, auto-replies


def bounce_class(status: str | None, diagnostic: str | None) -> tuple[str, str]:
    """``(hard|soft, reason)`` for a failed delivery reported as an RFC 3464 ``Status``
    and ``Diagnostic-Code``. Hard only when the engine's classifier calls the reply a hard
    bounce (the address itself is dead); a policy, content or mailbox-full failure is
    soft and never suppresses (P5)."""
    text = _DIAG_TYPE.sub("", (diagnostic or "").strip(), count=1) if diagnostic else ""
    text = " ".join(text.split())
    match = _REPLY.match(text)
    if match:
        code, rest = int(match[1]), match[2].strip()
    else:
        code, rest = None, text
    # "x.0.0" says nothing (undefined status): then the reply text decides, as for SMTP.
    if parse_enhanced(rest) is None and status and parse_enhanced(status) \
            and not status.endswith(".0.0"):
        rest = f"{status} {rest}".strip()
    if code is None:
        cls = (status or "5").split(".")[0]
        code = 550 if cls == "5" else 450
    reason = f"{code} {rest}".strip() if (match or rest) else (status or "failed")
    verdict = classify_reply(code, rest, "rcpt")
    return ("hard" if verdict is ReplyClass.HARD_BOUNCE else "soft"), reason[:1000]


_BOUNCE = {rs.HARD: "hard", rs.SOFT: "soft", rs.SENDER: "sender"}


def parse_report(raw: bytes) -> MailReport:
    """Read one mail from the bounce mailbox (:mod:`workers.after_acceptance.bounces`). Never
    raises: what cannot be read at all is ``kind='unreadable'`` with ``error`` saying why;
    what is no report (or only says "delayed", "delivered", "away") is ``kind='other'`` or
    its kind with no events."""
    reading = read_safely(raw)
    report = MailReport(reading.kind, addresses=reading.addresses,
                        original_message_id=reading.original_message_id,
                        report_message_id=reading.report_message_id,
                        subject=reading.subject, error=reading.error)
    mid = reading.original_message_id
    for failure in reading.failures:
        if failure.effect == rs.COMPLAINT:
            agent = failure.diagnostic or f"complaint ({failure.feedback_type or 'abuse'})"
            report.events.append(Feedback("complaint", failure.recipient, None, agent[:1000],
                                          None, mid, code="feedback"))
        elif failure.effect in _BOUNCE:
            text = failure.diagnostic or failure.label
            report.events.append(Feedback("bounce", failure.recipient,
                                          _BOUNCE[failure.effect], text[:1000],
                                          failure.status or None, mid, code=failure.reason))
        else:
            report.ignored.append(failure)
    return report
