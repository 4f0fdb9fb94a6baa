"""A From address the relay refuses is paused and probed until the relay accepts it
(docs/design.md §17)."""

from __future__ import annotations

from email.utils import parseaddr
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.states import (
    Campaign,
)

# --- a refused From is probed until the relay accepts it (docs/design.md §17) ---------------------

SENDER_REFUSED = "the relay refuses this From address"

_REFUSE_SENDER = sa.text("""
INSERT INTO sender_refusals AS r (sender, last_reply, probe_recipient, next_probe_at)
VALUES (:sender, :reply, :recipient, now() + interval '2 seconds')
ON CONFLICT (sender) DO UPDATE
   SET last_reply = excluded.last_reply,
       probe_recipient = coalesce(excluded.probe_recipient, r.probe_recipient)
""")


def refuse_sender(conn: Connection, sender: str, reply: str,
                  recipient: str | None = None) -> None:
    """The relay refuses ``sender`` (a campaign's From, paused): probe it with the same MAIL
    FROM (and RCPT for ``recipient``: Postfix reports it there) until it is accepted. A
    refusal already known changes only its last reply (no escalation per thread)."""
    conn.execute(_REFUSE_SENDER, {"sender": sender.lower(), "reply": reply[:1000],
                                  "recipient": recipient})


# Exactly one process probes a refused sender at a time: it moves next_probe_at first
# (2, 4, 8 ... s up to :probe_max, escalated once per failed probe).
_TAKE_SENDER_PROBE = sa.text("""
UPDATE sender_refusals
   SET next_probe_at = now() + make_interval(secs => least(:probe_max,
                                                          power(2, least(failures, 10))))
 WHERE sender = (SELECT sender FROM sender_refusals WHERE next_probe_at <= now()
                  ORDER BY next_probe_at LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING sender, probe_recipient
""")


def take_sender_probe(conn: Connection, probe_max: float) -> tuple[str, str | None] | None:
    """A refused sender whose probe is due (and this caller's turn to probe it)."""
    row = conn.execute(_TAKE_SENDER_PROBE, {"probe_max": float(probe_max)}).first()
    return None if row is None else (row.sender, row.probe_recipient)


def sender_still_refused(conn: Connection, sender: str, reply: str) -> None:
    conn.execute(sa.text("UPDATE sender_refusals SET failures = failures + 1, "
                         "last_reply = :reply WHERE sender = :sender"),
                 {"sender": sender, "reply": reply[:1000]})


_PAUSED_FOR_SENDER = sa.text(f"""
SELECT id, from_addr FROM campaigns
 WHERE status = '{Campaign.PAUSED}' AND paused_reason LIKE :reason
""")


def sender_accepted(conn: Connection, sender: str) -> list[int]:
    """The relay accepts ``sender`` again: forget the refusal. Returns the campaigns
    SendDock paused for it (never one a person paused), for the caller to resume."""
    conn.execute(sa.text("DELETE FROM sender_refusals WHERE sender = :sender"),
                 {"sender": sender})
    return [int(row.id) for row in conn.execute(
        _PAUSED_FOR_SENDER, {"reason": f"{SENDER_REFUSED}%"}).all()
        if parseaddr(row.from_addr)[1].lower() == sender]


def sender_refusals(conn: Connection) -> list[dict[str, Any]]:
    """Refused From addresses being probed (Queue health, the alarm): sender, since when,
    the last reply, the failed probes and the next one."""
    rows = conn.execute(sa.text("SELECT sender, since, last_reply, failures, next_probe_at "
                                "FROM sender_refusals ORDER BY since LIMIT 50"))
    return [dict(r) for r in rows.mappings()]
