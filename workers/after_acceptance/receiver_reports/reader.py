"""Recognize the container (gzip, zip, email message) and the format (DMARC aggregate XML,
SMTP TLS JSON, DMARC failure report) of one file, within size limits.

Safety: XML is parsed by lxml with entity resolution, DTD loading and network access off
(``resolve_entities=False, load_dtd=False, no_network=True, huge_tree=False``) and a
document that declares entities is refused outright; gzip and zip are inflated in bounded
steps so that a small file that expands without end (a "zip bomb") stops at
``MAX_EXPANDED_BYTES`` with a reason instead of filling memory.
"""

from __future__ import annotations

import base64
import binascii
import email
import email.policy
import hashlib
import io
import re
import zipfile
import zlib
from email.message import Message
from email.utils import parseaddr

from workers.after_acceptance.receiver_reports.aggregate import parse_aggregate
from workers.after_acceptance.receiver_reports.failure import (
    parse_feedback_part,
    parse_plain_text_failure,
)
from workers.after_acceptance.receiver_reports.model import (
    AggregateReport,
    FailureReport,
    ReportError,
    TlsReport,
)
from workers.after_acceptance.receiver_reports.tls import parse_tls
from workers.core.i18n import N_, Text

Report = AggregateReport | FailureReport | TlsReport

MAX_INPUT_BYTES = 25 * 1024 * 1024
MAX_EXPANDED_BYTES = 64 * 1024 * 1024
MAX_ZIP_MEMBERS = 16
_CHUNK = 1024 * 1024

_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"


def read_report(data: bytes, filename: str | None = None) -> list[Report]:
    """Every report in ``data`` (one file); raises ReportError with the reason if none."""
    if len(data) > MAX_INPUT_BYTES:
        raise ReportError(N_("file is larger than %(n)s MiB", n=MAX_INPUT_BYTES // (1024 * 1024)))
    if not data.strip():
        raise ReportError(N_("empty file"))
    return _read_payload(data, depth=0)


def _read_payload(data: bytes, depth: int) -> list[Report]:
    if depth > 3:
        raise ReportError(N_("report nested too deeply (archive in archive in archive)"))
    if data.startswith(_GZIP_MAGIC):
        return _read_payload(_gunzip(data), depth + 1)
    if data.startswith(_ZIP_MAGIC):
        return _read_payload(_unzip(data), depth + 1)
    head = data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if head == b"<":
        return [parse_aggregate(data)]
    if head == b"{":
        return [parse_tls(data)]
    if _looks_like_email(data):
        return _read_email(data, depth)
    if not data.strip():
        raise ReportError(N_("empty file"))
    raise ReportError(N_(
        "not a recognized report format (not a DMARC aggregate XML report, an SMTP TLS "
        "JSON report, or an email message carrying one)"))


def _gunzip(data: bytes) -> bytes:
    out = io.BytesIO()
    rest = data
    while rest.startswith(_GZIP_MAGIC):
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pending = rest
        try:
            while True:
                chunk = inflater.decompress(pending, _CHUNK)
                out.write(chunk)
                if out.tell() > MAX_EXPANDED_BYTES:
                    raise ReportError(N_("gzip expands beyond %(n)s MiB; refused",
                                         n=MAX_EXPANDED_BYTES // (1024 * 1024)))
                pending = inflater.unconsumed_tail
                if inflater.eof or not (pending or chunk):
                    break
        except zlib.error as exc:
            if out.tell():
                break  # trailing garbage after a complete member
            raise ReportError(N_("damaged gzip file (%(error)s)", error=str(exc))) from None
        rest = inflater.unused_data.lstrip(b"\x00")
    result = out.getvalue()
    if not result:
        raise ReportError(N_("gzip file holds nothing"))
    return result


def _unzip(data: bytes) -> bytes:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError) as exc:
        raise ReportError(N_("damaged zip file (%(error)s)", error=str(exc))) from None
    members = [m for m in archive.infolist() if not m.is_dir()]
    if not members:
        raise ReportError(N_("zip file holds no file"))
    if len(members) > MAX_ZIP_MEMBERS:
        raise ReportError(N_("zip file holds %(n)s files; at most %(most)s", n=len(members),
                                 most=MAX_ZIP_MEMBERS))
    preferred = [m for m in members if m.filename.lower().endswith((".xml", ".json"))]
    member = (preferred or members)[0]
    out = io.BytesIO()
    try:
        with archive.open(member) as stream:
            while chunk := stream.read(_CHUNK):
                out.write(chunk)
                if out.tell() > MAX_EXPANDED_BYTES:
                    raise ReportError(N_("zip expands beyond %(n)s MiB; refused",
                                         n=MAX_EXPANDED_BYTES // (1024 * 1024)))
    except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, EOFError) as exc:
        raise ReportError(N_("damaged zip file (%(error)s)", error=str(exc))) from None
    return out.getvalue()


_HEADER_LINE = re.compile(rb"^[!-9;-~]+:[ \t]", re.M)


def _looks_like_email(data: bytes) -> bool:
    head = data[:8192]
    if head.startswith(b"From "):
        return True
    return len(_HEADER_LINE.findall(head)) >= 2


_REPORT_TYPES = (
    "application/zip", "application/x-zip", "application/x-zip-compressed",
    "application/gzip", "application/x-gzip", "application/xml", "text/xml",
    "application/json", "application/tlsrpt+json", "application/tlsrpt+gzip",
    "application/octet-stream",
)
_REPORT_NAME = re.compile(r"\.(xml|json|zip|gz|gzip)$", re.I)


def _read_email(data: bytes, depth: int) -> list[Report]:
    msg = email.message_from_bytes(data.replace(b"\r\n", b"\n"), policy=email.policy.compat32)
    reports: list[Report] = []
    problems: list[str] = []
    for part in msg.walk():
        ctype = part.get_content_type().lower()
        if ctype == "message/feedback-report":
            reports.append(parse_feedback_part(_part_text(part), msg, _source_of(msg)))
            continue
        if part.is_multipart():
            continue
        name = part.get_filename() or ""
        if ctype in _REPORT_TYPES or (name and _REPORT_NAME.search(name)):
            payload = part.get_payload(decode=True)
            if not isinstance(payload, bytes) or not payload.strip():
                continue
            try:
                reports.extend(_read_payload(payload, depth + 1))
            except ReportError as exc:
                problems.append(N_("%(part)s: %(reason)s", part=name or ctype, reason=exc.reason))
    if reports:
        return reports
    if problems:
        raise ReportError(Text.joined("; ", problems))
    failure = parse_plain_text_failure(msg, _source_of(msg))
    if failure is not None:
        return [failure]
    # A report pasted into the body (some receivers send the XML inline).
    for part in msg.walk():
        if part.get_content_maintype() == "text":
            body = part.get_payload(decode=True)
            if isinstance(body, bytes) and body.lstrip()[:5] in (b"<?xml", b"<feed"):
                return [parse_aggregate(body)]
    raise ReportError(N_("email message carries no DMARC or SMTP TLS report"))


def _part_text(part: Message) -> str:
    payload = part.get_payload(decode=True)
    if isinstance(payload, bytes) and payload.strip():
        return payload.decode("utf-8", "replace")
    inner = part.get_payload()
    if isinstance(inner, list):  # parsed as message/* with header-only sub-messages
        text = "\n".join(m.as_string() if isinstance(m, Message) else str(m) for m in inner)
    else:
        text = str(inner or "")
    if str(part.get("Content-Transfer-Encoding", "")).strip().lower() == "base64":
        try:
            raw = base64.b64decode("".join(text.split()), validate=False)
            return raw.decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            return text
    return text


def _source_of(msg: Message) -> tuple[str, str]:
    """(report id, reporting org) of a report message."""
    message_id = (msg.get("Message-ID") or "").strip()
    if not message_id:
        message_id = hashlib.sha256(msg.as_bytes()).hexdigest()[:32]
    sender = parseaddr(str(msg.get("From") or ""))[1]
    return message_id, sender.rpartition("@")[2].lower() or "unknown"

