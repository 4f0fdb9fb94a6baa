"""Reading a bounce as text, whatever it is made of.

Bounces are written by every kind of software, and some are broken: unknown charsets
(``ANSI_X3.110-1983``, ``unknown-8bit``), MIME boundaries that do not match, base64 that
does not decode, binary, parts of many megabytes. Nothing here raises for such input: a
charset Python does not know is read as UTF-8 (else Latin-1), a part that does not decode is
read as it stands, and only the first :data:`MAX_BYTES` of a message and :data:`PART_CHARS`
of a part are read (a bounce says what it has to say at its top).
"""

from __future__ import annotations

import codecs
import email
import email.policy
import html
import re
from dataclasses import dataclass, field
from email.header import decode_header
from email.message import Message

MAX_BYTES = 2 * 1024 * 1024   # of one message
PART_CHARS = 200_000          # of one part's text
MAX_PARTS = 200

_ISO2022 = re.compile(rb"\x1b[$(][@BJ]")
_TAG = re.compile(r"<(script|style)\b.*?</\1\s*>|<[^>]*>", re.IGNORECASE | re.DOTALL)
_BREAK_TAG = re.compile(r"<\s*(br|/p|/div|/tr|/li|/h\d)\b[^>]*>", re.IGNORECASE)

# Where a message's own text ends and the returned original begins (non-MIME bounces).
ORIGINAL_MARKERS = re.compile(
    r"^\s*(?:-{2,}\s*)?(?:"
    r"(?:this is a copy of|below this line is a copy of|a copy of the original message)"
    r"|original message (?:follows|headers? follows?)"
    r"|(?:the )?(?:returned|unsent|undelivered|original) message(?: headers)?(?: follows)?\s*-*\s*$"
    r"|(?:message|original) headers follow"
    r"|text of (?:your|the) message follows"
    r"|start of returned message"
    r"|the header of the original message is following"
    r"|\*\*\* ?original message"
    r")",
    re.IGNORECASE | re.MULTILINE)


def charset_name(name: str | None) -> str:
    """A codec Python knows for ``name`` (utf-8 when it knows none)."""
    if not name:
        return "utf-8"
    name = name.strip().strip('"').lower()
    aliases = {"unknown-8bit": "utf-8", "x-unknown": "utf-8", "ansi_x3.110-1983": "latin-1",
               "ks_c_5601-1987": "cp949", "x-sjis": "shift_jis", "shift-jis": "shift_jis",
               "sjis": "shift_jis", "iso-2022-jp-ms": "iso2022_jp_ext", "cp932": "cp932",
               "windows-31j": "cp932", "utf8": "utf-8", "x-user-defined": "latin-1"}
    name = aliases.get(name, name)
    try:
        return codecs.lookup(name).name
    except (LookupError, ValueError):
        return "utf-8"


def decode_bytes(data: bytes, charset: str | None = None) -> str:
    """Text of ``data`` in ``charset``; bytes that are not valid become U+FFFD. ISO-2022-JP
    (Japanese carriers) is recognised by its escape sequences when no charset says so."""
    if not data:
        return ""
    codec = charset_name(charset)
    if codec in ("ascii", "utf-8") and _ISO2022.search(data):
        codec = "iso2022_jp"
    try:
        return data.decode(codec, "replace")
    except Exception:  # a codec that fails on its own input (some CJK codecs)
        return data.decode("utf-8", "replace")


def header_text(value: object) -> str:
    """A header's value with its RFC 2047 encoded words decoded (unknown charsets too)."""
    if value is None:
        return ""
    raw = str(value)
    if "=?" not in raw:
        return " ".join(raw.split())
    try:
        pieces = decode_header(raw)
    except Exception:
        return " ".join(raw.split())
    out = []
    for chunk, charset in pieces:
        out.append(decode_bytes(chunk, charset) if isinstance(chunk, bytes) else chunk)
    return " ".join("".join(out).split())


def html_text(markup: str) -> str:
    return html.unescape(_TAG.sub("", _BREAK_TAG.sub("\n", markup)))


def payload_of(part: Message, decode: bool = False) -> object:
    """``part.get_payload(decode)``, or None where the email package raises on it (a
    charset parameter with a NUL in it, for one)."""
    try:
        return part.get_payload(decode=True) if decode else part.get_payload()
    except Exception:
        return None


def part_text(part: Message) -> str:
    """A leaf part's decoded text (transfer encoding and charset), never raising."""
    payload = payload_of(part, decode=True)
    if payload is None:
        raw = payload_of(part)
        if isinstance(raw, str):
            payload = raw.encode("utf-8", "surrogateescape")
        elif isinstance(raw, list):
            return "\n\n".join(_as_text(p) for p in raw if isinstance(p, Message))
        else:
            return ""
    if not isinstance(payload, bytes):
        return ""
    try:
        charset = part.get_content_charset()
    except Exception:
        charset = None
    text = decode_bytes(payload[:PART_CHARS * 2], charset)[:PART_CHARS]
    if _subtype(part) == "html":
        text = html_text(text)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _subtype(part: Message) -> str:
    try:
        return part.get_content_subtype()
    except Exception:
        return ""


def _as_text(msg: Message) -> str:
    """Headers (and body) of a message kept as parsed sub-blocks (``message/*`` parts)."""
    try:
        lines = [f"{k}: {header_text(v)}" for k, v in msg.items()]
    except Exception:
        lines = []
    body = payload_of(msg)
    if isinstance(body, str) and body.strip():
        lines.append("")
        lines.append(body)
    return "\n".join(lines)


@dataclass
class Letter:
    """One bounce, read: its headers, its own explanation (``text``: the text parts that
    are not the returned original), the machine-readable parts and the original's headers."""

    msg: Message
    headers: dict[str, str]
    text: str = ""
    status_parts: list[str] = field(default_factory=list)      # message/delivery-status
    feedback_parts: list[str] = field(default_factory=list)    # message/feedback-report
    original: Message | None = None                            # the returned message's headers
    original_text: str = ""                                    # ... as text, with its body
    json_text: str = ""

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


def _headers_of(msg: Message) -> dict[str, str]:
    found: dict[str, str] = {}
    try:
        items = msg.items()
    except Exception:
        return found
    for key, value in items:
        found.setdefault(str(key).lower(), header_text(value))
    return found


def _original_of(part: Message) -> Message | None:
    inner = payload_of(part)
    if isinstance(inner, list) and inner and isinstance(inner[0], Message):
        return inner[0]
    text = part_text(part)
    if text:
        return email.message_from_string(text.lstrip("\n"), policy=email.policy.compat32)
    return None


_BOUNDARY_LINE = re.compile(rb"^--([^\s-][^\r\n]{0,200}?)(?:--)?\r?$", re.MULTILINE)


def _repaired(msg: Message, raw: bytes) -> Message:
    """A multipart message whose declared boundary is not in its body (broken by a relay, or
    by anonymising) parsed again with the boundary its body does use."""
    try:
        if not msg.get_content_maintype() == "multipart" or msg.is_multipart():
            return msg
        _head, sep, body = raw.partition(b"\n\n")
        if not sep:
            _head, sep, body = raw.partition(b"\r\n\r\n")
        seen: dict[bytes, int] = {}
        for found in _BOUNDARY_LINE.finditer(body):
            seen[found[1]] = seen.get(found[1], 0) + 1
        used = max(seen.items(), key=lambda kv: kv[1], default=(b"", 0))
        if used[1] < 2:
            return msg
        fixed = copy_with_boundary(msg, used[0].decode("ascii", "replace"))
        return email.message_from_bytes(fixed + b"\n\n" + body, policy=email.policy.compat32)
    except Exception:
        return msg


def copy_with_boundary(msg: Message, boundary: str) -> bytes:
    lines = []
    for key, value in msg.items():
        if key.lower() == "content-type":
            value = f'{msg.get_content_type()}; boundary="{boundary}"'
        lines.append(f"{key}: {value}")
    return "\n".join(lines).encode("utf-8", "replace")


def read_letter(raw: bytes) -> Letter:
    """Parse ``raw`` leniently into a :class:`Letter` (never raises on content)."""
    raw = raw[:MAX_BYTES]
    msg = _repaired(email.message_from_bytes(raw, policy=email.policy.compat32), raw)
    letter = Letter(msg, _headers_of(msg))
    texts: list[str] = []
    html_texts: list[str] = []
    _walk(msg, letter, texts, html_texts, depth=0, count=[0])
    text = "\n".join(t for t in texts if t.strip()) or "\n".join(html_texts)
    letter.text = text
    return letter


def _walk(part: Message, letter: Letter, texts: list[str], html_texts: list[str], *,
          depth: int, count: list[int]) -> None:
    count[0] += 1
    if count[0] > MAX_PARTS or depth > 8:
        return
    try:
        ctype = part.get_content_type()
    except Exception:
        ctype = "text/plain"
    if ctype in ("message/delivery-status", "message/global-delivery-status"):
        letter.status_parts.append(part_text(part))
        return
    if ctype == "message/feedback-report":
        letter.feedback_parts.append(part_text(part))
        return
    if ctype in ("message/rfc822", "message/global", "text/rfc822-headers",
                 "message/rfc822-headers", "message/partial"):
        if letter.original is None:
            letter.original = _original_of(part)
            letter.original_text = part_text(part) if ctype != "message/rfc822" or \
                letter.original is None else _as_text(letter.original) + "\n" + \
                _body_text(letter.original)
        return
    if part.is_multipart():
        payload = payload_of(part)
        if isinstance(payload, list):
            for sub in payload:
                if isinstance(sub, Message):
                    _walk(sub, letter, texts, html_texts, depth=depth + 1, count=count)
        return
    if ctype.startswith("multipart/"):
        # A multipart without its boundary (or with a broken header): read it as text.
        texts.append(part_text(part))
        return
    if ctype == "application/json" or (ctype == "text/plain" and depth == 0
                                       and part_text(part).lstrip().startswith("{")):
        letter.json_text = part_text(part)
        if ctype == "application/json":
            return
    if ctype == "text/html":
        html_texts.append(part_text(part))
    elif ctype.startswith("text/") or (ctype == "application/octet-stream" and depth == 0):
        texts.append(part_text(part))


def _body_text(msg: Message) -> str:
    try:
        if msg.is_multipart():
            return ""
        return part_text(msg)[:20_000]
    except Exception:
        return ""


def own_text(text: str) -> tuple[str, str]:
    """Split a non-MIME bounce's text into its own explanation and the returned original."""
    found = ORIGINAL_MARKERS.search(text)
    if not found or found.start() == 0:
        return text, ""
    return text[:found.start()], text[found.start():]
