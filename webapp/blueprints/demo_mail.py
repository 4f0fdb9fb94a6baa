"""The demo's mail viewer (``senddock demo`` only, admins): what the demo's SMTP sink
received, each message shown as its recipient would see it, links clickable.

The sink keeps the newest messages whole in a folder (``webapp.sink.MailKeeper``); this
blueprint only reads that folder. It is registered only when the app runs as the demo.
Message content is untrusted: headers and text are escaped by the templates, and the HTML
part is served on its own URL under a CSP sandbox (unique origin, no scripts) that only
lets links open in a new tab.
"""

from __future__ import annotations

import re
from datetime import datetime
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import Path
from typing import Any

from flask import Blueprint, abort, render_template, request
from markupsafe import Markup, escape
from werkzeug.wrappers import Response

from webapp.blueprints.campaigns import PREVIEW_CSP
from webapp.context import config
from webapp.sink import KEEP_LAST, kept_envelope, kept_ids, kept_raw

bp = Blueprint("demo_mail", __name__, url_prefix="/demo/mail")

# The campaign preview's sandbox, plus popups that escape it: a link in the message opens
# the real URL (tracked click, confirmation, unsubscribe) in a new, ordinary tab.
MAIL_CSP = PREVIEW_CSP.replace("sandbox;", "sandbox allow-popups allow-popups-to-escape-sandbox;",
                               1)
_HEAD = re.compile(r"<head(\s[^>]*)?>", re.IGNORECASE)
_URL = re.compile(r"https?://[^\s<>\"']+", re.IGNORECASE)
_URL_TAIL = ".,;:!?)]}»\u201d\u2019"
PAGE_SIZE = 200
RAW_SHOWN = 512 * 1024
SUMMARY_HEADERS = ("From", "To", "Cc", "Reply-To", "Subject", "Date", "List-Unsubscribe",
                   "Message-ID")


def _folder() -> Path:
    return Path(config().extra["demo_mail_dir"])


def _when(meta: dict[str, Any]) -> datetime | None:
    try:
        return datetime.fromisoformat(str(meta.get("time")))
    except ValueError:
        return None


def _matches(meta: dict[str, Any], query: str) -> bool:
    addresses = [str(meta.get("mail_from") or ""), *map(str, meta.get("rcpt_tos") or [])]
    return any(query in address.lower() for address in addresses)


@bp.get("/")
def index() -> str:
    shown_query = request.args.get("q", "").strip()[:200]
    query = shown_query.lower()
    folder = _folder()
    rows: list[dict[str, Any]] = []
    more = False
    for message_id in reversed(kept_ids(folder)):
        meta = kept_envelope(folder, message_id)
        if meta is None or (query and not _matches(meta, query)):
            continue
        if len(rows) == PAGE_SIZE:
            more = True
            break
        rows.append({**meta, "id": message_id, "when": _when(meta)})
    return render_template("demo_mail/index.html", rows=rows, q=shown_query, more=more,
                           page_size=PAGE_SIZE,
                           keep=int(config().extra.get("demo_mail_keep", KEEP_LAST)))


def _message(message_id: int) -> tuple[dict[str, Any], bytes, EmailMessage]:
    folder = _folder()
    meta = kept_envelope(folder, message_id)
    raw = kept_raw(folder, message_id)
    if meta is None or raw is None:
        abort(404)
    parsed = BytesParser(policy=policy.default).parsebytes(raw)
    assert isinstance(parsed, EmailMessage)
    return meta, raw, parsed


def _part_text(message: EmailMessage, subtype: str) -> str | None:
    """The decoded body part of ``subtype`` (html or plain), or None if there is none."""
    try:
        part = message.get_body(preferencelist=(subtype,))
    except (KeyError, ValueError):
        return None
    if part is None:
        return None
    try:
        return str(part.get_content())
    except (LookupError, ValueError, AssertionError):
        payload = part.get_payload(decode=True)
        return payload.decode("utf-8", "replace") if isinstance(payload, bytes) else None


def linkify(text: str) -> Markup:
    """``text`` escaped, its http(s) URLs made links that open in a new tab (as a mail
    program shows a plain-text message)."""
    out: list[str] = []
    at = 0
    for found in _URL.finditer(text):
        url = found[0].rstrip(_URL_TAIL)
        out.append(str(escape(text[at:found.start()])))
        out.append(f'<a href="{escape(url)}" target="_blank" rel="noopener noreferrer">'
                   f"{escape(url)}</a>")
        at = found.start() + len(url)
    out.append(str(escape(text[at:])))
    return Markup("".join(out))  # every piece is escaped above


def _headers(message: EmailMessage) -> list[tuple[str, str]]:
    shown: list[tuple[str, str]] = []
    for name in SUMMARY_HEADERS:
        try:
            values = message.get_all(name) or []
        except (ValueError, IndexError):  # a malformed header is shown raw below
            continue
        shown.extend((name, str(value)) for value in values)
    return shown


@bp.get("/<int:message_id>")
def show(message_id: int) -> str:
    meta, raw, message = _message(message_id)
    source = raw[:RAW_SHOWN].decode("utf-8", "replace")
    return render_template(
        "demo_mail/show.html", m={**meta, "id": message_id, "when": _when(meta)},
        headers=_headers(message), has_html=_part_text(message, "html") is not None,
        text=_part_text(message, "plain"), source=source, size=len(raw),
        cut=len(raw) > RAW_SHOWN, shown=RAW_SHOWN, linkify=linkify)


@bp.get("/<int:message_id>/body.html")
def body_html(message_id: int) -> Response:
    _meta, _raw, message = _message(message_id)
    html = _part_text(message, "html")
    if html is None:
        abort(404)
    # Links open in a new tab (the sandbox allows popups, not navigating the app's page);
    # the <base> goes inside <head> when there is one, so a doctype keeps its place.
    head = _HEAD.search(html)
    at = head.end() if head else 0
    response = Response(html[:at] + '<base target="_blank">' + html[at:], mimetype="text/html")
    response.headers["Content-Security-Policy"] = MAIL_CSP
    response.headers["X-Frame-Options"] = "SAMEORIGIN"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response
