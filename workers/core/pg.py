"""PostgreSQL as production runs it, in one place for the web side and the workers:

- the database URL, as libpq reads it (multi-host ``postgresql://h1:5432,h2:5432/db?
  target_session_attrs=read-write`` included) for every engine and raw connection;
- engines with a hard connection budget, idle connections handed back, the
  ``application_name`` naming process and role, and per-role statement/lock timeouts;
- errors translated by SQLSTATE into a :class:`Problem` with its plain message;
- outage logging: one line when the database goes away (or its problem changes), one when
  it is back, with how long it was gone.

``workers`` never imports ``webapp``; the web side builds on this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import psycopg
import sqlalchemy as sa
from psycopg import generators, pq, waiting
from psycopg.abc import Buffer
from psycopg.adapt import PyFormat, Transformer
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import set_json_loads
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import QueuePool
from sqlalchemy.util import queue as sqla_queue

from workers.core import fastjson
from workers.core.i18n import N_

log = logging.getLogger("senddock.database")

# json and jsonb columns are parsed with orjson (falling back to ``json`` for what only it
# reads, so every value reads as before): a batch of 500 messages reads 500 jobs back.
set_json_loads(fastjson.loads)

URL_VARIABLE = "SENDDOCK_DATABASE_URL"
URL_EXAMPLE = ("postgresql://user:password@host:5432/db, several hosts as "
               "postgresql://user@h1:5432,h2:5432/db?target_session_attrs=read-write")


# --- the URL ---------------------------------------------------------------------------


class DatabaseUrlError(ValueError):
    """The database URL cannot be used; the message is one line naming the variable."""


def conninfo(raw: str, variable: str = URL_VARIABLE) -> str:
    """``raw`` as a libpq connection string every connection of ours uses.

    Accepts what libpq accepts (``postgresql://``/``postgres://`` URLs with one or several
    ``host:port`` pairs, ``key=value`` strings), SQLAlchemy's ``postgresql+psycopg://``
    spelling, and its ``?host=h1:p1&host=h2:p2`` multi-host form (turned into libpq's
    ``host=h1,h2&port=p1,p2``). Raises :class:`DatabaseUrlError` naming ``variable``.
    """
    text = raw.strip()
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres+psycopg://"):
        if text.startswith(prefix):
            text = "postgresql://" + text[len(prefix):]
    if "://" in text:
        scheme = text.split("://", 1)[0]
        if scheme not in {"postgresql", "postgres"}:
            raise DatabaseUrlError(f"{variable} must start with postgresql://, got "
                                   f"{scheme}:// (e.g. {URL_EXAMPLE})")
        text = _sqlalchemy_multihost(text)
    try:
        params = conninfo_to_dict(text)
    except psycopg.Error as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "cannot be parsed"
        raise DatabaseUrlError(f"{variable} is not a PostgreSQL URL ({reason}); "
                               f"expected {URL_EXAMPLE}") from None
    hosts = str(params.get("host") or "").split(",")
    ports = [p for p in str(params.get("port") or "").split(",") if p != ""]
    for port in ports:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise DatabaseUrlError(f"{variable} has a bad port {port!r}; expected "
                                   f"{URL_EXAMPLE}")
    if len(ports) > 1 and len(ports) != len(hosts):
        raise DatabaseUrlError(f"{variable} names {len(hosts)} host(s) but {len(ports)} "
                               f"ports; give one port per host or one for all")
    return text


def _sqlalchemy_multihost(url: str) -> str:
    """SQLAlchemy's ``?host=h1:p1&host=h2:p2`` → libpq's ``?host=h1,h2&port=p1,p2``."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    hosts = [v for k, v in query if k == "host"]
    if not hosts or not any(":" in h and not h.startswith("/") for h in hosts):
        return url
    names, ports = [], []
    for h in hosts:
        name, _, port = h.rpartition(":") if ":" in h else (h, "", "")
        names.append(name or h)
        ports.append(port)
    rest = [(k, v) for k, v in query if k not in {"host", "port"}]
    rest.insert(0, ("host", ",".join(names)))
    if any(ports):
        rest.insert(1, ("port", ",".join(p or "5432" for p in ports)))
    return parts._replace(query=urlencode(rest, safe=",/:")).geturl()


def describe(info: str) -> str:
    """Hosts, ports and database of a connection string, without user or password:
    for logs and the admins' Queue health page, never for anonymous callers."""
    params = conninfo_to_dict(info)
    hosts = str(params.get("host") or "localhost").split(",")
    ports = str(params.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    where = ",".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=False))
    return f"{where}/{params.get('dbname', '')}"


# Every connection of ours notices a peer that vanished without a FIN (a host cut off, a
# link gone) within seconds, not after the kernel's 2 h 11 min: TCP keepalives while idle
# (5 s, then 3 probes 2 s apart) and tcp_user_timeout while data waits for its
# acknowledgement (10 s). Waits on the database are then bounded; that a session is cut
# while its worker lives is safe because liveness is a lease and the worker is fenced
# (docs/design.md §15, docs/reliability.md). The URL may set any of these itself (libpq's names).
TCP_DEFAULTS: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 5,
                                "keepalives_interval": 2, "keepalives_count": 3,
                                "tcp_user_timeout": 10_000}


# Every session of ours runs without PostgreSQL's JIT compiler. PostgreSQL compiles a
# statement whose estimated cost passes `jit_above_cost`, and estimates grow with the
# tables: at about 120,000 jobs the enqueue statement crossed it, and from then on every
# call spent 150-240 ms compiling some 245 functions to execute in 2 ms
# (docs/performance.md, "JIT"). Our statements are a queue's and a page's, short and many;
# none gains what a compilation costs.
SESSION_OPTIONS = "-c jit=off"


def connect(info: str, *, application_name: str, connect_timeout: int = 5,
            options: str = "", **kwargs: Any) -> psycopg.Connection[Any]:
    """A raw psycopg connection (the health check) with the same URL
    handling as the engines, bounded waits (:data:`TCP_DEFAULTS`) and our session
    settings (:data:`SESSION_OPTIONS`, then the URL's own ``options``, then ``options``)."""
    given = conninfo_to_dict(info)
    extra: dict[str, Any] = {k: v for k, v in TCP_DEFAULTS.items() if k not in given}
    extra.update({"application_name": application_name, "connect_timeout": connect_timeout})
    extra["options"] = " ".join(str(o) for o in (SESSION_OPTIONS, given.get("options"),
                                                 options) if o)
    return psycopg.connect(make_conninfo(info, **extra), **kwargs)


# --- engines and the connection budget -------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """The most PostgreSQL connections one process opens, by use.

    serve  = web + health + delivery + liveness
    web    = web + health
    worker = delivery + liveness

    (The LISTEN of a process is on its liveness session: workers/delivery/listener.py. One
    of the delivery connections is the send guard's session, which the drain threads share
    to check a campaign message at the relay's 354: workers/delivery/send_guard.py.)
    """

    web: int
    delivery: int
    health: int = 1
    liveness: int = 1

    def total(self, process: str) -> int:
        web = self.web + self.health
        delivery = self.delivery + self.liveness
        return {"serve": web + delivery, "web": web, "worker": delivery}.get(process,
                                                                              web + delivery)

    def line(self, process: str) -> str:
        """One log line stating this process's budget."""
        parts = []
        if process in {"serve", "web"}:
            parts += [f"web {self.web}", f"health {self.health}"]
        if process in {"serve", "worker"}:
            parts += [f"delivery {self.delivery} (the send guard's included)",
                      f"liveness {self.liveness}"]
        return (f"PostgreSQL connection budget of this {process} process: "
                f"{' + '.join(parts)} = {self.total(process)}")


def timeout_options(statement_timeout: float | None = None,
                    lock_timeout: float | None = None,
                    idle_in_transaction: float | None = None) -> str:
    """libpq ``options`` setting the session's timeouts (seconds; None = server's)."""
    opts = []
    for name, value in (("statement_timeout", statement_timeout),
                        ("lock_timeout", lock_timeout),
                        ("idle_in_transaction_session_timeout", idle_in_transaction)):
        if value is not None:
            opts.append(f"-c {name}={int(value * 1000)}")
    return " ".join(opts)


def application_name(process: str, role: str) -> str:
    """``senddock-<process>/<role>``, e.g. ``senddock-serve/web``, ``senddock-worker/
    delivery``: what ``pg_stat_activity`` shows for each of our connections."""
    return f"senddock-{process}/{role}"[:63]


def make_engine(info: str, *, process: str, role: str, size: int,
                pre_ping: bool = True, statement_timeout: float | None = None,
                lock_timeout: float | None = None, checkout_timeout: float = 30.0,
                idle_timeout: float | None = 60.0, connect_timeout: int = 5,
                idle_in_transaction: float | None = None) -> Engine:
    """An engine that never holds more than ``size`` connections, closes the ones idle
    longer than ``idle_timeout`` seconds, names them ``application_name(process, role)``
    and runs them with the given timeouts. A checkout waits at most ``checkout_timeout``
    for a free connection (then SQLAlchemy's TimeoutError: see :func:`classify`)."""
    name = application_name(process, role)
    options = timeout_options(statement_timeout, lock_timeout, idle_in_transaction)

    def creator() -> Any:
        return connect(info, application_name=name, connect_timeout=connect_timeout,
                       options=options)

    # The URL is never used to connect (the creator does, with libpq's own parsing, so
    # multi-host URLs work); it names the database, without credentials, so caches keyed
    # by ``str(engine.url)`` tell databases apart and logs say where we connect.
    label = sa.URL.create("postgresql+psycopg", database=describe(info))
    engine = sa.create_engine(
        label, creator=creator, poolclass=QueuePool,
        pool_size=max(1, size), max_overflow=0, pool_timeout=checkout_timeout,
        pool_pre_ping=False, pool_use_lifo=True, pool_recycle=1800)
    engine.info = info  # type: ignore[attr-defined]
    if pre_ping:
        _ping_when_idle(engine)
    if idle_timeout:
        _watch_idle(engine, idle_timeout)
    return engine


def engine_conninfo(engine: Engine) -> str:
    """The connection string ``engine`` connects with (an engine of :func:`make_engine`
    keeps it; for any other, its URL as libpq reads it)."""
    info = getattr(engine, "info", None)
    if isinstance(info, str):
        return info
    return conninfo(engine.url.render_as_string(hide_password=False))


# A connection back in the pool for less than this is handed out without a ping.
PING_AFTER_IDLE = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """SQLAlchemy's pre-ping, but only for a connection that sat in the pool for
    :data:`PING_AFTER_IDLE` seconds or more: a PostgreSQL restart or a dropped connection
    happens while it waits there (a restart takes longer than that), and a request then
    gets a fresh connection instead of a driver error (tests/integration/test_faults.py).
    A connection in steady use (an API burst hands each one out again within
    milliseconds) skips the round trip, which was one in three of a ``POST /messages``
    and a sixth of its Python CPU."""

    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_conn: Any, record: Any) -> None:
        record.info["senddock_checked_in"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        since = record.info.pop("senddock_checked_in", None)
        if since is not None and time.monotonic() - since < PING_AFTER_IDLE:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except psycopg.Error as exc:
            raise sa.exc.DisconnectionError(first_line(exc)) from exc
        if not alive:
            raise sa.exc.DisconnectionError("the connection did not answer a ping")


_WATCHED: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()
_REAPER: list[threading.Thread] = []
_REAPER_LOCK = threading.Lock()
_REAPER_WAKE = threading.Event()  # a new engine: recompute how long to sleep


def _watch_idle(engine: Engine, idle_timeout: float) -> None:
    """Have the process's reaper thread close ``engine``'s connections idle longer than
    ``idle_timeout`` (LIFO checkout keeps the busy ones on top, the idle at the bottom)."""

    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_conn: Any, record: Any) -> None:
        record.info["senddock_idle_since"] = time.monotonic()

    with _REAPER_LOCK:
        _WATCHED[engine] = idle_timeout
        _REAPER_WAKE.set()
        if not _REAPER:
            thread = threading.Thread(target=_reap_forever, name="pg-idle-reaper",
                                      daemon=True)
            _REAPER.append(thread)
            thread.start()


def _reap_forever() -> None:
    while True:
        _REAPER_WAKE.wait(min([5.0, *(t / 2 for t in list(_WATCHED.values()))]))
        _REAPER_WAKE.clear()
        for engine, idle_timeout in list(_WATCHED.items()):
            try:
                reap_idle(engine, idle_timeout)
            except Exception:  # never let the reaper die; the pool still caps the count
                log.exception("closing idle connections failed")


def reap_idle(engine: Engine, idle_timeout: float) -> int:
    """Close the connections of ``engine``'s pool idle for ``idle_timeout`` seconds or
    more; the number closed."""
    pool = engine.pool
    if not isinstance(pool, QueuePool):
        return 0
    now = time.monotonic()
    kept, closed = [], 0
    while True:
        try:
            record = pool._pool.get(False)
        except sqla_queue.Empty:
            break
        if now - record.info.get("senddock_idle_since", now) >= idle_timeout:
            try:
                record.close()
            finally:
                pool._dec_overflow()
            closed += 1
        else:
            kept.append(record)
    # Back in their order (they came out newest first): LIFO hands out the freshest.
    for record in reversed(kept):
        pool._pool.put(record, False)
    return closed


# --- errors by SQLSTATE ----------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """What went wrong with the database, in words a user and an operator understand."""

    kind: str        # disk_full, too_many_connections, read_only, shutdown, busy, unreachable
    status: str      # the word /healthz gives anonymous callers
    message: str     # the plain sentence shown on pages, in the API and on Queue health
    retry_after: int  # seconds, for the 503's Retry-After
    writes_only: bool = False  # reads still work (disk full, read-only)


DISK_FULL = Problem(
    "disk_full", "disk full",
    N_("The database server's disk is full, so nothing new can be saved right now; nothing "
       "already accepted was lost. An administrator must free disk space."), 30, True)
TOO_MANY_CONNECTIONS = Problem(
    "too_many_connections", "too many connections",
    N_("The database has too many connections open right now; nothing was lost. Try again "
       "in a few seconds."), 5)
READ_ONLY = Problem(
    "read_only", "read-only",
    N_("The database is read-only right now (a standby, or a failover under way), so nothing "
       "new can be saved; nothing already accepted was lost. Try again shortly."), 10, True)
SHUTDOWN = Problem(
    "shutdown", "restarting",
    N_("The database server is shutting down or restarting; nothing was lost. Try again in "
       "a few seconds."), 5)
BUSY = Problem(
    "busy", "busy",
    N_("The database is busy (a lock or a slow query held this request up); nothing was "
       "changed. Try again in a few seconds."), 5)
UNREACHABLE = Problem(
    "unreachable", "unreachable",
    N_("The database is unreachable right now; nothing was lost. Try again shortly."), 5)

PROBLEMS = {p.kind: p for p in (DISK_FULL, TOO_MANY_CONNECTIONS, READ_ONLY, SHUTDOWN, BUSY,
                                UNREACHABLE)}

# SQLSTATE (exact, then by class) → problem.
_BY_SQLSTATE = {
    "53100": DISK_FULL,             # disk_full
    "53300": TOO_MANY_CONNECTIONS,  # too_many_connections
    "25006": READ_ONLY,             # read_only_sql_transaction
    "57P01": SHUTDOWN,              # admin_shutdown
    "57P02": SHUTDOWN,              # crash_shutdown
    "57P03": SHUTDOWN,              # cannot_connect_now (starting up / shutting down)
    "55P03": BUSY,                  # lock_not_available (lock_timeout)
    "57014": BUSY,                  # query_canceled (statement_timeout)
    "25P03": BUSY,                  # idle_in_transaction_session_timeout
    "40P01": BUSY,                  # deadlock_detected
}
_BY_CLASS = {"08": UNREACHABLE, "53": DISK_FULL, "58": UNREACHABLE}

# A failed *connection attempt* has no SQLSTATE in psycopg (no server result to read it
# from); the server's FATAL message is all there is. These are PostgreSQL's own texts
# (src/backend) and libpq's for target_session_attrs.
_BY_CONNECT_MESSAGE = (
    # First: with several hosts the message lists every host's failure, and "the only
    # one up is a standby" says more than "the old primary is down".
    ("session is read-only", READ_ONLY),
    ("server is in hot standby mode", READ_ONLY),
    ("too many clients already", TOO_MANY_CONNECTIONS),
    ("remaining connection slots are reserved", TOO_MANY_CONNECTIONS),
    ("too many connections for", TOO_MANY_CONNECTIONS),
    ("the database system is starting up", SHUTDOWN),
    ("the database system is shutting down", SHUTDOWN),
    ("the database system is in recovery mode", SHUTDOWN),
    ("the database system is not yet accepting connections", SHUTDOWN),
    ("terminating connection due to administrator command", SHUTDOWN),
    ("no space left on device", DISK_FULL),
)


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE behind ``exc`` (SQLAlchemy wraps psycopg's error in ``.orig``)."""
    for candidate in (exc, getattr(exc, "orig", None), exc.__cause__):
        state = getattr(candidate, "sqlstate", None)
        if state:
            return str(state)
    return None


def classify(exc: BaseException) -> Problem | None:
    """The :class:`Problem` a database error is, or None if ``exc`` is not one of those
    (a bug or bad input: the caller's business). This is the only place that reads
    SQLSTATEs and server messages."""
    if isinstance(exc, DatabaseProblem):
        return exc.problem
    if isinstance(exc, sa.exc.TimeoutError):
        return BUSY  # our own pool had no free connection within its checkout timeout
    orig = getattr(exc, "orig", None) or exc
    if not isinstance(exc, sa.exc.DBAPIError | psycopg.Error):
        return None
    state = sqlstate_of(exc)
    if state in _BY_SQLSTATE:
        return _BY_SQLSTATE[state]
    if state and state[:2] in _BY_CLASS:
        return _BY_CLASS[state[:2]]
    if isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError) or \
            getattr(exc, "connection_invalidated", False):
        text = str(orig).lower()
        for needle, problem in _BY_CONNECT_MESSAGE:
            if needle in text:
                return problem
        if state is None or state.startswith(("08", "57P")):
            return UNREACHABLE
    return None


class DatabaseProblem(Exception):
    """A database error translated: ``problem`` says what happened in plain words;
    ``detail`` is the driver's first line (for logs and admins only)."""

    def __init__(self, problem: Problem, detail: str = "") -> None:
        super().__init__(detail or problem.message)
        self.problem = problem
        self.detail = detail


def first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(orig).__name__


def translate(exc: BaseException) -> DatabaseProblem | None:
    """``exc`` as a :class:`DatabaseProblem` (noted in :data:`RECENT`), or None."""
    problem = classify(exc)
    if problem is None:
        return None
    RECENT.note(problem, first_line(exc))
    return DatabaseProblem(problem, first_line(exc))


class Recent:
    """The last database problem this process met, for ``/healthz`` and Queue health:
    a write failing on a full disk shows as degraded even while reads still work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[Problem, str, float] | None = None

    def note(self, problem: Problem, detail: str) -> None:
        with self._lock:
            self._last = (problem, detail, time.monotonic())

    def within(self, seconds: float) -> tuple[Problem, str, float] | None:
        """(problem, detail, seconds ago) if one was met in the last ``seconds``."""
        with self._lock:
            last = self._last
        if last is None:
            return None
        ago = time.monotonic() - last[2]
        return (last[0], last[1], ago) if ago <= seconds else None

    def clear(self) -> None:
        with self._lock:
            self._last = None


RECENT = Recent()


# --- outages ---------------------------------------------------------------------------


class Outage:
    """One log line when the database becomes unusable (or its problem changes), one when
    it is usable again with how long it was not. Thread-safe; share one per process.

    Failures in the ``settle`` seconds after an outage ended are its tail, not a new
    one: attempts that began before the heal (a connect under ``connect_timeout``, a
    statement under ``tcp_user_timeout``, 10 s) fail after another thread's success.
    They are logged at debug level; only failures that go on past the window make a new
    outage, said once."""

    def __init__(self, who: str, logger: logging.Logger | None = None,
                 settle: float = 10.0) -> None:
        self.who = who
        self.log = logger or log
        self.settle = settle
        self._lock = threading.Lock()
        self._since: float | None = None
        self._quiet = False  # this outage began in the settle window: not said yet
        self._problem: Problem | None = None
        self._seen: set[Problem] = set()  # the kinds this outage has shown
        self.last_ended = 0.0  # monotonic time the last outage ended (0: none yet)

    @property
    def active(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException | Problem, retrying: str = "") -> Problem:
        """Record a failure; logs only if it starts an outage or is a kind this outage has
        not shown yet (threads that meet a failover at different moments see its kinds
        in turn: gone, read-only, gone again -- that is one line per kind, not per turn)."""
        problem = exc if isinstance(exc, Problem) else (classify(exc) or UNREACHABLE)
        detail = "" if isinstance(exc, Problem) else first_line(exc)
        with self._lock:
            now = time.monotonic()
            settling = bool(self.last_ended) and now - self.last_ended < self.settle
            if self._since is None:
                self._since = now
                self._quiet = settling
            elif self._quiet and not settling:
                self._quiet = False  # it went on past the window: a new outage
            self._problem = problem
            changed = not self._quiet and problem not in self._seen
            if not self._quiet:
                self._seen.add(problem)
        if changed:
            self.log.warning("%s: database %s (%s)%s", self.who, problem.status,
                             detail or problem.kind, f"; {retrying}" if retrying else "")
        elif self._quiet:
            self.log.debug("%s: database %s (%s) just after an outage ended", self.who,
                           problem.status, detail or problem.kind)
        return problem

    def ok(self) -> None:
        """Record a success; logs the end of an outage with its length."""
        if self._since is None:
            return
        with self._lock:
            if self._since is None:
                return
            now = time.monotonic()
            length = now - self._since
            problem, quiet = self._problem, self._quiet
            self._since, self._problem, self._quiet = None, None, False
            self._seen = set()
            if not quiet:  # a tail keeps the window of the outage it followed
                self.last_ended = now
        if not quiet:
            self.log.info("%s: database usable again after %.1f s (was: %s)", self.who,
                          length, problem.status if problem else "?")


def wait_until(attempt: Callable[[], Any], outage: Outage, stopping: threading.Event,
               *, what: str, max_backoff: float = 5.0) -> Any:
    """Call ``attempt`` until it succeeds or ``stopping`` is set (then None). Database
    errors are logged through ``outage`` (one line per change) and retried with backoff;
    any other error propagates."""
    backoff = 0.5
    while not stopping.is_set():
        try:
            result = attempt()
        except Exception as exc:
            if classify(exc) is None:
                raise
            outage.failed(exc, retrying=f"{what}: waiting and retrying")
            stopping.wait(backoff)
            backoff = min(backoff * 2, max_backoff)
            continue
        outage.ok()
        return result
    return None


def driver_rows(conn: sa.Connection, statement: str,
                params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one hot statement (``%(name)s`` placeholders) on ``conn``'s psycopg connection,
    inside whatever transaction ``conn`` is in, and return its rows as dicts: what
    SQLAlchemy's execute adds per statement (compiling the parameters, the result's
    metadata, row proxies) was about a sixth of a ``POST /messages``'s Python CPU. A
    driver error is raised as SQLAlchemy would raise it (``DBAPIError`` subclasses, so
    the error handlers and :func:`classify` see the same thing), and a connection the
    error broke is invalidated so it never returns to the pool."""
    with _driver(conn, statement, params) as raw, \
            raw.cursor(row_factory=dict_row) as cur:
        cur.execute(statement, params)
        return cur.fetchall() if cur.description is not None else []


class NativeStatement:
    """A hot statement written with ``%(name)s`` placeholders, turned once into
    PostgreSQL's own ``$n`` ones: psycopg converts the placeholders of a statement longer
    than 4 KB anew on every execution (its cache stops there), a tenth of a 500-message
    batch's Python. ``%%`` is a literal ``%``; any other ``%`` is refused here."""

    _PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%|%")

    def __init__(self, text: str) -> None:
        self.source = text
        self.names: list[str] = []

        def native(match: re.Match[str]) -> str:
            if match.group(1) is None:
                if match.group(0) == "%":
                    raise ValueError(f"a lone % in a statement: {text[:80]}")
                return "%"
            if match.group(1) not in self.names:
                self.names.append(match.group(1))
            return f"${self.names.index(match.group(1)) + 1}"

        self.text = self._PLACEHOLDER.sub(native, text)
        self._names: dict[tuple[int, ...], bytes] = {}

    def name(self, types: Sequence[int]) -> bytes:
        """The name it is prepared under on a session with parameters of these types (an
        integer's type follows its size): its text and the types hashed."""
        key = tuple(types)
        name = self._names.get(key)
        if name is None:
            digest = hashlib.sha1(f"{self.text}{key}".encode()).hexdigest()[:16]
            name = self._names[key] = f"senddock_{digest}".encode()
        return name

    def args(self, params: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(params[name] for name in self.names)


def driver_tuples(conn: sa.Connection, statement: NativeStatement, params: dict[str, Any]
                  ) -> tuple[list[str], list[tuple[Any, ...]]]:
    """:func:`driver_rows` for a hot statement of many rows or columns, planned once per
    session: its column names and its rows as tuples (a dict per row was an eighth of a
    500-message batch's Python).

    The statement is prepared on the session at its first run and given one generic plan
    there. Left to PostgreSQL's ``plan_cache_mode = auto``, the enqueue statement was
    planned anew on four calls in five, 2 ms of planning to 1 ms of execution. The
    setting is set and reset around it in the same round trip (libpq's pipeline), and a
    failure rolls it back with the statement's transaction.

    In autocommit (the API's requests) that round trip is written to libpq directly, the
    setting and the reset prepared too (:func:`_generic_round_trip`): psycopg's own
    pipeline costs 75 µs of this process's CPU a call more than a plain execute, and a
    ``POST /messages`` took about a fifth less of the server's CPU without it
    (docs/performance.md, "One statement a request"). Inside a transaction it takes
    psycopg's pipeline, which begins the transaction as psycopg would."""
    args = statement.args(params)
    with _driver(conn, statement.source, params) as raw:
        if raw.autocommit:
            try:
                return _generic_round_trip(raw, statement, args)
            except psycopg.errors.InvalidSqlStatementName:
                # psycopg deallocates every statement of the session when it rolls back
                # a transaction while it has statements of its own prepared: prepare ours
                # again. Nothing of the failed round trip ran (one implicit transaction).
                _PREPARED.pop(raw, None)
                return _generic_round_trip(raw, statement, args)
        with psycopg.RawCursor(raw, row_factory=tuple_row) as cur:
            with setting_around(raw, "plan_cache_mode", "force_generic_plan"):
                cur.execute(statement.text, args, prepare=True)
            if cur.description is None:
                return [], []
            return [c.name for c in cur.description], cur.fetchall()


# The statements each session has prepared under their own names (driver_tuples).
_PREPARED: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[bytes]] = \
    weakref.WeakKeyDictionary()
# The setting and its reset, each prepared once per session too (a prepared statement is
# not parsed again; pg_stat_statements counts it once, not at each call).
_GENERIC = (b"senddock_generic_plans", b"SET plan_cache_mode = force_generic_plan")
_AUTO = (b"senddock_auto_plans", b"RESET plan_cache_mode")
_WAIT = 0.1  # seconds between two looks at the socket, as psycopg's own waits


def _generic_round_trip(raw: psycopg.Connection[Any], statement: NativeStatement,
                        args: tuple[Any, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The setting, the statement and the reset, each prepared first on a new session,
    written to libpq in pipeline mode with one sync point: one round trip and, in
    autocommit, one transaction; a failure anywhere is raised as psycopg raises it."""
    tx = Transformer(raw)
    values = tx.dump_sequence(args, [PyFormat.AUTO] * len(args))
    name = statement.name(tx.types or ())
    prepared = _PREPARED.setdefault(raw, set())
    sent: list[bytes | None] = []  # per result to come: the name it prepares, or None
    pgconn = raw.pgconn

    def run(name: bytes, text: bytes, types: Sequence[int] | None = None,
            values: Sequence[Buffer | None] | None = None,
            formats: Sequence[pq.Format] | None = None) -> int:
        if name not in prepared:
            pgconn.send_prepare(name, text, param_types=types)
            sent.append(name)
        pgconn.send_query_prepared(name, values, param_formats=formats)
        sent.append(None)
        return len(sent) - 1

    with raw.lock:
        pgconn.enter_pipeline_mode()
        try:
            run(*_GENERIC)
            at = run(name, statement.text.encode(), tx.types, values, tx.formats)
            run(*_AUTO)
            pgconn.pipeline_sync()
            waiting.wait(generators.send(pgconn), pgconn.socket, _WAIT)
            results = waiting.wait(_until_sync(pgconn), pgconn.socket, _WAIT)
        finally:
            if pgconn.pipeline_status != pq.PipelineStatus.OFF:
                try:
                    pgconn.exit_pipeline_mode()
                except psycopg.Error:  # lost, or left with results unread: never reused
                    pgconn.finish()
    # What was prepared stays prepared when the rest failed: a prepared statement is the
    # session's, not the transaction's.
    prepared.update(made for made, result in zip(sent, results, strict=True)
                    if made and result.status == pq.ExecStatus.COMMAND_OK)
    failed = next((r for r in results if r.status == pq.ExecStatus.FATAL_ERROR), None)
    if failed is not None:
        raise psycopg.errors.error_from_result(failed, encoding=raw.info.encoding)
    result = results[at]
    if result.status != pq.ExecStatus.TUPLES_OK:
        return [], []
    tx.set_pgresult(result)
    names = [(result.fname(i) or b"").decode(raw.info.encoding) for i in range(result.nfields)]
    return names, tx.load_rows(0, result.ntuples, tuple)


def _until_sync(pgconn: pq.abc.PGconn) -> generators.PQGen[list[pq.abc.PGresult]]:
    """Read a pipeline's results up to its sync point (for psycopg's ``waiting.wait``)."""
    results: list[pq.abc.PGresult] = []
    while True:
        while pgconn.is_busy():
            if (yield waiting.Wait.R):  # nothing yet after _WAIT seconds: wait again
                pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:  # the end of one statement's results
            continue
        if result.status == pq.ExecStatus.PIPELINE_SYNC:
            return results
        results.append(result)


@contextlib.contextmanager
def setting_around(raw: psycopg.Connection[Any], name: str, value: str) -> Iterator[None]:
    """Set a session setting, run what the block sends, and reset it, all in one round
    trip (libpq's pipeline mode: one implicit transaction on an autocommit session), so a
    statement that fails leaves the setting as it was. ``name`` and ``value`` are ours,
    never a user's."""
    with raw.pipeline():
        raw.execute(f"SET {name} = {value}")
        yield
        raw.execute(f"RESET {name}")


@contextlib.contextmanager
def _driver(conn: sa.Connection, statement: str,
            params: dict[str, Any]) -> Iterator[psycopg.Connection[Any]]:
    """``conn``'s psycopg connection in ``conn``'s transaction, a driver error raised as
    SQLAlchemy would raise it (see :func:`driver_rows`)."""
    if not conn.in_transaction():
        conn.begin()  # what SQLAlchemy's own execute does (autobegin): its commit is ours
    raw = conn.connection.driver_connection
    assert isinstance(raw, psycopg.Connection)
    try:
        yield raw
    except psycopg.Error as exc:
        if raw.closed or raw.broken:
            conn.invalidate(exc)
        raise sa.exc.DBAPIError.instance(statement, params, exc, psycopg.Error,
                                         connection_invalidated=conn.invalidated) from exc
