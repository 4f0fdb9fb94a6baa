"""The audit log: who did what, when."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain.errors import Invalid
from workers.core.i18n import N_

#: The longest search the audit filters take (an address is at most 320 characters): a
#: 60,000-character pattern held the request for seconds.
MAX_FILTER = 320


def record(conn: Connection, actor: str, action: str, target: str = "",
           **details: Any) -> None:
    """Append one entry in the caller's transaction, so the log and the change it describes
    commit (or roll back) together."""
    conn.execute(sa.text("INSERT INTO audit_log (actor, action, target, details) "
                         "VALUES (:actor, :action, :target, CAST(:details AS jsonb))"),
                 {"actor": actor, "action": action, "target": target,
                  "details": json.dumps(details, default=str)})


def entries(conn: Connection, *, actor: str | None = None, action: str | None = None,
            limit: int = 100, before_id: int | None = None, target: str | None = None,
            since: datetime | None = None, until: datetime | None = None,
            ) -> list[dict[str, Any]]:
    """Newest first; ``action`` matches exactly or as a prefix ending in '.' (``job.``),
    ``target`` exactly (an address, ``job:42``, ``user:7``); ``before_id`` pages. A filter
    over :data:`MAX_FILTER` characters is :class:`Invalid`."""
    for name, value in (("actor", actor), ("action", action), ("target", target)):
        if value is not None and len(value) > MAX_FILTER:
            raise Invalid(N_("at most %(max)s characters", max=str(MAX_FILTER)),
                          fields={name: N_("at most %(max)s characters", max=str(MAX_FILTER))})
    rows = conn.execute(sa.text("""
        SELECT id, at, actor, action, target, details FROM audit_log
         WHERE (CAST(:actor AS text) IS NULL OR actor ILIKE '%' || :actor || '%')
           AND (CAST(:action AS text) IS NULL OR action = :action
                OR (right(:action, 1) = '.' AND starts_with(action, :action)))
           AND (CAST(:target AS text) IS NULL OR target = :target)
           AND (CAST(:since AS timestamptz) IS NULL OR at >= :since)
           AND (CAST(:until AS timestamptz) IS NULL OR at < :until)
           AND (CAST(:before AS bigint) IS NULL OR id < :before)
         ORDER BY id DESC LIMIT :limit"""),
        {"actor": actor, "action": action, "before": before_id, "limit": limit,
         "target": target, "since": since, "until": until})
    return [dict(r) for r in rows.mappings()]
