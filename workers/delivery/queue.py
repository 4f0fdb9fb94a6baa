"""All queue SQL, in one place, so the promises can be checked in one file.

Each statement carries a line saying what it guarantees. The job states are
``pending → sending → sent | retry → sending … | failed | bounced | skipped | cancelled``
(and ``held`` for verification mail held by policy). Functions take a SQLAlchemy
``Connection``; the caller owns the transaction.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parseaddr
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.jobs import ClaimedJob, Outcome  # defined in core; imported from here too
from workers.core.states import (
    ACTIVE,
    BOUNCED,
    CANCELLED,
    CLAIMABLE,
    COUNTED,
    HELD,
    PENDING,
    PRIORITY,
    PROBLEM,
    RETRY,
    SENDING,
    SENT,
    SKIPPED,
    TERMINAL,
    WAITING,
    Campaign,
    sql_list,
)

#: The suppression reason a hard bounce writes (suppressions.reason, not a job state).
BOUNCE_REASON = "bounced"


# --- enqueue ---------------------------------------------------------------------------

# Jobs are created in workers.delivery.enqueue (the one way into the queue).

# Broadcasts that were accepted but whose jobs do not exist yet (the send request returned).
_BROADCASTS_TO_ENQUEUE = sa.text(f"""
SELECT b.id FROM broadcasts b JOIN campaigns c ON c.id = b.campaign_id
 WHERE b.enqueued_at IS NULL AND c.status IN {sql_list(Campaign.STARTED)} ORDER BY b.id LIMIT 10
""")


def broadcasts_to_enqueue(conn: Connection) -> list[int]:
    return [r.id for r in conn.execute(_BROADCASTS_TO_ENQUEUE)]


def notify_new_jobs(conn: Connection, kind: str) -> None:
    """Wake idle workers at once (delivered at commit): P7's fast path."""
    conn.execute(sa.text("SELECT pg_notify('senddock_jobs', :kind)"), {"kind": kind})


# --- claim -----------------------------------------------------------------------------

# Claim in one statement: due jobs in priority order (transactional kinds first, P7),
# skipping rows other workers hold (SKIP LOCKED), marked `sending` with this worker's id,
# the batch's claim token and the database clock at the claim (clock_timestamp(), not the
# transaction start: a claim that waited on a lock is as young as its commit). The caller
# registers the token as held *before* the statement runs, so the lost-claim release can
# never take back a claim in progress. Paused and cancelled campaigns are out of the claim
# path: the transactional jobs come from their own index, and each open broadcast whose
# campaign is `sending` (the lifecycle's one-row decision, workers.delivery.lifecycle) from its own
# range of delivery_jobs_broadcast_due_idx, so a paused or cancelled backlog of any size is
# never read, and a cancelled campaign's jobs not settled yet are never claimed. Nothing
# is claimed while every relay (:relays of them, docs/design.md §17) is marked down (P6) or has
# paused us (one relay up is enough: it carries the others' streams), nor for a recipient
# domain that is throttling us (docs/design.md §16: the other domains keep flowing).
# The Message-ID is fixed at the first claim and never changes (P3): random (it must not
# reveal volume) on the campaign's From domain.
_CLAIM = sa.text(rf"""
WITH relay_up AS (
    SELECT EXISTS (SELECT 1 FROM relay_state r
                    WHERE r.id <= :relays AND r.status <> 'down'
                      AND NOT coalesce(r.throttled_until > now(), false)) AS ok
), transactional AS (
    SELECT j.id, j.priority, j.available_at FROM delivery_jobs j
     WHERE j.status IN {sql_list(CLAIMABLE)} AND j.broadcast_id IS NULL
       AND j.available_at <= now() AND (SELECT ok FROM relay_up)
       AND NOT EXISTS (SELECT 1 FROM domain_throttles t
                        WHERE t.domain = lower(split_part(j.email, '@', 2))
                          AND t.until > now())
     ORDER BY j.priority, j.available_at, j.id
     LIMIT :n
       FOR UPDATE OF j SKIP LOCKED
), campaign AS (
    SELECT d.id, d.priority, d.available_at FROM broadcasts b
     CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.available_at FROM delivery_jobs j
         WHERE j.broadcast_id = b.id AND j.status IN {sql_list(CLAIMABLE)}
           AND j.available_at <= now()
           AND NOT EXISTS (SELECT 1 FROM domain_throttles t
                            WHERE t.domain = lower(split_part(j.email, '@', 2))
                              AND t.until > now())
         ORDER BY j.available_at, j.id
         LIMIT :n
           FOR UPDATE OF j SKIP LOCKED) d
     WHERE b.finished_at IS NULL
       AND EXISTS (SELECT 1 FROM campaigns c WHERE c.id = b.campaign_id
                      AND c.status = '{Campaign.SENDING}')
       AND (SELECT ok FROM relay_up)
), due AS (
    SELECT id FROM (SELECT * FROM transactional UNION ALL SELECT * FROM campaign) c
     ORDER BY priority, available_at, id
     LIMIT :n
), claimed AS (
    UPDATE delivery_jobs j
       SET status = '{SENDING}', claimed_by = :worker, claim_token = CAST(:token AS uuid),
           claimed_at = clock_timestamp(),
           message_id = coalesce(j.message_id, '<' || replace(gen_random_uuid()::text, '-', '')
               || '@' || coalesce((SELECT lower(substring(c.from_addr FROM '@([^@>\s]+)>?\s*$'))
                                     FROM campaigns c WHERE c.id = j.campaign_id), :domain)
               || '>')
      FROM due WHERE j.id = due.id
    RETURNING j.id, j.kind, j.priority, j.email, j.claim_token, j.attempts, j.retry_base,
              j.correlation_id, j.message_id, j.campaign_id, j.subscriber_id, j.broadcast_id,
              j.user_ref, j.payload,
              EXISTS (SELECT 1 FROM suppressions s WHERE s.email = lower(j.email))
                  AS suppressed,
              coalesce((SELECT s.name FROM subscribers s WHERE s.id = j.subscriber_id), '')
                  AS name,
              coalesce((SELECT s.attributes FROM subscribers s WHERE s.id = j.subscriber_id),
                       '{{}}'::jsonb) AS attributes,
              (SELECT c.updated_at::text FROM campaigns c
                WHERE c.id = coalesce(j.campaign_id, (j.payload ->> 'campaign_id')::bigint))
                  AS campaign_version,
              extract(epoch FROM clock_timestamp() - j.available_at)::float8 AS waited
)
-- One JSON value for the whole batch: decoding it is far cheaper in Python than rows.
SELECT coalesce(json_agg(claimed ORDER BY claimed.id), '[]'::json) AS jobs FROM claimed
""")


def claim_batch(conn: Connection, worker_id: str, n: int, domain: str,
                token: str | None = None, relays: int = 1) -> list[ClaimedJob]:
    """Claim up to ``n`` due jobs for ``worker_id`` under one claim ``token`` (a fresh one
    when None), while one of the first ``relays`` relays is usable. No two workers ever
    get the same job."""
    rows = conn.execute(_CLAIM, {"worker": worker_id, "n": n, "domain": domain,
                                 "token": token or str(uuid.uuid4()),
                                 "relays": relays}).scalar_one()
    jobs = [ClaimedJob(**row) for row in rows]
    jobs.sort(key=lambda j: (j.priority, j.id))
    return jobs


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


# --- liveness: leases (docs/design.md §15) -------------------------------------------------------

_REGISTER_WORKER = sa.text("""
INSERT INTO workers (id, node, hostname, pid, threads, heartbeat_at, lease_until)
VALUES (:id, :node, :hostname, :pid, :threads, clock_timestamp(),
        clock_timestamp() + make_interval(secs => :lease))
RETURNING lease_term
""")


def register_worker(conn: Connection, *, worker_id: str, node: str, hostname: str, pid: int,
                    threads: int, lease: float) -> int:
    """Register the pool with a lease of ``lease`` seconds from the database's clock;
    returns the lease's term."""
    return int(conn.execute(_REGISTER_WORKER, {
        "id": worker_id, "node": node, "hostname": hostname, "pid": pid, "threads": threads,
        "lease": lease}).scalar_one())


# Renew the lease: it runs ``lease`` seconds from the database's clock now. A lease that
# had lapsed (or a worker marked stopped or dead meanwhile) starts a new term: what the
# worker claimed under the old term may have been taken back, so it gives that back
# instead of sending it. Only the workers row is touched (never delivery_jobs, whose
# locks must not hold a lease up). None when the row is gone.
_RENEW_LEASE = sa.text("""
UPDATE workers
   SET lease_term = lease_term + CASE WHEN lease_until <= clock_timestamp()
                                        OR stopped_at IS NOT NULL THEN 1 ELSE 0 END,
       lease_until = clock_timestamp() + make_interval(secs => :lease),
       heartbeat_at = clock_timestamp(), stopped_at = NULL, in_flight = :in_flight
 WHERE id = :id
RETURNING lease_term
""")


def renew_lease(conn: Connection, worker_id: str, lease: float, in_flight: int) -> int | None:
    """Renew ``worker_id``'s lease; its term (None if the worker is not registered)."""
    term = conn.execute(_RENEW_LEASE, {"id": worker_id, "lease": lease,
                                       "in_flight": in_flight}).scalar()
    return None if term is None else int(term)


# End the other backends named ``name`` (a worker's liveness sessions: the name holds its
# id) -- those a partition cut off, which the server keeps until its keepalives give up.
# Waits up to 1 s for each to exit, so the caller knows it is gone. Same role only
# (PostgreSQL allows no more without pg_signal_backend).
_END_STALE_SESSIONS = sa.text("""
SELECT pid FROM pg_stat_activity
 WHERE application_name = :name
   AND CASE WHEN pid = pg_backend_pid() THEN false  -- CASE: evaluated first, never itself
            ELSE pg_terminate_backend(pid, 1000) END
""")


def end_stale_sessions(conn: Connection, name: str) -> list[int]:
    """Terminate the other sessions named ``name``; the pids ended."""
    return [int(pid) for pid in conn.execute(_END_STALE_SESSIONS, {"name": name}).scalars()]


# Take back the in-flight jobs of the given dead workers, or of every worker whose lease
# expired more than :grace seconds ago: back to `pending` with their place in line (their
# available_at is kept), attempt not counted (we cannot know whether the relay got the
# message; the Message-ID stays the same, P3). The workers rows are locked first, so a
# renewal running at the same moment waits and then starts a new term: the worker gives
# back what it held instead of sending it. A dead worker is marked stopped.
_TAKE_BACK = sa.text(f"""
WITH dead AS (
    SELECT id FROM workers
     WHERE id <> :me
       AND (id = ANY(CAST(:ids AS text[]))
            OR lease_until < now() - make_interval(secs => :grace))
       AND (stopped_at IS NULL
            OR id IN (SELECT DISTINCT claimed_by FROM delivery_jobs WHERE status = '{SENDING}'))
       FOR UPDATE
), taken AS (
    UPDATE delivery_jobs j
       SET status = '{PENDING}', claimed_by = NULL, claim_token = NULL, claimed_at = NULL,
           last_error = 'taken back from worker ' || j.claimed_by
                        || ' after its lease expired',
           last_error_class = 'orphan'
      FROM dead WHERE j.status = '{SENDING}' AND j.claimed_by = dead.id
    RETURNING dead.id AS worker
), marked AS (
    UPDATE workers w SET stopped_at = now() FROM dead
     WHERE w.id = dead.id AND w.stopped_at IS NULL
)
SELECT dead.id, (SELECT count(*) FROM taken WHERE taken.worker = dead.id) AS n FROM dead
""")


def take_back(conn: Connection, *, me: str, grace: float,
              dead: Sequence[str] = ()) -> dict[str, int]:
    """Take back the jobs of every worker whose lease expired ``grace`` seconds ago, and
    of the workers ``dead`` names (known gone); returns {worker_id: jobs taken back}."""
    rows = conn.execute(_TAKE_BACK, {"me": me, "grace": grace, "ids": list(dead)}).all()
    return {row.id: int(row.n) for row in rows}


# This node's other registered processes (the startup hook asks the OS whether they are
# still there: a restart takes its predecessor's jobs back at once, P4).
_NODE_PEERS = sa.text(f"""
SELECT id, hostname, pid FROM workers
 WHERE node = :node AND id <> :me
   AND (stopped_at IS NULL
        OR id IN (SELECT DISTINCT claimed_by FROM delivery_jobs WHERE status = '{SENDING}'))
""")


def node_peers(conn: Connection, node: str, me: str) -> list[tuple[str, str, int]]:
    return [(r.id, r.hostname, r.pid)
            for r in conn.execute(_NODE_PEERS, {"node": node, "me": me})]


# Claims in this live worker's name that it does not hold: the claim committed but its
# answer never arrived (the connection died on the way back). It cannot race a claim in
# progress: a claim's token is registered as held before its statement runs, and a claim
# registered after the caller's snapshot of held tokens ran after :fence (the database
# clock, read before that snapshot), while only claims older than :fence minus the worker
# timeout (a margin for clock steps) are touched. Back to `pending`, attempt not counted.
_RELEASE_LOST_CLAIMS = sa.text(f"""
UPDATE delivery_jobs
   SET status = '{PENDING}', claimed_by = NULL, claim_token = NULL, claimed_at = NULL
 WHERE status = '{SENDING}' AND claimed_by = :me
   AND claimed_at < CAST(:fence AS timestamptz) - make_interval(secs => :margin)
   AND claim_token <> ALL(CAST(:holding AS uuid[]))
""")


def release_lost_claims(conn: Connection, worker_id: str,
                        held_tokens: Callable[[], Sequence[str]], margin: float) -> int:
    """Put back jobs claimed by ``worker_id`` under a token it does not hold.
    ``held_tokens`` is called after the fence is read (the order is the guarantee)."""
    fence = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    holding = list(held_tokens())
    return conn.execute(_RELEASE_LOST_CLAIMS, {"me": worker_id, "holding": holding,
                                               "fence": fence, "margin": margin}).rowcount


# Release jobs this worker claimed but will not send (shutdown mid-batch, relay trouble):
# back to `pending` without using an attempt.
_RELEASE = sa.text(f"""
UPDATE delivery_jobs
   SET status = '{PENDING}', claimed_by = NULL, claim_token = NULL, claimed_at = NULL
 WHERE id = ANY(CAST(:ids AS bigint[])) AND status = '{SENDING}'
   AND claim_token = ANY(CAST(:tokens AS uuid[]))
""")


def release(conn: Connection, jobs: Sequence[ClaimedJob]) -> int:
    if not jobs:
        return 0
    return conn.execute(_RELEASE, {"ids": [j.id for j in jobs],
                                   "tokens": [j.claim_token for j in jobs]}).rowcount


def mark_worker_stopped(conn: Connection, worker_id: str) -> int:
    """Mark the pool stopped; returns the jobs still claimed in its name (left to the
    rescuer, which takes them back once this process's lease has expired)."""
    return int(conn.execute(sa.text(f"""
        UPDATE workers SET stopped_at = now(), in_flight = (
            SELECT count(*) FROM delivery_jobs WHERE status = '{SENDING}' AND claimed_by = :id)
         WHERE id = :id RETURNING in_flight"""), {"id": worker_id}).scalar() or 0)


# --- relay state (P6) ------------------------------------------------------------------

# Pause all delivery (every process: the claim reads this row) and probe with backoff:
# 2, 4, ... s up to :probe_max (SENDDOCK_RELAY_PROBE_MAX); after a refused login no more
# often than :login_interval (docs/design.md §16: a fail2ban jail must never ban us). The refused
# URL's fingerprint is kept, so a process started with a different one probes at once.
# The pause escalates once per probe cycle (docs/design.md §17): a failure seen by a drain thread
# while the relay is already down (another thread's reply, or a send that started before
# the pause) changes neither the failure count nor the next probe; only a failed probe,
# or a different reason (a refused login now), does. The row lock makes this a
# compare-and-set across every thread and process.
_RELAY_DOWN = sa.text("""
UPDATE relay_state
   SET status = 'down', since = CASE WHEN status = 'down' THEN since ELSE now() END,
       last_error = :error,
       failures = CASE WHEN status = 'down' AND NOT :probe
                        AND reason IS NOT DISTINCT FROM :reason
                       THEN failures ELSE failures + 1 END,
       reason = :reason, smtp_fingerprint = :fingerprint,
       probe_recipient = coalesce(:probe_recipient, probe_recipient),
       next_probe_at = CASE WHEN status = 'down' AND NOT :probe
                             AND reason IS NOT DISTINCT FROM :reason THEN next_probe_at
           ELSE now() + make_interval(secs => CASE WHEN :reason = 'login'
           THEN :login_interval
           ELSE least(:probe_max, power(2, least(failures, 10))) END) END,
       updated_at = now()
 WHERE id = :relay
RETURNING failures
""")


def mark_relay_down(conn: Connection, error: str, *, login: bool = False,
                    fingerprint: str | None = None, probe_recipient: str | None = None,
                    login_interval: float = 300, probe_max: float = 60,
                    probe: bool = False, relay: int = 1) -> int:
    """Pause all delivery and probe with backoff (``login``: the relay refused our
    credentials -- probed at most every ``login_interval`` seconds). ``probe_recipient``:
    the probe also asks RCPT for this address (a refusal reported only at RCPT).
    ``probe``: this failure is a probe's (it escalates the backoff); a drain thread's
    failure while the relay is already down counts once. Returns the failure count."""
    return int(conn.execute(_RELAY_DOWN, {
        "error": error[:1000], "reason": "login" if login else None,
        "fingerprint": fingerprint, "probe_recipient": probe_recipient,
        "login_interval": float(login_interval), "probe_max": float(probe_max),
        "probe": probe, "relay": relay}).scalar_one())


def mark_relay_ok(conn: Connection, relay: int = 1) -> bool:
    """Resume delivery through ``relay``. Returns True if it had been down."""
    row = conn.execute(sa.text("""
        UPDATE relay_state SET status = 'ok', failures = 0, next_probe_at = NULL,
               reason = NULL, probe_recipient = NULL, updated_at = now(), since = now()
         WHERE id = :relay AND status = 'down' RETURNING id"""), {"relay": relay}).first()
    return row is not None


# Exactly one process probes a down relay at a time: it moves next_probe_at forward first.
_TAKE_PROBE = sa.text("""
UPDATE relay_state
   SET next_probe_at = now() + make_interval(secs => CASE WHEN reason = 'login'
           THEN :login_interval ELSE least(:probe_max, power(2, least(failures, 10))) END)
 WHERE id = :relay AND status = 'down' AND (next_probe_at IS NULL OR next_probe_at <= now())
RETURNING id
""")


def take_probe_turn(conn: Connection, login_interval: float = 300,
                    probe_max: float = 60, relay: int = 1) -> bool:
    return conn.execute(_TAKE_PROBE, {"login_interval": float(login_interval),
                                      "probe_max": float(probe_max),
                                      "relay": relay}).first() is not None


def probe_now(conn: Connection) -> bool:
    """An admin's "Retry now": every relay that is down is probed at once. True if one
    was down."""
    row = conn.execute(sa.text("UPDATE relay_state SET next_probe_at = now() "
                               "WHERE status = 'down' RETURNING id")).first()
    return row is not None


def note_smtp_url(conn: Connection, fingerprint: str, relay: int = 1) -> bool:
    """At start: if the relay is down because of a *different* SMTP URL (say, the password
    was fixed), probe at once instead of waiting out the old backoff. True if so."""
    row = conn.execute(sa.text("""
        UPDATE relay_state SET next_probe_at = now()
         WHERE id = :relay AND status = 'down' AND smtp_fingerprint IS DISTINCT FROM :fp
        RETURNING id"""), {"fp": fingerprint, "relay": relay}).first()
    return row is not None


def ensure_relays(conn: Connection, relays: int) -> None:
    """A ``relay_state`` row for each of the configured relays (1..relays)."""
    conn.execute(sa.text("INSERT INTO relay_state (id, status) SELECT i, 'ok' "
                         "FROM generate_series(1, :n) i ON CONFLICT (id) DO NOTHING"),
                 {"n": relays})


def relay_states(conn: Connection, relays: int) -> list[dict[str, Any]]:
    """The state of each configured relay (1..relays), in order; a relay no worker has
    used yet is ok."""
    return [relay_status(conn, i) for i in range(1, relays + 1)]


def relay_status(conn: Connection, relay: int = 1) -> dict[str, Any]:
    row = conn.execute(sa.text("""
        SELECT r.*, coalesce(r.throttled_until > now(), false) AS paused,
               l.paced_rate, coalesce(r.throttled_until > now(), false)
                             OR l.paced_rate IS NOT NULL AS throttled
          FROM relay_state r LEFT JOIN rate_limiter l ON l.id = 1 WHERE r.id = :relay"""),
                       {"relay": relay}).mappings().first()
    return dict(row) if row else {"id": relay, "status": "ok", "throttled": False,
                                  "paused": False, "paced_rate": None}


# --- throttling (docs/design.md §16, §17): slow down, never fail ----------------------------------
# A relay that throttles us is paced (AIMD, on the shared rate limiter's row): its rate is
# halved at most once per second -- threads that see the same reply at the same moment
# count once -- and grows back by a step per clean PACE_CLEAN_INTERVAL; nothing stops. A
# relay that closes the channel (421) is also paused, and a recipient domain that throttles
# us waits alone: the n-th pause in a row lasts backoff[n-1] seconds (the last step
# repeats), and a pause lengthens only when a reply *after* the previous pause ended says
# the same again (compare-and-set on the row: replies during a pause change nothing).

PACE_FLOOR = 0.05  # messages per second: never slower than one every 20 s
PACE_CLEAN_INTERVAL = 2.0  # seconds without a throttle reply before the rate grows a step
PACE_STEPS = 5  # the rate grows back to where it was first halved from in this many steps
PACE_MEASURE = 5.0  # seconds of sends the first halving measures the rate over
PACE_START = 2.0  # the rate the first halving assumes when fewer were measured
# A relay that counts per fixed window (Postfix's anvil) refuses everything until its
# window ends, however slowly we send: halving on each refusal would fall far below what
# it accepts. So a halving never goes below the rate the relay accepted over the last
# PACE_ACCEPTED seconds (it demonstrably takes that much).
PACE_ACCEPTED = 10.0

_PACE_DOWN = sa.text(f"""
WITH measured AS (
    SELECT greatest(count(*) / {PACE_MEASURE}, {PACE_START}) AS rate FROM delivery_jobs
     WHERE status = '{SENT}' AND finished_at > now() - make_interval(secs => {PACE_MEASURE})
), accepted AS (
    SELECT count(*) / {PACE_ACCEPTED} AS rate FROM delivery_jobs
     WHERE status = '{SENT}' AND finished_at > now() - make_interval(secs => {PACE_ACCEPTED})
), cur AS (
    SELECT least(coalesce(l.paced_rate, CASE WHEN :limit > 0 THEN :limit
                                             ELSE (SELECT rate FROM measured) END),
                 CASE WHEN :limit > 0 THEN :limit ELSE 'infinity'::float8 END) AS rate
      FROM rate_limiter l WHERE id = 1
)
UPDATE rate_limiter l
   SET paced_rate = greatest((SELECT rate FROM cur) / 2, (SELECT rate FROM accepted),
                             {PACE_FLOOR}),
       paced_step = coalesce(l.paced_step,
                             greatest((SELECT rate FROM cur) / {PACE_STEPS}, {PACE_FLOOR})),
       paced_at = now()
 WHERE id = 1 AND (l.paced_at IS NULL OR l.paced_rate IS NULL
                   OR l.paced_at <= now() - interval '1 second')
RETURNING paced_rate
""")

_THROTTLE_RELAY = sa.text("""
UPDATE relay_state
   SET throttle_hits = throttle_hits + CASE WHEN :counted THEN 1 ELSE 0 END,
       throttle_reply = :reply, updated_at = now()
 WHERE id = :relay
""")

# 421: the relay closed the channel. A pause, escalated once per cycle (see above).
_PAUSE_RELAY = sa.text("""
UPDATE relay_state
   SET pause_hits = CASE WHEN throttled_until > now() - interval '10 minutes'
                         THEN pause_hits + 1 ELSE 1 END
 WHERE id = :relay AND (throttled_until IS NULL OR throttled_until <= now())
RETURNING pause_hits
""")


def throttle_relay(conn: Connection, reply: str, backoff: Sequence[int], *,
                   rate_limit: float = 0, pause: bool = False,
                   relay: int = 1) -> float | None:
    """The relay throttles us: halve the paced send rate of every process (at most once a
    second; the first time from the rate measured over the last seconds, never above
    ``rate_limit`` when one is set). ``pause`` (a 421: the relay closed the channel): also
    stop claiming for the next backoff step, escalated once per pause cycle. Returns the
    rate in force when this call lowered it, else None."""
    rate = conn.execute(_PACE_DOWN, {"limit": float(rate_limit)}).scalar()
    hits = conn.execute(_PAUSE_RELAY, {"relay": relay}).scalar() if pause else None
    if hits is not None:
        delay = float(backoff[min(int(hits), len(backoff)) - 1])
        conn.execute(sa.text("UPDATE relay_state SET throttled_until = now() + "
                             "make_interval(secs => :d) WHERE id = :relay"),
                     {"d": delay, "relay": relay})
    conn.execute(_THROTTLE_RELAY, {"reply": reply[:1000], "relay": relay,
                                   "counted": rate is not None or hits is not None})
    return None if rate is None else float(rate)


# Grow the paced rate back by one step per clean interval; pacing ends once the rate is
# back above the configured limit (or, without one, above twice where it was halved from).
_PACE_CEILING = f"CASE WHEN :limit > 0 THEN :limit ELSE paced_step * {PACE_STEPS} * 2 END"
_PACE_UP = sa.text(f"""
UPDATE rate_limiter
   SET paced_rate = CASE WHEN paced_rate + paced_step >= {_PACE_CEILING}
                         THEN NULL ELSE paced_rate + paced_step END,
       paced_step = CASE WHEN paced_rate + paced_step >= {_PACE_CEILING}
                         THEN NULL ELSE paced_step END,
       paced_at = now()
 WHERE id = 1 AND paced_rate IS NOT NULL
   AND paced_at <= now() - make_interval(secs => {PACE_CLEAN_INTERVAL})
RETURNING paced_rate
""")


def paced_rate(conn: Connection) -> float | None:
    """The rate a throttling relay is paced at now (None: not paced)."""
    value = conn.execute(sa.text("SELECT paced_rate FROM rate_limiter WHERE id = 1")).scalar()
    return None if value is None else float(value)


def reset_pacing(conn: Connection) -> None:
    conn.execute(sa.text("UPDATE rate_limiter SET paced_rate = NULL, paced_step = NULL, "
                         "paced_at = NULL WHERE id = 1"))


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
    conn.execute(sa.text("DELETE FROM domain_throttles WHERE until < now() - interval '1 day'"))


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


# --- rate limit ------------------------------------------------------------------------
# On the database's clock, shared by every process and host (docs/design.md §16). Per second: a GCRA
# ("theoretical arrival time") in one row, so sends are spaced 1/rate apart however many
# workers ask and fractional rates work (0.5/s = one send every 2 s). Per hour and per
# day: sends counted per minute over rolling windows. The row lock taken first serializes
# every grant, so two processes can never both take the last permit.


@dataclass
class Permits:
    """Sends this worker may start: the first at ``first_at`` (this process's monotonic
    clock), the following ones ``interval`` seconds apart. ``granted == 0``: ask again in
    ``retry_in`` seconds."""

    granted: int
    first_at: float = 0.0
    interval: float = 0.0
    retry_in: float = 0.0
    rate: float = 0.0  # the per-second rate in force (0: none; a throttling relay's pace)


_RATE_STATE = sa.text("""
WITH cur AS (
    SELECT extract(epoch FROM tat)::float8 AS tat,
           extract(epoch FROM clock_timestamp())::float8 AS now, paced_rate
      FROM rate_limiter WHERE id = 1 FOR UPDATE
)
SELECT c.tat, c.now, c.paced_rate,
       (SELECT coalesce(sum(used), 0) FROM rate_minutes
         WHERE minute >= date_trunc('minute', now() - interval '1 hour')) AS hour,
       (SELECT coalesce(sum(used), 0) FROM rate_minutes
         WHERE minute >= date_trunc('minute', now() - interval '1 day')) AS day
  FROM cur c
""")

# Take the granted slots: the next free slot moves past them; the minute is counted.
_RATE_TAKE = sa.text("""
WITH t AS (
    UPDATE rate_limiter SET tat = to_timestamp(:tat) WHERE id = 1
)
INSERT INTO rate_minutes AS m (minute, used) VALUES (date_trunc('minute', now()), :n)
ON CONFLICT (minute) DO UPDATE SET used = m.used + :n
""")


def acquire_permits(conn: Connection, want: int, per_second: float, per_hour: int = 0,
                    per_day: int = 0, horizon: float = 1.0) -> Permits:
    """Permits for up to ``want`` sends, never more than the limits allow (0 = no limit):
    at most ``per_second`` sends per second, ``per_hour`` in any rolling 60 minutes and
    ``per_day`` in any rolling 24 hours, across every process. Per second, the slots lie
    on a grid of ``1/per_second`` aligned to the database clock's whole seconds, so every
    second holds at most ``per_second`` of them and the last leaves ``1/per_second`` for
    the relay's reply before the next second begins. Slots up to ``horizon`` seconds ahead
    are handed out; the caller waits for each. Unused ones go back with
    :func:`refund_permits` in the same transaction."""
    conn.execute(_PACE_UP, {"limit": float(per_second)})
    state = conn.execute(_RATE_STATE).one()
    observed = time.monotonic()  # the database's clock was read before this instant
    if state.paced_rate is not None:  # a throttling relay paces every process
        per_second = min(per_second or math.inf, float(state.paced_rate))
    n, retry_in = want, 1.0
    interval = 1.0 / per_second if per_second > 0 else 0.0
    start = max(state.tat, state.now)
    if interval:
        start = math.ceil(round(start * per_second, 6)) / per_second  # onto the grid
        ahead = start - state.now
        slots = int((horizon - ahead) // interval) + 1 if ahead <= horizon else 0
        n = min(n, slots)
        retry_in = max(0.05, ahead - horizon)
    for limit, used, window in ((per_hour, state.hour, 60.0), (per_day, state.day, 600.0)):
        if limit > 0 and limit - int(used) < n:
            n, retry_in = max(0, limit - int(used)), window
    if n <= 0:
        return Permits(0, retry_in=retry_in, rate=per_second)
    conn.execute(_RATE_TAKE, {"tat": start + interval * n, "n": n})
    return Permits(n, first_at=observed + max(0.0, start - state.now), interval=interval,
                   rate=per_second)


def refund_permits(conn: Connection, permits: Permits, used: int) -> None:
    """Give back the permits a claim did not need (same transaction as the grant, so the
    rate row is still locked by us and nobody was handed a later slot meanwhile)."""
    unused = permits.granted - used
    if unused <= 0:
        return
    conn.execute(sa.text("""
        WITH t AS (UPDATE rate_limiter SET tat = tat - make_interval(secs => :back)
                    WHERE id = 1)
        UPDATE rate_minutes SET used = greatest(0, used - :n)
         WHERE minute = date_trunc('minute', now())"""),
                 {"back": permits.interval * unused, "n": unused})


# The limits and what is used of them, for Queue health.
_RATE_USAGE = sa.text("""
SELECT (SELECT coalesce(sum(used), 0) FROM rate_minutes
         WHERE minute >= date_trunc('minute', now() - interval '1 minute')) AS last_minute,
       (SELECT coalesce(sum(used), 0) FROM rate_minutes
         WHERE minute >= date_trunc('minute', now() - interval '1 hour')) AS hour,
       (SELECT coalesce(sum(used), 0) FROM rate_minutes
         WHERE minute >= date_trunc('minute', now() - interval '1 day')) AS day
""")


def rate_usage(conn: Connection) -> dict[str, int]:
    """Sends counted against the limits: in the current and last minute, the rolling
    hour and the rolling day (whole minutes, so slightly more than the exact window)."""
    row = conn.execute(_RATE_USAGE).one()
    return {"last_minute": int(row.last_minute), "hour": int(row.hour), "day": int(row.day)}


def forget_expired_imports(conn: Connection) -> int:
    """Delete the CSV files checked first and never imported, once they expired (their
    chunks go with them): docs/design.md §34."""
    return int(conn.execute(sa.text(
        "DELETE FROM import_uploads WHERE expires_at <= now()")).rowcount)


def prune_rate_minutes(conn: Connection) -> None:
    """Forget minutes older than the longest window (maintenance)."""
    conn.execute(sa.text("DELETE FROM rate_minutes WHERE minute < now() - interval '25 hours'"))


# --- minute counters (migration 0035_minute_counters) -----------------------------------

#: How far back attempt_minutes is kept: Queue health's chart shows the last hour.
MINUTES_KEPT = timedelta(hours=2)
PRUNE_BATCH = 10_000

# One batch of counter rows older than the horizon, along the primary key (minute first);
# each batch is its own short statement, so no long lock is held on the rows the
# finishers upsert (which are all newer).
_PRUNE_MINUTES = sa.text("""
DELETE FROM attempt_minutes WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM attempt_minutes
     WHERE minute < now() - make_interval(secs => :kept) LIMIT :batch))
""")


def prune_minutes(conn: Connection, kept: timedelta = MINUTES_KEPT,
                  batch: int = PRUNE_BATCH) -> int:
    """Delete the attempt counters older than ``kept``, ``batch`` rows per statement, each
    committed on its own when ``conn`` is in autocommit; returns how many went."""
    total = 0
    while True:
        gone = conn.execute(_PRUNE_MINUTES, {"kept": kept.total_seconds(),
                                              "batch": batch}).rowcount
        total += gone
        if gone < batch:
            return total


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
# waiting, on every POST (issue 27).
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


# --- verification ----------------------------------------------------------------------
# Transactional mail for one user of the team's SaaS (docs/design.md §21). "Live" means not
# terminal: pending, sending, retry or held; the partial unique index delivery_jobs_one_active_idx
# keeps it to one live job per (kind, user).

# A job as the API and the pages read it: each field's name, and its expression where
# the column alone is not it.
JOB_FIELDS: dict[str, str] = {
    "id": "id", "kind": "kind", "status": "status", "email": "email",
    "user_ref": "user_ref", "correlation_id": "correlation_id::text", "flags": "flags",
    "payload": "payload", "attempts": "attempts", "available_at": "available_at",
    "created_at": "created_at", "finished_at": "finished_at", "last_error": "last_error",
    "last_error_class": "last_error_class", "requested_by": "requested_by",
    "idempotency_key": "idempotency_key", "message_id": "message_id"}


def job_columns(without: Sequence[str] = ()) -> str:
    """The select list of :data:`JOB_FIELDS`, less the fields ``without``."""
    return ", ".join(expression if expression == name else f"{expression} AS {name}"
                     for name, expression in JOB_FIELDS.items() if name not in without)


JOB_COLUMNS = job_columns()


def lock_user(conn: Connection, kind: str, user_ref: str) -> None:
    """Serialize requests for one (kind, user) until the caller's transaction ends, so the
    cooldown check and the insert that follows it cannot interleave with another request.
    (The two-key form lives in a key space apart from the workers' bigint liveness locks.)"""
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(7, hashtext(:kind || ':' || :user_ref))"),
                 {"kind": kind, "user_ref": user_ref})


def single_job(conn: Connection, job_id: int) -> dict[str, Any]:
    """One transactional job in the shape the verification API and support page use."""
    return dict(conn.execute(sa.text(f"SELECT {JOB_COLUMNS} FROM delivery_jobs WHERE id = :id"),
                             {"id": job_id}).mappings().one())


# The user's most recent job and how many seconds of resend cooldown are left (0 when none),
# measured on the database clock from the latest of: the job's creation, its acceptance by
# the relay, and the last resend that reused it.
_LATEST_JOB_FOR_USER = sa.text(f"""
SELECT {JOB_COLUMNS},
       greatest(0, extract(epoch FROM greatest(
           created_at,
           CASE WHEN status = '{SENT}' THEN finished_at END,
           CAST(payload ->> 'resent_at' AS timestamptz))
         + make_interval(secs => :cooldown) - now()))::float8 AS cooldown_left,
       greatest(created_at, CASE WHEN status = '{SENT}' THEN finished_at END,
                CAST(payload ->> 'resent_at' AS timestamptz))
         + make_interval(secs => :cooldown) AS cooldown_until
  FROM delivery_jobs
 WHERE kind = :kind AND user_ref = :user_ref
 ORDER BY created_at DESC, id DESC LIMIT 1
""")


def latest_job_for_user(conn: Connection, kind: str, user_ref: str,
                        cooldown: float) -> dict[str, Any] | None:
    """The newest job for the user, with ``cooldown_left`` (seconds) and
    ``cooldown_until`` for a resend cooldown of ``cooldown`` seconds; None if there is none."""
    row = conn.execute(_LATEST_JOB_FOR_USER, {"kind": kind, "user_ref": user_ref,
                                              "cooldown": cooldown}).mappings().first()
    return dict(row) if row else None


# A resend that reuses the live job: a waiting (pending/retry) job becomes due now, at the
# priority of a single request of its kind (an imported one no longer waits behind the rest
# of its import: states.BULK_STEP); the resend time is stamped on every live job so the
# cooldown restarts. Held jobs are left to release/drop. Returns nothing when the job is no
# longer live.
_MARK_RESENT = sa.text(f"""
UPDATE delivery_jobs
   SET available_at = CASE WHEN status IN {sql_list(CLAIMABLE)} THEN now() ELSE available_at END,
       priority = CASE WHEN status IN {sql_list(CLAIMABLE)} THEN least(priority, :priority)
                       ELSE priority END,
       payload = payload || jsonb_build_object(
           'resent_at', now(), 'resends', coalesce((payload ->> 'resends')::int, 0) + 1)
 WHERE id = :id AND status IN {sql_list((*CLAIMABLE, SENDING))}
RETURNING {JOB_COLUMNS}
""")


# A waiting job asked for again by a single request (the user is waiting for it now): at
# that request's priority if it was imported (states.BULK_STEP). Only a job still waiting
# moves; nothing else about it changes.
_HURRY = sa.text(f"""
UPDATE delivery_jobs SET priority = :priority
 WHERE id = :id AND priority > :priority AND status IN {sql_list(CLAIMABLE)}
""")


def hurry(conn: Connection, job_id: int, priority: int) -> None:
    conn.execute(_HURRY, {"id": job_id, "priority": priority})


def mark_resent(conn: Connection, job_id: int, priority: int) -> dict[str, Any] | None:
    """``priority``: the kind's, a single request's."""
    row = conn.execute(_MARK_RESENT, {"id": job_id, "priority": priority}).mappings().first()
    return dict(row) if row else None


# Release a held job: it becomes `pending` and due now. Only a job still `held` moves, so
# two support people clicking at once release it once.
_RELEASE_HELD = sa.text(f"""
UPDATE delivery_jobs SET status = '{PENDING}', available_at = now()
 WHERE id = :id AND kind = :kind AND status = '{HELD}'
RETURNING {JOB_COLUMNS}
""")


def release_held(conn: Connection, job_id: int,
                 kind: str = "verification") -> dict[str, Any] | None:
    row = conn.execute(_RELEASE_HELD, {"id": job_id, "kind": kind}).mappings().first()
    return dict(row) if row else None


# Drop a held job: terminal `cancelled`, with the reason kept as its last error. Only a job
# still `held` moves.
_DROP_HELD = sa.text(f"""
UPDATE delivery_jobs
   SET status = '{CANCELLED}', finished_at = now(), last_error = :reason,
       last_error_class = 'dropped'
 WHERE id = :id AND kind = :kind AND status = '{HELD}'
RETURNING {JOB_COLUMNS}
""")


def drop_held(conn: Connection, job_id: int, reason: str,
              kind: str = "verification") -> dict[str, Any] | None:
    row = conn.execute(_DROP_HELD, {"id": job_id, "kind": kind, "reason": reason}
                       ).mappings().first()
    return dict(row) if row else None


# --- inbox actions -------------------------------------------------------------------
# Failed and bounced jobs not dismissed: what an admin may retry or dismiss (the inbox's
# read queries are in webapp/domain/queue_reads.py).

@dataclass
class ProblemFilter:
    """Which failed/bounced jobs an inbox view (or "retry all matching") is about."""

    kind: str | None = None
    campaign_id: int | None = None
    error_class: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    email: str | None = None
    correlation_id: str | None = None
    job_id: int | None = None
    job_ids: list[int] | None = None  # the jobs an admin chose on the page

    def where(self) -> tuple[str, dict[str, Any]]:
        """SQL conditions on ``j`` (built from fixed fragments; values are bound), so the
        planner sees exactly the predicates of delivery_jobs_problem_*_idx."""
        clauses = [f"j.status IN {sql_list(PROBLEM)}", "j.dismissed_at IS NULL"]
        params: dict[str, Any] = {}
        for name, clause in (
                ("kind", "j.kind = :kind"), ("campaign_id", "j.campaign_id = :campaign_id"),
                ("error_class", "j.last_error_class = :error_class"),
                ("since", "j.finished_at >= :since"), ("until", "j.finished_at < :until"),
                ("email", "lower(j.email) = lower(:email)"),
                ("correlation_id", "j.correlation_id = CAST(:correlation_id AS uuid)"),
                ("job_id", "j.id = :job_id"),
                ("job_ids", "j.id = ANY(CAST(:job_ids AS bigint[]))")):
            value = getattr(self, name)
            if value is not None and value != "":
                clauses.append(clause)
                params[name] = value
        return " AND ".join(clauses), params


# The campaigns a retry touches, locked (in id order) before any job changes: completion
# locks the same rows, so the two are serialized on the campaign and a campaign is never
# left `sent` with pending jobs (P8).
_LOCK_RETRY_CAMPAIGNS = """
SELECT c.id FROM campaigns c
 WHERE c.id IN (SELECT j.campaign_id FROM delivery_jobs j
                 WHERE {where} AND j.finished_at <= :as_of AND j.campaign_id IS NOT NULL)
 ORDER BY c.id FOR UPDATE OF c
"""

# Retry, set-based and safe to repeat: the jobs go back to `pending` with a fresh schedule
# (due now; the schedule restarts at retry_base, the attempt numbers go on, the
# job_attempts rows stay). The UPDATE re-checks the status under the row lock, so two
# clicks (or two admins) retry each job once: the second finds it `pending` and skips it.
# Only jobs finished by `as_of` (when the page was shown) are touched, so a job that
# failed again since is not retried behind the admin's back. Left out and reported, never
# silently skipped: suppressed addresses, cancelled campaigns, and jobs whose user already
# has a live job of the same kind (one live job per user and kind; of several failed jobs
# of one user only the newest is retried). A `sent` campaign that gets jobs back is
# `sending` again until they finish (P8).
_RETRY_PROBLEMS = f"""
WITH candidates AS (
    SELECT j.id, j.kind, j.email, j.campaign_id, c.status AS campaign_status,
           EXISTS (SELECT 1 FROM suppressions s WHERE s.email = lower(j.email)) AS suppressed,
           j.user_ref IS NOT NULL AND (
               EXISTS (SELECT 1 FROM delivery_jobs l
                        WHERE l.kind = j.kind AND l.user_ref = j.user_ref
                          AND l.status IN {{active}})
               OR row_number() OVER (PARTITION BY j.kind, j.user_ref
                                     ORDER BY j.finished_at DESC, j.id DESC) > 1) AS busy
      FROM delivery_jobs j LEFT JOIN campaigns c ON c.id = j.campaign_id
     WHERE {{where}} AND j.finished_at <= :as_of
), retried AS (
    UPDATE delivery_jobs j
       SET status = '{PENDING}', retry_base = j.attempts, available_at = now(),
           finished_at = NULL, dismissed_at = NULL, claimed_by = NULL, claim_token = NULL,
           claimed_at = NULL
      FROM candidates x
     WHERE j.id = x.id AND NOT x.suppressed AND NOT x.busy
       AND x.campaign_status IS DISTINCT FROM 'cancelled'
       AND j.status IN {{problem}} AND j.dismissed_at IS NULL
    RETURNING j.id, j.kind, j.campaign_id
), reopened AS (
    -- finished_at stays: the campaign first finished then, whatever is retried later.
    UPDATE campaigns SET status = '{Campaign.SENDING}', updated_at = now()
     WHERE id IN (SELECT campaign_id FROM retried) AND status = '{Campaign.SENT}'
    RETURNING broadcast_id
), unfinished AS (
    UPDATE broadcasts SET finished_at = NULL WHERE id IN (SELECT broadcast_id FROM reopened)
)
SELECT (SELECT count(*) FROM retried) AS retried,
       (SELECT coalesce(array_agg(DISTINCT kind), '{{{{}}}}') FROM retried) AS kinds,
       (SELECT count(*) FROM candidates WHERE suppressed) AS suppressed,
       (SELECT coalesce(array_agg(email ORDER BY email), '{{{{}}}}') FROM (
            SELECT email FROM candidates WHERE suppressed ORDER BY email LIMIT 5) e)
           AS suppressed_examples,
       (SELECT count(*) FROM candidates
         WHERE campaign_status = '{Campaign.CANCELLED}') AS cancelled,
       (SELECT count(*) FROM candidates WHERE busy AND NOT suppressed) AS busy
"""


def retry_problem_jobs(conn: Connection, where: ProblemFilter,
                       as_of: datetime) -> dict[str, Any]:
    """Retry every open problem matching ``where`` that finished by ``as_of``; returns
    ``retried``, ``kinds``, ``suppressed`` (+ ``suppressed_examples``), ``cancelled`` and
    ``busy`` (left out: the user has a live job of that kind)."""
    sql, params = where.where()
    conn.execute(sa.text(_LOCK_RETRY_CAMPAIGNS.format(where=sql)), {**params, "as_of": as_of})
    row = conn.execute(sa.text(_RETRY_PROBLEMS.format(where=sql, problem=sql_list(PROBLEM),
                                                      active=sql_list(ACTIVE))),
                       {**params, "as_of": as_of}).mappings().one()
    return dict(row)


# Dismiss: the job leaves the inbox (its state and history stay as they are).
_DISMISS = sa.text(f"""
UPDATE delivery_jobs SET dismissed_at = now()
 WHERE id = :id AND status IN {sql_list(PROBLEM)} AND dismissed_at IS NULL
RETURNING id, email, status
""")


def dismiss_job(conn: Connection, job_id: int) -> dict[str, Any] | None:
    row = conn.execute(_DISMISS, {"id": job_id}).mappings().first()
    return dict(row) if row else None


# --- transactional kinds (docs/design.md §21) -----------------------------------------------------
# Cancel what is still waiting for one (kind, user): pending (scheduled or due), retry and
# held messages end `cancelled`; a message being sent right now is left to finish. The
# status guard makes two concurrent cancels cancel each message once.
_CANCEL_WAITING = sa.text(f"""
UPDATE delivery_jobs
   SET status = '{CANCELLED}', finished_at = now(), last_error = :reason,
       last_error_class = '{CANCELLED}'
 WHERE kind = :kind AND user_ref = :user_ref AND status IN {sql_list(WAITING)}
RETURNING id
""")


def cancel_waiting(conn: Connection, kind: str, user_ref: str, reason: str) -> list[int]:
    """Ids of the messages cancelled (oldest first)."""
    return sorted(int(r.id) for r in conn.execute(_CANCEL_WAITING, {
        "kind": kind, "user_ref": user_ref, "reason": reason[:500]}))


# An admin's bulk actions on chosen jobs (the jobs browser, as Oban Web's): cancel those
# still waiting, retrying or held (a job already claimed finishes as it is, like a campaign
# cancel); or make retrying ones due now. Each re-checks the state under the row lock, so a
# job that moved on since the page was shown is left alone (and counted as not changed).
_CANCEL_CHOSEN = sa.text(f"""
UPDATE delivery_jobs
   SET status = '{CANCELLED}', finished_at = now(), last_error = :reason,
       last_error_class = '{CANCELLED}', claimed_by = NULL, claim_token = NULL
 WHERE id = ANY(CAST(:ids AS bigint[])) AND status IN {sql_list((*CLAIMABLE, HELD))}
RETURNING id
""")
_RETRY_CHOSEN_NOW = sa.text(f"""
UPDATE delivery_jobs SET available_at = now()
 WHERE id = ANY(CAST(:ids AS bigint[])) AND status = '{RETRY}' AND available_at > now()
RETURNING id
""")


def cancel_chosen(conn: Connection, job_ids: Sequence[int], reason: str) -> list[int]:
    """Cancel the chosen jobs that are waiting, retrying or held; returns those cancelled."""
    return [int(i) for i in conn.execute(_CANCEL_CHOSEN, {"ids": list(job_ids),
                                                          "reason": reason}).scalars()]


def retry_chosen_now(conn: Connection, job_ids: Sequence[int]) -> list[int]:
    """Make the chosen retrying jobs due now (their attempt count is kept)."""
    ids = [int(i) for i in conn.execute(_RETRY_CHOSEN_NOW, {"ids": list(job_ids)}).scalars()]
    if ids:
        notify_new_jobs(conn, "retry")
    return ids


_IN_FLIGHT_FOR_USER = sa.text(f"""
SELECT count(*) FROM delivery_jobs
 WHERE kind = :kind AND user_ref = :user_ref AND status = '{SENDING}'
""")


def in_flight_for_user(conn: Connection, kind: str, user_ref: str) -> int:
    return int(conn.execute(_IN_FLIGHT_FOR_USER, {"kind": kind, "user_ref": user_ref})
               .scalar_one())


# --- the job moves of the lifecycle, feedback and retention services ---------------------

def custom_plan(conn: Connection) -> None:
    """Plan this transaction's chunk statements for their own cursor values. psycopg
    prepares a statement run five times on a session, and PostgreSQL may then use one
    generic plan for every cursor: in the 1M bench some settle chunks took 40 s instead of
    1 s that way."""
    conn.execute(sa.text("SET LOCAL plan_cache_mode = force_custom_plan"))


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
