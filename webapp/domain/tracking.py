"""Privacy-friendly analytics: a campaign's tracking settings, the
opens and clicks its recipients make, and its figures.

Off by default: a campaign tracks nothing until a marketer turns opens or clicks on
(``campaign_tracking``). The engine then signs its links and adds an open pixel
(:mod:`workers.building.tracking`); here the public endpoints read those URLs back.

Guarantees kept here:

- a tracking URL is only believed when its HMAC is genuine; a click redirects to the URL
  stored for its link (``campaign_links``), never to one taken from the request;
- one event is one inserted row (no counter is read and written back), so counts are
  exact however many recipients click at once; totals count every open or click, the
  unique figures count recipients (jobs);
- what is stored is which recipient opened or clicked what, and when: no IP address, no
  user agent, no third-party call (docs/privacy.md).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from webapp.domain import audit, campaigns
from webapp.domain.errors import Conflict, Invalid, NotFound
from workers.building import tracking
from workers.core.i18n import N_, word
from workers.core.states import BOUNCED, SENT

BUCKETS = ("hour", "day")
SETTINGS = ("track_opens", "track_clicks", "archive")
MAX_BUCKETS = 500  # the newest hours or days shown (bounded at any age)
MAX_LINKS = 200

# The smallest transparent GIF (1x1): what the open pixel answers, always the same bytes.
PIXEL = (b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00"
         b"\x00\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")


# --- settings (marketers) -----------------------------------------------------------------

def get_settings(conn: Connection, campaign_id: int) -> dict[str, bool]:
    row = conn.execute(sa.text(
        "SELECT track_opens, track_clicks, archive FROM campaign_tracking "
        "WHERE campaign_id = :c"), {"c": campaign_id}).mappings().first()
    return dict(row) if row else {"track_opens": False, "track_clicks": False,
                                  "archive": False}


def form_values(form: Any) -> dict[str, bool]:
    """The composer's three checkboxes (absent: off)."""
    return {key: form.get(key) in ("on", "true", "1") for key in SETTINGS}


def save_settings(conn: Connection, campaign_id: int, values: dict[str, Any], *,
                  actor: str) -> dict[str, bool]:
    """Set the campaign's analytics and archive choices; only while it is editable (what
    was sent cannot change). The campaign's version moves, so the engine compiles it
    again with the new choices."""
    campaign = campaigns.get(conn, campaign_id, lock=True)
    chosen = {}
    for key in SETTINGS:
        value = values.get(key, False)
        if not isinstance(value, bool):
            raise Invalid(N_("%(field)s must be true or false", field=key),
                          fields={key: N_("must be true or false")})
        chosen[key] = value
    if chosen == get_settings(conn, campaign_id):
        return chosen
    if campaign["status"] not in campaigns.EDITABLE:
        raise Conflict(N_("campaign is already %(status)s; its tracking cannot change",
                          status=word(campaign["status"])))
    conn.execute(sa.text("""
        INSERT INTO campaign_tracking (campaign_id, track_opens, track_clicks, archive)
        VALUES (:c, :o, :k, :a)
        ON CONFLICT (campaign_id) DO UPDATE SET track_opens = :o, track_clicks = :k,
               archive = :a"""),
        {"c": campaign_id, "o": chosen["track_opens"], "k": chosen["track_clicks"],
         "a": chosen["archive"]})
    conn.execute(sa.text("UPDATE campaigns SET updated_at = now() WHERE id = :c"),
                 {"c": campaign_id})
    audit.record(conn, actor, "campaign.tracking", f"campaign:{campaign_id}", **chosen)
    return chosen


def copy_settings(conn: Connection, from_id: int, to_id: int) -> None:
    """A duplicate keeps the original's choices."""
    conn.execute(sa.text("""
        INSERT INTO campaign_tracking (campaign_id, track_opens, track_clicks, archive)
        SELECT :to, track_opens, track_clicks, archive FROM campaign_tracking
         WHERE campaign_id = :from
        ON CONFLICT (campaign_id) DO NOTHING"""), {"from": from_id, "to": to_id})


# --- events (anyone holding a genuine tracking URL) ---------------------------------------

_RECORD = sa.text("""
INSERT INTO campaign_events (campaign_id, broadcast_id, job_id, subscriber_id, kind, link_id)
SELECT c.id, c.broadcast_id, :job, s.id, :kind, CAST(:link AS bigint)
  FROM campaigns c
  JOIN campaign_tracking t ON t.campaign_id = c.id
  JOIN subscribers s ON s.id = :subscriber
 WHERE c.id = :campaign
   AND CASE WHEN :kind = 'open' THEN t.track_opens ELSE t.track_clicks END
""")


def _record(conn: Connection, campaign_id: int, job_id: int, subscriber_id: int, kind: str,
            link_id: int | None, statement: sa.TextClause = _RECORD) -> None:
    """One open or click of a campaign's message (``statement``: of a sequence's, then
    ``campaign_id`` is the email step's id)."""
    params = {"campaign": campaign_id, "job": job_id, "subscriber": subscriber_id,
              "kind": kind, "link": link_id}
    try:
        with conn.begin_nested():
            conn.execute(statement, params)
    except IntegrityError:
        pass  # the subscriber was deleted this instant: nothing to record


# A sequence's message (docs/sequences.md): the same, per email step.
_RECORD_SEQUENCE = sa.text("""
INSERT INTO sequence_events (step_id, job_id, subscriber_id, kind, link_id)
SELECT st.id, :job, s.id, :kind, CAST(:link AS bigint)
  FROM sequence_steps st
  JOIN sequences q ON q.id = st.sequence_id
  JOIN subscribers s ON s.id = :subscriber
 WHERE st.id = :campaign
   AND CASE WHEN :kind = 'open' THEN q.track_opens ELSE q.track_clicks END
""")


def _sequence_click(conn: Connection, secret_key: str, token: str) -> str:
    read = tracking.read_sequence_click_token(secret_key, token)
    if read is None:
        raise NotFound(N_("this link is not valid"))
    step_id, job_id, subscriber_id, link_id = read
    url = conn.execute(sa.text(
        "SELECT url FROM sequence_links WHERE id = :l AND step_id = :s"),
        {"l": link_id, "s": step_id}).scalar()
    if url is None:
        raise NotFound(N_("this link is not valid"))
    _record(conn, step_id, job_id, subscriber_id, "click", link_id, _RECORD_SEQUENCE)
    return str(url)


def click(conn: Connection, secret_key: str, token: str) -> str:
    """Record a click and return the link's stored URL; NotFound for a forged token or an
    unknown link. Recorded only while the campaign (or sequence) tracks clicks and the
    subscriber exists; the redirect works either way."""
    read = tracking.read_click_token(secret_key, token)
    if read is None:
        return _sequence_click(conn, secret_key, token)
    campaign_id, job_id, subscriber_id, link_id = read
    url = conn.execute(sa.text(
        "SELECT url FROM campaign_links WHERE id = :l AND campaign_id = :c"),
        {"l": link_id, "c": campaign_id}).scalar()
    if url is None:
        raise NotFound(N_("this link is not valid"))
    _record(conn, campaign_id, job_id, subscriber_id, "click", link_id)
    return str(url)


def open_(conn: Connection, secret_key: str, token: str) -> None:
    """Record an open; NotFound for a forged token."""
    token = token.removesuffix(".gif")
    read = tracking.read_open_token(secret_key, token)
    if read is not None:
        _record(conn, read[0], read[1], read[2], "open", None)
        return
    read = tracking.read_sequence_open_token(secret_key, token)
    if read is None:
        raise NotFound(N_("this image is not valid"))
    _record(conn, read[0], read[1], read[2], "open", None, _RECORD_SEQUENCE)


# --- figures ------------------------------------------------------------------------------

def check_bucket(raw: str | None) -> str:
    if raw in (None, ""):
        return "hour"
    if raw not in BUCKETS:
        raise Invalid(N_("by must be hour or day"), fields={"by": N_("hour or day")})
    return str(raw)


def stats(conn: Connection, campaign_id: int, *, by: str = "hour") -> dict[str, Any]:
    """The campaign's opens and clicks (total and unique, per link, per hour or day, in
    UTC) beside its unsubscribes, bounces and complaints. Exact: counted from the rows."""
    campaign = campaigns.with_counts(conn, campaign_id)
    by = check_bucket(by)
    settings = get_settings(conn, campaign_id)
    totals = {k: {"total": 0, "unique": 0} for k in ("opens", "clicks")}
    for row in conn.execute(sa.text("""
            SELECT kind, count(*) AS total, count(DISTINCT job_id) AS uniq
              FROM campaign_events WHERE campaign_id = :c GROUP BY kind"""),
            {"c": campaign_id}):
        totals[f"{row.kind}s"] = {"total": int(row.total), "unique": int(row.uniq)}
    links = [{"id": r.id, "url": r.url, "total": int(r.total), "unique": int(r.uniq)}
             for r in conn.execute(sa.text("""
        SELECT l.id, l.url, count(e.id) AS total, count(DISTINCT e.job_id) AS uniq
          FROM campaign_links l
          LEFT JOIN campaign_events e ON e.link_id = l.id
         WHERE l.campaign_id = :c
         GROUP BY l.id, l.url ORDER BY count(e.id) DESC, l.id LIMIT :n"""),
        {"c": campaign_id, "n": MAX_LINKS})]
    timeline = [{"at": r.at, "opens": int(r.opens), "unique_opens": int(r.unique_opens),
                 "clicks": int(r.clicks), "unique_clicks": int(r.unique_clicks)}
                for r in conn.execute(sa.text("""
        SELECT * FROM (
            SELECT date_trunc(:by, at, 'UTC') AS at,
                   count(*) FILTER (WHERE kind = 'open') AS opens,
                   count(DISTINCT job_id) FILTER (WHERE kind = 'open') AS unique_opens,
                   count(*) FILTER (WHERE kind = 'click') AS clicks,
                   count(DISTINCT job_id) FILTER (WHERE kind = 'click') AS unique_clicks
              FROM campaign_events WHERE campaign_id = :c
             GROUP BY 1 ORDER BY 1 DESC LIMIT :n) t ORDER BY at"""),
        {"c": campaign_id, "by": by, "n": MAX_BUCKETS})]
    unsubscribes = conn.execute(sa.text("""
        SELECT count(DISTINCT target) FROM audit_log
         WHERE action = 'subscriber.unsubscribe' AND details->>'campaign' = :c"""),
        {"c": str(campaign_id)}).scalar_one()
    audience = campaign.get("audience") or {}
    return {
        "campaign_id": campaign_id,
        "tracking": settings,
        "sent": int(campaign["counts"].get(SENT, 0)),
        "opens": totals["opens"], "clicks": totals["clicks"],
        "links": links, "by": by, "timeline": timeline,
        "unsubscribes": int(unsubscribes),
        "bounces": int(campaign["counts"].get(BOUNCED, 0)),
        "complaints": int(audience.get("complaints") or 0),
    }
