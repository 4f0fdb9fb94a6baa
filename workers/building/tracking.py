"""Open and click tracking, and the web version's address.

Off unless a marketer turns it on for a campaign. When on, the engine rewrites a
campaign's links to signed tracking URLs and adds an open pixel; the web app reads the
URLs back when a recipient follows one (:mod:`webapp.domain.tracking`). Both sides share
only the secret key.

- Only links written out in full in the campaign's templates are tracked (no template
  code in them): each is stored once in ``campaign_links``, and a tracking URL names its
  row. The redirect goes to the stored URL, never to one taken from the request, so a
  tracking URL cannot be turned into an open redirect, and a link that differs per
  recipient (it could carry personal data) is left as it is.
- A tracking URL names campaign, job, subscriber and link in hex, with a truncated
  HMAC-SHA256 over all of them: changing any part breaks it.
- Test sends are never tracked.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa
from itsdangerous import BadSignature, URLSafeSerializer
from sqlalchemy.engine import Connection

_SALT = b"senddock-tracking-v1"
_MAC_BYTES = 12
_ARCHIVE_SALT = "senddock-archive-v1"

# A link in an href (either quote) or written in a text body.
_HREF = re.compile(r"""(\bhref\s*=\s*)(["'])(.*?)\2""", re.IGNORECASE | re.DOTALL)
_TEXT_URL = re.compile(r"""https?://[^\s<>"'()]+""")
_TRAILING = ".,;:!?"
_TEMPLATE_CODE = ("{{", "{%", "{#")
_BODY_END = re.compile(r"</body\s*>", re.IGNORECASE)


@dataclass(frozen=True)
class Settings:
    """A campaign's analytics and archive choices (all off by default)."""

    track_opens: bool = False
    track_clicks: bool = False
    archive: bool = False


@dataclass(frozen=True)
class Links:
    """A tracked campaign's links: as written in an href (HTML-escaped) and as written in
    text, each to its ``campaign_links`` id."""

    html: dict[str, int] = field(default_factory=dict)
    text: dict[str, int] = field(default_factory=dict)


# --- signing ------------------------------------------------------------------------------

def _mac(secret_key: str, what: str, parts: tuple[int, ...]) -> str:
    message = ":".join((what, *map(str, parts))).encode()
    digest = hmac.new(secret_key.encode() + _SALT, message, hashlib.sha256).digest()
    return base64.b32encode(digest[:_MAC_BYTES]).decode().rstrip("=").lower()


def _token(secret_key: str, what: str, parts: tuple[int, ...]) -> str:
    return ".".join([*(f"{p:x}" for p in parts), _mac(secret_key, what, parts)])


def _read(secret_key: str, what: str, token: str, count: int) -> tuple[int, ...] | None:
    if not token.isascii():  # hex and base32 only: anything else is not a token
        return None
    pieces = token.lower().split(".")
    if len(pieces) != count + 1 or not all(0 < len(p) <= 16 for p in pieces[:count]):
        return None
    try:
        parts = tuple(int(p, 16) for p in pieces[:count])
    except ValueError:
        return None
    if any(p >= 2**63 for p in parts):
        return None
    expected = _mac(secret_key, what, parts)
    return parts if hmac.compare_digest(expected, pieces[count]) else None


def click_token(secret_key: str, campaign_id: int, job_id: int, subscriber_id: int,
                link_id: int) -> str:
    return _token(secret_key, "click", (campaign_id, job_id, subscriber_id, link_id))


def read_click_token(secret_key: str, token: str) -> tuple[int, int, int, int] | None:
    """(campaign, job, subscriber, link) of a genuine click token; None otherwise."""
    parts = _read(secret_key, "click", token, 4)
    return None if parts is None else (parts[0], parts[1], parts[2], parts[3])


def open_token(secret_key: str, campaign_id: int, job_id: int, subscriber_id: int) -> str:
    return _token(secret_key, "open", (campaign_id, job_id, subscriber_id))


def read_open_token(secret_key: str, token: str) -> tuple[int, int, int] | None:
    """(campaign, job, subscriber) of a genuine open token; None otherwise."""
    parts = _read(secret_key, "open", token, 3)
    return None if parts is None else (parts[0], parts[1], parts[2])


def click_url(base_url: str, secret_key: str, campaign_id: int, job_id: int,
              subscriber_id: int, link_id: int) -> str:
    return f"{base_url}/r/{click_token(secret_key, campaign_id, job_id, subscriber_id, link_id)}"


def open_url(base_url: str, secret_key: str, campaign_id: int, job_id: int,
             subscriber_id: int) -> str:
    return f"{base_url}/o/{open_token(secret_key, campaign_id, job_id, subscriber_id)}.gif"


# A sequence's message: the same URLs (``/r/``, ``/o/``), signed for another purpose, so a
# campaign's token never reads as a sequence's or the other way round.

def sequence_click_url(base_url: str, secret_key: str, step_id: int, job_id: int,
                       subscriber_id: int, link_id: int) -> str:
    token = _token(secret_key, "seq-click", (step_id, job_id, subscriber_id, link_id))
    return f"{base_url}/r/{token}"


def read_sequence_click_token(secret_key: str, token: str) -> tuple[int, int, int, int] | None:
    """(step, job, subscriber, link) of a genuine sequence click token; None otherwise."""
    parts = _read(secret_key, "seq-click", token, 4)
    return None if parts is None else (parts[0], parts[1], parts[2], parts[3])


def sequence_open_url(base_url: str, secret_key: str, step_id: int, job_id: int,
                      subscriber_id: int) -> str:
    return f"{base_url}/o/{_token(secret_key, 'seq-open', (step_id, job_id, subscriber_id))}.gif"


def read_sequence_open_token(secret_key: str, token: str) -> tuple[int, int, int] | None:
    """(step, job, subscriber) of a genuine sequence open token; None otherwise."""
    parts = _read(secret_key, "seq-open", token, 3)
    return None if parts is None else (parts[0], parts[1], parts[2])


def archive_token(secret_key: str, campaign_id: int) -> str:
    return URLSafeSerializer(secret_key, salt=_ARCHIVE_SALT).dumps(campaign_id)


def read_archive_token(secret_key: str, token: str) -> int | None:
    try:
        value = URLSafeSerializer(secret_key, salt=_ARCHIVE_SALT).loads(token)
    except BadSignature:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_LIST_ARCHIVE_SALT = "senddock-list-archive-v1"


def list_archive_url(base_url: str, secret_key: str, list_id: int) -> str:
    """A list's page of published web versions (unguessable, like each web version)."""
    token = URLSafeSerializer(secret_key, salt=_LIST_ARCHIVE_SALT).dumps(list_id)
    return f"{base_url}/archive/list/{token}"


def read_list_archive_token(secret_key: str, token: str) -> int | None:
    try:
        value = URLSafeSerializer(secret_key, salt=_LIST_ARCHIVE_SALT).loads(token)
    except BadSignature:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def archive_url(base_url: str, secret_key: str, campaign_id: int) -> str:
    """The campaign's public web version (answers only while its archive is on)."""
    return f"{base_url}/archive/{archive_token(secret_key, campaign_id)}"


# --- the links of a campaign --------------------------------------------------------------

def _trim(url: str) -> str:
    return url.rstrip(_TRAILING)


def _trackable(url: str) -> bool:
    return (url.startswith(("http://", "https://")) and not any(
        code in url for code in _TEMPLATE_CODE) and len(url) <= 2000)


def static_links(html_body: str | None, text_body: str | None) -> Links:
    """The links written out in full in the templates (ids 0: not stored yet)."""
    found_html = {raw: 0 for _, _, raw in _HREF.findall(html_body or "")
                  if _trackable(html.unescape(raw.strip()))}
    found_text = {_trim(u): 0 for u in _TEXT_URL.findall(text_body or "")
                  if _trackable(_trim(u))}
    return Links(found_html, found_text)


def store_links(conn: Connection, campaign_id: int, found: Links, *,
                table: str = "campaign_links", owner: str = "campaign_id") -> Links:
    """Store the campaign's links (each URL once; again and again is the same) and return
    them with their ids. A sequence's email step stores its own the same way
    (``sequence_links``, ``step_id``)."""
    assert (table, owner) in (("campaign_links", "campaign_id"), ("sequence_links", "step_id"))
    urls = sorted({html.unescape(raw.strip()) for raw in found.html} | set(found.text))
    if not urls:
        return Links()
    conn.execute(sa.text(f"""
        INSERT INTO {table} ({owner}, url)
        SELECT :c, u FROM unnest(CAST(:urls AS text[])) AS u
        ON CONFLICT ({owner}, url) DO NOTHING"""), {"c": campaign_id, "urls": urls})
    ids = {str(r.url): int(r.id) for r in conn.execute(sa.text(
        f"SELECT url, id FROM {table} WHERE {owner} = :c AND url = ANY(:urls)"),
        {"c": campaign_id, "urls": urls})}
    return Links({raw: ids[html.unescape(raw.strip())] for raw in found.html},
                 {url: ids[url] for url in found.text})


# --- rewriting a rendered message ---------------------------------------------------------

def rewrite_html(body: str, links: Links, make_url: Callable[[int], str]) -> str:
    """``body`` with every tracked href pointing at its tracking URL."""

    def swap(match: re.Match[str]) -> str:
        link_id = links.html.get(match.group(3))
        if link_id is None:
            return match.group(0)
        return f"{match.group(1)}{match.group(2)}{html.escape(make_url(link_id))}{match.group(2)}"

    return _HREF.sub(swap, body)


def rewrite_text(body: str, links: Links, make_url: Callable[[int], str]) -> str:
    """``body`` with every tracked URL replaced by its tracking URL."""

    def swap(match: re.Match[str]) -> str:
        url = match.group(0)
        trimmed = _trim(url)
        link_id = links.text.get(trimmed)
        if link_id is None:
            return url
        return make_url(link_id) + url[len(trimmed):]

    return _TEXT_URL.sub(swap, body)


def add_pixel(body: str, pixel_url: str) -> str:
    """``body`` with a 1x1 image loading ``pixel_url`` at the end of its body."""
    img = (f'<img src="{html.escape(pixel_url)}" width="1" height="1" alt="" '
           'style="display:block;width:1px;height:1px;border:0">')
    ends = list(_BODY_END.finditer(body))
    if not ends:
        return body + img
    at = ends[-1].start()
    return body[:at] + img + body[at:]
