"""The finisher: one database session that commits the drain threads' outcomes as they come
(docs/design.md §16, "The duplicate window is per message").

A drain thread hands its outcome over right after the relay's reply, builds its next
message meanwhile, and waits for the commit at the relay's 354, before that message goes
out: so a crash resends at most one message per thread.

The session runs in libpq's pipeline mode. The drain thread that hands an outcome over
writes its statement to the session itself, with its own sync point (so its own
transaction), even while earlier statements are still running: an outcome never waits
in this process, not even for another thread to wake up. The finisher's thread opens the
session, reads the results and settles each outcome's future: True only once its sync
point has come back, so once it is committed. Outcomes handed over while no session is
open (the first, or after an error) are sent together once one is.

The crash bound rests on that alone. If this process dies with statements still on the
session, PostgreSQL commits none, some or all of them, in the order they were written:
the backend gives up at its first failed send to the dead client ("could not send data
to client", then FATAL "connection to client lost" at its next interrupt check). Over a
Unix socket (the embedded server's) that is the reply to the statement running at the
kill, so the statements behind it never run; over TCP the first send after the close
still succeeds and they usually do; with ``client_connection_check_interval`` set the
running one is cancelled too. PostgreSQL 15 and 18 alike. An outcome not committed
leaves its job ``sending``, for the rescuer to take back and resend: one message per
drain thread at most, since a thread sends no further message before its previous
outcome is confirmed (docs/design.md §16).

If a statement fails, every outcome of its group gets the error and its drain thread
retries it itself (:meth:`workers.delivery.handover.Handover.record`); the session is then
dropped and the next outcome opens a fresh one.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass

import psycopg
from psycopg import pq
from sqlalchemy.engine import Connection

from workers import queue
from workers.queue import Outcome

log = logging.getLogger("senddock.worker")

MAX_GROUP = 100  # outcomes per statement at most
# Seconds a finish statement may run (a lock held on the jobs, a stuck server) before it is
# cancelled and its outcomes recorded by their threads: every wait of the finisher is
# bounded, this one by PostgreSQL, a lost network by the session's TCP timeouts.
FINISH_TIMEOUT = 10.0
IDLE_RELEASE = 2.0  # seconds without an outcome before the session goes back to the pool
STOP_BOUND = 30.0  # seconds stop() waits for the thread (a statement stuck on a lock)

STATEMENT = b"senddock_finish"  # the name the session prepares queue.FINISH_PIPELINED under
_JSONB, _TEXT = 3802, 25  # its parameter types

# Opens a connection whose statements run under FINISH_TIMEOUT (workers/pool.py's
# StatementDb.connect): the session's and commit_inline's.
Connect = Callable[[], AbstractContextManager[Connection]]
Item = tuple[Outcome, "Future[bool]"]


class Finisher:
    """``submit(outcome)`` returns a future: True once the outcome is committed, False if
    the mark was refused (the job was taken back meanwhile), or the database error."""

    def __init__(self, connect: Connect, worker_id: str) -> None:
        self.connect = connect
        self.worker_id = worker_id
        # Guards everything below and every libpq call on the session: a drain thread
        # writes a statement while the finisher's thread may be reading results.
        self._lock = threading.Lock()
        self._session = _Session(self)
        self._waiting: deque[Item] = deque()  # handed over while no session was ready
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stopped:
                return
            self._thread = threading.Thread(target=self._session.run, name="finisher",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Commit what was handed over, then end the thread. Outcomes submitted after
        this are committed in the caller's thread."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake()
        if thread is None:
            return
        thread.join(STOP_BOUND)
        if thread.is_alive():
            log.warning("the finisher is still waiting for the database after %.0fs; "
                        "its outcomes are committed when it answers", STOP_BOUND)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, outcome: Outcome) -> Future[bool]:
        item: Item = (outcome, Future())
        with self._lock:
            inline = self._stopped or self._thread is None
            sent = not inline and self._session.send([item])
            if not inline and not sent:
                self._waiting.append(item)
            wake = not inline and (not sent or self._session.needs_thread)
        if inline:
            self.commit_inline([item])
        elif wake:
            self._wake()
        return item[1]

    def commit_inline(self, group: Sequence[Item]) -> None:
        """On a connection of the caller's thread (after stop, or left over)."""
        try:
            with self.connect() as conn:
                accepted = queue.finish(conn, self.worker_id, [o for o, _ in group])
        except Exception as exc:
            _fail(group, exc)
        else:
            _settle(group, accepted)

    # --- for the session thread --------------------------------------------------------

    def _take(self) -> list[Item]:
        """What is waiting for a session (call with the lock held)."""
        group = list(self._waiting)
        self._waiting.clear()
        return group

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:  # the thread has wake-ups enough to read
            pass

    def _woken(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass


class _Session:
    """The session in pipeline mode and the finisher's thread: a connection from the pool,
    opened when an outcome comes, given back after IDLE_RELEASE idle seconds, dropped after
    an error. Every attribute but the selector is the finisher's lock's."""

    def __init__(self, finisher: Finisher) -> None:
        self.finisher = finisher
        self._stack: ExitStack | None = None
        self._conn: Connection | None = None
        self._pgconn: pq.abc.PGconn | None = None
        self._fd = -1  # its socket (pgconn.socket raises once the connection is lost)
        self._in_flight: deque[list[Item] | None] = deque()  # None: the PREPARE
        self._results: list[pq.abc.PGresult] = []  # of the oldest statement in flight
        self.unflushed = False  # libpq holds bytes the socket did not take yet
        self._watching_write = False
        self._broken: BaseException | None = None  # no more statements on this session
        self._selector = selectors.DefaultSelector()

    # --- any thread, with the lock held ------------------------------------------------

    @property
    def needs_thread(self) -> bool:
        """The finisher's thread must act: bytes left to write, or the session failed."""
        return self.unflushed or self._broken is not None

    def send(self, group: list[Item]) -> bool:
        """Write the group's statement and its sync point. False (nothing sent) when no
        session is ready; on any trouble the group gets the error and the session is
        given up (the finisher's thread cleans it up)."""
        pgconn = self._pgconn
        if pgconn is None or self._broken is not None:
            return False
        try:
            pgconn.send_query_prepared(STATEMENT, [
                queue.finish_document([o for o, _ in group]).encode(),
                self.finisher.worker_id.encode()])
            pgconn.pipeline_sync()
            self._in_flight.append(group)
            self.unflushed = pgconn.flush() == 1
        except Exception as exc:
            _fail(group, exc)
            self._broken = self._broken or exc
        return True

    # --- the finisher's thread ---------------------------------------------------------

    def run(self) -> None:
        finisher = self.finisher
        self._selector.register(finisher._wake_r, selectors.EVENT_READ)
        try:
            while True:
                with finisher._lock:
                    stopping = finisher._stopped
                    broken = self._broken
                    # A failed session is given up once nothing is in flight on it, or
                    # at once if the connection itself is gone.
                    give_up = not self._in_flight or (
                        self._pgconn is not None and self._pgconn.status != pq.ConnStatus.OK)
                if broken is not None and give_up:
                    self._lost(broken)
                self._send_waiting()
                with finisher._lock:
                    if stopping and not self._in_flight and not finisher._waiting:
                        return
                    self._watch_write()
                if not self._wait():
                    self._release_if_idle()
        except BaseException as exc:  # never leave a drain thread waiting on a future
            log.exception("the finisher stopped; outcomes are committed by their threads")
            with finisher._lock:
                finisher._stopped = True  # from now on, submit() commits inline
                pending = [g for g in self._in_flight if g] + [finisher._take()]
                self._in_flight.clear()
            for group in pending:
                _fail(group, exc)
            raise
        finally:
            self._close(self._detach(), self._broken)
            self._selector.close()

    def _send_waiting(self) -> None:
        """Open a session if outcomes wait for one, and send them."""
        with self.finisher._lock:
            if not self.finisher._waiting or self._broken is not None:
                return
            ready = self._pgconn is not None
        if not ready:
            try:
                self._open()
            except Exception as exc:
                with self.finisher._lock:
                    group = self.finisher._take()
                _fail(group, exc)
                return
        with self.finisher._lock:
            group = self.finisher._take()
            for start in range(0, len(group), MAX_GROUP):
                if not self.send(group[start:start + MAX_GROUP]):
                    # The session failed on an earlier part: the rest waits for the next.
                    self.finisher._waiting.extendleft(reversed(group[start:]))
                    break

    def _open(self) -> None:
        """Check a connection out (outside the lock: it may wait for the database)."""
        stack = ExitStack()
        try:
            conn = stack.enter_context(self.finisher.connect())
            driver = conn.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            pgconn = driver.pgconn
            pgconn.enter_pipeline_mode()  # psycopg's sessions are non-blocking already
            pgconn.send_prepare(STATEMENT, queue.FINISH_PIPELINED.encode(),
                                param_types=[_JSONB, _TEXT])
            pgconn.pipeline_sync()
        except BaseException as exc:
            stack.__exit__(type(exc), exc, exc.__traceback__)
            raise
        with self.finisher._lock:
            self._stack, self._conn, self._pgconn = stack, conn, pgconn
            self._fd = pgconn.socket
            self._in_flight.append(None)
            self.unflushed = pgconn.flush() == 1
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._watching_write = False

    def _watch_write(self) -> None:
        """Watch the socket for room while libpq holds unsent bytes (lock held)."""
        if self._pgconn is None or self.unflushed == self._watching_write:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.unflushed else 0)
        self._selector.modify(self._fd, events)
        self._watching_write = self.unflushed

    def _wait(self) -> bool:
        """Wait for a wake-up or for results, and settle what came back. False after
        IDLE_RELEASE seconds with nothing in flight and nothing handed over."""
        with self.finisher._lock:
            busy = bool(self._in_flight)
        events = self._selector.select(None if busy else IDLE_RELEASE)
        if not events:
            return busy
        done: list[tuple[list[Item] | None, list[pq.abc.PGresult]]] = []  # settled outside
        for key, mask in events:
            if key.fileobj is self.finisher._wake_r:
                self.finisher._woken()
                continue
            with self.finisher._lock:
                if self._pgconn is None:
                    continue
                try:
                    if mask & selectors.EVENT_WRITE:
                        self.unflushed = self._pgconn.flush() == 1
                    if mask & selectors.EVENT_READ:
                        done += self._receive(self._pgconn)
                except psycopg.Error as exc:
                    self._broken = self._broken or exc
        for group, results in done:
            self._settle(group, results)
        return True

    def _receive(self, pgconn: pq.abc.PGconn) -> list[tuple[list[Item] | None,
                                                            list[pq.abc.PGresult]]]:
        """The statements whose sync point has come back, with their results (lock held)."""
        pgconn.consume_input()
        done = []
        while self._in_flight and not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                continue  # the end of one statement's results; its sync point follows
            if result.status != pq.ExecStatus.PIPELINE_SYNC:
                self._results.append(result)
                continue
            done.append((self._in_flight.popleft(), self._results))
            self._results = []
        return done

    def _settle(self, group: list[Item] | None, results: list[pq.abc.PGresult]) -> None:
        error = next((r for r in results if r.status != pq.ExecStatus.TUPLES_OK
                      and r.status != pq.ExecStatus.COMMAND_OK), None)
        if error is not None:
            exc = _error(error)
            _fail(group or [], exc)
            with self.finisher._lock:
                self._broken = self._broken or exc  # no more statements on this session
            return
        if group:
            rows = [r for r in results if r.status == pq.ExecStatus.TUPLES_OK]
            _settle(group, queue.finished_ids(rows[0].get_value(0, 0) if rows else None))

    def _lost(self, exc: BaseException) -> None:
        """Give the session up: every statement still in flight gets the error."""
        with self.finisher._lock:
            pending = [g for g in self._in_flight if g]
            self._in_flight.clear()
            self._results = []
            detached = self._detach()
        for group in pending:
            _fail(group, exc)
        self._close(detached, exc)

    def _release_if_idle(self) -> None:
        """Give the connection back unless a drain thread has just used it."""
        with self.finisher._lock:
            if self._in_flight or self.finisher._waiting:
                return
            detached = self._detach()
        self._close(detached, None)

    def _detach(self) -> _Detached | None:
        """Take the connection off the session, so no statement goes out on it any more
        (lock held, or the thread's last act)."""
        stack, conn, pgconn, fd = self._stack, self._conn, self._pgconn, self._fd
        self._stack = self._conn = self._pgconn = None
        self._fd = -1
        self._broken = None
        self.unflushed = False
        if stack is None or conn is None or pgconn is None:
            return None
        return _Detached(stack, conn, pgconn, fd)

    def _close(self, detached: _Detached | None, exc: BaseException | None) -> None:
        """Give a detached connection back to the pool (after an error: so the pool
        drops it)."""
        if detached is None:
            return
        try:
            self._selector.unregister(detached.fd)
        except (KeyError, ValueError, OSError):
            pass
        self._watching_write = False
        try:
            if exc is None:
                _leave_pipeline(detached.pgconn)
        except Exception as err:
            log.debug("finisher session left pipeline mode with an error", exc_info=True)
            exc = err
        try:
            if exc is not None:
                detached.conn.invalidate()  # still in pipeline mode, or broken: dropped
            detached.stack.close()
        except Exception:
            log.debug("finisher session closed with an error", exc_info=True)


@dataclass(frozen=True, slots=True)
class _Detached:
    stack: ExitStack
    conn: Connection
    pgconn: pq.abc.PGconn
    fd: int


def _leave_pipeline(pgconn: pq.abc.PGconn) -> None:
    """Back to a plain session (nothing in flight), without our prepared statement, so
    the pool can hand it to anyone."""
    pgconn.exit_pipeline_mode()
    result = pgconn.exec_(b"DEALLOCATE " + STATEMENT)  # (PQexec always waits)
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise _error(result)


def _error(result: pq.abc.PGresult) -> psycopg.Error:
    """The psycopg exception for a failed result (its SQLSTATE's class)."""
    message = (result.error_message or b"").decode(errors="replace").strip()
    if result.status == pq.ExecStatus.PIPELINE_ABORTED:
        return psycopg.OperationalError("the statement was not run: " + message)
    sqlstate = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
    try:
        cls = psycopg.errors.lookup(sqlstate)
    except KeyError:
        cls = psycopg.DatabaseError
    return cls(message or "the finish statement failed")


def _settle(group: Sequence[Item], accepted: set[int]) -> None:
    for outcome, future in group:
        if not future.done():
            future.set_result(outcome.job_id in accepted)


def _fail(group: Sequence[Item], exc: BaseException) -> None:
    for _, future in group:
        if not future.done():
            future.set_exception(exc)
