"""Bounce and complaint reports in the mail: DSNs (RFC 3464) and ARF complaints (RFC 5965).

A report becomes zero or more :class:`Feedback` events, one per recipient it is about,
plus what is needed to find the job it concerns: the addresses the report was delivered
to (a VERP bounce address carries the job) and the Message-ID of the original message.

- DSNs: every per-recipient block of each ``message/delivery-status`` part with
  ``Action: failed`` is a bounce; ``delayed``, ``delivered``, ``relayed`` and ``expanded``
  are not. The block's ``Diagnostic-Code`` (else its ``Status``) is classified with the
  engine's own :func:`workers.delivery.classify.classify_reply`, so a DSN suppresses an address only
  when the reply says the address is dead (P5): hard; anything else failed is soft.
- Non-standard bounces (no delivery-status part): flufl.bounce's detectors find the
  failed recipients; they are hard only when the text says the user does not exist.
- ARF: a ``message/feedback-report`` part with a ``Feedback-Type`` of ``abuse``, ``fraud``,
  ``virus`` or ``other`` is a complaint about ``Original-Rcpt-To`` (else the original's
  ``To``). ``not-spam`` and ``auth-failure`` (RFC 6591) are not complaints.

Nothing here touches the database; :mod:`workers.after_acceptance.feedback` applies the events.
"""

from __future__ import annotations

import email
import email.policy
import re
from dataclasses import dataclass, field
from email.message import Message
from email.parser import HeaderParser
from email.utils import getaddresses, parseaddr

from flufl.bounce import all_failures

from workers.delivery.classify import ReplyClass, classify_reply, parse_enhanced

COMPLAINT_TYPES = frozenset({"abuse", "fraud", "virus", "other"})
_REPLY = re.compile(r"^\s*(?:smtp|x-postfix|x-unix|x-local)?\s*;?\s*(\d{3})\b[\s-]*(.*)$",
                    re.IGNORECASE | re.DOTALL)
_DIAG_TYPE = re.compile(r"^\s*[a-z0-9-]+\s*;\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Feedback:
    """One bounce or complaint about one recipient, from any source (mail or webhook).

    ``type`` is ``bounce`` or ``complaint``; ``bounce`` is ``hard`` (the address is dead:
    suppress) or ``soft`` (counts toward the soft-bounce threshold) for a bounce, None for
    a complaint. ``email`` is lower-cased; empty when the report redacted it (the event is
    then about whoever the matched job was sent to). ``message_id`` is the original message's
    Message-ID with its angle brackets, when the source gave it.
    """

    type: str
    email: str
    bounce: str | None = None
    reason: str = ""
    status: str | None = None
    message_id: str | None = None
    event_id: str | None = None  # the provider's id for this event (deduplication)


@dataclass
class MailReport:
    """What one mail in the bounce mailbox says. ``kind`` is ``dsn``, ``arf``, ``bounce``
    (a non-standard bounce flufl.bounce recognised) or ``other`` (not a report: nothing to
    do). ``addresses`` are the report's envelope/header recipients (for the VERP token)."""

    kind: str
    events: list[Feedback] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    original_message_id: str | None = None
    report_message_id: str | None = None


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


def _address(value: str | None) -> str | None:
    """The address of an RFC 3464 recipient field (``rfc822; a@b``) or a header value."""
    if not value:
        return None
    value = str(value).strip()
    if ";" in value:
        _kind, value = value.split(";", 1)
    addr = parseaddr(value.strip())[1] or value.strip().strip("<>")
    return addr.lower() if "@" in addr else None


def _original_headers(msg: Message) -> Message | None:
    """The headers of the original message a report carries (``message/rfc822``,
    ``message/rfc822-headers`` or ``text/rfc822-headers``), if it carries them."""
    for part in msg.walk():
        ctype = part.get_content_type()
        if ctype == "message/rfc822":
            inner = part.get_payload()
            if isinstance(inner, list) and inner and isinstance(inner[0], Message):
                return inner[0]
        if ctype in ("text/rfc822-headers", "message/rfc822-headers"):
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                return HeaderParser().parsestr(payload.decode("utf-8", "replace"))
            raw = part.get_payload()
            if isinstance(raw, str):
                return HeaderParser().parsestr(raw)
            if isinstance(raw, list) and raw and isinstance(raw[0], Message):
                return raw[0]
    return None


def _delivered_to(msg: Message) -> list[str]:
    """Where the report was delivered: the bounce address the original was sent from."""
    found: list[str] = []
    for header in ("Delivered-To", "X-Original-To", "Envelope-To", "X-Envelope-To", "To"):
        for _name, addr in getaddresses([str(v) for v in msg.get_all(header, [])]):
            if addr and addr.lower() not in found:
                found.append(addr.lower())
    return found


def _dsn_events(msg: Message, message_id: str | None) -> list[Feedback]:
    events: list[Feedback] = []
    for part in msg.walk():
        if part.get_content_type() != "message/delivery-status":
            continue
        blocks = part.get_payload()
        if not isinstance(blocks, list):
            continue
        # The first block is per-message (Reporting-MTA, ...); the rest are per recipient.
        for block in blocks[1:]:
            if not isinstance(block, Message):
                continue
            action = str(block.get("Action", "")).strip().lower()
            if not action.startswith(("failed", "error")):
                continue
            rcpt = _address(block.get("Original-Recipient")) \
                or _address(block.get("Final-Recipient"))
            if rcpt is None:
                continue
            status = str(block.get("Status", "")).strip().split()[0] if block.get("Status") \
                else None
            diagnostic = block.get("Diagnostic-Code")
            kind, reason = bounce_class(status, str(diagnostic) if diagnostic else None)
            events.append(Feedback("bounce", rcpt, kind, reason, status, message_id))
    return events


def _text_of(msg: Message, limit: int = 4000) -> str:
    chunks: list[str] = []
    for part in msg.walk():
        if part.get_content_type() == "text/plain":
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                chunks.append(payload.decode(part.get_content_charset() or "utf-8", "replace"))
        if sum(map(len, chunks)) > limit:
            break
    return "\n".join(chunks)[:limit]


def _reason_near(text: str, addr: str) -> str:
    """The line naming ``addr`` and the paragraph after it (qmail and friends put the
    reason on the next line), else the first line of the text."""
    lines = [ln.strip() for ln in text.splitlines()]
    for i, line in enumerate(lines):
        if addr in line.lower():
            rest = []
            for follow in lines[i + 1:i + 4]:
                if not follow or follow.startswith("-"):
                    break
                rest.append(follow)
            return " ".join(" ".join([line, *rest]).split())[:1000]
    return " ".join((lines[0] if lines else "").split())[:1000]


_ANY_ENHANCED = re.compile(r"(?<![\d.])([45]\.\d{1,3}\.\d{1,3})(?![\d.])")


def _heuristic_events(msg: Message, message_id: str | None) -> list[Feedback]:
    try:
        temporary, permanent = all_failures(msg)
    except Exception:  # flufl.bounce's heuristic detectors can trip over malformed mail
        return []
    text = _text_of(msg)
    events: list[Feedback] = []
    for raw_addr in sorted(permanent | temporary):
        addr = raw_addr.decode("ascii", "replace").lower()
        reason = _reason_near(text, addr)
        # qmail and others quote the enhanced status in the text: "(#5.1.1)".
        found = _ANY_ENHANCED.search(reason)
        kind, _ = bounce_class(found[1] if found else None, reason)
        if raw_addr not in permanent:
            kind = "soft"
        events.append(Feedback("bounce", addr, kind, reason, found[1] if found else None,
                               message_id))
    return events


def _arf_events(msg: Message, original: Message | None,
                message_id: str | None) -> list[Feedback] | None:
    for part in msg.walk():
        if part.get_content_type() != "message/feedback-report":
            continue
        payload = part.get_payload()
        if isinstance(payload, list) and payload and isinstance(payload[0], Message):
            fields = payload[0]
        else:
            raw = part.get_payload(decode=True)
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(payload)
            fields = HeaderParser().parsestr(text.lstrip("\r\n"))
        feedback_type = str(fields.get("Feedback-Type", "")).strip().lower()
        if feedback_type not in COMPLAINT_TYPES:
            return []
        rcpts = [a for a in (_address(v) for v in fields.get_all("Original-Rcpt-To", []))
                 if a]
        if not rcpts and original is not None:
            rcpts = [a.lower() for _n, a in getaddresses(original.get_all("To", []))
                     if "@" in a]
        if not rcpts:
            # Redacted (Microsoft's JMRP, Yahoo): about whoever the matched job was sent to.
            rcpts = [""]
        agent = str(fields.get("User-Agent", "")).strip()
        reason = f"complaint ({feedback_type})" + (f" via {agent}" if agent else "")
        return [Feedback("complaint", r, None, reason[:1000], None, message_id)
                for r in dict.fromkeys(rcpts)]
    return None


def _arf_sender(msg: Message) -> list[str]:
    """The ARF ``Original-Mail-From`` (our bounce address, so the VERP token)."""
    for part in msg.walk():
        if part.get_content_type() == "message/feedback-report":
            payload = part.get_payload()
            if isinstance(payload, list) and payload and isinstance(payload[0], Message):
                fields = payload[0]
            else:
                raw = part.get_payload(decode=True)
                text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) \
                    else str(payload)
                fields = HeaderParser().parsestr(text.lstrip("\r\n"))
            sender = _address(fields.get("Original-Mail-From"))
            return [sender] if sender else []
    return []


def parse_report(raw: bytes) -> MailReport:
    """Read one mail from the bounce mailbox. Never raises for malformed mail: what cannot
    be read as a report is ``kind='other'`` with no events."""
    msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    original = _original_headers(msg)
    original_id = str(original.get("Message-ID")).strip() if original is not None \
        and original.get("Message-ID") else None
    report = MailReport("other", addresses=_delivered_to(msg),
                        original_message_id=original_id,
                        report_message_id=str(msg.get("Message-ID") or "").strip() or None)
    ctype = msg.get_content_type()
    report_type = str(msg.get_param("report-type", "") or "").lower()
    if (ctype == "multipart/report" and report_type == "feedback-report") or \
            any(p.get_content_type() == "message/feedback-report" for p in msg.walk()):
        events = _arf_events(msg, original, original_id)
        if events is not None:
            report.kind = "arf"
            report.events = events
            report.addresses = _arf_sender(msg) + report.addresses
            return report
    if any(p.get_content_type() == "message/delivery-status" for p in msg.walk()):
        report.kind = "dsn"
        report.events = _dsn_events(msg, original_id)
        return report
    events = _heuristic_events(msg, original_id)
    if events:
        report.kind = "bounce"
        report.events = events
    return report
