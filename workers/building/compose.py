"""Turning a claimed job into the bytes handed to the relay.

A campaign's templates are compiled once per process and version (its ``updated_at``,
which the claim returns with each job) and reused for every recipient; only the
per-recipient render and the MIME assembly run per message. An edited draft is compiled
again, so a test send after an edit shows the edit.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parseaddr
from importlib import resources
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from workers.building import submitted, tracking
from workers.building.dkim import KeyRing, from_domain
from workers.building.html_text import html_to_text
from workers.building.kinds import SEQUENCE, KindCatalog, UnknownKind, message_context
from workers.building.links import bounce_address, unsubscribe_url
from workers.building.message import (
    CampaignTemplate,
    Layout,
    TemplateError,
    build_mime,
    compile_campaign,
    list_id,
)
from workers.core.addresses import domain_of
from workers.core.jobs import ClaimedJob
from workers.core.settings import Config

# The built-in verification message as shipped (migration 0014 seeded the `verification`
# kind with it; a test keeps the two equal). Transactional mail renders from `kinds`.
MAIL_TEMPLATES = resources.files("workers.building") / "mail_templates"


@dataclass(frozen=True)
class PreparedCampaign:
    name: str
    from_addr: str
    subject: str
    template: CampaignTemplate
    list_id: int = 0
    list_name: str = ""
    # Analytics and the web version: off unless turned on for the campaign.
    analytics: tracking.Settings = field(default_factory=tracking.Settings)
    links: tracking.Links = field(default_factory=tracking.Links)


@dataclass(frozen=True)
class Envelope:
    """The envelope sender and the bytes for one job. ``campaign_sender``: the envelope
    sender is the campaign's own From (no bounce address), so a relay refusing it refuses
    that campaign, not every message (docs/design.md §16)."""

    mail_from: str
    message: bytes
    campaign_sender: bool = False


@functools.lru_cache(maxsize=256)
def address_of(field: str) -> str:
    """The bare address of a From field (cached: a campaign's messages share one)."""
    return parseaddr(field)[1]


def message_id_domain(address: str) -> str:
    """The domain Message-IDs are made on: the From address's, or ``senddock.local`` when
    it has none."""
    return domain_of(address_of(address)) or "senddock.local"


def layout_of(html: str | None, postal_address: str | None) -> Layout | None:
    """The campaign's layout from its row (None: the body is the whole HTML). A layout
    changes only while no campaign using it is being sent (webapp.domain.layouts), and
    its change bumps the drafts' version, so the cache above stays right."""
    return Layout(html, postal_address or "") if html is not None else None


def recipient_context(*, email: str, name: str, attributes: dict[str, Any],
                      unsubscribe_url: str, campaign_name: str,
                      subject: str, archive_url: str = "") -> dict[str, Any]:
    """The variables a campaign template sees for one recipient (the preview uses the same,
    so what the marketer previews is what is sent)."""
    return {
        "subscriber": {"email": email, "name": name, "attributes": attributes},
        "email": email, "name": name, "attributes": attributes,
        "unsubscribe_url": unsubscribe_url,
        # The web version ("view in browser"): empty unless the campaign's archive is on.
        "archive_url": archive_url,
        "campaign": {"name": campaign_name, "subject": subject},
    }


class Composer:
    """Builds messages for any job kind; safe to share between worker threads."""

    def __init__(self, engine: Engine, config: Config) -> None:
        self.engine = engine
        self.config = config
        self._campaigns: dict[int, tuple[str | None, PreparedCampaign]] = {}
        self._steps: dict[int, tuple[str, PreparedCampaign]] = {}
        self._lock = threading.Lock()
        self.kinds = KindCatalog(engine)
        self.keys = KeyRing(engine, config.secret_key)

    def campaign(self, campaign_id: int, version: str | None = None) -> PreparedCampaign:
        """The compiled campaign at ``version`` (its updated_at as text); None reads the
        current version from the database."""
        cached = self._campaigns.get(campaign_id)
        if cached is not None and version is not None and cached[0] == version:
            return cached[1]
        with self.engine.connect() as conn:
            row = conn.execute(sa.text(
                "SELECT c.name, c.from_addr, c.subject, c.text_body, c.html_body, "
                "c.list_id, l.name AS list_name, c.updated_at::text AS version, "
                "y.html AS layout_html, y.postal_address, "
                "coalesce(t.track_opens, false) AS track_opens, "
                "coalesce(t.track_clicks, false) AS track_clicks, "
                "coalesce(t.archive, false) AS archive "
                "FROM campaigns c JOIN lists l ON l.id = c.list_id "
                "LEFT JOIN layouts y ON y.id = c.layout_id "
                "LEFT JOIN campaign_tracking t ON t.campaign_id = c.id WHERE c.id = :id"),
                {"id": campaign_id}).one()
        if cached is not None and cached[0] == row.version:
            return cached[1]
        settings = tracking.Settings(row.track_opens, row.track_clicks, row.archive)
        links = tracking.Links()
        if settings.track_clicks:
            with self.engine.begin() as conn:
                links = tracking.store_links(conn, campaign_id, tracking.static_links(
                    row.html_body, row.text_body))
        prepared = PreparedCampaign(
            name=row.name, from_addr=row.from_addr, subject=row.subject,
            template=compile_campaign(row.subject, row.text_body, row.html_body,
                                      layout_of(row.layout_html, row.postal_address)),
            list_id=row.list_id, list_name=row.list_name, analytics=settings, links=links)
        with self._lock:
            self._campaigns[campaign_id] = (row.version, prepared)  # the old version goes
        return prepared

    def build(self, job: ClaimedJob) -> Envelope:
        """The envelope sender and message bytes for ``job``, DKIM-signed with the From
        domain's active keys (every kind goes through here). Raises
        ``workers.building.message.TemplateError`` if a template cannot render for this
        recipient."""
        if job.kind == "broadcast" or (job.kind == "test" and "kind" not in job.payload):
            envelope = self._build_campaign(job)
        elif submitted.stored_id(job.payload) is not None:
            envelope = self._build_submitted(job)
        elif job.kind == SEQUENCE:
            envelope = self._build_sequence(job)
        else:
            envelope = self._build_kind(job)
        return self._signed(envelope)

    def retry_schedule(self, kind: str) -> tuple[int, ...]:
        """The delays between attempts for ``kind``: the kind's own (docs/design.md §21), else the
        settings' (campaigns, tests, and the built-in kind unless an admin set one)."""
        return self.kinds.retry_schedule(kind, self.config.retry_schedule)

    def _signed(self, envelope: Envelope) -> Envelope:
        if not self.keys.any():
            return envelope
        domain = from_domain(envelope.message)
        if domain is None:
            return envelope
        return replace(envelope, message=self.keys.sign(envelope.message, domain))

    def _headers(self, job: ClaimedJob) -> dict[str, str]:
        return {"X-SendDock-Correlation-ID": job.correlation_id}

    def _test_recipient(self, job: ClaimedJob) -> tuple[str, dict[str, Any]]:
        """A test message is rendered with the chosen subscriber's fields (payload)."""
        subscriber_id = job.payload.get("subscriber_id")
        if not subscriber_id:
            return "", {}
        with self.engine.connect() as conn:
            row = conn.execute(sa.text("SELECT name, attributes FROM subscribers "
                                       "WHERE id = :id"), {"id": int(subscriber_id)}).first()
        return (row.name, row.attributes) if row else ("", {})

    def _build_campaign(self, job: ClaimedJob) -> Envelope:
        campaign_id = job.campaign_id or int(job.payload.get("campaign_id", 0))
        prepared = self.campaign(campaign_id, job.campaign_version)
        headers = self._headers(job)
        name, attributes = job.name, job.attributes
        unsub = ""
        if job.kind == "test":
            # A real subscriber's link in a test would unsubscribe them when the tester
            # clicks it; the placeholder's landing page explains that.
            name, attributes = self._test_recipient(job)
            unsub = f"{self.config.base_url}/u/test-message"
        elif job.subscriber_id is not None:
            unsub = unsubscribe_url(self.config.base_url, self.config.secret_key,
                                    job.subscriber_id, campaign_id)
            headers["List-Unsubscribe"] = f"<{unsub}>"
            headers["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
        archive = tracking.archive_url(self.config.base_url, self.config.secret_key,
                                       campaign_id) if prepared.analytics.archive else ""
        rendered = prepared.template.render(recipient_context(
            email=job.email, name=name, attributes=attributes, unsubscribe_url=unsub,
            campaign_name=prepared.name, subject=prepared.subject, archive_url=archive))
        subject = rendered.subject
        if job.kind == "test":
            subject = f"[Test] {subject}"
        from_addr = address_of(prepared.from_addr)
        if prepared.list_id:
            headers["List-Id"] = list_id(prepared.list_name, prepared.list_id, from_addr)
        text, html = self._tracked(prepared, campaign_id, job, rendered.text, rendered.html)
        message = build_mime(from_addr=prepared.from_addr, to_addr=job.email, subject=subject,
                             text=text, html=html, message_id=job.message_id,
                             headers=headers)
        sender = self._envelope_from(job, from_addr)
        return Envelope(sender, message, campaign_sender=sender == from_addr)

    def _tracked(self, prepared: PreparedCampaign, campaign_id: int, job: ClaimedJob,
                 text: str | None, html: str | None) -> tuple[str | None, str | None]:
        """A campaign's text and HTML parts, tracked when the campaign tracks them (its
        recipients only, and those who allow it; test sends are never tracked)."""
        if job.kind != "broadcast" or job.subscriber_id is None or not job.tracking:
            return with_tracking(prepared, text, html, None, None)
        config, subscriber_id = self.config, job.subscriber_id

        def click(link_id: int) -> str:
            return tracking.click_url(config.base_url, config.secret_key, campaign_id,
                                      job.id, subscriber_id, link_id)

        return with_tracking(prepared, text, html, click, tracking.open_url(
            config.base_url, config.secret_key, campaign_id, job.id, subscriber_id))

    def _build_kind(self, job: ClaimedJob) -> Envelope:
        """A transactional kind's message (or its test send): the kind's templates, at
        least as new as the version the job was enqueued with, seeing its data and event."""
        name = str(job.payload.get("kind")) if job.kind == "test" else job.kind
        version = job.payload.get("kind_version")
        try:
            prepared = self.kinds.get(name, int(version) if version is not None else None)
        except UnknownKind:
            raise TemplateError("kind", None, f"there is no kind {name!r}") from None
        rendered = prepared.template.render(message_context(
            email=job.email, user_ref=job.user_ref, kind=name, payload=job.payload))
        subject = f"[Test] {rendered.subject}" if job.kind == "test" else rendered.subject
        headers = self._headers(job)
        headers["Auto-Submitted"] = "auto-generated"  # RFC 3834: no auto-replies to it
        text = rendered.text
        if text is None and rendered.html is not None:
            text = html_to_text(rendered.html)  # no HTML-only mail (spam filters score it)
        message = build_mime(from_addr=self.config.mail_from, to_addr=job.email,
                             subject=subject, text=text, html=rendered.html,
                             message_id=job.message_id, headers=headers)
        return Envelope(self._envelope_from(job, self.config.mail_from), message)

    def _build_submitted(self, job: ClaimedJob) -> Envelope:
        """A message submitted by SMTP: its stored bytes, less our headers and Bcc
        (:mod:`workers.building.submitted`)."""
        try:
            mail_from, raw = submitted.load(self.engine, self.config.secret_key, job.payload)
        except submitted.Missing as exc:
            raise TemplateError("message", None, str(exc)) from None
        message = submitted.prepared(raw, correlation_id=job.correlation_id,
                                     message_id=job.message_id,
                                     now=datetime.now(UTC))
        sender = mail_from or submitted.from_address(raw) or address_of(self.config.mail_from)
        verp = self.config.feedback.bounce_address
        if verp:
            sender = bounce_address(verp, self.config.secret_key, job.id)
        return Envelope(sender, message)
    def sequence_step(self, step_id: int) -> tuple[PreparedCampaign, int | None]:
        """A sequence's email step compiled at its current version (an edit before the send
        is what is sent), with the sequence's layout; and its sequence's id."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.text(
                "SELECT st.version, st.subject, st.text_body, st.html_body, q.id, q.name, "
                "q.from_addr, y.html AS layout_html, y.postal_address, q.track_opens, "
                "q.track_clicks "
                "FROM sequence_steps st JOIN sequences q ON q.id = st.sequence_id "
                "LEFT JOIN layouts y ON y.id = q.layout_id WHERE st.id = :id"),
                {"id": step_id}).first()
        if row is None:
            raise TemplateError("sequence", None, f"there is no sequence step {step_id}")
        version = (f"{row.version}:{row.from_addr}:{hash(row.layout_html)}:"
                   f"{row.track_opens}:{row.track_clicks}")
        cached = self._steps.get(step_id)
        if cached is not None and cached[0] == version:
            return cached[1], row.id
        settings = tracking.Settings(row.track_opens, row.track_clicks)
        links = tracking.Links()
        if settings.track_clicks:
            with self.engine.begin() as conn:
                links = tracking.store_links(conn, step_id, tracking.static_links(
                    row.html_body, row.text_body), table="sequence_links", owner="step_id")
        prepared = PreparedCampaign(
            name=row.name, from_addr=row.from_addr or self.config.mail_from,
            subject=row.subject, template=compile_campaign(
                row.subject, row.text_body, row.html_body,
                layout_of(row.layout_html, row.postal_address)),
            analytics=settings, links=links)
        with self._lock:
            self._steps[step_id] = (version, prepared)
        return prepared, row.id

    def _build_sequence(self, job: ClaimedJob) -> Envelope:
        """A sequence's email step for its subscriber: the step's content as it is now,
        seeing the subscriber's fields and the triggering event's data; its links and open
        pixel tracked as a campaign's when the sequence tracks them."""
        step_id = int(job.payload.get("step_id", 0))
        prepared, _ = self.sequence_step(step_id)
        headers = self._headers(job)
        unsub = ""
        if job.subscriber_id is not None:
            unsub = unsubscribe_url(self.config.base_url, self.config.secret_key,
                                    job.subscriber_id, None)
            headers["List-Unsubscribe"] = f"<{unsub}>"
            headers["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
        data = job.payload.get("data")
        context = recipient_context(
            email=job.email, name=job.name, attributes=job.attributes, unsubscribe_url=unsub,
            campaign_name=prepared.name, subject=prepared.subject)
        context["data"] = data if isinstance(data, dict) else {}
        context["event"] = {"data": context["data"]}
        rendered = prepared.template.render(context)
        headers["Auto-Submitted"] = "auto-generated"
        click: Callable[[int], str] | None = None
        pixel = None
        if job.subscriber_id is not None and job.tracking:
            config, subscriber_id = self.config, job.subscriber_id

            def tracked_link(link_id: int) -> str:
                return tracking.sequence_click_url(config.base_url, config.secret_key,
                                                   step_id, job.id, subscriber_id, link_id)

            click = tracked_link
            pixel = tracking.sequence_open_url(config.base_url, config.secret_key, step_id,
                                               job.id, subscriber_id)
        text, html = with_tracking(prepared, rendered.text, rendered.html, click, pixel)
        message = build_mime(from_addr=prepared.from_addr, to_addr=job.email,
                             subject=rendered.subject, text=text, html=html,
                             message_id=job.message_id, headers=headers)
        from_addr = address_of(prepared.from_addr)
        return Envelope(self._envelope_from(job, from_addr), message)

    def _envelope_from(self, job: ClaimedJob, from_addr: str) -> str:
        """The VERP bounce address for this job when SENDDOCK_BOUNCE_ADDRESS is set (bounces
        then name their job), else the From address."""
        verp = self.config.feedback.bounce_address
        if verp:
            return bounce_address(verp, self.config.secret_key, job.id)
        return address_of(from_addr)


def with_tracking(prepared: PreparedCampaign, text: str | None, html: str | None,
                  click: Callable[[int], str] | None,
                  pixel: str | None) -> tuple[str | None, str | None]:
    """The text and HTML parts with tracked links (``click`` makes a link's tracking URL)
    and the open pixel, each when the campaign or sequence tracks it and the message has a
    recipient to credit (``None``: not tracked); and a text part made from the HTML when
    there is none (no HTML-only mail: spam filters score it)."""
    if click is not None and prepared.analytics.track_clicks:
        if html is not None:
            html = tracking.rewrite_html(html, prepared.links, click)
        if text is not None:
            text = tracking.rewrite_text(text, prepared.links, click)
    if text is None and html is not None:
        text = html_to_text(html)
    if pixel is not None and prepared.analytics.track_opens and html is not None:
        html = tracking.add_pixel(html, pixel)
    return text, html
