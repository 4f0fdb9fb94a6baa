"""The finisher: one thread with one database session that commits the drain threads'
outcomes as they come (SPEC 10, "The duplicate window is per message").

A drain thread hands its outcome over right after the relay's reply, builds its next
message meanwhile, and waits for the commit at the relay's 354, before that message goes
out: so a crash resends at most one message per thread.

The session runs in libpq's pipeline mode. Whatever has been handed over is sent at once
as one statement (with its own sync point, so its own transaction), even while earlier
statements are still running: an outcome never waits in this process for a statement to
finish, it waits in PostgreSQL, which commits it even if this process dies the next
moment. Outcomes that arrive while the thread is busy go out together in the next
statement (group commit). No outcome is ever held back to fill a group.

If a statement fails, every outcome of its group gets the error and its drain thread
retries it itself (:meth:`workers.pool.Pool._record`); the session is then dropped and the
next outcome opens a fresh one.
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

import psycopg
from psycopg import pq
from sqlalchemy.engine import Connection

from workers import queue
from workers.queue import Outcome

log = logging.getLogger("senddock.worker")

MAX_GROUP = 100  # outcomes per statement at most
IDLE_RELEASE = 2.0  # seconds without an outcome before the session goes back to the pool
STOP_BOUND = 30.0  # seconds stop() waits for the thread (a statement stuck on a lock)

STATEMENT = b"senddock_finish"  # the name the session prepares queue.FINISH_PIPELINED under
_JSONB, _TEXT = 3802, 25  # its parameter types

Connect = Callable[[], AbstractContextManager[Connection]]
Item = tuple[Outcome, "Future[bool]"]


class Finisher:
    """``submit(outcome)`` returns a future: True once the outcome is committed, False if
    the mark was refused (the job was taken back meanwhile), or the database error."""

    def __init__(self, connect: Connect, worker_id: str) -> None:
        self.connect = connect
        self.worker_id = worker_id
        self._waiting: deque[Item] = deque()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._signalled = False
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stopped:
                return
            self._thread = threading.Thread(target=_Session(self).run, name="finisher",
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
        future: Future[bool] = Future()
        with self._lock:
            inline = self._stopped or self._thread is None
            if not inline:
                self._waiting.append((outcome, future))
                wake, self._signalled = not self._signalled, True
        if inline:
            self.commit_inline([(outcome, future)])
        elif wake:
            self._wake()
        return future

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

    def take(self) -> tuple[list[Item], bool]:
        """Everything handed over so far; True once stop() was called."""
        with self._lock:
            self._signalled = False
            group = list(self._waiting)
            self._waiting.clear()
            return group, self._stopped

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:  # the thread has wake-ups enough to read
            pass

    def woken(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass


class _Session:
    """The finisher's thread and its session in pipeline mode: a connection from the pool,
    opened when an outcome comes, given back after IDLE_RELEASE idle seconds, dropped after
    an error."""

    def __init__(self, finisher: Finisher) -> None:
        self.finisher = finisher
        self._stack: ExitStack | None = None
        self._conn: Connection | None = None
        self._pgconn: pq.abc.PGconn | None = None
        self._fd = -1  # its socket (pgconn.socket raises once the connection is lost)
        self._in_flight: deque[list[Item] | None] = deque()  # None: the PREPARE
        self._results: list[pq.abc.PGresult] = []  # of the oldest statement in flight
        self._unflushed = False
        self._broken: BaseException | None = None  # no more statements on this session
        self._selector = selectors.DefaultSelector()
        self._selector.register(finisher._wake_r, selectors.EVENT_READ)

    def run(self) -> None:
        finisher = self.finisher
        try:
            while True:
                group, stopping = finisher.take()
                for start in range(0, len(group), MAX_GROUP):
                    self._send(group[start:start + MAX_GROUP])
                if stopping and not self._in_flight:
                    return
                if not self._wait():
                    self._release()
        except BaseException as exc:  # never leave a drain thread waiting on a future
            log.exception("the finisher stopped; outcomes are committed by their threads")
            for pending in self._in_flight:
                _fail(pending or [], exc)
            self._in_flight.clear()
            group, _ = finisher.take()
            with finisher._lock:
                finisher._stopped = True  # from now on, submit() commits inline
            if group:
                finisher.commit_inline(group)
            raise
        finally:
            self._release(self._broken)
            self._selector.close()

    def _send(self, group: list[Item]) -> None:
        """Send the group's statement and its sync point; on any trouble the group gets
        the error (its threads retry it)."""
        while self._broken is not None and self._in_flight:  # let the old session drain
            self._wait()
        if self._broken is not None:
            self._release(self._broken)
        try:
            pgconn = self._pgconn or self._open()
            pgconn.send_query_prepared(STATEMENT, [
                queue.finish_document([o for o, _ in group]).encode(),
                self.finisher.worker_id.encode()])
            pgconn.pipeline_sync()
            self._in_flight.append(group)
            self._flush()
        except Exception as exc:
            _fail(group, exc)
            self._lost(exc)

    def _open(self) -> pq.abc.PGconn:
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
        self._stack, self._conn, self._pgconn, self._fd = stack, conn, pgconn, pgconn.socket
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._in_flight.append(None)
        return pgconn

    def _flush(self) -> None:
        assert self._pgconn is not None
        unflushed = self._pgconn.flush() == 1
        if unflushed != self._unflushed:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if unflushed else 0)
            self._selector.modify(self._fd, events)
            self._unflushed = unflushed

    def _wait(self) -> bool:
        """Wait for a wake-up or for results, and take the results in. False after
        IDLE_RELEASE seconds with nothing in flight and nothing handed over."""
        timeout = None if self._in_flight else IDLE_RELEASE
        events = self._selector.select(timeout)
        if not events:
            return bool(self._in_flight)
        for key, mask in events:
            if key.fileobj is self.finisher._wake_r:
                self.finisher.woken()
            elif self._pgconn is not None:
                try:
                    if mask & selectors.EVENT_WRITE:
                        self._flush()
                    if mask & selectors.EVENT_READ:
                        self._receive(self._pgconn)
                except psycopg.Error as exc:
                    self._lost(exc)
        return True

    def _receive(self, pgconn: pq.abc.PGconn) -> None:
        """Settle every statement whose sync point has come back."""
        pgconn.consume_input()
        while self._in_flight and not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                continue  # the end of one statement's results; its sync point follows
            if result.status != pq.ExecStatus.PIPELINE_SYNC:
                self._results.append(result)
                continue
            group, results = self._in_flight.popleft(), self._results
            self._results = []
            self._settle(group, results)

    def _settle(self, group: list[Item] | None, results: list[pq.abc.PGresult]) -> None:
        error = next((r for r in results if r.status != pq.ExecStatus.TUPLES_OK
                      and r.status != pq.ExecStatus.COMMAND_OK), None)
        if error is not None:
            exc = _error(error)
            _fail(group or [], exc)
            self._broken = self._broken or exc  # no more statements on this session
            return
        if group:
            rows = [r for r in results if r.status == pq.ExecStatus.TUPLES_OK]
            _settle(group, queue.finished_ids(rows[0].get_value(0, 0) if rows else None))

    def _lost(self, exc: BaseException) -> None:
        """The connection failed: every statement in flight gets the error."""
        for group in self._in_flight:
            _fail(group or [], exc)
        self._in_flight.clear()
        self._results = []
        self._release(exc)

    def _release(self, exc: BaseException | None = None) -> None:
        """Give the connection back to the pool (after an error: so the pool drops it)."""
        stack, conn, pgconn = self._stack, self._conn, self._pgconn
        self._stack = self._conn = self._pgconn = None
        self._broken = None
        self._unflushed = False
        if stack is None or pgconn is None:
            return
        try:
            self._selector.unregister(self._fd)
        except (KeyError, ValueError, OSError):
            pass
        self._fd = -1
        try:
            if exc is None:
                _leave_pipeline(pgconn)
        except Exception as err:
            log.debug("finisher session left pipeline mode with an error", exc_info=True)
            exc = err
        try:
            if exc is not None and conn is not None:
                conn.invalidate()  # still in pipeline mode, or broken: the pool drops it
            stack.close()
        except Exception:
            log.debug("finisher session closed with an error", exc_info=True)


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
