"""The rescuer and the startup hook: take back the in-flight jobs of dead workers (P2, P4,
docs/design.md §15).

A worker is dead when its lease expired ``SENDDOCK_LEASE_GRACE`` seconds ago (the database
clock judges; the worker itself stopped starting messages ``SENDDOCK_LEASE_MARGIN``
seconds before the expiry, by its own clock), or -- for this node's start only -- when
it ran on this very host and its process is gone. Never because its session or an
advisory lock looks gone. A rescued job keeps its place in line (its ``available_at``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence

from sqlalchemy.engine import Engine

from workers import queue
from workers.core import pg
from workers.delivery.lease import Lease
from workers.delivery.services import DB_ERRORS, Service

log = logging.getLogger("senddock.worker")

INTERVAL = 5.0  # seconds between rescues


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` of this host is gone (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def take_back(engine: Engine, *, me: str, grace: float,
              dead: Sequence[str] = ()) -> dict[str, int]:
    """Take back the jobs of workers whose lease expired ``grace`` ago and of ``dead``;
    wakes idle loops everywhere when any came back."""
    with engine.begin() as conn:
        taken = queue.take_back(conn, me=me, grace=grace, dead=dead)
        if any(taken.values()):
            queue.notify_new_jobs(conn, "rescued")
    for worker, n in taken.items():
        if n:
            log.warning("took back %d in-flight job(s) from dead worker %s", n, worker)
    return taken


def startup(engine: Engine, *, me: str, node: str, grace: float) -> dict[str, int]:
    """The startup hook: this node's processes that ran on this host and are gone are
    this process's previous incarnations: their jobs come back at once; any other dead
    worker's once its lease expired ``grace`` ago."""
    with engine.connect() as conn:
        peers = queue.node_peers(conn, node, me)
    here = socket.gethostname()
    gone = [worker for worker, host, pid in peers if host == here and process_gone(pid)]
    return take_back(engine, me=me, grace=grace, dead=gone)


class Rescuer(Service):
    """Every few seconds: dead workers' jobs back, and this worker's own lost claims
    (a claim that committed but whose answer never arrived) back to `pending`."""

    name = "rescuer"

    def __init__(self, engine: Engine, *, worker_id: str, lease: Lease, grace: float,
                 outage: pg.Outage, held_tokens: Callable[[], list[str]]) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.lease = lease
        self.grace = grace
        self.outage = outage
        self.held_tokens = held_tokens
        self.interval = INTERVAL

    def run(self) -> None:
        # Judge peers only with a lease of our own renewed without a break for a whole
        # lease: after a database outage every peer's lease looks expired until it has
        # had the time to renew (taking their jobs would be safe -- they are fenced --
        # but would only churn them).
        if self.lease.held_for() < self.lease.seconds:
            return
        try:
            take_back(self.engine, me=self.worker_id, grace=self.grace)
            with self.engine.begin() as conn:
                lost = queue.release_lost_claims(conn, self.worker_id, self.held_tokens,
                                                 self.lease.seconds)
            if lost:
                log.warning("put back %d job(s) whose claim reply was lost", lost)
        except DB_ERRORS as exc:
            self.outage.failed(exc)
