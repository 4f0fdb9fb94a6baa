"""Messages submitted by SMTP (docs/smtp.md): the client's bytes as they came, less our own
headers.

A submitted job's payload names its stored message (``data.smtp_message_id``) with a
signature made with ``SENDDOCK_SECRET_KEY`` (``data.smtp_signature``): an API client
cannot point a job of its own at someone else's message by writing those fields in
``data``. The header block loses every ``X-SendDock-*`` field (the client's instructions
to us) and ``Bcc`` (RFC 6409 8.1: it must not reach the recipients); ``Message-ID`` and
``Date`` are added when missing (RFC 6409 8.2, 8.3) and the job's correlation id is
added as for every message. The body, and every other header line, is delivered byte
for byte (8BITMIME and SMTPUTF8 content included); DKIM signs the result like any other
message (:meth:`workers.building.compose.Composer.build`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from email.utils import format_datetime, parseaddr
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

STRIPPED_PREFIX = b"x-senddock-"
_NAME = re.compile(rb"^([!-9;-~]+)[ \t]*:")


def signature(secret_key: str, message_id: int) -> str:
    """The signature a submitted job's payload carries for its stored message."""
    return hmac.new(secret_key.encode(), f"smtp-message:{message_id}".encode(),
                    hashlib.sha256).hexdigest()[:32]


def stored_id(payload: dict[str, Any]) -> int | None:
    """The stored message a job's payload names, or None (not a submitted message)."""
    data = payload.get("data")
    if not isinstance(data, dict) or "smtp_message_id" not in data:
        return None
    value = data["smtp_message_id"]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def source(payload: Any) -> dict[str, Any] | None:
    """Where a submitted job came from (token name, client address, Message-ID and the
    stored message's id), or None for a job that did not come by SMTP."""
    if not isinstance(payload, dict):
        return None
    data = payload.get("data")
    found = data.get("source") if isinstance(data, dict) else None
    if not isinstance(found, dict) or found.get("via") != "smtp":
        return None
    return {"token": str(found.get("token", "")), "client": str(found.get("client", "")),
            "message_id": str(found.get("message_id", "")), "stored_id": stored_id(payload)}


def split(raw: bytes) -> tuple[bytes, bytes]:
    """(header block without its blank line, rest): the rest starts with the blank line
    (CRLF or LF, as the client wrote it), so ``head + rest`` is ``raw``."""
    ends = [(at, 2) for at in (raw.find(b"\r\n\r\n"),) if at >= 0]
    ends += [(at, 1) for at in (raw.find(b"\n\n"),) if at >= 0]
    if not ends:
        return raw, b""
    at, width = min(ends)
    return raw[:at + width], raw[at + width:]


def head_of(raw: bytes) -> bytes:
    """The header block alone (no copy of the body: a 20 MB message is not copied to read
    its headers)."""
    crlf, lf = raw.find(b"\r\n\r\n"), raw.find(b"\n\n")
    ends = [at + width for at, width in ((crlf, 2), (lf, 1)) if at >= 0]
    return raw[:min(ends)] if ends else raw


def _fields(head: bytes) -> list[bytes]:
    """The header block as whole fields (each with its continuation lines and line ends)."""
    fields: list[bytes] = []
    for line in head.splitlines(keepends=True):
        if line[:1] in (b" ", b"\t") and fields:
            fields[-1] += line
        else:
            fields.append(line)
    return fields


def field_name(field: bytes) -> bytes:
    match = _NAME.match(field)
    return match.group(1).lower() if match else b""


def strip_headers(raw: bytes) -> bytes:
    """``raw`` without its ``X-SendDock-*`` and ``Bcc`` fields; every other byte kept."""
    head, rest = split(raw)
    kept = [f for f in _fields(head)
            if not (field_name(f).startswith(STRIPPED_PREFIX) or field_name(f) == b"bcc")]
    return b"".join(kept) + rest


def header_values(raw: bytes, name: str) -> list[str]:
    """The unfolded values of header ``name`` (case-insensitive), decoded as UTF-8 with
    replacement (SMTPUTF8 headers are UTF-8)."""
    head = head_of(raw)
    wanted = name.lower().encode()
    values = []
    for f in _fields(head):
        if field_name(f) == wanted:
            value = f.split(b":", 1)[1]
            values.append(re.sub(rb"\r?\n(?=[ \t])", b"", value).strip().decode(
                "utf-8", "replace"))
    return values


def newline_of(raw: bytes) -> bytes:
    end = raw.find(b"\n")
    return b"\r\n" if end > 0 and raw[end - 1:end] == b"\r" else b"\n"


def prepared(raw: bytes, *, correlation_id: str, message_id: str, now: Any) -> bytes:
    """The bytes handed to the relay for one recipient of a submitted message."""
    stripped = strip_headers(raw)
    nl = newline_of(stripped)
    added = [b"X-SendDock-Correlation-ID: " + correlation_id.encode() + nl]
    if not header_values(stripped, "Message-ID"):
        added.append(b"Message-ID: " + message_id.encode() + nl)
    if not header_values(stripped, "Date"):
        added.append(b"Date: " + format_datetime(now).encode() + nl)
    return b"".join(added) + stripped


class Missing(Exception):
    """The stored message is gone or the payload's signature does not match."""


def load(engine: Engine, secret_key: str, payload: dict[str, Any]) -> tuple[str, bytes]:
    """(envelope sender the client gave, raw bytes) of a job's stored message."""
    message_id = stored_id(payload)
    data = payload.get("data") or {}
    if message_id is None or not hmac.compare_digest(
            str(data.get("smtp_signature", "")), signature(secret_key, message_id)):
        raise Missing("the job names a submitted message it was not created with")
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT mail_from, raw FROM smtp_messages WHERE id = :id"),
                           {"id": message_id}).first()
    if row is None:
        raise Missing(f"submitted message {message_id} is no longer stored")
    return row.mail_from, bytes(row.raw)


def from_address(raw: bytes) -> str:
    values = header_values(raw, "From")
    return parseaddr(values[0])[1] if values else ""
