"""A campaign's lifecycle in the jobs table: broadcasts started, completed, counted, and
a cancelled campaign's waiting jobs settled."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.states import (
    ACTIVE,
    CANCELLED,
    CLAIMABLE,
    COUNTED,
    PRIORITY,
    Campaign,
    sql_list,
)
from workers.queue.common import custom_plan

# --- campaign lifecycle ----------------------------------------------------------------

# Sending a campaign creates its broadcast: the durable record of the request (P1). The
# jobs are enqueued by a worker (enqueue_broadcast), so the request returns at once.
# A campaign sent to a segment freezes the segment's conditions on its broadcast.
_START_BROADCAST = sa.text(f"""
WITH b AS (INSERT INTO broadcasts (campaign_id, audience_filter)
           SELECT c.id, g.conditions FROM campaigns c
             LEFT JOIN segments g ON g.id = c.segment_id
            WHERE c.id = :campaign_id
           RETURNING id)
UPDATE campaigns c SET status = '{Campaign.SENDING}', broadcast_id = b.id, started_at = now(),
       updated_at = now(), scheduled_at = NULL
  FROM b WHERE c.id = :campaign_id
RETURNING b.id
""")


def start_broadcast(conn: Connection, campaign_id: int) -> int:
    """Start sending ``campaign_id`` now (the caller has checked and locked the campaign);
    returns the new broadcast's id and wakes the workers to enqueue it."""
    broadcast_id = conn.execute(_START_BROADCAST, {"campaign_id": campaign_id}).scalar_one()
    conn.execute(sa.text("SELECT pg_notify('senddock_jobs', 'enqueue')"))
    return int(broadcast_id)


# Scheduled campaigns whose time has come start, each once: the row lock (SKIP LOCKED) keeps
# two processes from starting the same one, and the schedule lives in the row, so it
# survives restarts. The audit entry is written in the same statement.
_START_DUE_CAMPAIGNS = sa.text(f"""
WITH due AS (
    SELECT id FROM campaigns WHERE status = '{Campaign.SCHEDULED}' AND scheduled_at <= now()
     ORDER BY scheduled_at FOR UPDATE SKIP LOCKED
), b AS (
    INSERT INTO broadcasts (campaign_id, audience_filter)
    SELECT due.id, g.conditions FROM due JOIN campaigns c ON c.id = due.id
      LEFT JOIN segments g ON g.id = c.segment_id
    RETURNING id, campaign_id
), started AS (
    UPDATE campaigns c SET status = '{Campaign.SENDING}', broadcast_id = b.id, started_at = now(),
           updated_at = now(), scheduled_at = NULL
      FROM b WHERE c.id = b.campaign_id
    RETURNING c.id
), logged AS (
    INSERT INTO audit_log (actor, action, target, details)
    SELECT 'scheduler', 'campaign.send', 'campaign:' || id, '{{"scheduled": true}}'::jsonb
      FROM started
)
SELECT id FROM started ORDER BY id
""")


def start_due_campaigns(conn: Connection) -> list[int]:
    """Start every scheduled campaign that is due (run by the pool every second)."""
    started = [int(r.id) for r in conn.execute(_START_DUE_CAMPAIGNS)]
    if started:
        conn.execute(sa.text("SELECT pg_notify('senddock_jobs', 'enqueue')"))
    return started


# Completion is serialized with retries on the campaign row: the candidates are locked
# first (SKIP LOCKED: a campaign a retry is changing right now is judged at the next
# pass), then counted by a second statement, whose snapshot sees every retry committed
# before the lock was taken; a retry that comes later waits for the lock, finds the
# campaign `sent` and reopens it (P8).
_COMPLETION_CANDIDATES = sa.text(f"""
SELECT c.id FROM campaigns c JOIN broadcasts b ON b.id = c.broadcast_id
 WHERE c.status IN ('{Campaign.SENDING}', '{Campaign.CANCELLED}') AND b.finished_at IS NULL
   AND (b.enqueued_at IS NOT NULL OR c.status = '{Campaign.CANCELLED}')
 ORDER BY c.id FOR UPDATE OF c SKIP LOCKED
""")

# A campaign is `sent` only when its broadcast is enqueued and none of its jobs is still
# active: the counts are read from the same counters that P8 reads. A cancelled campaign's
# broadcast is stamped finished too once its in-flight jobs are done, so only live
# broadcasts are ever summed for the backlog. The campaign keeps its first finish time when
# jobs retried later finish again (the broadcast's finished_at is the latest).
_COMPLETE_CAMPAIGNS = sa.text(f"""
WITH done AS (
    SELECT c.id, c.status, c.broadcast_id FROM campaigns c
      JOIN broadcasts b ON b.id = c.broadcast_id
     WHERE c.id = ANY(CAST(:ids AS bigint[]))
       AND c.status IN ('{Campaign.SENDING}', '{Campaign.CANCELLED}') AND b.finished_at IS NULL
       AND (b.enqueued_at IS NOT NULL OR c.status = '{Campaign.CANCELLED}')
       AND coalesce((SELECT sum(n) FROM broadcast_counts bc
                      WHERE bc.broadcast_id = b.id
                        AND bc.status IN {sql_list(ACTIVE)}), 0) = 0
), b AS (
    UPDATE broadcasts SET finished_at = now() FROM done WHERE broadcasts.id = done.broadcast_id
)
UPDATE campaigns SET status = '{Campaign.SENT}',
       finished_at = coalesce(campaigns.finished_at, now()),
       updated_at = now()
  FROM done WHERE campaigns.id = done.id AND done.status = '{Campaign.SENDING}'
RETURNING campaigns.id
""")


def complete_finished_campaigns(conn: Connection) -> list[int]:
    """Mark `sent` every sending campaign whose jobs are all terminal (and close the
    broadcasts of cancelled ones). Campaigns a retry holds are left for the next call."""
    ids = list(conn.execute(_COMPLETION_CANDIDATES).scalars())
    if not ids:
        return []
    return [r.id for r in conn.execute(_COMPLETE_CAMPAIGNS, {"ids": ids})]


# Exact counts (P8): the sum over the trigger-maintained slots, consistent with the jobs in
# any snapshot because both change in the same transaction.
_BROADCAST_COUNTS = sa.text("""
SELECT status, sum(n)::bigint AS n FROM broadcast_counts
 WHERE broadcast_id = :broadcast_id GROUP BY status
""")


def broadcast_counts(conn: Connection, broadcast_id: int) -> dict[str, int]:
    counts = dict.fromkeys(COUNTED, 0)
    for row in conn.execute(_BROADCAST_COUNTS, {"broadcast_id": broadcast_id}):
        counts[row.status] = int(row.n)
    return counts


_MANY_BROADCAST_COUNTS = sa.text("""
SELECT broadcast_id, status, sum(n)::bigint AS n FROM broadcast_counts
 WHERE broadcast_id = ANY(CAST(:ids AS bigint[])) GROUP BY broadcast_id, status
""")


def many_broadcast_counts(conn: Connection, ids: Sequence[int]) -> dict[int, dict[str, int]]:
    result = {i: dict.fromkeys(COUNTED, 0) for i in ids}
    for row in conn.execute(_MANY_BROADCAST_COUNTS, {"ids": list(ids)}):
        result[row.broadcast_id][row.status] = int(row.n)
    return result


# The same numbers straight from the jobs: what the counters must always equal.
_GROUP_BY_STATUS = sa.text("""
SELECT status, count(*) AS n FROM delivery_jobs WHERE broadcast_id = :broadcast_id
 GROUP BY status
""")


def broadcast_counts_slow(conn: Connection, broadcast_id: int) -> dict[str, int]:
    counts = dict.fromkeys(COUNTED, 0)
    for row in conn.execute(_GROUP_BY_STATUS, {"broadcast_id": broadcast_id}):
        counts[row.status] = int(row.n)
    return counts


# Waiting jobs without counting a million rows: campaign jobs from the counters of the
# broadcasts still open (finished ones have none, and there may be thousands of them), the
# (few) transactional ones from the claim index.
_BACKLOG = sa.text(f"""
SELECT coalesce((SELECT sum(bc.n) FROM broadcasts b
                   JOIN broadcast_counts bc ON bc.broadcast_id = b.id
                  WHERE b.finished_at IS NULL AND bc.status IN {sql_list(CLAIMABLE)}), 0)
     + (SELECT count(*) FROM delivery_jobs
         WHERE status IN {sql_list(CLAIMABLE)} AND broadcast_id IS NULL
           AND priority < {PRIORITY["broadcast"]}) AS n""")

# What SENDDOCK_MAX_BACKLOG bounds (the request pipeline reads it inside its statement),
# from the per-kind counters the jobs table's statement triggers keep (exact, committed
# with the rows they count: kind_counts holds jobs without a broadcast only). Counting the
# claim index instead cost O(backlog) per request: 0.8 ms of PostgreSQL CPU with 2,000
# waiting, on every POST.
TRANSACTIONAL_BACKLOG_COUNT = f"""
SELECT coalesce(sum(n), 0)::bigint FROM kind_counts
 WHERE status IN {sql_list(CLAIMABLE)}"""
_TRANSACTIONAL_BACKLOG = sa.text(TRANSACTIONAL_BACKLOG_COUNT)


def transactional_backlog(conn: Connection) -> int:
    """Transactional jobs waiting (pending + retry), from the claim index: what
    SENDDOCK_MAX_BACKLOG bounds. A campaign's jobs never count: its audience is bounded by
    its list, and a 10,000,000-recipient campaign must not refuse a verification email
    (P7)."""
    return int(conn.execute(_TRANSACTIONAL_BACKLOG).scalar_one())


def backlog(conn: Connection) -> int:
    """Jobs waiting to be sent (pending + retry)."""
    return int(conn.execute(_BACKLOG).scalar() or 0)


# One chunk: the broadcast's waiting jobs in one window of ids (after, upto], read along
# the primary key, so a chunk reads at most its window's rows, in heap order (the enqueue
# wrote them there one after another), whatever the campaign's size and however much of
# it is settled already. They become `cancelled` (a legal move from `pending` and
# `retry`; the UPDATE re-checks the state under the row lock, so a job a rescue is moving
# is settled as it ends up), and the count triggers move them between the counters in the
# same statement. No FOR UPDATE first: locking each row before updating it cost a WAL
# record per job (20 % of the chunk). (Walking delivery_jobs_broadcast_due_idx instead, as
# before, also read the entries of every job settled before it until a vacuum removed
# them; most of the 1,382 jobs/s measured at 10M was the trigger plan that migration
# 0034_trigger_plans fixed, docs/performance.md.)
_SETTLE_WINDOW = sa.text(f"""
WITH settled AS (
    UPDATE delivery_jobs j
       SET status = '{CANCELLED}', finished_at = now(), claimed_by = NULL, claim_token = NULL
     WHERE j.id > :after AND j.id <= :upto
       AND j.broadcast_id = :broadcast_id AND j.status IN {sql_list(CLAIMABLE)}
    RETURNING 1
)
SELECT count(*) FROM settled
""")


def settle_window(conn: Connection, broadcast_id: int, after: int, upto: int) -> int:
    """Cancel the waiting jobs of ``broadcast_id`` whose id is in (``after``, ``upto``]
    (in the caller's transaction); returns how many."""
    custom_plan(conn)
    return int(conn.execute(_SETTLE_WINDOW, {"broadcast_id": broadcast_id, "after": after,
                                             "upto": upto}).scalar_one())
