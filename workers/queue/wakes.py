"""Waking idle workers after an autocommitted enqueue (docs/design.md §13).

A job committed by its own statement (the transactional API, the SMTP submission) must
wake the idle delivery threads of every process at once: that is P7's fast path. The
wake is a ``pg_notify`` in a transaction of its own, never in the insert's commit: there
PostgreSQL's database-wide notify lock is held through the WAL flush and serialized every
request's commit (600-810 commits/s without it, 165-190 with it, pgbench on 2 cores).

The request does not send it. It hands its kinds to this process's :class:`Waker` and
returns; the waker's thread sends one statement for every kind handed over since its last
one. A wake sent after a job committed covers it, so a burst of requests costs one wake
per round trip of the waker rather than one per request, and no request waits for it.

If the process dies between a commit and its wake, or the wake fails, nothing is lost:
idle delivery threads look for due work every second on their own (the listener's
fallback), so the job is sent at most that much later.
"""

from __future__ import annotations

import logging
import os
import threading

import sqlalchemy as sa

from workers.core import pg

log = logging.getLogger(__name__)

# One statement for every kind waiting to be woken.
WAKE = "SELECT pg_notify('senddock_jobs', k) FROM unnest(CAST(%(kinds)s AS text[])) k"


class Waker:
    """The process's wake sender: :meth:`wake` queues kinds for a database and returns;
    one thread sends them, one statement per database per turn."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._pending: dict[sa.Engine, set[str]] = {}
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._sending = False
        self.sent = 0  # statements sent (tests and benches read it)

    def wake(self, engine: sa.Engine, kinds: list[str]) -> None:
        """Wake the workers of ``engine``'s database for ``kinds`` (the jobs are committed)."""
        if not kinds:
            return
        with self._ready:
            self._pending.setdefault(engine, set()).update(kinds)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="senddock-waker",
                                                daemon=True)
                self._thread.start()
            self._ready.notify()

    def idle(self, timeout: float = 5.0) -> bool:
        """Wait until every wake handed over has been sent (tests): False on timeout."""
        with self._ready:
            return self._ready.wait_for(lambda: not self._pending and not self._sending,
                                        timeout)

    def _run(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: bool(self._pending))
                turn, self._pending = self._pending, {}
                self._sending = True
            try:
                for engine, kinds in turn.items():
                    self._send(engine, sorted(kinds))
            finally:
                with self._ready:
                    self._sending = False
                    self._ready.notify_all()

    def _send(self, engine: sa.Engine, kinds: list[str]) -> None:
        try:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                pg.driver_rows(conn, WAKE, {"kinds": kinds})
            self.sent += 1
        except Exception as exc:  # the workers' own polling finds the jobs within a second
            log.warning("could not wake the workers for %s: %s", ", ".join(kinds),
                        pg.first_line(exc))


#: This process's waker.
WAKER = Waker()
