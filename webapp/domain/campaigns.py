"""Campaigns: compose, send (now or scheduled), pause, resume, cancel, and honest counts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit, composer, layouts, segments, text_limits
from webapp.domain import fields as rules
from webapp.domain.errors import Conflict, Invalid, NotFound
from webapp.domain.lists import check_email, get_list, get_member, subscriber_page
from workers import queue
from workers.building import tracking as signing
from workers.building.compose import recipient_context
from workers.building.links import unsubscribe_url
from workers.building.message import (
    PREVIEW_SECONDS,
    Layout,
    TemplateError,
    TemplateLimit,
    compile_campaign,
)
from workers.core import states
from workers.core.i18n import N_, word
from workers.core.states import Campaign
from workers.delivery import lifecycle

EDITABLE = Campaign.EDITABLE
# The header-bound fields as a message names them.
_HEADER_FIELDS = {"subject": N_("subject"), "from": N_("from")}
FIELDS = ("id", "name", "list_id", "from_addr", "subject", "text_body", "html_body", "status",
          "scheduled_at", "broadcast_id", "created_at", "updated_at", "started_at",
          "finished_at", "paused_reason", "segment_id", "layout_id")


def validate_templates(subject: str, text: str | None, html: str | None,
                       layout: Layout | None = None) -> None:
    """Compile the templates now, so an error shows when composing, not mid-send (P9):
    :class:`Invalid` names every bad field at once."""
    if not (text or "").strip() and not (html or "").strip():
        required = N_("text or html required")
        raise Invalid(N_("a campaign needs a text or an HTML body"),
                      fields={"text": required, "html": required})
    # Every field's error at once (the UI lists them all; the API names every field).
    composer.check_templates({"subject": subject, "text": text, "html": html})
    # A trial render for a stand-in recipient, under the preview's budget: a template that
    # is over a render limit (operations, output size, time) even then is refused now,
    # naming the limit. Other errors depend on the data and show on the preview.
    try:
        compile_campaign(subject, text, html, layout).render(recipient_context(
            email="someone@example.com", name="", attributes={},
            unsubscribe_url="https://example.com/u/preview", campaign_name="",
            subject=subject), seconds=PREVIEW_SECONDS)
    except TemplateLimit as exc:
        raise Invalid(N_("template error in %(field)s: %(message)s",
                         field=composer.FIELD_NAMES.get(exc.field, exc.field),
                         message=exc.message),
                      fields={exc.field: exc.message}, limit=exc.limit) from None
    except TemplateError:
        pass


def _text(data: dict[str, Any], key: str) -> str:
    """The field as stripped text ("" when absent); any other type is refused by name."""
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Invalid(N_("%(field)s must be a string", field=key),
                      fields={key: N_("must be a string")})
    return value.strip()


def _refuse_control_characters(headers: dict[str, str]) -> None:
    """Header-bound fields (the From address with its display name, the subject) hold no
    CR, LF or other control character: each would break the header it goes into, or start
    a new one. 422 naming the field (P9), at compose, never mid-send."""
    for key, value in headers.items():
        found = rules.control_character(value)
        if found:
            raise Invalid(N_("%(field)s must not contain line breaks or other control "
                             "characters (found %(found)s): it becomes a mail header",
                             field=_HEADER_FIELDS.get(key, key), found=found),
                          fields={key: N_("contains the control character %(found)s",
                                          found=found)})


def _check(data: dict[str, Any], default_from: str) -> dict[str, Any]:
    # Control characters are refused as sent, before any trimming: a subject or From
    # with a tab or line break at its end is refused like one with it inside.
    _refuse_control_characters({k: v for k in ("subject", "from")
                                if isinstance(v := data.get(k), str)})
    name = _text(data, "name")
    subject = _text(data, "subject")
    missing = {k: N_("required") for k, v in (("name", name), ("subject", subject)) if not v}
    if missing:
        raise Invalid(N_("missing: %(fields)s", fields=", ".join(missing)), fields=missing)
    from_addr = _text(data, "from") or _text(data, "from_addr") or default_from.strip()
    # As sent (before trimming), as the API's document states them.
    text_limits.check("name", data.get("name"), text_limits.CAMPAIGN_NAME)
    text_limits.check("subject", data.get("subject"), text_limits.SUBJECT)
    text_limits.check("from", data.get("from") or from_addr, text_limits.FROM)
    _refuse_control_characters({"subject": subject, "from": from_addr})
    try:
        check_email(from_addr.rsplit("<", 1)[-1].rstrip(">") if "<" in from_addr else from_addr)
    except Invalid as exc:  # the field is From, whatever the address check calls it
        raise Invalid(exc.message, fields={"from": exc.fields.get("email", exc.message)}
                      ) from None
    text, html = data.get("text"), data.get("html")
    for field, value in (("text", text), ("html", html)):
        if value is not None and not isinstance(value, str):
            raise Invalid(N_("%(field)s must be a string", field=field),
                          fields={field: N_("must be a string")})
    validate_templates(subject, text, html)
    return {"name": name, "subject": subject, "from_addr": from_addr,
            "text_body": text or None, "html_body": html or None}


def create(conn: Connection, data: dict[str, Any], *, default_from: str,
           actor: str = "system") -> dict[str, Any]:
    list_id = data.get("list_id")
    if not isinstance(list_id, int) or isinstance(list_id, bool):
        raise Invalid(N_("list_id must be a number"),
                      fields={"list_id": N_("required integer")})
    get_list(conn, list_id)
    values = _check(data, default_from)
    values.update(_audience_and_layout(conn, list_id, data, values))
    row = conn.execute(sa.text("""
        INSERT INTO campaigns (name, list_id, from_addr, subject, text_body, html_body,
                               segment_id, layout_id)
        VALUES (:name, :list_id, :from_addr, :subject, :text_body, :html_body,
                :segment_id, :layout_id)
        RETURNING id"""), {**values, "list_id": list_id}).one()
    audit.record(conn, actor, "campaign.create", f"campaign:{row.id}", name=values["name"])
    return with_counts(conn, row.id)


def update(conn: Connection, campaign_id: int, data: dict[str, Any], *, default_from: str,
           actor: str = "system") -> dict[str, Any]:
    current = get(conn, campaign_id, lock=True)
    if current["status"] not in EDITABLE:
        raise Conflict(N_("campaign is %(status)s; only drafts can be edited",
                          status=word(current["status"])))
    list_id = data.get("list_id", current["list_id"])
    get_list(conn, int(list_id))
    values = _check(data, default_from)
    values.update(_audience_and_layout(conn, int(list_id), {
        "segment_id": current["segment_id"], "layout_id": current["layout_id"], **data}, values))
    conn.execute(sa.text("""
        UPDATE campaigns SET name = :name, list_id = :list_id, from_addr = :from_addr,
               subject = :subject, text_body = :text_body, html_body = :html_body,
               segment_id = :segment_id, layout_id = :layout_id,
               updated_at = now() WHERE id = :id"""),
        {**values, "list_id": int(list_id), "id": campaign_id})
    audit.record(conn, actor, "campaign.update", f"campaign:{campaign_id}")
    return get(conn, campaign_id)


def _audience_and_layout(conn: Connection, list_id: int, data: dict[str, Any],
                        values: dict[str, Any]) -> dict[str, Any]:
    """The segment (of the campaign's list) and layout it picks, both checked; the
    templates are compiled again inside the layout."""
    segment_id = segments.check_for_campaign(conn, list_id, data.get("segment_id"))
    layout = layouts.check_for_campaign(conn, data.get("layout_id"))
    if layout is not None:
        validate_templates(values["subject"], values["text_body"], values["html_body"], layout)
    layout_id = data.get("layout_id")
    return {"segment_id": segment_id,
            "layout_id": int(layout_id) if layout is not None and layout_id else None}


def layout_for(conn: Connection, campaign: dict[str, Any]) -> Layout | None:
    return layouts.check_for_campaign(conn, campaign.get("layout_id"))


def get(conn: Connection, campaign_id: int, *, lock: bool = False) -> dict[str, Any]:
    row = conn.execute(sa.text(
        f"SELECT {', '.join(FIELDS)} FROM campaigns WHERE id = :id"
        + (" FOR UPDATE" if lock else "")), {"id": campaign_id}).mappings().first()
    if row is None:
        raise NotFound(N_("campaign %(id)s does not exist", id=str(campaign_id)))
    return dict(row)


def with_counts(conn: Connection, campaign_id: int) -> dict[str, Any]:
    """The campaign with exact counts (P8) and its audience summary."""
    campaign = get(conn, campaign_id)
    return _attach_counts(conn, [campaign])[0]


def _attach_counts(conn: Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids = [r["broadcast_id"] for r in rows if r["broadcast_id"]]
    counts = queue.many_broadcast_counts(conn, ids) if ids else {}
    summaries = {}
    if ids:
        for b in conn.execute(sa.text(
                "SELECT id, total, skipped_suppressed, skipped_inactive, enqueued_at, "
                "finished_at, complaints "
                "FROM broadcasts WHERE id = ANY(:ids)"), {"ids": ids}).mappings():
            summaries[b["id"]] = dict(b)
    for r in rows:
        c = counts.get(r["broadcast_id"], dict.fromkeys(states.COUNTED, 0))
        r["counts"] = c
        r["total"] = sum(c.values())
        r["audience"] = summaries.get(r["broadcast_id"])
        r["enqueued"] = bool(r["audience"] and r["audience"]["enqueued_at"])
    return rows


def all_with_counts(conn: Connection, limit: int = 200, *,
                    query: str = "") -> list[dict[str, Any]]:
    """The newest campaigns (whose name or subject contains ``query``, if given) with their
    list's name and exact counts."""
    columns = ", ".join(f"c.{f}" for f in FIELDS)
    rows = conn.execute(sa.text(f"""
        SELECT {columns}, l.name AS list_name FROM campaigns c
          JOIN lists l ON l.id = c.list_id
         WHERE CAST(:q AS text) = '' OR strpos(lower(c.name || ' ' || c.subject), :q) > 0
         ORDER BY c.id DESC LIMIT :limit"""),
        {"limit": limit, "q": query.strip().lower()}).mappings()
    return _attach_counts(conn, [dict(r) for r in rows])


def send(conn: Connection, campaign_id: int, *, actor: str = "system",
         at: datetime | None = None) -> dict[str, Any]:
    """Send now (or schedule for ``at``). Returns at once: the broadcast row is the durable
    record of the request (P1) and a worker enqueues its jobs set-based."""
    campaign = get(conn, campaign_id, lock=True)
    if campaign["status"] not in EDITABLE:
        raise Conflict(N_("campaign is already %(status)s", status=word(campaign["status"])))
    validate_templates(campaign["subject"], campaign["text_body"], campaign["html_body"],
                       layout_for(conn, campaign))
    if at is not None and at > datetime.now(UTC):
        conn.execute(sa.text(f"UPDATE campaigns SET status = '{Campaign.SCHEDULED}', "
                             "scheduled_at = :at, "
                             "updated_at = now() WHERE id = :id"), {"at": at, "id": campaign_id})
        audit.record(conn, actor, "campaign.schedule", f"campaign:{campaign_id}", at=at)
    else:
        queue.start_broadcast(conn, campaign_id)
        audit.record(conn, actor, "campaign.send", f"campaign:{campaign_id}")
    return with_counts(conn, campaign_id)


def unschedule(conn: Connection, campaign_id: int, *, actor: str = "system") -> dict[str, Any]:
    campaign = get(conn, campaign_id, lock=True)
    if campaign["status"] != Campaign.SCHEDULED:
        raise Conflict(N_("campaign is %(status)s, not scheduled",
                          status=word(campaign["status"])))
    conn.execute(sa.text(f"UPDATE campaigns SET status = '{Campaign.DRAFT}', scheduled_at = NULL, "
                         "updated_at = now() WHERE id = :id"), {"id": campaign_id})
    audit.record(conn, actor, "campaign.unschedule", f"campaign:{campaign_id}")
    return with_counts(conn, campaign_id)


def _refused(campaign: dict[str, Any], to: str) -> Conflict:
    status = word(campaign["status"])
    if to == Campaign.PAUSED:
        return Conflict(N_("only a sending campaign can be paused; this one is %(status)s",
                           status=status))
    if to == Campaign.SENDING:
        return Conflict(N_("only a paused campaign can be resumed; this one is %(status)s",
                           status=status))
    return Conflict(N_("campaign is already %(status)s", status=status))


def pause(conn: Connection, campaign_id: int, *, actor: str = "system") -> dict[str, Any]:
    """Stop claiming the campaign's jobs (one row, any size) and starting its messages;
    the ones in flight finish (``in_flight``: how many)."""
    in_flight = lifecycle.stop_sending(conn, campaign_id)
    if not lifecycle.pause_campaign(conn, campaign_id, None, actor):
        raise _refused(get(conn, campaign_id), Campaign.PAUSED)
    return {**with_counts(conn, campaign_id), "in_flight": in_flight}


def resume(conn: Connection, campaign_id: int, *, actor: str = "system") -> dict[str, Any]:
    """Claim the campaign's jobs again (idle workers are woken at once)."""
    if not lifecycle.resume_campaign(conn, campaign_id, actor):
        raise _refused(get(conn, campaign_id), Campaign.SENDING)
    return with_counts(conn, campaign_id)


def cancel(conn: Connection, campaign_id: int, *, actor: str = "system") -> dict[str, Any]:
    """Cancel: from the commit on none of its jobs is claimed (one row, any size); the
    engine then moves the waiting ones to `cancelled` in chunks (workers.delivery.lifecycle), and
    the page counts them down. No message of it starts after the commit: the cancel waits
    for the ones inside an SMTP transaction (at most one per drain thread), which finish;
    ``in_flight`` says how many there were."""
    in_flight = lifecycle.stop_sending(conn, campaign_id)
    if not lifecycle.cancel_campaign(conn, campaign_id, actor):
        raise _refused(get(conn, campaign_id), Campaign.CANCELLED)
    return {**with_counts(conn, campaign_id), "in_flight": in_flight}


# --- before sending: audience, preview, test send ----------------------------------------

_AUDIENCE = sa.text("""
SELECT count(*) AS members,
       count(*) FILTER (WHERE x.email IS NOT NULL) AS suppressed,
       count(*) FILTER (WHERE x.email IS NULL AND s.status <> 'active') AS inactive
  FROM memberships m JOIN subscribers s ON s.id = m.subscriber_id
  LEFT JOIN suppressions x ON x.email = lower(s.email)
 WHERE m.list_id = :list_id
""")


def audience(conn: Connection, list_id: int, segment_id: int | None = None
             ) -> dict[str, int]:
    """Who a send to the list (narrowed by the segment, if any) would reach right now, by
    the same rules as the enqueue (one message per address; suppressed and inactive
    subscribers left out)."""
    if segment_id is not None:
        return segments.count(conn, list_id, segments.get(conn, segment_id)["conditions"])
    row = conn.execute(_AUDIENCE, {"list_id": list_id}).one()
    members, suppressed, inactive = int(row.members), int(row.suppressed), int(row.inactive)
    return {"members": members, "suppressed": suppressed, "inactive": inactive,
            "will_receive": members - suppressed - inactive}


def _preview_subscriber(conn: Connection, list_id: int, subscriber_id: int | None,
                        email: str) -> dict[str, Any] | None:
    if subscriber_id is not None:
        return get_member(conn, list_id, subscriber_id)
    if email.strip():
        page = subscriber_page(conn, list_id, query=email, limit=1)
        if not page["rows"]:
            raise NotFound(N_("no subscriber on this list matches “%(email)s”",
                              email=email.strip()), fields={"subscriber": N_("no match")})
        return dict(page["rows"][0])
    rows = subscriber_page(conn, list_id, limit=1)["rows"]
    return dict(rows[0]) if rows else None


def preview(conn: Connection, campaign_id: int, *, base_url: str, secret_key: str,
            subscriber_id: int | None = None, email: str = "") -> dict[str, Any]:
    """The campaign rendered for one real subscriber of its list (by id, by a search, or the
    first one), exactly as the workers will render it. A template error is returned (not
    raised) with its field and line, so the page can show it next to the bodies."""
    campaign = get(conn, campaign_id)
    subscriber = _preview_subscriber(conn, campaign["list_id"], subscriber_id, email)
    sample = subscriber or {"id": None, "email": "someone@example.com", "name": "",
                            "attributes": {}}
    unsub = unsubscribe_url(base_url, secret_key, sample["id"], campaign_id) \
        if sample["id"] is not None else f"{base_url}/u/preview"
    result: dict[str, Any] = {"campaign": campaign, "subscriber": subscriber,
                              "sample": sample, "error": None, "rendered": None}
    try:
        template = compile_campaign(campaign["subject"], campaign["text_body"],
                                    campaign["html_body"], layout_for(conn, campaign))
        result["rendered"] = template.render(recipient_context(
            email=sample["email"], name=sample["name"], attributes=sample["attributes"],
            unsubscribe_url=unsub, campaign_name=campaign["name"],
            subject=campaign["subject"],
            archive_url=_archive_url(conn, campaign_id, base_url, secret_key)),
            seconds=PREVIEW_SECONDS)
    except TemplateError as exc:
        result["error"] = exc
    return result


def _archive_url(conn: Connection, campaign_id: int, base_url: str, secret_key: str) -> str:
    """``{{ archive_url }}`` as the messages will carry it: the web version's address while
    the campaign publishes one, else nothing (as the worker renders it)."""
    on = conn.execute(sa.text("SELECT archive FROM campaign_tracking WHERE campaign_id = :c"),
                      {"c": campaign_id}).scalar()
    return signing.archive_url(base_url, secret_key, campaign_id) if on else ""


def test_send(conn: Connection, campaign_id: int, email: str, *,
              subscriber_id: int | None = None, actor: str = "system") -> int:
    """Queue one ``[Test]`` message of the campaign to ``email`` (rendered with the given
    subscriber's fields, if any). It goes through the same engine, ahead of campaign mail,
    and counts in no campaign figure. Returns the job id."""
    campaign = get(conn, campaign_id)
    validate_templates(campaign["subject"], campaign["text_body"], campaign["html_body"],
                       layout_for(conn, campaign))
    address = check_email(email)
    if subscriber_id is not None:
        get_member(conn, campaign["list_id"], subscriber_id)
    job_id = queue.enqueue_test(conn, address, {"campaign_id": campaign_id,
                                                  "subscriber_id": subscriber_id}, actor=actor)
    audit.record(conn, actor, "campaign.test_send", f"campaign:{campaign_id}", email=address,
                 job_id=job_id)
    return job_id
