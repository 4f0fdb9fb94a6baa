"""The campaign lifecycle: pause, resume and cancel, each one small statement on the
campaign row at any size (SPEC 17), and the periodic service that settles a cancelled
campaign's waiting jobs afterwards in bounded chunks.

The decision is the campaign's status: the claim takes a broadcast's jobs only while its
campaign is `sending` (workers.queue._CLAIM), so from the commit of a pause or a cancel no
claim that starts later hands out one of its jobs, however many are still `pending`. A
cancel then leaves the jobs to :class:`Settler`, which moves them `pending | retry →
cancelled` (legal moves of :data:`workers.states.TRANSITIONS`) ten thousand at a time,
each chunk its own short transaction, while the counters (kept by the same statements)
stay exact: the page shows "cancelling: N left" from them until N is 0.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from workers.core.states import CANCELLED, CLAIMABLE, Campaign, sql_list

log = logging.getLogger("senddock.lifecycle")

# One statement: the campaign row moves (only from the states given, so a concurrent move
# makes this one a no-op) and the audit entry is written with it. It never touches a job,
# so it costs the same for ten recipients or ten million. Pausing records the reason (a
# marketer's pause has none); resuming clears it; cancelling stamps the finish.
_MOVE = sa.text(f"""
WITH moved AS (
    UPDATE campaigns
       SET status = :to, updated_at = now(),
           paused_reason = CASE WHEN :to = '{Campaign.PAUSED}' THEN CAST(:reason AS text)
                                WHEN :to = '{Campaign.SENDING}' THEN NULL ELSE paused_reason END,
           finished_at = CASE WHEN :to = '{Campaign.CANCELLED}' THEN now() ELSE finished_at END,
           scheduled_at = CASE WHEN :to = '{Campaign.CANCELLED}' THEN NULL ELSE scheduled_at END
     WHERE id = :id AND status = ANY(CAST(:from AS text[]))
    RETURNING id
)
INSERT INTO audit_log (actor, action, target, details)
SELECT :actor, :action, 'campaign:' || id, CAST(:details AS jsonb) FROM moved
RETURNING id
""")


def _move(conn: Connection, campaign_id: int, *, to: str, action: str, actor: str,
          reason: str | None = None) -> bool:
    sources = [s for s, targets in Campaign.TRANSITIONS.items() if to in targets]
    details = {"reason": reason} if reason else {}
    return conn.execute(_MOVE, {"id": campaign_id, "to": to, "from": sources,
                                "reason": reason, "actor": actor, "action": action,
                                "details": json.dumps(details)}).first() is not None


def pause_campaign(conn: Connection, campaign_id: int, reason: str | None,
                   actor: str) -> bool:
    """Pause a sending campaign (a marketer's button, the relay refusing its From, the
    complaint guard): nothing new is claimed from the commit on; in-flight messages
    finish. ``reason`` is shown on its page (None for a person's pause). True if this call
    paused it (False: it was not sending)."""
    return _move(conn, campaign_id, to=Campaign.PAUSED, action="campaign.pause",
                 actor=actor, reason=reason[:1000] if reason else None)


def resume_campaign(conn: Connection, campaign_id: int, actor: str) -> bool:
    """Claim a paused campaign's jobs again (idle workers are woken at commit)."""
    if not _move(conn, campaign_id, to=Campaign.SENDING, action="campaign.resume",
                 actor=actor):
        return False
    conn.execute(sa.text("SELECT pg_notify('senddock_jobs', 'broadcast')"))
    return True


def cancel_campaign(conn: Connection, campaign_id: int, actor: str) -> bool:
    """Cancel a campaign that has not finished: from the commit on none of its jobs is
    claimed; the waiting ones become `cancelled` shortly after (:class:`Settler`)."""
    return _move(conn, campaign_id, to=Campaign.CANCELLED, action="campaign.cancel",
                 actor=actor)


# --- settling a cancelled campaign's jobs ----------------------------------------------

# Cancelled campaigns that still have waiting jobs, from the exact counters (a cancelled
# campaign with none left costs one counter lookup).
_TO_SETTLE = sa.text(f"""
SELECT b.id, w.n FROM campaigns c JOIN broadcasts b ON b.id = c.broadcast_id
 CROSS JOIN LATERAL (
    SELECT coalesce(sum(bc.n), 0) AS n FROM broadcast_counts bc
     WHERE bc.broadcast_id = b.id AND bc.status IN {sql_list(CLAIMABLE)}) w
 WHERE c.status = '{Campaign.CANCELLED}' AND w.n > 0
 ORDER BY b.id
""")

#: Consecutive job ids one stream of the settler takes before the next stream's stripe: the
#: streams write different heap pages.
STRIPE = 1024

# One chunk: the next waiting jobs along delivery_jobs_broadcast_due_idx after the cursor
# (a keyset, so each chunk reads only its own entries, never the ones already settled);
# they become `cancelled` (a legal move from `pending` and `retry`; the UPDATE re-checks
# the state under the row lock, so a job a rescue is moving is settled as it ends up), and
# the count triggers move them between the counters in the same statement. No FOR UPDATE
# first: locking each row before updating it cost a WAL record per job (20 % of the
# chunk). The ids go to the UPDATE as one array (a primary-key probe each): as a join the
# planner merged it with the primary key read from its start, so every chunk read all the
# rows before it (a 1M cancel settled 10,000 rows per 25 s). Returns how many moved and
# where the chunk ended. With several streams (:class:`Settler`), stream ``part`` of
# ``parts`` takes only its stripes of ids.
_SETTLE_CHUNK = sa.text(f"""
WITH chunk AS MATERIALIZED (
    SELECT id, available_at FROM delivery_jobs
     WHERE broadcast_id = :broadcast_id AND status IN {sql_list(CLAIMABLE)}
       AND (available_at, id) > (CAST(:after_at AS timestamptz), CAST(:after_id AS bigint))
       AND (id / {STRIPE}) % CAST(:parts AS bigint) = :part
     ORDER BY available_at, id LIMIT :n
), settled AS (
    UPDATE delivery_jobs j
       SET status = '{CANCELLED}', finished_at = now(), claimed_by = NULL, claim_token = NULL
     WHERE j.id = ANY(ARRAY(SELECT id FROM chunk)) AND j.status IN {sql_list(CLAIMABLE)}
    RETURNING j.id
)
SELECT (SELECT count(*) FROM settled) AS n, last.available_at, last.id
  FROM (SELECT 1) one
  LEFT JOIN (SELECT available_at, id FROM chunk ORDER BY available_at DESC, id DESC LIMIT 1)
       last ON true
""")

#: Where a cursor starts: before every job.
START = ("-infinity", 0)


@dataclass
class SettleChunk:
    settled: int
    last: tuple[datetime | str, int] | None


def settle_chunk(conn: Connection, broadcast_id: int, after: tuple[datetime | str, int],
                 n: int, *, part: int = 0, parts: int = 1) -> SettleChunk:
    """Cancel up to ``n`` waiting jobs of ``broadcast_id`` after the keyset ``after``
    (in the caller's transaction); of stream ``part`` of ``parts`` (its stripes of ids)."""
    custom_plan(conn)
    row = conn.execute(_SETTLE_CHUNK, {"broadcast_id": broadcast_id, "after_at": after[0],
                                       "after_id": after[1], "n": n, "part": part,
                                       "parts": parts}).one()
    last = (row.available_at, int(row.id)) if row.id is not None else None
    return SettleChunk(int(row.n), last)


def custom_plan(conn: Connection) -> None:
    """Plan this transaction's chunk statements for their own cursor values. psycopg
    prepares a statement run five times on a session, and PostgreSQL may then use one
    generic plan for every cursor: in the 1M bench some settle chunks took 40 s instead of
    1 s that way."""
    conn.execute(sa.text("SET LOCAL plan_cache_mode = force_custom_plan"))


def to_settle(conn: Connection) -> dict[int, int]:
    """{broadcast id: jobs still waiting} for every cancelled campaign not settled yet."""
    return {int(r.id): int(r.n) for r in conn.execute(_TO_SETTLE)}


@dataclass
class Settler:
    """The periodic service that settles cancelled campaigns (one per maintenance pool;
    several at once only skip each other's locked rows). Each tick works for at most
    ``budget`` seconds in chunks of ``chunk`` jobs, each its own transaction, so it never
    holds many locks or a long snapshot, and sending (other campaigns, transactional mail)
    goes on between chunks. ``streams`` sessions can settle at once, each its own stripes
    of the campaign's ids. One by default: a row's new version, its index entries and its
    WAL are the cost (the triggers are a sixth of it); two sessions on contiguous id
    ranges settled 27,000 jobs/s where one gave 19,000 (1M table, loaded machine), but
    the striped streams were not faster than one at 10M (each reads the other's entries
    and visits their rows; docs/performance.md), so they stay an option until measured.
    """

    engine: Engine
    chunk: int = 10_000
    budget: float = 5.0
    streams: int = 1
    stopping: threading.Event = field(default_factory=threading.Event)
    # (broadcast id, stream) -> where its last chunk ended (start again from the top at
    # the end: a job skipped while locked, or put back to `pending` by a rescue, is
    # behind it).
    cursors: dict[tuple[int, int], tuple[datetime | str, int]] = field(default_factory=dict)

    def tick(self) -> int:
        """Settle for up to ``budget`` seconds; returns how many jobs were cancelled."""
        deadline = time.monotonic() + self.budget
        with self.engine.connect() as conn:
            waiting = to_settle(conn)
        self.cursors = {k: c for k, c in self.cursors.items() if k[0] in waiting}
        if not waiting:
            return 0
        if self.streams == 1:
            total = self._stream(list(waiting), 0, deadline)
        else:
            with ThreadPoolExecutor(self.streams, thread_name_prefix="settler") as pool:
                total = sum(f.result() for f in [
                    pool.submit(self._stream, list(waiting), part, deadline)
                    for part in range(self.streams)])
        if total:
            log.info("settled %d job(s) of cancelled campaigns", total)
        return total

    def _stream(self, waiting: list[int], part: int, deadline: float) -> int:
        total = 0
        for broadcast_id in waiting:
            key = (broadcast_id, part)
            while time.monotonic() < deadline and not self.stopping.is_set():
                with self.engine.begin() as conn:
                    done = settle_chunk(conn, broadcast_id, self.cursors.get(key, START),
                                        self.chunk, part=part, parts=self.streams)
                total += done.settled
                if done.last is None:  # the end of its range: from the top next time
                    self.cursors.pop(key, None)
                    break
                self.cursors[key] = done.last
        return total
