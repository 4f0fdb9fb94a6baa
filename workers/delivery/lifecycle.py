"""The campaign lifecycle: pause, resume and cancel, each one small statement on the
campaign row at any size (docs/design.md §26), and the periodic service that settles a cancelled
campaign's waiting jobs afterwards in bounded chunks.

The decision is the campaign's status: the claim takes a broadcast's jobs only while its
campaign is `sending` (workers.queue.claim), so from the commit of a pause or a cancel no
claim that starts later hands out one of its jobs, however many are still `pending`. A
cancel then leaves the jobs to :class:`Settler`, which moves them `pending | retry →
cancelled` (legal moves of :data:`workers.states.TRANSITIONS`) along the campaign's span
of ids, ten thousand ids at a time, each chunk its own short transaction, while the
counters (kept by the same statements) stay exact: the page shows "cancelling: N left"
from them until N is 0.

What the claim cannot stop are the jobs a worker claimed before the commit: a batch's
later messages. So a campaign message is also checked at the relay's 354, just before it
goes out (workers/delivery/send_guard.py): the process's guard session takes the
campaign's shared advisory lock and reads its status; a pause or a cancel takes the
exclusive lock before it moves the row (:func:`stop_sending`), so it waits for the
messages then inside an SMTP transaction (at most one per drain thread) and every later
check sees the new status. From
the commit on no campaign message starts; the ones in flight finish and are counted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from workers.core.states import CLAIMABLE, Campaign, sql_list
from workers.delivery.send_guard import guard_key
from workers.queue import custom_plan, settle_window  # noqa: F401 (settle_window: callers)

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


# --- the send guard ---------------------------------------------------------------------

# (Advisory locks are per database; pg_locks lists every database's.)
_IN_FLIGHT = sa.text("""
SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND mode = 'ShareLock'
   AND classid = CAST(:high AS oid) AND objid = CAST(:low AS oid)
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())""")


def stop_sending(conn: Connection, campaign_id: int) -> int:
    """In the caller's transaction: wait until no message of the campaign is inside an
    SMTP transaction, and keep any from starting until the transaction ends (a pause or a
    cancel then commits its status, which every later check sees). Returns how many
    processes were sending its messages when it was asked: their guard sessions held the
    lock (those in flight finish; at most one per drain thread)."""
    key = guard_key(campaign_id)
    in_flight = int(conn.execute(_IN_FLIGHT, {"high": key >> 32,
                                              "low": key & 0xFFFFFFFF}).scalar_one())
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
    return in_flight


def pause_campaign(conn: Connection, campaign_id: int, reason: str | None,
                   actor: str) -> bool:
    """Pause a sending campaign (a marketer's button, the relay refusing its From, the
    complaint guard): nothing new is claimed from the commit on; in-flight messages
    finish. ``reason`` is shown on its page (None for a person's pause). True if this call
    paused it (False: it was not sending)."""
    stop_sending(conn, campaign_id)
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
    claimed; the waiting ones become `cancelled` shortly after (:class:`Settler`), and
    no message of it starts any more (:func:`stop_sending`)."""
    stop_sending(conn, campaign_id)
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

# A cancelled campaign's jobs lie in one span of ids: the enqueue inserts them together
# and records the span on the broadcast (broadcasts.first_job_id / last_job_id, widened by
# every enqueue chunk). A broadcast enqueued before that was recorded has its span read
# once from its waiting jobs.
_SPAN = sa.text(f"""
SELECT coalesce(b.first_job_id, w.lo) AS lo, coalesce(b.last_job_id, w.hi) AS hi
  FROM broadcasts b
  LEFT JOIN LATERAL (
    SELECT min(j.id) AS lo, max(j.id) AS hi FROM delivery_jobs j
     WHERE j.broadcast_id = b.id AND j.status IN {sql_list(CLAIMABLE)}
       AND (b.first_job_id IS NULL OR b.last_job_id IS NULL)) w ON true
 WHERE b.id = :broadcast_id
""")

def settle_span(conn: Connection, broadcast_id: int) -> tuple[int, int] | None:
    """(first, last): the ids between which the broadcast's jobs lie; None if it has none
    waiting (and no recorded span)."""
    row = conn.execute(_SPAN, {"broadcast_id": broadcast_id}).first()
    if row is None or row.lo is None:
        return None
    return int(row.lo), int(row.hi)




def to_settle(conn: Connection) -> dict[int, int]:
    """{broadcast id: jobs still waiting} for every cancelled campaign not settled yet."""
    return {int(r.id): int(r.n) for r in conn.execute(_TO_SETTLE)}


@dataclass
class Sweep:
    """One pass over a cancelled broadcast's span of ids, handed out a window at a time
    (in id order) to whichever stream asks next: each stream's chunk reads its own heap
    pages, and no stream idles while another still has a long range left."""

    broadcast_id: int
    upto: int  # the span's last id
    next: int  # windows start after this id
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, size: int) -> tuple[int, int] | None:
        """The next window (after, upto], or None when the pass is over."""
        with self.lock:
            if self.next >= self.upto:
                return None
            window = (self.next, min(self.next + size, self.upto))
            self.next = window[1]
            return window

    def give_back(self, window: tuple[int, int]) -> None:
        """A window that was not settled (its transaction failed, or the tick ran out of
        time before it): taken again first."""
        with self.lock:
            self.next = min(self.next, window[0])


@dataclass
class Settler:
    """The periodic service that settles cancelled campaigns (one per maintenance pool;
    several at once only wait on each other's row locks). Each tick works for at most
    ``budget`` seconds in chunks of ``chunk`` consecutive ids, each its own transaction, so
    it never holds many locks or a long snapshot, and sending (other campaigns,
    transactional mail) goes on between chunks. ``streams`` sessions settle at once, each
    taking the next window of the campaign's span (measured: docs/performance.md). When a
    pass ends with jobs still waiting (one was `sending` when its window was settled and
    came back `pending`, or an enqueue chunk committed after the span was read), the next
    tick starts a new pass over the span read again.
    """

    engine: Engine
    chunk: int = 10_000
    budget: float = 5.0
    streams: int = 2
    stopping: threading.Event = field(default_factory=threading.Event)
    sweeps: dict[int, Sweep] = field(default_factory=dict)

    def tick(self) -> int:
        """Settle for up to ``budget`` seconds; returns how many jobs were cancelled."""
        deadline = time.monotonic() + self.budget
        with self.engine.connect() as conn:
            waiting = to_settle(conn)
            self.sweeps = {b: s for b, s in self.sweeps.items() if b in waiting}
            for broadcast_id in waiting:
                if broadcast_id not in self.sweeps:
                    span = settle_span(conn, broadcast_id)
                    if span is not None:
                        self.sweeps[broadcast_id] = Sweep(broadcast_id, span[1], span[0] - 1)
        sweeps = [self.sweeps[b] for b in waiting if b in self.sweeps]
        if not sweeps:
            return 0
        if self.streams == 1:
            total = self._stream(sweeps, deadline)
        else:
            with ThreadPoolExecutor(self.streams, thread_name_prefix="settler") as pool:
                total = sum(f.result() for f in [pool.submit(self._stream, sweeps, deadline)
                                                 for _ in range(self.streams)])
        for sweep in sweeps:
            if sweep.next >= sweep.upto:  # the pass is over: a new one if any are left
                self.sweeps.pop(sweep.broadcast_id, None)
        if total:
            log.info("settled %d job(s) of cancelled campaigns", total)
        return total

    def _stream(self, sweeps: list[Sweep], deadline: float) -> int:
        total = 0
        for sweep in sweeps:
            while time.monotonic() < deadline and not self.stopping.is_set():
                window = sweep.take(self.chunk)
                if window is None:
                    break
                try:
                    with self.engine.begin() as conn:
                        total += settle_window(conn, sweep.broadcast_id, *window)
                except BaseException:
                    sweep.give_back(window)
                    raise
        return total
