"""Liveness: workers register and renew a lease; a lapsed worker's jobs are taken back
(docs/design.md §15)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.jobs import ClaimedJob
from workers.core.states import (
    PENDING,
    SENDING,
)

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
