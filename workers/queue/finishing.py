"""Finish: record the relay's answer for claimed jobs (group commit), and a late hard
bounce for a job already sent."""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.jobs import Outcome
from workers.core.states import (
    BOUNCED,
    SENDING,
    SENT,
    TERMINAL,
    sql_list,
)
from workers.queue.common import BOUNCE_REASON

# --- finish ----------------------------------------------------------------------------

# Finish jobs the moment the relay has answered (docs/design.md §16: the duplicate window is one
# message per worker thread). One statement, so one round trip and one commit on an
# autocommit session, prepared once per session; it takes one JSON document, so the
# outcomes that reach the finisher (workers/delivery/finisher.py) together are committed together
# (group commit). The guard (still `sending`, under the same claim token) means a job that
# was taken back (and maybe claimed again) is never finished twice: nothing changes, its
# id does not come back, the mark is refused. The guard is a join condition on purpose:
# as a plain `status = 'sending'` it let the planner read all of delivery_jobs_sending_idx
# (every job in flight, and an entry for each one finished since the last vacuum) where
# each outcome needs one primary-key lookup: 0.98 ms per statement growing to 1.64 after
# 12,000 finished, against 0.50-0.57 (bench/bench_finish.py). The ids are also given as
# an array (`j.id = ANY (...)`): the prepared statement's generic plan guesses 100
# outcomes from jsonb_to_recordset, and on a table of a few thousand jobs (a new install,
# the API bench) it chose a hash join over a sequential scan of delivery_jobs: 2.5 ms for
# one outcome instead of 0.15, the biggest PostgreSQL cost of a transactional burst
# (bench/bench_finish.py, "without the id array"). A counted outcome adds its
# attempt, numbered after every earlier one (manual retries included); a hard bounce
# suppresses the address in the same statement.
_FINISH = f"""
WITH o AS (
    SELECT * FROM jsonb_to_recordset(%(outcomes)s::jsonb)
        AS o(id bigint, token uuid, status text, counted boolean, class text, delay float8,
             error text, code int, enhanced text, reply text, stage text, duration_ms float8,
             started_at timestamptz)
), u AS (
    UPDATE delivery_jobs j
       SET status = o.status,
           attempts = j.attempts + CASE WHEN o.counted THEN 1 ELSE 0 END,
           available_at = CASE WHEN o.delay IS NULL THEN j.available_at
                               ELSE now() + make_interval(secs => o.delay) END,
           last_error = coalesce(o.error, j.last_error),
           last_error_class = coalesce(o.class, j.last_error_class),
           finished_at = CASE WHEN o.status IN {sql_list(TERMINAL)} THEN now() END,
           claimed_by = NULL, claim_token = NULL, claimed_at = NULL
      FROM o
     WHERE j.id = ANY (ARRAY(SELECT x.id FROM o x))  -- the primary key at any table size
       AND j.id = o.id AND CASE WHEN j.status = '{SENDING}' THEN j.claim_token END = o.token
    RETURNING j.id, j.attempts, j.email, j.kind, o.status, o.counted, o.class, o.code,
              o.enhanced, o.reply, o.stage, o.duration_ms, o.started_at
), a AS (
    INSERT INTO job_attempts (job_id, kind, attempt, started_at, duration_ms, outcome,
                              smtp_code, enhanced_code, reply, stage, worker)
    SELECT id, kind, attempts, coalesce(started_at, now()), duration_ms, class, code,
           enhanced, reply, stage, %(worker)s::text
      FROM u WHERE counted
), s AS (
    INSERT INTO suppressions (email, reason, job_id, reply, created_by)
    SELECT DISTINCT ON (lower(email)) lower(email), '{BOUNCE_REASON}', id, reply, 'system'
      FROM u WHERE status = '{BOUNCED}'
    ON CONFLICT (email) DO NOTHING
)
SELECT coalesce(array_agg(id), '{{}}') FROM u
"""


def finish(conn: Connection, worker_id: str, outcomes: Sequence[Outcome]) -> set[int]:
    """Record the outcomes: committed when this returns (``conn`` is in autocommit), or
    with the caller's transaction block around it. Returns the ids recorded; an id
    missing was refused (that job was no longer claimed under its token)."""
    driver = conn.connection.driver_connection
    if driver is None or not driver.autocommit:  # the commit below is the guarantee
        raise RuntimeError("finish needs a connection in autocommit")
    if not outcomes:
        return set()
    row = driver.execute(_FINISH, {"outcomes": finish_document(outcomes), "worker": worker_id},
                         prepare=True).fetchone()
    return set(row[0]) if row else set()


# The same statement for a session in libpq's pipeline mode (workers/delivery/finisher.py), which
# prepares it under its own name: $1 the outcomes (finish_document), $2 the worker's id;
# its one value, the ids recorded, comes back as text (finished_ids).
FINISH_PIPELINED = _FINISH % {"outcomes": "$1", "worker": "$2"}


def finish_document(outcomes: Sequence[Outcome]) -> str:
    """The outcomes as the JSON document the finish statement takes."""
    return json.dumps([{
        "id": o.job_id, "token": o.claim_token, "status": o.status, "counted": o.counted,
        "class": o.reply_class, "delay": o.delay, "error": o.error, "code": o.code,
        "enhanced": o.enhanced, "reply": o.reply, "stage": o.stage,
        "duration_ms": o.duration_ms,
        "started_at": o.started_at.isoformat() if o.started_at else None,
    } for o in outcomes])


def finished_ids(value: bytes | None) -> set[int]:
    """The finish statement's result in text form ('{1,2,3}') as ids."""
    text = (value or b"{}").decode().strip("{}")
    return {int(i) for i in text.split(",")} if text else set()


def finish_one(conn: Connection, worker_id: str, outcome: Outcome) -> bool:
    """Record one outcome (see :func:`finish`). False when the mark was refused."""
    return outcome.job_id in finish(conn, worker_id, [outcome])


# sent → bounced, guarded on the status: a job bounced twice (DSN and webhook) moves once.
# finished_at moves to now so the late bounce shows at the top of the failed-jobs inbox.
_BOUNCE_JOB = sa.text(f"""
UPDATE delivery_jobs
   SET status = '{BOUNCED}', last_error = :reason, last_error_class = 'hard_bounce',
       finished_at = now(), dismissed_at = NULL
 WHERE id = :id AND status = '{SENT}'
RETURNING id
""")


def bounce_sent(conn: Connection, job_id: int, reason: str) -> bool:
    """A late hard bounce (a DSN or a webhook) for a sent job: it becomes ``bounced``;
    False when it was not ``sent`` (already bounced, or never sent)."""
    return conn.execute(_BOUNCE_JOB, {"id": job_id, "reason": reason}).first() is not None
