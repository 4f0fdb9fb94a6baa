"""Following an unsubscribe link: who it names, and putting them on the suppression list
(docs/design.md §20). The links themselves are signed by the engine
(:mod:`workers.building.links`)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit, suppressions
from webapp.domain.errors import NotFound
from workers.building.links import read_token
from workers.core.i18n import N_


def recipient_for(conn: Connection, secret_key: str, token: str) -> dict[str, Any] | None:
    """The subscriber a genuine link names (id, email, status, suppressed; and the sender,
    list and campaign it came from, so the page can say what stops), or None for a forged,
    broken or stale link (the subscriber no longer exists)."""
    read = read_token(secret_key, token)
    if read is None:
        return None
    row = conn.execute(sa.text("""
        SELECT s.id, s.email, s.status,
               EXISTS (SELECT 1 FROM suppressions x WHERE x.email = lower(s.email))
                   AS suppressed,
               c.name AS campaign_name, c.from_addr AS sender, l.name AS list_name
          FROM subscribers s
          LEFT JOIN campaigns c ON c.id = CAST(:campaign AS bigint)
          LEFT JOIN lists l ON l.id = c.list_id
         WHERE s.id = :id"""), {"id": read[0], "campaign": read[1]}).mappings().first()
    return None if row is None else {**row, "campaign_id": read[1]}


def unsubscribe(conn: Connection, secret_key: str, token: str, *, via: str) -> dict[str, Any]:
    """Unsubscribe the recipient a genuine link names: their address goes on the suppression
    list (reason ``unsubscribed``; an existing entry is kept) and the subscriber is marked
    ``unsubscribed``, so no later campaign reaches them. Idempotent. Raises NotFound for a
    link that is not genuine."""
    recipient = recipient_for(conn, secret_key, token)
    if recipient is None:
        raise NotFound(N_("this unsubscribe link is not valid"))
    actor = f"recipient ({via})"
    note = f"campaign {recipient['campaign_id']}" if recipient["campaign_id"] else ""
    suppressions.suppress(conn, recipient["email"], "unsubscribed", note=note, actor=actor)
    changed = conn.execute(sa.text("UPDATE subscribers SET status = 'unsubscribed' "
                                   "WHERE id = :id AND status = 'active'"),
                           {"id": recipient["id"]}).rowcount
    if changed:
        audit.record(conn, actor, "subscriber.unsubscribe", f"subscriber:{recipient['id']}",
                     campaign=recipient["campaign_id"])
    return {**recipient, "status": "unsubscribed" if changed else recipient["status"],
            "suppressed": True}
