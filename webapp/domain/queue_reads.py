"""Read queries of the queue for the pages: support, inbox, health, campaign progress.

Nothing here changes a job; the statements that do (and the promises P2-P8 they keep) are
in :mod:`workers.queue`. Every list is keyset-paged or bounded by an index, so a page view
never counts a million rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.states import (
    ACTIVE,
    ADDRESS_INDEXED,
    CANCELLED,
    CLAIMABLE,
    HELD,
    KINDS,
    PENDING,
    PRIORITIES,
    PRIORITY,
    PROBLEM,
    RETRY,
    SENDING,
    SENT,
    STATES,
    Campaign,
    sql_list,
)
from workers.queue import JOB_COLUMNS, ProblemFilter

# --- reading jobs ----------------------------------------------------------------------

def get_job(conn: Connection, job_id: int) -> dict[str, Any] | None:
    row = conn.execute(sa.text("SELECT * FROM delivery_jobs WHERE id = :id"),
                       {"id": job_id}).mappings().first()
    return dict(row) if row else None


def job_attempts(conn: Connection, job_id: int) -> list[dict[str, Any]]:
    """The job's attempts in the order they happened (numbered 1, 2, … across manual
    retries too)."""
    rows = conn.execute(sa.text("""
        SELECT attempt, started_at, duration_ms, outcome, smtp_code, enhanced_code, reply,
               stage, worker
          FROM job_attempts WHERE job_id = :id ORDER BY started_at, id"""), {"id": job_id})
    return [dict(r) for r in rows.mappings()]


# Every job for one user, newest first (delivery_jobs_user_idx).
_JOBS_FOR_USER = sa.text(f"""
SELECT {JOB_COLUMNS} FROM delivery_jobs
 WHERE kind = :kind AND user_ref = :user_ref
 ORDER BY created_at DESC, id DESC LIMIT :limit
""")


def jobs_for_user(conn: Connection, kind: str, user_ref: str,
                  limit: int = 100) -> list[dict[str, Any]]:
    rows = conn.execute(_JOBS_FOR_USER, {"kind": kind, "user_ref": user_ref, "limit": limit})
    return [dict(r) for r in rows.mappings()]


_ATTEMPTS_FOR_JOBS = sa.text("""
SELECT job_id, attempt, started_at, duration_ms, outcome, smtp_code, enhanced_code, reply,
       stage
  FROM job_attempts WHERE job_id = ANY(CAST(:ids AS bigint[])) ORDER BY job_id, started_at, id
""")


def attempts_for_jobs(conn: Connection, job_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
    """The attempts of several jobs in one query, keyed by job id (oldest attempt first)."""
    result: dict[int, list[dict[str, Any]]] = {i: [] for i in job_ids}
    if job_ids:
        for row in conn.execute(_ATTEMPTS_FOR_JOBS, {"ids": list(job_ids)}).mappings():
            result[row["job_id"]].append(dict(row))
    return result


# Each user the `hits` arm found, with their newest job and how many jobs they have: one
# lateral lookup per user on delivery_jobs_user_idx. `{kind}`-style slots take the kind
# condition (one kind, or every transactional kind).
_NEWEST_PER_USER = """
SELECT h.user_ref, last.email, last.status, last.created_at, last.kind AS last_kind,
       (SELECT count(*) FROM delivery_jobs c
         WHERE {c_kind} AND c.user_ref = h.user_ref) AS jobs
  FROM hits h
 CROSS JOIN LATERAL (
    SELECT j.email, j.status, j.created_at, j.kind FROM delivery_jobs j
     WHERE {j_kind} AND j.user_ref = h.user_ref
     ORDER BY j.created_at DESC, j.id DESC LIMIT 1) last
 ORDER BY last.created_at DESC
"""
_ONE_KIND = {"c_kind": "c.kind = :kind", "j_kind": "j.kind = :kind"}
_ALL_KINDS = {"c_kind": "c.kind NOT IN ('broadcast', 'test')",
              "j_kind": "j.kind NOT IN ('broadcast', 'test')"}


def _users_search(hits: str, kinds: dict[str, str]) -> sa.TextClause:
    return sa.text("WITH hits AS (" + hits + ")" + _NEWEST_PER_USER.format(**kinds))


# Users whose jobs match an address (case-insensitive), a correlation ID or a user id, each
# with their newest job. Each arm has its own index (email, correlation, user), so the
# search stays an index lookup however large the table grows.
_EXACT_HITS = """
    SELECT DISTINCT user_ref FROM delivery_jobs
     WHERE {kind} AND user_ref IS NOT NULL
       AND (lower(email) = lower(CAST(:email AS text))
            OR correlation_id = CAST(:correlation_id AS uuid)
            OR user_ref = CAST(:user_ref AS text))
     LIMIT :limit
"""
# One kind, or every transactional kind (the support page shows them all, docs/design.md §21).
_SEARCH_ONE_KIND = _users_search(_EXACT_HITS.format(kind="kind = :kind"), _ONE_KIND)
_SEARCH_ALL_KINDS = _users_search(_EXACT_HITS.format(kind="kind NOT IN ('broadcast', 'test')"),
                                  _ALL_KINDS)


def search_users(conn: Connection, kind: str | None, *, email: str | None = None,
                 correlation_id: str | None = None, user_ref: str | None = None,
                 limit: int = 50) -> list[dict[str, Any]]:
    """Users (``user_ref``) with a ``kind`` job (None: of any transactional kind) matching
    any of the given keys; None keys match nothing. ``correlation_id`` must be a valid
    UUID or None."""
    rows = conn.execute(_SEARCH_ONE_KIND if kind else _SEARCH_ALL_KINDS, {
        "kind": kind, "email": email, "correlation_id": correlation_id,
        "user_ref": user_ref, "limit": limit})
    return [dict(r) for r in rows.mappings()]


# Users whose transactional jobs' address or user id contains `pattern` (a LIKE pattern),
# through the trigram index delivery_jobs_transactional_search_idx (the expression and the
# predicate repeat the index's), each with their newest job.
_LIKE_HITS = """
    SELECT DISTINCT user_ref FROM delivery_jobs
     WHERE kind <> 'broadcast' AND {kind} AND user_ref IS NOT NULL
       AND lower(email || ' ' || coalesce(user_ref, '')) LIKE :pattern
     LIMIT :limit
"""
_LIKE_ONE_KIND = _users_search(_LIKE_HITS.format(kind="kind = :kind"), _ONE_KIND)
_LIKE_ALL_KINDS = _users_search(_LIKE_HITS.format(kind="kind <> 'test'"), _ALL_KINDS)


def search_users_like(conn: Connection, kind: str | None, pattern: str,
                      limit: int = 50) -> list[dict[str, Any]]:
    """Users with a ``kind`` job (None: of any transactional kind) whose lower-cased
    "email user_id" matches the LIKE ``pattern`` (the caller escapes it)."""
    rows = conn.execute(_LIKE_ONE_KIND if kind else _LIKE_ALL_KINDS, {
        "kind": kind, "pattern": pattern, "limit": limit})
    return [dict(r) for r in rows.mappings()]


# --- inbox and health ------------------------------------------------------------------
# The failed-jobs inbox (failed and bounced jobs not dismissed) and the queue's vital signs.
# Every list is keyset-paged on an index; nothing counts a million rows per page view.

def problem_jobs(conn: Connection, where: ProblemFilter, *,
                 after: tuple[datetime, int] | None = None,
                 limit: int = 50) -> list[dict[str, Any]]:
    """Failed and bounced jobs, newest first, ``limit`` of them after the keyset ``after``
    (finished_at, id). Walks delivery_jobs_problem_idx (or its per-campaign twin)."""
    sql, params = where.where()
    if after is not None:
        sql += " AND (j.finished_at, j.id) < (:after_at, :after_id)"
        params.update(after_at=after[0], after_id=after[1])
    # A search for one address, correlation ID or job matches a handful of rows: find them
    # by their own index first, then sort. Without the fence the planner may walk the inbox
    # index in date order hoping to meet them early, and read all million entries.
    source = "delivery_jobs j"
    if where.email or where.correlation_id or where.job_id is not None:
        source = f"(WITH m AS MATERIALIZED (SELECT * FROM delivery_jobs j WHERE {sql}) " \
                 "SELECT * FROM m) j"
    rows = conn.execute(sa.text(f"""
        SELECT j.id, j.kind, j.status, j.email, j.campaign_id, c.name AS campaign_name,
               j.user_ref, j.attempts, j.last_error, j.last_error_class,
               j.correlation_id::text AS correlation_id, j.finished_at, j.created_at,
               j.payload #>> '{{data,source,via}}' AS via,
               EXISTS (SELECT 1 FROM suppressions s WHERE s.email = lower(j.email))
                   AS suppressed
          FROM {source} LEFT JOIN campaigns c ON c.id = j.campaign_id
         WHERE {sql}
         ORDER BY j.finished_at DESC, j.id DESC
         LIMIT :limit"""), {**params, "limit": limit})
    return [dict(r) for r in rows.mappings()]


# Held transactional mail waiting for support to release or drop it, oldest first
# (delivery_jobs_transactional_idx).
_HELD = sa.text(f"""
SELECT {JOB_COLUMNS} FROM delivery_jobs
 WHERE kind <> 'broadcast' AND kind = :kind AND status = '{HELD}'
 ORDER BY created_at, id LIMIT :limit
""")


def held_jobs(conn: Connection, kind: str, limit: int = 20) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(_HELD, {"kind": kind, "limit": limit}).mappings()]


_HELD_COUNT = sa.text(f"""
SELECT count(*) FROM delivery_jobs WHERE kind <> 'broadcast' AND kind = :kind
   AND status = '{HELD}'
""")


def held_count(conn: Connection, kind: str) -> int:
    return int(conn.execute(_HELD_COUNT, {"kind": kind}).scalar_one())


# Jobs per kind and state without counting jobs: campaign jobs from the per-broadcast
# counters, the other kinds from the per-kind ones (both kept by the same statement
# trigger, exact at every snapshot), so the cost does not grow with the jobs ever sent.
_JOBS_BY_KIND_AND_STATE = sa.text("""
SELECT 'broadcast' AS kind, status, sum(n)::bigint AS n FROM broadcast_counts GROUP BY status
UNION ALL
SELECT kind, status, sum(n)::bigint AS n FROM kind_counts GROUP BY kind, status
""")


def jobs_by_kind_and_state(conn: Connection) -> dict[str, dict[str, int]]:
    """{kind: {status: n}} for every kind and state (zeros included)."""
    result = {kind: dict.fromkeys(STATES, 0) for kind in KINDS}
    for row in conn.execute(_JOBS_BY_KIND_AND_STATE):
        result.setdefault(row.kind, dict.fromkeys(STATES, 0))[row.status] = int(row.n)
    return result


# How long the longest-waiting due job has waited: one probe of the transactional claim
# index per priority and one per open, unpaused broadcast (a paused campaign's jobs are not
# waiting on us, and are never read).
_OLDEST_DUE = sa.text(f"""
SELECT extract(epoch FROM now() - min(t.available_at)) FROM (
    SELECT (SELECT j.available_at FROM delivery_jobs j
             WHERE j.status IN {sql_list(CLAIMABLE)} AND j.broadcast_id IS NULL
               AND j.priority = p AND j.available_at <= now()
             ORDER BY j.available_at LIMIT 1) AS available_at
      FROM unnest(CAST(:priorities AS int[])) p
    UNION ALL
    SELECT (SELECT j.available_at FROM delivery_jobs j
             WHERE j.broadcast_id = b.id AND j.status IN {sql_list(CLAIMABLE)}
               AND j.available_at <= now()
             ORDER BY j.available_at LIMIT 1)
      FROM broadcasts b
     WHERE b.finished_at IS NULL
       AND EXISTS (SELECT 1 FROM campaigns c WHERE c.id = b.campaign_id
                      AND c.status = '{Campaign.SENDING}')) t
""")


def oldest_due_age(conn: Connection) -> float:
    """Seconds the oldest due (pending or retry) job has been waiting; 0 when none is."""
    value = conn.execute(_OLDEST_DUE, {"priorities": list(PRIORITIES)}
                         ).scalar()
    return max(0.0, float(value or 0))


# Counted attempts per minute, kind and outcome class (sent, hard_bounce, rejected,
# transient, build): the sent-per-minute chart, sends and failures by class. Read from
# attempt_minutes, which a statement trigger on job_attempts keeps (migration
# 0035_minute_counters): a few rows per minute and kind, however many attempts were made.
_ATTEMPTS_PER_MINUTE = sa.text("""
SELECT minute, kind, outcome, sum(n)::bigint AS n FROM attempt_minutes
 WHERE minute >= :since AND minute < :until
 GROUP BY minute, kind, outcome
""")


def attempts_per_minute(conn: Connection, since: datetime,
                        until: datetime) -> list[tuple[datetime, str, str, int]]:
    """(minute, kind, outcome, attempts) for the minutes from ``since`` (whole minutes:
    pass a minute's start) to before ``until``."""
    rows = conn.execute(_ATTEMPTS_PER_MINUTE, {"since": since, "until": until})
    return [(r.minute, r.kind, r.outcome, int(r.n)) for r in rows]


# Jobs that failed or bounced in a window (the failure-rate alarm), from the inbox index.
_PROBLEMS_SINCE = sa.text(f"""
SELECT count(*) FROM delivery_jobs j
 WHERE j.status IN {sql_list(PROBLEM)} AND j.dismissed_at IS NULL AND j.finished_at >= :since
""")


def problems_since(conn: Connection, since: datetime) -> int:
    return int(conn.execute(_PROBLEMS_SINCE, {"since": since}).scalar() or 0)


# Pools that have not stopped or still have jobs in flight, with whether their lease is
# valid (`live`, on the database clock), how long ago it expired (`lease_overdue`, < 0
# while valid) and the jobs `sending` in their name (read from the jobs, not from the row
# the worker writes: a vanished worker writes nothing).
_WORKERS = sa.text(f"""
WITH sending AS (
    SELECT claimed_by, count(*) AS n FROM delivery_jobs
     WHERE status = '{SENDING}' GROUP BY claimed_by
)
SELECT w.id, w.node, w.hostname, w.pid, w.threads, coalesce(s.n, 0) AS in_flight,
       w.started_at, w.heartbeat_at, w.lease_until, w.lease_until > now() AS live,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age,
       extract(epoch FROM now() - w.lease_until)::float8 AS lease_overdue
  FROM workers w LEFT JOIN sending s ON s.claimed_by = w.id
 WHERE w.stopped_at IS NULL OR s.n > 0
 ORDER BY w.started_at, w.id
""")


def running_workers(conn: Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(_WORKERS).mappings()]


# Jobs `sending` in the name of a worker whose lease expired (or that is not registered):
# a vanished, cut-off or frozen host's; taken back SENDDOCK_LEASE_GRACE after the expiry.
_STRANDED = sa.text(f"""
SELECT count(*) AS n,
       coalesce(max(extract(epoch FROM now() - w.lease_until)), 0)::float8 AS overdue
  FROM delivery_jobs j LEFT JOIN workers w ON w.id = j.claimed_by
 WHERE j.status = '{SENDING}' AND (w.id IS NULL OR w.lease_until <= now())
""")


def stranded(conn: Connection) -> tuple[int, float]:
    """(jobs `sending` under an expired lease, seconds since the oldest such expiry)."""
    row = conn.execute(_STRANDED).one()
    return int(row.n), float(row.overdue)


def in_flight(conn: Connection) -> int:
    """Every job `sending`, whoever holds it (a vanished worker's included)."""
    return int(conn.execute(sa.text(
        f"SELECT count(*) FROM delivery_jobs WHERE status = '{SENDING}'")).scalar_one())


# --- campaign live page ----------------------------------------------------------------

# The most frequent error replies among a broadcast's problem jobs (retrying, failed,
# bounced), over at most `sample` of them via delivery_jobs_broadcast_idx: bounded cost.
_TOP_ERRORS = sa.text(f"""
SELECT left(last_error, 300) AS reply, count(*) AS n FROM (
    SELECT last_error FROM delivery_jobs
     WHERE broadcast_id = :broadcast_id AND status IN {sql_list(('retry', *PROBLEM))}
       AND last_error IS NOT NULL
     LIMIT :sample) problems
 GROUP BY 1 ORDER BY n DESC, reply LIMIT :limit
""")


def top_errors(conn: Connection, broadcast_id: int, limit: int = 5,
               sample: int = 2000) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(_TOP_ERRORS, {
        "broadcast_id": broadcast_id, "limit": limit, "sample": sample}).mappings()]


# A broadcast's failed and bounced jobs dismissed from the inbox, per state (the campaign
# page counts them with the failed and bounced, and says how many were dismissed), from
# delivery_jobs_broadcast_idx: as many rows as the campaign has problems.
_DISMISSED = sa.text(f"""
SELECT status, count(*) AS n FROM delivery_jobs
 WHERE broadcast_id = :broadcast_id AND status IN {sql_list(PROBLEM)}
   AND dismissed_at IS NOT NULL
 GROUP BY status
""")


def dismissed_problems(conn: Connection, broadcast_id: int) -> dict[str, int]:
    counts = dict.fromkeys(PROBLEM, 0)
    for row in conn.execute(_DISMISSED, {"broadcast_id": broadcast_id}):
        counts[row.status] = int(row.n)
    return counts


# The newest finishes of one broadcast since `since`, newest first from
# delivery_jobs_broadcast_finished_idx, capped at `sample`: how many, the oldest of them,
# how many of them are after `recent` (the steady check's window, from the same sample),
# and the newest finish at all. The newest is read as the index's last entry (LIMIT 1):
# written as max() the planner, whose statistics said no job of the broadcast had
# finished yet, aggregated every finished job of the campaign instead (13 ms at 19,000
# sent, growing with every message of a 10M campaign).
_RECENT_FINISHES = sa.text("""
SELECT count(*) AS n, min(finished_at) AS oldest, now() AS now,
       count(*) FILTER (WHERE finished_at > :recent) AS n_recent,
       (SELECT finished_at FROM delivery_jobs
         WHERE broadcast_id = :broadcast_id AND finished_at IS NOT NULL
         ORDER BY finished_at DESC LIMIT 1) AS newest
  FROM (SELECT finished_at FROM delivery_jobs
         WHERE broadcast_id = :broadcast_id AND finished_at IS NOT NULL
           AND finished_at > :since
         ORDER BY finished_at DESC LIMIT :sample) recent
""")

# When the broadcast's retrying jobs come due: the first and the last, read along the
# claim index (delivery_jobs_claim_idx) in due order.
_RETRY_DUE = sa.text(f"""
SELECT (SELECT available_at FROM delivery_jobs
         WHERE status IN {sql_list(CLAIMABLE)} AND priority = :priority
           AND broadcast_id = :broadcast_id AND status = '{RETRY}'
         ORDER BY available_at LIMIT 1) AS next_at,
       (SELECT available_at FROM delivery_jobs
         WHERE status IN {sql_list(CLAIMABLE)} AND priority = :priority
           AND broadcast_id = :broadcast_id AND status = '{RETRY}'
         ORDER BY available_at DESC LIMIT 1) AS last_at
""")


def recent_finishes(conn: Connection, broadcast_id: int, since: datetime,
                    sample: int, recent: datetime | None = None) -> Any:
    """(n, oldest, now, n_recent, newest): how many of the broadcast's jobs finished after
    ``since`` (at most ``sample``, the newest), the oldest of those, the database's now,
    how many of those finished after ``recent`` (default ``since``), and the newest
    finish."""
    return conn.execute(_RECENT_FINISHES, {"broadcast_id": broadcast_id, "since": since,
                                           "sample": sample,
                                           "recent": recent or since}).one()


# A campaign's jobs waiting for a recipient domain that throttles us (docs/design.md §17): per
# domain throttled now, how many of the broadcast's waiting jobs go there. Only read while some
# domain is throttled, and bounded: at most THROTTLED_SCAN waiting jobs are looked at
# (``more``: there may be more than counted).
THROTTLED_SCAN = 50_000
_THROTTLED_WAITING = sa.text(f"""
WITH t AS (SELECT domain, until FROM domain_throttles WHERE until > now()
            ORDER BY domain LIMIT 20),
w AS (SELECT lower(split_part(j.email, '@', 2)) AS domain FROM delivery_jobs j
       WHERE j.broadcast_id = :broadcast_id AND j.status IN {sql_list(CLAIMABLE)}
         AND EXISTS (SELECT 1 FROM t)
       LIMIT {THROTTLED_SCAN})
SELECT t.domain, t.until, count(w.domain) AS n,
       (SELECT count(*) FROM w) >= {THROTTLED_SCAN} AS more
  FROM t JOIN w ON w.domain = t.domain GROUP BY t.domain, t.until ORDER BY t.domain
""")


def throttled_waiting(conn: Connection, broadcast_id: int) -> list[dict[str, Any]]:
    """[{domain, until, n, more}]: the broadcast's jobs waiting for a throttled domain."""
    return [dict(r) for r in conn.execute(_THROTTLED_WAITING,
                                          {"broadcast_id": broadcast_id}).mappings()]


def retry_due(conn: Connection, broadcast_id: int) -> tuple[datetime | None, datetime | None]:
    """(when the first retrying job of the broadcast comes due, when the last one does)."""
    row = conn.execute(_RETRY_DUE, {"broadcast_id": broadcast_id,
                                    "priority": PRIORITY["broadcast"]}).one()
    return row.next_at, row.last_at


# --- transactional kinds (docs/design.md §21) -----------------------------------------------------

# Cumulative outcomes per kind and class (senddock_messages_total, senddock_retries_total):
# the trigger-kept slots of job_outcome_counts summed; a few dozen rows however many jobs.
_OUTCOME_COUNTS = sa.text("""
SELECT kind, class AS class_, outcome, sum(n)::bigint AS n FROM job_outcome_counts
 GROUP BY kind, class, outcome
""")


def outcome_counts(conn: Connection) -> dict[tuple[str, str, str], int]:
    """{(kind, class, outcome): n} since the database was created; outcome is a terminal
    status or ``retry``. Only ever grows."""
    return {(r.kind, r.class_, r.outcome): int(r.n) for r in conn.execute(_OUTCOME_COUNTS)}


# The cumulative time-to-sent histogram: jobs and seconds per bucket, kind and class.
_TIME_TO_SENT_COUNTS = sa.text("""
SELECT kind, class AS class_, bucket, sum(n)::bigint AS n, sum(seconds)::float8 AS seconds
  FROM time_to_sent_counts GROUP BY kind, class, bucket
""")


def time_to_sent_counts(conn: Connection) -> dict[tuple[str, str], dict[int, tuple[int,
                                                                                  float]]]:
    """{(kind, class): {bucket: (jobs, seconds)}}; bucket i holds the jobs whose time to
    sent was above bound i-1 and at most bound i (the last: above every bound)."""
    result: dict[tuple[str, str], dict[int, tuple[int, float]]] = {}
    for r in conn.execute(_TIME_TO_SENT_COUNTS):
        result.setdefault((r.kind, r.class_), {})[int(r.bucket)] = (int(r.n), float(r.seconds))
    return result


# What the Transactional page shows per kind over the last 24 hours, from
# delivery_jobs_kind_created_idx: requested, sent, failed, waiting, retries (transient
# failures retried), and time to sent (from when the message was due) p50/p95.
_KIND_STATS = sa.text(f"""
SELECT kind, count(*) AS requested,
       count(*) FILTER (WHERE status = '{SENT}') AS sent,
       count(*) FILTER (WHERE status IN {sql_list(PROBLEM)}) AS failed,
       count(*) FILTER (WHERE status IN {sql_list(ACTIVE)}) AS waiting,
       count(*) FILTER (WHERE status = '{CANCELLED}') AS cancelled,
       coalesce(sum(CASE WHEN status = '{RETRY}' THEN attempts
                         ELSE greatest(attempts - 1, 0) END), 0)::bigint AS retries,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds) AS p95
  FROM (SELECT kind, status, attempts,
               CASE WHEN status = '{SENT}' THEN extract(epoch FROM finished_at - greatest(
                   created_at, CAST(payload ->> 'send_at' AS timestamptz))) END AS seconds
          FROM delivery_jobs
         WHERE kind <> 'broadcast' AND kind = ANY(CAST(:kinds AS text[]))
           AND created_at >= now() - make_interval(secs => :window)) j
 GROUP BY kind
""")


def kind_stats(conn: Connection, kinds: Sequence[str],
               window: float = 86400) -> dict[str, dict[str, Any]]:
    """Per kind, over jobs requested in the last ``window`` seconds (zeros for none)."""
    empty = {"requested": 0, "sent": 0, "failed": 0, "waiting": 0, "cancelled": 0,
             "retries": 0, "p50": None, "p95": None}
    result = {k: dict(empty) for k in kinds}
    for row in conn.execute(_KIND_STATS, {"kinds": list(kinds), "window": window}).mappings():
        result[row["kind"]] = {k: row[k] for k in empty}
    return result


# The kinds a user has mail of (support): one probe of delivery_jobs_user_idx.
_KINDS_FOR_USER = sa.text("""
SELECT DISTINCT kind FROM delivery_jobs
 WHERE user_ref = :user_ref AND kind NOT IN ('broadcast', 'test') ORDER BY kind
""")


def kinds_for_user(conn: Connection, user_ref: str) -> list[str]:
    return list(conn.execute(_KINDS_FOR_USER, {"user_ref": user_ref}).scalars())


# --- the jobs browser (admins) ---------------------------------------------------------
# Jobs by state, Sidekiq/Oban style: waiting (due, in claim order), retrying (in the order
# they come due, with their next run), in flight, held. Each is keyset-paged along the
# index that serves the state, so a deep page costs what the first does.

# The predicate of delivery_jobs_email_idx: the jobs an address search finds.
_ADDRESS_INDEXED = f"(j.kind <> 'broadcast' OR j.status IN {sql_list(ADDRESS_INDEXED)})"


@dataclass
class JobFilter:
    """Which jobs a jobs-browser tab shows."""

    kind: str | None = None
    broadcast_id: int | None = None
    email: str | None = None

    def where(self) -> tuple[str, dict[str, Any]]:
        clauses: list[str] = []
        params: dict[str, Any] = {}
        if self.kind:
            clauses.append("j.kind = :kind")
            params["kind"] = self.kind
        if self.broadcast_id is not None:
            clauses.append("j.broadcast_id = :broadcast_id")
            params["broadcast_id"] = self.broadcast_id
        if self.email:
            # Only what the address index holds (its predicate repeated): a campaign's
            # waiting and sent millions are not searched by address.
            clauses.append("lower(j.email) = lower(:email)")
            clauses.append(_ADDRESS_INDEXED)
            params["email"] = self.email
        return "".join(f" AND {c}" for c in clauses), params


# A transactional message whose send_at is still ahead (delivery_jobs_claim_idx's predicate
# repeated). It is pending but not due: the waiting tab, the dashboard's "due now" and Queue
# health leave it out, the Scheduled tab lists it.
_SCHEDULED_MESSAGE = (f"j.status IN {sql_list(CLAIMABLE)} AND j.broadcast_id IS NULL "
                      f"AND j.status = '{PENDING}' AND j.available_at > now()")


# state -> (condition, order columns). Waiting and retrying walk delivery_jobs_claim_idx
# (its predicate is repeated so the planner can use it), in flight delivery_jobs_sending_idx,
# held delivery_jobs_transactional_idx; sent and cancelled, newest first, walk
# delivery_jobs_sent_idx and delivery_jobs_cancelled_idx backwards (a campaign's, its
# delivery_jobs_broadcast_finished_idx), so a page costs its 51 rows at 10M jobs too.
BROWSER_STATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "waiting": (f"j.status IN {sql_list(CLAIMABLE)} AND j.status = '{PENDING}'",
                ("j.priority", "j.available_at", "j.id")),
    "retrying": (f"j.status IN {sql_list(CLAIMABLE)} AND j.status = '{RETRY}'",
                 ("j.priority", "j.available_at", "j.id")),
    "sending": (f"j.status = '{SENDING}'", ("j.claimed_at", "j.id")),
    "held": (f"j.kind <> 'broadcast' AND j.status = '{HELD}'", ("j.created_at", "j.id")),
    "sent": (f"j.status = '{SENT}'", ("j.finished_at", "j.id")),
    "cancelled": (f"j.status = '{CANCELLED}'", ("j.finished_at", "j.id")),
    # Transactional messages asked for with a later send_at: waiting, but not yet due.
    "scheduled": (_SCHEDULED_MESSAGE, ("j.available_at", "j.id")),
}
NEWEST_FIRST = frozenset({"sent", "cancelled"})  # finished: the latest is what one looks for


_BROWSER_COLUMNS = """j.id, j.kind, j.status, j.email, j.priority, j.available_at, j.attempts,
               j.last_error, j.last_error_class, j.claimed_by, j.claimed_at, j.created_at,
               j.finished_at, j.campaign_id, j.user_ref"""


def jobs_in_state(conn: Connection, state: str, where: JobFilter, *,
                  after: Sequence[Any] | None = None, limit: int = 50
                  ) -> list[dict[str, Any]]:
    """Jobs in the browser ``state`` matching ``where``, in the order they will be
    handled (finished ones newest first), ``limit`` of them after the keyset ``after`` (the
    previous page's last row's order columns)."""
    if state == "waiting":
        return _waiting(conn, where, after=after, limit=limit)
    condition, order = BROWSER_STATES[state]
    newest_first = state in NEWEST_FIRST
    extra, params = where.where()
    keyset = ""
    if after is not None:
        names = [f":after{i}" for i in range(len(order))]
        keyset = f" AND ({', '.join(order)}) {'<' if newest_first else '>'} " \
                 f"({', '.join(names)})"
        params.update({f"after{i}": v for i, v in enumerate(after)})
    if newest_first:
        order = tuple(f"{column} DESC" for column in order)
    rows = conn.execute(sa.text(f"""
        SELECT {_BROWSER_COLUMNS}, c.name AS campaign_name
          FROM delivery_jobs j LEFT JOIN campaigns c ON c.id = j.campaign_id
         WHERE {condition}{extra}{keyset}
         ORDER BY {', '.join(order)} LIMIT :limit"""), {**params, "limit": limit})
    return [dict(r) for r in rows.mappings()]


# Waiting jobs in claim order, each page read the way the claim reads them: the
# transactional ones along delivery_jobs_claim_idx, each open broadcast's along its own
# range of delivery_jobs_broadcast_due_idx (the keyset inside that range), merged. So a
# page reads at most `limit` entries per open campaign and as many of the transactional
# index, however many millions wait.
_WAITING = f"""
SELECT w.*, c.name AS campaign_name FROM (
    (SELECT {_BROWSER_COLUMNS} FROM delivery_jobs j
      WHERE j.status IN {sql_list(CLAIMABLE)} AND j.broadcast_id IS NULL
        AND j.status = '{PENDING}' AND j.available_at <= now(){{extra}}{{keyset}}
      ORDER BY j.priority, j.available_at, j.id LIMIT :limit)
    UNION ALL
    SELECT d.* FROM broadcasts b CROSS JOIN LATERAL (
        SELECT {_BROWSER_COLUMNS} FROM delivery_jobs j
         WHERE j.broadcast_id = b.id AND j.status IN {sql_list(CLAIMABLE)}
           AND j.status = '{PENDING}'{{extra}}{{campaign_keyset}}
         ORDER BY j.available_at, j.id LIMIT :limit) d
     WHERE b.finished_at IS NULL{{campaign}}
) w LEFT JOIN campaigns c ON c.id = w.campaign_id
 ORDER BY w.priority, w.available_at, w.id LIMIT :limit
"""


def _waiting(conn: Connection, where: JobFilter, *, after: Sequence[Any] | None,
             limit: int) -> list[dict[str, Any]]:
    extra, params = where.where()
    keyset = campaign_keyset = ""
    campaign = " AND b.id = :broadcast_id" if where.broadcast_id is not None else ""
    if after is not None:
        keyset = " AND (j.priority, j.available_at, j.id) > (:after0, :after1, :after2)"
        params.update({f"after{i}": v for i, v in enumerate(after)})
        # Campaign jobs all have the campaign class's priority: the keyset inside a
        # broadcast's range is on (available_at, id) alone, which its index answers.
        if after[0] > PRIORITY["broadcast"]:
            campaign = " AND false"
        elif after[0] == PRIORITY["broadcast"]:
            campaign_keyset = " AND (j.available_at, j.id) > (:after1, :after2)"
    if where.kind not in (None, "broadcast") or where.email:
        campaign = " AND false"  # an address finds no campaign job waiting (JobFilter)
    rows = conn.execute(sa.text(_WAITING.format(
        extra=extra, keyset=keyset, campaign_keyset=campaign_keyset, campaign=campaign)),
        {**params, "limit": limit})
    return [dict(r) for r in rows.mappings()]


def scheduled_message_count(conn: Connection, where: JobFilter) -> int:
    """Transactional messages matching ``where`` whose send_at is still ahead (a campaign's
    jobs are never among them: a scheduled campaign has none until its time)."""
    if where.broadcast_id is not None or where.kind == "broadcast":
        return 0
    extra, params = where.where()
    return int(conn.execute(sa.text(
        f"SELECT count(*) FROM delivery_jobs j WHERE {_SCHEDULED_MESSAGE}{extra}"),
        params).scalar() or 0)


_COUNTS_FOR_EMAIL = sa.text(f"""
SELECT status, count(*) AS n FROM delivery_jobs j
 WHERE lower(j.email) = lower(:email) AND {_ADDRESS_INDEXED}
   AND (CAST(:kind AS text) IS NULL OR j.kind = :kind)
   AND j.status IN {sql_list(STATES)}
 GROUP BY status
""")


def state_counts_for_email(conn: Connection, email: str, kind: str | None
                           ) -> dict[str, int]:
    """Jobs per state for one address (a handful of rows)."""
    counts = dict.fromkeys(STATES, 0)
    for row in conn.execute(_COUNTS_FOR_EMAIL, {"email": email, "kind": kind}):
        counts[row.status] = int(row.n)
    return counts


_COUNT_PROBLEMS = """
SELECT count(*) FROM (SELECT 1 FROM delivery_jobs j WHERE {where} AND j.finished_at <= :as_of
                       LIMIT :cap) matching
"""


def count_problems(conn: Connection, where: ProblemFilter, as_of: datetime,
                   cap: int = 1_000_000) -> int:
    """How many open problems "retry all matching" would retry (those finished by
    ``as_of``), counted along the inbox index up to ``cap``."""
    sql, params = where.where()
    return int(conn.execute(sa.text(_COUNT_PROBLEMS.format(where=sql)),
                            {**params, "as_of": as_of, "cap": cap}).scalar_one())


_COUNT_RETRYABLE = """
SELECT count(*) FROM (
    SELECT 1 FROM delivery_jobs j LEFT JOIN campaigns c ON c.id = j.campaign_id
     WHERE {where} AND j.finished_at <= :as_of
       AND NOT EXISTS (SELECT 1 FROM suppressions s WHERE s.email = lower(j.email))
       AND c.status IS DISTINCT FROM 'cancelled'
     LIMIT :cap) retryable
"""


def count_retryable(conn: Connection, where: ProblemFilter, as_of: datetime,
                    cap: int = 1_000_000) -> int:
    """Of the problems :func:`count_problems` counts, those "retry all" can put back: not
    on the suppression list, not of a cancelled campaign ("Retry all 59" was
    offered for 59 suppressed addresses, and could only refuse them all)."""
    sql, params = where.where()
    return int(conn.execute(sa.text(_COUNT_RETRYABLE.format(where=sql)),
                            {**params, "as_of": as_of, "cap": cap}).scalar_one())


_SCHEDULED_CAMPAIGNS = sa.text(f"""
SELECT c.id, c.name, c.scheduled_at, l.name AS list_name, l.subscriber_count
  FROM campaigns c JOIN lists l ON l.id = c.list_id
 WHERE c.status = '{Campaign.SCHEDULED}' ORDER BY c.scheduled_at, c.id LIMIT :limit
""")


def scheduled_campaigns(conn: Connection, limit: int = 100) -> list[dict[str, Any]]:
    """Campaigns waiting for their time (their jobs are created when it comes)."""
    return [dict(r) for r in conn.execute(_SCHEDULED_CAMPAIGNS, {"limit": limit}).mappings()]
