"""A recipient domain that throttles us is slowed, not failed; a streak of identical
refusals that was about us is given back to its jobs (docs/design.md §16)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.states import (
    PENDING,
    PROBLEM,
    RETRY,
    sql_list,
)
from workers.queue.common import BOUNCE_REASON

_THROTTLE_DOMAIN = sa.text("""
INSERT INTO domain_throttles AS t (domain, until, last_reply, hits)
VALUES (:domain, now() + make_interval(secs => :first), :reply, 1)
ON CONFLICT (domain) DO UPDATE
   SET hits = CASE WHEN t.until > now() - interval '10 minutes' THEN t.hits + 1 ELSE 1 END,
       last_reply = excluded.last_reply, updated_at = now()
 WHERE t.until <= now()
RETURNING hits
""")


def throttle_domain(conn: Connection, domain: str, reply: str,
                    backoff: Sequence[int]) -> float | None:
    """A recipient domain throttles us: its jobs wait for the next backoff step while the
    other domains keep flowing. A reply while the domain is already waiting (another
    thread's, a send started before the pause) changes nothing: returns None; else the
    seconds that domain now waits."""
    domain = domain.lower()
    hits = conn.execute(_THROTTLE_DOMAIN, {"domain": domain, "reply": reply[:1000],
                                           "first": float(backoff[0])}).scalar()
    if hits is None:
        return None
    delay = float(backoff[min(int(hits), len(backoff)) - 1])
    conn.execute(sa.text("UPDATE domain_throttles SET until = now() + make_interval(secs => :d) "
                         "WHERE domain = :domain"), {"d": delay, "domain": domain})
    return delay


def lift_domain_throttles(conn: Connection, domains: Sequence[str]) -> None:
    """Those domains were judged throttled for a reply that turned out to be the relay's
    (docs/design.md §17): their mail need not wait."""
    conn.execute(sa.text("DELETE FROM domain_throttles WHERE domain = ANY(:domains)"),
                 {"domains": [d.lower() for d in domains]})


def domain_throttles(conn: Connection) -> list[dict[str, Any]]:
    """Recipient domains slowed down now or in the last hour (Queue health): domain,
    until when, the last reply, how many throttles in a row, and whether it is active."""
    rows = conn.execute(sa.text("""
        SELECT domain, until, last_reply, hits, until > now() AS active FROM domain_throttles
         WHERE until > now() - interval '1 hour' ORDER BY until DESC, domain LIMIT 50"""))
    return [dict(r) for r in rows.mappings()]


def prune_domain_throttles(conn: Connection) -> None:
    """Forget the throttles that ended more than a day ago (Maintenance, hourly)."""
    conn.execute(sa.text("DELETE FROM domain_throttles WHERE until < now() - interval '1 day'"))


# --- the same refusal for many recipients in a row (docs/design.md §16) ---------------------------

# Undo what a streak of identical refusals charged to recipients before it was recognized
# as being about us: the jobs go back to `pending`, their attempt is given back, and a
# suppression a bounce among them made is lifted. Only jobs still in the state that refusal
# left them in are touched (an admin or a later attempt may have moved them since).
_REPRIEVE = sa.text(f"""
WITH r AS (
    UPDATE delivery_jobs
       SET status = '{PENDING}', attempts = greatest(0, attempts - 1), available_at = now(),
           finished_at = NULL, last_error = :reason, last_error_class = 'relay'
     WHERE id = ANY(CAST(:ids AS bigint[])) AND status IN {sql_list((*PROBLEM, RETRY))}
    RETURNING id
), s AS (
    DELETE FROM suppressions WHERE reason = '{BOUNCE_REASON}' AND job_id IN (SELECT id FROM r)
)
SELECT count(*) FROM r
""")


def reprieve_jobs(conn: Connection, job_ids: Sequence[int], reason: str) -> int:
    """Put back jobs wrongly charged for a refusal that was about us; returns how many."""
    if not job_ids:
        return 0
    return int(conn.execute(_REPRIEVE, {"ids": list(job_ids), "reason": reason[:1000]})
               .scalar_one())
