"""Following the unsubscribe link of a message: who it names, and their preference page
. The links themselves are signed by the engine
(:mod:`workers.building.links`).

Leaving a list is per list: the membership is deleted and a ``list_unsubscribes`` row
keeps who left, when, how and from which campaign's message. The person stays on their
other lists and is not put on the suppression list. Nothing adds the membership back but
a new confirmed consent through the list's public form (double opt-in,
:func:`webapp.domain.subscriptions.confirm`), and a CSV import or a marketer's addition
skips them (:mod:`webapp.domain.lists`). The link of a message with no list (a campaign
deleted since) leaves every list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit
from webapp.domain.errors import Invalid, NotFound
from workers.building.links import read_token
from workers.core.i18n import N_

LOCALES = ("en", "es")


def recipient_for(conn: Connection, secret_key: str, token: str) -> dict[str, Any] | None:
    """The subscriber a genuine link names (id, email, status, locale, suppressed; the
    sender, list and campaign the message came from; the lists they are on and those they
    left), or None for a forged, broken or stale link (the subscriber no longer exists)."""
    read = read_token(secret_key, token)
    if read is None:
        return None
    row = conn.execute(sa.text("""
        SELECT s.id, s.email, s.status, s.locale, s.tracking,
               EXISTS (SELECT 1 FROM suppressions x WHERE x.email = lower(s.email))
                   AS suppressed,
               c.name AS campaign_name, c.from_addr AS sender, l.id AS list_id,
               l.name AS list_name,
               EXISTS (SELECT 1 FROM memberships m WHERE m.list_id = l.id
                          AND m.subscriber_id = s.id) AS on_list
          FROM subscribers s
          LEFT JOIN campaigns c ON c.id = CAST(:campaign AS bigint)
          LEFT JOIN lists l ON l.id = c.list_id
         WHERE s.id = :id"""), {"id": read[0], "campaign": read[1]}).mappings().first()
    if row is None:
        return None
    return {**row, "campaign_id": read[1], "lists": lists_of(conn, row["id"]),
            "left": left_lists(conn, row["id"])}


def lists_of(conn: Connection, subscriber_id: int) -> list[dict[str, Any]]:
    """The lists the subscriber is on, by name."""
    return [dict(r) for r in conn.execute(sa.text("""
        SELECT l.id, l.name FROM memberships m JOIN lists l ON l.id = m.list_id
         WHERE m.subscriber_id = :s ORDER BY lower(l.name), l.id"""),
        {"s": subscriber_id}).mappings()]


def left_lists(conn: Connection, subscriber_id: int) -> list[dict[str, Any]]:
    """The lists the subscriber left (and has not joined again), by name."""
    return [dict(r) for r in conn.execute(sa.text("""
        SELECT l.id, l.name, u.created_at FROM list_unsubscribes u
          JOIN lists l ON l.id = u.list_id
         WHERE u.subscriber_id = :s ORDER BY lower(l.name), l.id"""),
        {"s": subscriber_id}).mappings()]


def leave(conn: Connection, subscriber_id: int, list_ids: Sequence[int] | None, *,
          via: str, campaign_id: int | None = None) -> list[str]:
    """Take the subscriber off ``list_ids`` (None: every list they are on), keeping a
    ``list_unsubscribes`` row for each. Returns the names of the lists actually left
    (empty when they were on none of them): idempotent."""
    left = conn.execute(sa.text("""
        WITH gone AS (
            DELETE FROM memberships
             WHERE subscriber_id = :s
               AND (CAST(:lists AS bigint[]) IS NULL OR list_id = ANY(CAST(:lists AS bigint[])))
            RETURNING list_id
        ), kept AS (
            INSERT INTO list_unsubscribes (list_id, subscriber_id, campaign_id, via)
            SELECT list_id, :s, :c, :via FROM gone
            ON CONFLICT (list_id, subscriber_id) DO UPDATE
               SET campaign_id = EXCLUDED.campaign_id, via = EXCLUDED.via, created_at = now()
        ), hooks AS (
            -- The ``unsubscribed`` event for the event webhooks (as migration 0015's
            -- trigger queues it for a suppression), naming the list left.
            INSERT INTO webhook_deliveries (endpoint_id, event, payload)
            SELECT e.id, 'unsubscribed', jsonb_build_object(
                     'type', 'message.unsubscribed',
                     'timestamp', to_char(now() AT TIME ZONE 'UTC',
                                          'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                     'data', jsonb_build_object(
                         'event', 'unsubscribed', 'email', s.email, 'reason', :via,
                         'list_id', g.list_id, 'campaign_id', CAST(:c AS bigint)))
              FROM gone g JOIN subscribers s ON s.id = :s
              JOIN webhook_endpoints e ON e.enabled AND 'unsubscribed' = ANY(e.events)
                   AND cardinality(e.kinds) = 0
        )
        SELECT l.id, l.name FROM gone g JOIN lists l ON l.id = g.list_id
         ORDER BY lower(l.name), l.id"""),
        {"s": subscriber_id, "lists": None if list_ids is None else list(list_ids),
         "c": campaign_id, "via": via}).all()
    for list_id, _name in left:
        audit.record(conn, f"recipient ({via})", "subscriber.unsubscribe",
                     f"subscriber:{subscriber_id}", list=list_id, campaign=campaign_id)
    return [name for _id, name in left]


def _genuine(conn: Connection, secret_key: str, token: str) -> dict[str, Any]:
    recipient = recipient_for(conn, secret_key, token)
    if recipient is None:
        raise NotFound(N_("this unsubscribe link is not valid"))
    return recipient


def unsubscribe(conn: Connection, secret_key: str, token: str, *, via: str) -> dict[str, Any]:
    """Take the recipient a genuine link names off the list the message came from (every
    list when it names none). The result has ``left_now``: the names of the lists left.
    Idempotent. Raises NotFound for a link that is not genuine."""
    recipient = _genuine(conn, secret_key, token)
    lists = None if recipient["list_id"] is None else [recipient["list_id"]]
    names = leave(conn, recipient["id"], lists, via=via, campaign_id=recipient["campaign_id"])
    return {**recipient, "left_now": names, "lists": lists_of(conn, recipient["id"])}


def update(conn: Connection, secret_key: str, token: str, *, leave_ids: Sequence[int],
           leave_all: bool, locale: str | None,
           tracking: bool | None = None) -> dict[str, Any]:
    """The preference page's form: leave the chosen lists (or all), set the language and
    the consent to open and click tracking (None: unchanged). ``left_now`` names the lists
    left, ``locale_changed`` says whether the language did."""
    recipient = _genuine(conn, secret_key, token)
    if locale is not None and locale not in LOCALES:
        raise Invalid(N_("choose English or Spanish"), fields={"locale": N_("unknown")})
    on = {item["id"] for item in recipient["lists"]}
    if not leave_all and any(i not in on for i in leave_ids):
        raise Invalid(N_("you are not on that list"), fields={"lists": N_("not on it")})
    names: list[str] = []
    if leave_all or leave_ids:
        names = leave(conn, recipient["id"], None if leave_all else list(leave_ids),
                      via="preference page", campaign_id=recipient["campaign_id"])
    changed = locale is not None and locale != recipient["locale"]
    if changed:
        conn.execute(sa.text("UPDATE subscribers SET locale = :loc WHERE id = :id"),
                     {"loc": locale, "id": recipient["id"]})
        audit.record(conn, "recipient (preference page)", "subscriber.locale",
                     f"subscriber:{recipient['id']}", locale=locale)
    if tracking is not None and tracking != recipient["tracking"]:
        conn.execute(sa.text("UPDATE subscribers SET tracking = :t WHERE id = :id"),
                     {"t": tracking, "id": recipient["id"]})
        audit.record(conn, "recipient (preference page)", "subscriber.tracking",
                     f"subscriber:{recipient['id']}", tracking=tracking)
        recipient = {**recipient, "tracking": tracking}
    return {**recipient, "left_now": names, "locale_changed": changed,
            "locale": locale if changed else recipient["locale"],
            "lists": lists_of(conn, recipient["id"]), "left": left_lists(conn, recipient["id"])}
