"""The database check behind ``/healthz`` and Queue health: its own connection with short
timeouts, run on its own thread, so the answer comes within a second whatever the
database does (locked tables, exhausted connections, a server that stopped answering).

The check reads (``SELECT``, the relay state) *and* writes: a row into a session
temporary table created ``ON COMMIT DELETE ROWS`` in the database's default tablespace,
so every check extends a file on the database's disk (a full disk fails it with 53100)
and commits (a read-only standby fails it with 25006).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from workers import queue
from workers.core import pg
from workers.core.i18n import N_

DEADLINE = 0.9  # seconds /healthz waits for the check
REUSE = 0.5  # seconds a finished check's answer is reused (load balancers poll often)
RECENT_WINDOW = 15.0  # seconds a problem met by a request still degrades the health

NOT_ANSWERING = pg.Problem(
    "not_answering", "not answering",
    "The database did not answer within a second; nothing was lost. Try again shortly.", 5)


@dataclass
class Check:
    """One check's outcome. ``problem`` None means reads and writes both work."""

    problem: pg.Problem | None
    detail: str = ""  # the driver's words: for admins only
    relay: dict[str, Any] = field(default_factory=lambda: {"status": "ok"})
    took_ms: float = 0.0
    at: float = field(default_factory=time.monotonic)

    @property
    def reachable(self) -> bool:
        return self.problem is None or self.problem.writes_only or \
            self.problem.kind in {"busy", "too_many_connections"}


class HealthProbe:
    """Checks the database on one dedicated connection (the budget's ``health 1``)."""

    def __init__(self, info: str, process: str = "web") -> None:
        self.info = info
        self.engine: Engine = pg.make_engine(
            info, process=process, role="health", size=1, pre_ping=False,
            statement_timeout=0.5, lock_timeout=0.3, checkout_timeout=0.5,
            idle_timeout=None, connect_timeout=2)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="healthz")
        self._lock = threading.Lock()
        self._running: Future[Check] | None = None
        self._last: Check | None = None

    def start(self) -> None:
        """Begin a check now (unless a recent answer will be reused) and return at once: a
        page that reads other things first collects it with :meth:`check`, so the probe's
        commit (one WAL flush, slow while a big campaign writes) overlaps that work."""
        with self._lock:
            self._submit()

    def _submit(self) -> Check | Future[Check]:
        """The reusable last answer, or the running check (started if none is)."""
        last = self._last
        if last is not None and time.monotonic() - last.at < REUSE:
            return last
        if self._running is None or self._running.done():
            self._running = self._executor.submit(self._run)
        return self._running

    def check(self, deadline: float = DEADLINE) -> Check:
        """The database's state, within ``deadline`` seconds."""
        with self._lock:
            running = self._submit()
        if isinstance(running, Check):
            return running
        try:
            result = running.result(timeout=deadline)
        except FutureTimeout:
            return Check(NOT_ANSWERING, f"no answer within {deadline:.1f} s",
                         took_ms=deadline * 1000)
        with self._lock:
            self._last = result
        return result

    def _run(self) -> Check:
        started = time.monotonic()
        try:
            with self.engine.connect() as conn:
                relay = self._probe(conn)
            problem, detail = None, ""
        except Exception as exc:
            problem = pg.classify(exc)
            if problem is None:
                raise
            detail, relay = pg.first_line(exc), {"status": "unknown"}
        return Check(problem, detail, relay, (time.monotonic() - started) * 1000)

    @staticmethod
    def _probe(conn: Connection) -> dict[str, Any]:
        relay = queue.relay_status(conn)
        conn.rollback()
        if not conn.info.get("senddock_probe_table"):
            conn.execute(sa.text("SET temp_tablespaces = ''"))
            conn.execute(sa.text("CREATE TEMP TABLE IF NOT EXISTS senddock_health_probe "
                                 "(at timestamptz) ON COMMIT DELETE ROWS"))
            conn.commit()
            conn.info["senddock_probe_table"] = True
        conn.execute(sa.text("INSERT INTO senddock_health_probe VALUES (now())"))
        conn.commit()
        return {"status": relay.get("status", "ok"), "since": relay.get("since"),
                "last_error": relay.get("last_error")}

    def summary(self) -> tuple[Check, pg.Problem | None, str]:
        """(the check, the problem to report, its detail): the check's own problem, else
        one met by this process's requests in the last few seconds that a successful
        check does not disprove (too many connections, busy)."""
        result = self.check()
        if result.problem is not None:
            return result, result.problem, result.detail
        recent = pg.RECENT.within(RECENT_WINDOW)
        if recent is not None and recent[0].kind in {"too_many_connections", "busy"}:
            return result, recent[0], f"{recent[1]} ({recent[2]:.0f} s ago)"
        return result, None, ""

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.engine.dispose()


def details(probe: HealthProbe, engine: Engine) -> dict[str, Any]:
    """What Queue health shows admins about the database: the check, the driver's words,
    where we connect (no credentials) and our connections per ``application_name``."""
    result, problem, detail = probe.summary()
    connections: list[dict[str, Any]] = []
    limits: dict[str, Any] = {}
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT application_name, state, count(*) AS n FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE 'senddock%' "
                "GROUP BY 1, 2 ORDER BY 1, 2")).mappings().all()
            connections = [dict(r) for r in rows]
            limits = dict(conn.execute(sa.text(
                "SELECT current_setting('max_connections')::int AS max, "
                "current_setting('superuser_reserved_connections')::int AS reserved, "
                "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                "'client backend') AS used")).mappings().one())
    except Exception as exc:
        if pg.classify(exc) is None:
            raise
    return {"status": "ok" if problem is None else problem.status,
            "message": problem.message if problem else N_("Reads and writes work."),
            "detail": detail, "took_ms": result.took_ms,
            "where": pg.describe(probe.info), "connections": connections,
            "limits": limits}
