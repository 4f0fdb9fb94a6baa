"""Retention and erasure: old jobs deleted in chunks with the counters kept (P8), and an
erased address taken out of every job (docs/privacy.md)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.states import (
    CANCELLED,
    PROBLEM,
    SENT,
    SKIPPED,
    TERMINAL,
    sql_list,
)
from workers.queue.common import custom_plan

# Retention (workers.delivery.retention).
#: A rolled-up campaign keeps its jobs in these states (and any job with an event).
KEPT = PROBLEM
#: ... and drops these.
DROPPED: tuple[str, ...] = (SENT, CANCELLED, SKIPPED)


def _put_back(counters: str, key: str) -> str:
    """Add the deleted rows (``gone``) back to the counters the delete trigger took them
    from, in the same statement: the counts describe what was sent, not what is stored."""
    return f"""
    INSERT INTO {counters} AS c ({key}, status, slot, n)
    SELECT {key}, status, pg_backend_pid() % 16, count(*) FROM gone
     GROUP BY {key}, status ORDER BY {key}, status
    ON CONFLICT ({key}, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n"""


# One chunk of a campaign: its next finished jobs along
# delivery_jobs_broadcast_finished_idx after the (finished_at, id) cursor; the ones in a
# dropped state with no feedback event are deleted (by id array: a primary-key probe each,
# never a merge with the whole key), and what the count trigger subtracts for them is
# added back in the same statement, so the counters never move (P8).
_CAMPAIGN_CHUNK = sa.text(f"""
WITH chunk AS MATERIALIZED (
    SELECT id, finished_at, status FROM delivery_jobs
     WHERE broadcast_id = :broadcast_id AND finished_at IS NOT NULL
       AND (finished_at, id) > (CAST(:after_at AS timestamptz), CAST(:after_id AS bigint))
     ORDER BY finished_at, id LIMIT :n
), gone AS (
    DELETE FROM delivery_jobs j
     WHERE j.id = ANY(ARRAY(SELECT id FROM chunk)) AND j.status IN {sql_list(DROPPED)}
       AND NOT EXISTS (SELECT 1 FROM job_events e WHERE e.job_id = j.id)
    RETURNING j.broadcast_id, j.status
), kept AS ({_put_back("broadcast_counts", "broadcast_id")})
SELECT (SELECT count(*) FROM gone) AS n, last.finished_at, last.id
  FROM (SELECT 1) one
  LEFT JOIN (SELECT finished_at, id FROM chunk ORDER BY finished_at DESC, id DESC LIMIT 1)
       last ON true
""")

# One chunk of transactional jobs: finished ones of one kind created before the cutoff,
# oldest first along delivery_jobs_kind_created_idx; the per-kind counters are put back
# the same way.
_TRANSACTIONAL_CHUNK = sa.text(f"""
WITH gone AS (
    DELETE FROM delivery_jobs j
     WHERE j.id = ANY(ARRAY(SELECT id FROM delivery_jobs
                     WHERE kind <> 'broadcast' AND kind = :kind
                       AND created_at < now() - CAST(:days AS float8) * interval '1 day'
                       AND status IN {sql_list(TERMINAL)}
                     ORDER BY created_at LIMIT :n FOR UPDATE SKIP LOCKED))
       AND j.status IN {sql_list(TERMINAL)}
    RETURNING j.kind, j.status
), kept AS ({_put_back("kind_counts", "kind")})
SELECT count(*) FROM gone
""")


def delete_transactional_chunk(conn: Connection, kind: str, days: float, n: int) -> int:
    """Delete up to ``n`` finished jobs of ``kind`` created more than ``days`` ago (in the
    caller's transaction); returns how many."""
    custom_plan(conn)
    return int(conn.execute(_TRANSACTIONAL_CHUNK, {"kind": kind, "days": days, "n": n}
                            ).scalar_one())


def roll_up_chunk(conn: Connection, broadcast_id: int, after: tuple[datetime | str, int],
                  n: int) -> tuple[int, tuple[datetime, int] | None]:
    """Delete the dropped rows among the next ``n`` finished jobs of the broadcast after
    the keyset ``after``; returns (rows deleted, where the chunk ended or None at the end)."""
    custom_plan(conn)
    row = conn.execute(_CAMPAIGN_CHUNK, {"broadcast_id": broadcast_id, "after_at": after[0],
                                         "after_id": after[1], "n": n}).one()
    return int(row.n), ((row.finished_at, int(row.id)) if row.id is not None else None)


# --- personal data (docs/privacy.md) ---------------------------------------------------
# An erased address leaves its jobs' rows and counts (P8) but not the address: the jobs
# take a placeholder, lose their payload and user, and a reply text naming the address has
# it replaced. `address` is lower-cased; `pattern` matches it in text.
_ERASE_ADDRESS = sa.text("""
UPDATE delivery_jobs SET email = :p, payload = '{}'::jsonb, user_ref = NULL,
       last_error = regexp_replace(last_error, :rx, '[erased]', 'gi')
 WHERE lower(email) = :e RETURNING id
""")


def erase_address(conn: Connection, address: str, placeholder: str, pattern: str
                  ) -> list[int]:
    """Take ``address`` out of every job that has it; returns their ids."""
    return [int(i) for i in conn.execute(_ERASE_ADDRESS, {
        "p": placeholder, "e": address, "rx": pattern}).scalars()]
