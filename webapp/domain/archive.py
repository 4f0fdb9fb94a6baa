"""The public web version of a sent campaign.

Opt-in per campaign (``campaign_tracking.archive``, off by default). Its address is signed
(:func:`workers.building.tracking.archive_url`), so it cannot be guessed from a campaign
id; the same address goes into the campaign's messages as ``{{ archive_url }}`` ("view in
browser"). It answers only once the campaign has been sent (or is sending) and while its
archive stays on.

No recipient's data is ever rendered: the web version is rendered for a neutral stand-in
(the name :data:`PLACEHOLDER_NAME`, the address :data:`PLACEHOLDER_EMAIL`, no attributes,
an unsubscribe link that only explains itself), inside the campaign's layout as its
messages are, and its links are the campaign's own, never tracking URLs.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import campaigns
from webapp.domain.errors import NotFound
from workers.building import tracking
from workers.building.compose import recipient_context
from workers.building.message import PREVIEW_SECONDS, TemplateError, compile_campaign
from workers.core.i18n import N_
from workers.core.states import Campaign

PLACEHOLDER_EMAIL = "subscriber@example.com"
# A subject such as "Team news for {{ name }}" reads as a sentence for the stand-in too.
PLACEHOLDER_NAME = "Subscriber"
LIST_LIMIT = 200
_TITLE = re.compile(r"<title[\s>]", re.I)
PUBLISHED = (Campaign.SENDING, Campaign.PAUSED, Campaign.SENT, Campaign.CANCELLED)


def is_on(conn: Connection, campaign_id: int) -> bool:
    return bool(conn.execute(sa.text(
        "SELECT archive FROM campaign_tracking WHERE campaign_id = :c"),
        {"c": campaign_id}).scalar())


def web_version(conn: Connection, *, base_url: str, secret_key: str,
                token: str) -> dict[str, Any]:
    """The campaign a genuine archive token names, rendered for the neutral stand-in:
    {campaign, subject, html, text}. NotFound for a forged token, an unknown campaign, one
    not sent yet, or one whose archive is off (all the same answer)."""
    campaign_id = tracking.read_archive_token(secret_key, token)
    missing = NotFound(N_("there is no web version here"))
    if campaign_id is None:
        raise missing
    try:
        campaign = campaigns.get(conn, campaign_id)
    except NotFound:
        raise missing from None
    if campaign["status"] not in PUBLISHED or not is_on(conn, campaign_id):
        raise missing
    try:
        rendered = compile_campaign(
            campaign["subject"], campaign["text_body"], campaign["html_body"],
            campaigns.layout_for(conn, campaign)).render(
            recipient_context(
                email=PLACEHOLDER_EMAIL, name=PLACEHOLDER_NAME, attributes={},
                unsubscribe_url=f"{base_url}/u/preview", campaign_name=campaign["name"],
                subject=campaign["subject"],
                archive_url=tracking.archive_url(base_url, secret_key, campaign_id)),
            seconds=PREVIEW_SECONDS)
    except TemplateError:
        raise missing from None
    html = rendered.html
    if html is not None and not _TITLE.search(html):
        # A browser tab and a bookmark name the page by its subject.
        html = f"<!doctype html><title>{escape(rendered.subject)}</title>\n{html}"
    return {"campaign": campaign, "subject": rendered.subject, "html": html,
            "text": rendered.text}


def urls_for_campaign(conn: Connection, campaign: dict[str, Any], *, base_url: str,
                      secret_key: str) -> dict[str, str] | None:
    """The web version's public address and its list's archive page while the campaign's
    archive is on, else None."""
    if not is_on(conn, campaign["id"]):
        return None
    return {"campaign": tracking.archive_url(base_url, secret_key, campaign["id"]),
            "list": tracking.list_archive_url(base_url, secret_key, campaign["list_id"])}


def _subject(subject: str) -> str:
    """A subject as the neutral stand-in would see it (a campaign's name is internal)."""
    try:
        return compile_campaign(subject, "x", None).render(recipient_context(
            email=PLACEHOLDER_EMAIL, name="", attributes={}, unsubscribe_url="",
            campaign_name="", subject=subject), seconds=PREVIEW_SECONDS).subject
    except TemplateError:
        return ""


def list_page(conn: Connection, *, base_url: str, secret_key: str,
              token: str) -> dict[str, Any]:
    """A list's published web versions, newest first (at most :data:`LIST_LIMIT`):
    {list_name, issues: [{subject, at, url}]}. NotFound for a forged token or an unknown
    list, or a list that has published none (the same answer)."""
    list_id = tracking.read_list_archive_token(secret_key, token)
    missing = NotFound(N_("there is no web version here"))
    if list_id is None:
        raise missing
    rows = conn.execute(sa.text("""
        SELECT c.id, c.subject, coalesce(c.started_at, c.created_at) AS at, l.name AS list_name
          FROM campaigns c
          JOIN campaign_tracking t ON t.campaign_id = c.id AND t.archive
          JOIN lists l ON l.id = c.list_id
         WHERE c.list_id = :l AND c.status = ANY(:published)
         ORDER BY at DESC, c.id DESC LIMIT :n"""),
        {"l": list_id, "published": list(PUBLISHED), "n": LIST_LIMIT}).mappings().all()
    if not rows:
        raise missing
    return {"list_name": rows[0]["list_name"],
            "issues": [{"subject": _subject(r["subject"]), "at": r["at"],
                        "url": tracking.archive_url(base_url, secret_key, r["id"])}
                       for r in rows]}
