"""DMARC failure (forensic) reports: RFC 6591 ARF parts, and plain-text reports."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email.message import Message
from email.utils import parsedate_to_datetime

from workers.after_acceptance.receiver_reports.model import FailureReport, ReportError
from workers.core.i18n import N_

_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):[ \t]*(.*)$")


def _fields(text: str) -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    last: str | None = None
    for line in text.replace("\r\n", "\n").split("\n"):
        if line[:1] in (" ", "\t") and last:
            fields[last][-1] += " " + line.strip()
            continue
        match = _FIELD.match(line)
        if match:
            last = match.group(1).lower()
            fields.setdefault(last, []).append(match.group(2).strip())
        else:
            last = None
    return fields


def _date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed


def _first(fields: dict[str, list[str]], name: str) -> str | None:
    values = fields.get(name)
    return values[0] if values and values[0] else None


def parse_feedback_part(text: str, msg: Message, source: tuple[str, str]) -> FailureReport:
    fields = _fields(text)
    feedback_type = (_first(fields, "feedback-type") or "").lower()
    if not feedback_type:
        raise ReportError(N_("feedback report has no Feedback-Type"))
    arrival = _date(_first(fields, "arrival-date") or _first(fields, "received-date")) \
        or _date(str(msg.get("Date") or ""))
    return FailureReport(
        feedback_type=feedback_type,
        reported_domain=(_first(fields, "reported-domain") or "").lower() or None,
        source_ip=_first(fields, "source-ip"),
        arrival=arrival,
        original_mail_from=_first(fields, "original-mail-from"),
        original_rcpt_to=_first(fields, "original-rcpt-to"),
        auth_failure=[v.lower() for v in fields.get("auth-failure", [])],
        delivery_result=(_first(fields, "delivery-result") or "").lower() or None,
        report_id=source[0], org_name=source[1],
    )


_PLAIN = {
    "reported_domain": re.compile(r"^\s*Sender Domain:\s*(\S+)", re.M | re.I),
    "source_ip": re.compile(r"^\s*Sender IP Address:\s*(\S+)", re.M | re.I),
    "arrival": re.compile(r"^\s*Received date:\s*(.+)$", re.M | re.I),
}


def parse_plain_text_failure(msg: Message, source: tuple[str, str]) -> FailureReport | None:
    """Failure reports sent as text without an ARF part (Exim's DMARC module does this)."""
    subject = str(msg.get("Subject") or "")
    if not re.search(r"DMARC (Forensic|Failure)", subject, re.I):
        return None
    for part in msg.walk():
        if part.get_content_type() != "text/plain":
            continue
        payload = part.get_payload(decode=True)
        text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
        found = {k: m.group(1).strip() for k, rx in _PLAIN.items() if (m := rx.search(text))}
        if "reported_domain" in found and "source_ip" in found:
            return FailureReport(
                feedback_type="auth-failure",
                reported_domain=found["reported_domain"].lower(),
                source_ip=found["source_ip"],
                arrival=_date(found.get("arrival")) or _date(str(msg.get("Date") or "")),
                original_mail_from=None, original_rcpt_to=None, auth_failure=["dmarc"],
                delivery_result="other", report_id=source[0], org_name=source[1],
            )
    return None
