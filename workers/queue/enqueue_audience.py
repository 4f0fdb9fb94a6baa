"""Jobs created in bulk: a campaign's audience, chunk by chunk, and the due steps of
sequences (docs/sequences.md). The messages to one person are in
:mod:`workers.queue.enqueue_messages`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.states import (
    PENDING,
    PRIORITY,
    Campaign,
    sql_list,
)
from workers.queue import audience
from workers.queue.common import SEQUENCE, custom_plan

# --- enqueue ---------------------------------------------------------------------------

# The jobs of a broadcast accepted by the send request are created here, chunk by chunk.

# Broadcasts that were accepted but whose jobs do not exist yet (the send request returned).
_BROADCASTS_TO_ENQUEUE = sa.text(f"""
SELECT b.id FROM broadcasts b JOIN campaigns c ON c.id = b.campaign_id
 WHERE b.enqueued_at IS NULL AND c.status IN {sql_list(Campaign.STARTED)} ORDER BY b.id LIMIT 10
""")


def broadcasts_to_enqueue(conn: Connection) -> list[int]:
    return [r.id for r in conn.execute(_BROADCASTS_TO_ENQUEUE)]


# --- a campaign's audience ------------------------------------------------------------
# One statement per chunk of a broadcast: it reads the next `chunk` members of the
# campaign's list after the broadcast's cursor (enqueued_upto), inserts the jobs of the
# active, unsuppressed ones, adds the skipped ones to the broadcast's audience summary and
# moves the cursor, all in the caller's transaction. Each chunk reads its members along
# memberships' primary key and the subscribers by theirs, so its cost and memory do not
# grow with the list (one 10M-row statement spilled its hash join, its materialized
# audience and the count trigger's transition table to disk). The two primary keys are
# walked side by side (a merge join; 0.56 s for a 1M chunk, where first materializing the
# members and hashing the subscribers took 2 s). The chunk that finds fewer members than
# asked stamps enqueued_at. (The lower bound on subscribers starts their walk at the
# cursor: without it every chunk read the table from its start.) The span of the ids it
# created is recorded too (the settler of a cancel walks it). The row lock (SKIP LOCKED)
# keeps two processes off the same broadcast; a crash rolls back only the chunk in
# progress, and the next run goes on from the cursor. Jobs can be claimed from the first
# chunk on.
_ENQUEUE_CHUNK = f"""
WITH b AS (
    SELECT b.id, b.campaign_id, b.enqueued_upto, c.list_id
      FROM broadcasts b JOIN campaigns c ON c.id = b.campaign_id
     WHERE b.id = :broadcast_id AND b.enqueued_at IS NULL
       AND c.status IN {{started}}
       FOR UPDATE OF b SKIP LOCKED
), audience AS MATERIALIZED (
    SELECT s.id, s.email, s.status,
           EXISTS (SELECT 1 FROM suppressions x WHERE x.email = lower(s.email)) AS suppressed,
           {{chosen}} AS chosen
      FROM memberships m JOIN subscribers s ON s.id = m.subscriber_id
     WHERE m.list_id = (SELECT list_id FROM b)
       AND m.subscriber_id > (SELECT enqueued_upto FROM b)
       AND s.id > (SELECT enqueued_upto FROM b)
     ORDER BY m.subscriber_id LIMIT :chunk
), ins AS (
    INSERT INTO delivery_jobs (kind, priority, status, email, broadcast_id, campaign_id,
                               subscriber_id)
    SELECT 'broadcast', :priority, '{PENDING}', a.email, b.id, b.campaign_id, a.id
      FROM audience a, b
     WHERE a.chosen AND a.status = 'active' AND NOT a.suppressed
    RETURNING id
), made AS (
    SELECT count(*) AS n, min(id) AS first_id, max(id) AS last_id FROM ins
), summary AS (
    SELECT (SELECT n FROM made) AS total,
           (SELECT first_id FROM made) AS first_id, (SELECT last_id FROM made) AS last_id,
           count(*) FILTER (WHERE chosen AND suppressed) AS skipped_suppressed,
           count(*) FILTER (WHERE chosen AND NOT suppressed AND status <> 'active')
               AS skipped_inactive,
           count(*) AS seen, max(id) AS upto
      FROM audience
)
UPDATE broadcasts SET total = broadcasts.total + summary.total,
       skipped_suppressed = broadcasts.skipped_suppressed + summary.skipped_suppressed,
       skipped_inactive = broadcasts.skipped_inactive + summary.skipped_inactive,
       enqueued_upto = coalesce(summary.upto, broadcasts.enqueued_upto),
       first_job_id = least(broadcasts.first_job_id, summary.first_id),
       last_job_id = greatest(broadcasts.last_job_id, summary.last_id),
       enqueued_at = CASE WHEN summary.seen < :chunk THEN now() END
  FROM summary, b WHERE broadcasts.id = b.id
RETURNING broadcasts.total, broadcasts.skipped_suppressed, broadcasts.skipped_inactive,
          broadcasts.enqueued_at IS NOT NULL AS done, summary.total AS added
"""
# A segmented broadcast goes through the same statement: its frozen conditions become the
# `chosen` column (workers.queue.audience: whitelisted fragments, bound values), so
# members outside the segment are read, not enqueued and not counted as skipped, and the
# cursor still walks the whole list. The whole list's `chosen` is `true`, and only a date
# condition reads the membership's date (the primary key alone, an index-only scan, serves
# the rest).
_WHOLE_LIST = sa.text(_ENQUEUE_CHUNK.format(started=sql_list(Campaign.STARTED), chosen="true"))
_AUDIENCE_FILTER = sa.text("SELECT audience_filter FROM broadcasts WHERE id = :id")


def _chunk_statement(conn: Connection, broadcast_id: int
                     ) -> tuple[sa.TextClause, dict[str, Any]]:
    conditions = conn.execute(_AUDIENCE_FILTER, {"id": broadcast_id}).scalar()
    if not conditions:
        return _WHOLE_LIST, {}
    chosen, params = audience.predicate(conditions)
    return sa.text(_ENQUEUE_CHUNK.format(started=sql_list(Campaign.STARTED),
                                         chosen=f"({chosen})")), params


#: Members per enqueue chunk. Measured at 1M on a loaded machine (load 8-14, so only
#: roughly): chunks of 200,000 and 50,000 were slower than one statement, a chunk of
#: 1,000,000 the same; so a list of up to a million is one statement, and ten million are
#: ten statements of the size that ran at 137,841/s, instead of one that spills to disk
#: (71,000/s).
ENQUEUE_CHUNK = 1_000_000


@dataclass
class EnqueueStep:
    total: int
    skipped_suppressed: int
    skipped_inactive: int
    added: int  # jobs this chunk created
    done: bool  # the whole audience is enqueued

    def summary(self) -> dict[str, int]:
        return {"total": self.total, "skipped_suppressed": self.skipped_suppressed,
                "skipped_inactive": self.skipped_inactive}


def enqueue_chunk(conn: Connection, broadcast_id: int,
                  chunk: int = ENQUEUE_CHUNK) -> EnqueueStep | None:
    """Create the jobs of the broadcast's next ``chunk`` members. None when the broadcast
    is already enqueued, not sending, or another process holds it right now."""
    custom_plan(conn)  # each chunk planned for its own place in the list
    statement, params = _chunk_statement(conn, broadcast_id)
    row = conn.execute(statement, {**params, "broadcast_id": broadcast_id, "chunk": chunk,
                                   "priority": PRIORITY["broadcast"]}).first()
    if row is None:
        return None
    return EnqueueStep(row.total, row.skipped_suppressed, row.skipped_inactive, row.added,
                       row.done)


def enqueue_broadcast(conn: Connection, broadcast_id: int,
                      chunk: int = ENQUEUE_CHUNK) -> dict[str, int] | None:
    """Create all of the broadcast's jobs in the caller's transaction (chunk after chunk).
    Returns the audience summary, or None when the broadcast is already enqueued or
    another process is enqueueing it now. The engine commits each chunk on its own."""
    step = None
    while True:
        last = enqueue_chunk(conn, broadcast_id, chunk)
        if last is None:
            return step.summary() if step is not None else None
        step = last
        if step.done:
            return step.summary()


# --- sequences (docs/sequences.md) ---------------------------------------------------
# A due email step of a sequence (workers.delivery.sequences decides which are due).
# One job per (enrollment, email step), set-based. The key `seq:<enrollment>:<step>` under
# the unique index delivery_jobs_idempotency_idx (kind, idempotency_key) is the step's
# at-most-once rule: a second insert for the same pair, from any advancer, inserts nothing.
_ENQUEUE_DUE_STEPS = sa.text(f"""
INSERT INTO delivery_jobs (kind, priority, status, email, subscriber_id, idempotency_key,
                           payload)
SELECT '{SEQUENCE}', :priority, '{PENDING}', s.email, s.id,
       'seq:' || i.enrollment_id || ':' || i.step_id,
       jsonb_build_object('sequence_id', e.sequence_id, 'enrollment_id', e.id,
                          'step_id', i.step_id, 'data', e.data)
  FROM unnest(CAST(:enrollments AS bigint[]), CAST(:steps AS bigint[]))
       WITH ORDINALITY AS i(enrollment_id, step_id, n)
  JOIN sequence_enrollments e ON e.id = i.enrollment_id
  JOIN subscribers s ON s.id = e.subscriber_id
 ORDER BY i.n
ON CONFLICT DO NOTHING
RETURNING id, idempotency_key
""")

_EXISTING_JOBS = sa.text(f"""
SELECT id, idempotency_key FROM delivery_jobs
 WHERE kind = '{SEQUENCE}' AND idempotency_key = ANY(:keys)
""")


def step_key(enrollment_id: int, step_id: int) -> str:
    return f"seq:{enrollment_id}:{step_id}"


def enqueue_due_steps(conn: Connection, sends: Sequence[tuple[int, int]]
                      ) -> dict[tuple[int, int], int]:
    """Make the job of each (enrollment, email step) in ``sends`` in the caller's
    transaction; returns each pair's job id (the existing one when the pair already had
    its job: it is never made twice)."""
    if not sends:
        return {}
    keys = {step_key(e, s): (e, s) for e, s in sends}
    made: dict[tuple[int, int], int] = {}
    for row in conn.execute(_ENQUEUE_DUE_STEPS, {
            "priority": PRIORITY[SEQUENCE], "enrollments": [e for e, _ in sends],
            "steps": [s for _, s in sends]}):
        made[keys[row.idempotency_key]] = int(row.id)
    missing = [k for k, pair in keys.items() if pair not in made]
    if missing:
        for row in conn.execute(_EXISTING_JOBS, {"keys": missing}):
            made[keys[row.idempotency_key]] = int(row.id)
    conn.execute(sa.text("SELECT pg_notify('senddock_jobs', :kind)"), {"kind": SEQUENCE})
    return made
