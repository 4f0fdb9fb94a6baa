"""The heartbeat: renews this worker's lease (workers/delivery/lease.py) on a session of its own.

The renewal touches the ``workers`` row only, so a lock on ``delivery_jobs`` never holds
a lease up. A session that failed is dropped and the next renewal opens a fresh one; a
renewal after the lease had lapsed comes back under a new term (the drain threads then
give back what they claimed before, unsent). Every wait is bounded: the session's TCP
keepalives and ``tcp_user_timeout`` (workers/core/pg.py) and a statement timeout.

The session also carries the process's LISTEN (workers/delivery/listener.py): each new
session listens before it is used, so a reconnect listens again.

The session is named after the worker (``senddock-worker/liveness <worker id>``), so a
fresh one ends the stale ones this worker left on the server: a session cut by a
partition stays there (a backend waiting for a client that will never answer) until the
server's own keepalives give up, two hours by default. Only this worker's, never a
peer's: the name holds the worker id.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from workers import queue
from workers.core import pg
from workers.delivery.lease import Lease
from workers.delivery.services import DB_ERRORS, Service

log = logging.getLogger("senddock.worker")

STATEMENT_TIMEOUT_MS = 5000


class Heartbeat(Service):
    name = "heartbeat"

    def __init__(self, engine: Engine, *, worker_id: str, lease: Lease, interval: float,
                 outage: pg.Outage, process: str, in_flight: Callable[[], int],
                 register: Callable[[Connection], int]) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.lease = lease
        self.interval = interval
        self.outage = outage
        self.process = process
        self.in_flight = in_flight
        self.register = register  # (re)registers the worker; its lease's term
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self.session_name = pg.application_name(process, f"liveness {worker_id}")

    def start(self) -> None:
        """Register (a fresh lease) on the liveness session; raises database errors."""
        with self._lock:
            asked = time.monotonic()
            term = self.register(self._session())
            self.lease.confirm(asked, term)

    def run(self) -> None:
        with self._lock:
            out = self.lease.ran_out()
            if out is not None:
                log.warning("worker %s: its lease ran out %.0f s ago without a renewal; it "
                            "starts no message until the database renews it",
                            self.worker_id, out)
            try:
                conn = self._session()
                asked = time.monotonic()  # the renewal runs after this moment
                term = queue.renew_lease(conn, self.worker_id, self.lease.seconds,
                                         self.in_flight())
                if term is None:  # the row is gone: register again
                    term = self.register(conn)
            except DB_ERRORS as exc:
                self.close(invalidate=True)
                self.outage.failed(exc, retrying="the lease is renewed once it is back; "
                                   "nothing is sent meanwhile")
                return
            old = self.lease.confirm(asked, term)
            if old is not None:
                log.warning("worker %s: its lease lapsed and was renewed under a new term "
                            "(%d, was %d): what it had claimed is given back unsent",
                            self.worker_id, term, old)
            self.outage.ok()

    def _session(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                conn.execute(sa.text(
                    "SELECT set_config('application_name', :name, false), "
                    "set_config('statement_timeout', :ms, false)"),
                    {"name": self.session_name, "ms": str(STATEMENT_TIMEOUT_MS)})
                ended = queue.end_stale_sessions(conn, self.session_name)
                conn.execute(sa.text("LISTEN senddock_jobs"))
            except BaseException:
                conn.invalidate()
                conn.close()
                raise
            if ended:
                log.info("worker %s: ended %d stale session(s) it had left on the server "
                         "(backend %s)", self.worker_id, len(ended),
                         ", ".join(str(pid) for pid in ended))
            self._conn = conn
        return self._conn

    def listening(self) -> psycopg.Connection[Any] | None:
        """The liveness session's driver connection, listening; None while there is none."""
        conn = self._conn
        if conn is None or conn.closed or conn.invalidated:
            return None
        raw = conn.connection.driver_connection
        return raw if isinstance(raw, psycopg.Connection) and not raw.closed else None

    def close(self, invalidate: bool = False) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if invalidate:
                conn.invalidate()
            conn.close()
        except Exception:
            log.debug("liveness session closed with an error", exc_info=True)
