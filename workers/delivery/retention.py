"""Retention (docs/design.md §26): the jobs table's size follows the settings, not history.

A campaign finished more than ``SENDDOCK_RETENTION_CAMPAIGN_DAYS`` ago is *rolled up*: the
per-recipient rows of mail that went out (or was cancelled or skipped) are deleted, while
its counters stay exactly what they were (the delete puts back what the count trigger
takes off, in the same statement), its failed and bounced jobs stay (the inbox, retries),
and so does every job a feedback event points at (complaints, bounce reports). Its
suppressions stay in the suppression list. Transactional jobs are deleted once finished
and older than ``SENDDOCK_RETENTION_TRANSACTIONAL_DAYS`` (their per-kind counters kept
the same way). 0 keeps rows forever.

The engine runs it as a periodic service in bounded chunks, each its own short
transaction along an index (a keyset, so a chunk reads only its own entries), so it never
holds a long lock or snapshot and sending goes on between chunks. Why batched deletes and
not partitions: docs/scale-out.md, "Retention", with the figures.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from workers.core.states import Campaign, sql_list
from workers.queue import (  # noqa: F401 (KEPT, DROPPED, roll_up_chunk: callers)
    DROPPED,
    KEPT,
    delete_transactional_chunk,
    roll_up_chunk,
)

log = logging.getLogger("senddock.retention")


# Finished campaigns older than the setting and not rolled up yet (a handful per day).
_CAMPAIGNS_DUE = sa.text(f"""
SELECT b.id FROM broadcasts b JOIN campaigns c ON c.id = b.campaign_id
 WHERE b.rolled_up_at IS NULL AND b.finished_at < now() - CAST(:days AS float8) * interval '1 day'
   AND c.status IN {sql_list((Campaign.SENT, Campaign.CANCELLED))}
 ORDER BY b.id LIMIT 100
""")

_ROLLED_UP = sa.text("UPDATE broadcasts SET rolled_up_at = now() WHERE id = :id")

# Submitted messages (docs/smtp.md) whose jobs are all gone. A message's jobs are created
# in its own transaction, so they share its created_at: each message asks
# delivery_jobs_kind_created_idx once per kind, never scans the jobs.
_SUBMITTED_CHUNK = sa.text("""
WITH gone AS (
    DELETE FROM smtp_messages m
     WHERE m.id = ANY(ARRAY(SELECT id FROM smtp_messages
                     WHERE created_at < now() - CAST(:days AS float8) * interval '1 day'
                     ORDER BY created_at LIMIT :n FOR UPDATE SKIP LOCKED))
       AND NOT EXISTS (SELECT 1 FROM delivery_jobs j
                        WHERE j.kind IN (SELECT name FROM kinds) AND j.kind <> 'broadcast'
                          AND j.created_at = m.created_at
                          AND j.payload -> 'data' ->> 'smtp_message_id' = m.id::text)
    RETURNING 1
)
SELECT count(*) FROM gone
""")

_KINDS = sa.text("SELECT DISTINCT kind FROM kind_counts WHERE n <> 0 ORDER BY kind")

START = ("-infinity", 0)


@dataclass
class Retention:
    """The periodic retention service (on maintenance pools). ``tick`` works for at most
    ``budget`` seconds in chunks of ``chunk`` rows, each its own transaction."""

    engine: Engine
    campaign_days: float
    transactional_days: float
    chunk: int = 5_000
    budget: float = 5.0
    stopping: threading.Event = field(default_factory=threading.Event)
    cursors: dict[int, tuple[datetime | str, int]] = field(default_factory=dict)

    def _more_time(self, deadline: float) -> bool:
        return time.monotonic() < deadline and not self.stopping.is_set()

    def tick(self) -> dict[str, int]:
        """Run for up to ``budget`` seconds; returns rows deleted and campaigns rolled up."""
        deadline = time.monotonic() + self.budget
        done = {"campaign_rows": 0, "campaigns": 0, "transactional_rows": 0}
        if self.campaign_days > 0:
            self._campaigns(deadline, done)
        if self.transactional_days > 0:
            self._transactional(deadline, done)
            self._submitted(deadline, done)
        if any(done.values()):
            log.info("retention: %s", done)
        return done

    def _campaigns(self, deadline: float, done: dict[str, int]) -> None:
        with self.engine.connect() as conn:
            due = list(conn.execute(_CAMPAIGNS_DUE, {"days": self.campaign_days}).scalars())
        for broadcast_id in due:
            while self._more_time(deadline):
                with self.engine.begin() as conn:
                    row = roll_up_chunk(conn, broadcast_id,
                                        self.cursors.get(broadcast_id, START), self.chunk)
                    done["campaign_rows"] += row[0]
                    if row[1] is None:
                        conn.execute(_ROLLED_UP, {"id": broadcast_id})
                        done["campaigns"] += 1
                        self.cursors.pop(broadcast_id, None)
                        break
                self.cursors[broadcast_id] = row[1]

    def _transactional(self, deadline: float, done: dict[str, int]) -> None:
        with self.engine.connect() as conn:
            kinds = list(conn.execute(_KINDS).scalars())
        for kind in kinds:
            while self._more_time(deadline):
                with self.engine.begin() as conn:
                    n = delete_transactional_chunk(conn, kind, self.transactional_days,
                                                   self.chunk)
                done["transactional_rows"] += n
                if n < self.chunk:
                    break

    def _submitted(self, deadline: float, done: dict[str, int]) -> None:
        """Stored SMTP messages none of whose jobs remain (``submitted_messages`` in
        ``done`` when there were any)."""
        while self._more_time(deadline):
            with self.engine.begin() as conn:
                n = int(conn.execute(_SUBMITTED_CHUNK, {
                    "days": self.transactional_days, "n": self.chunk}).scalar_one())
            if n:
                done["submitted_messages"] = done.get("submitted_messages", 0) + n
            if n < self.chunk:
                break




def forget_expired_imports(conn: Connection) -> int:
    """Delete the CSV files checked first and never imported, once they expired (their
    chunks go with them): docs/design.md §35."""
    return int(conn.execute(sa.text(
        "DELETE FROM import_uploads WHERE expires_at <= now()")).rowcount)
