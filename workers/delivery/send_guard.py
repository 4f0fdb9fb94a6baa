"""The send guard: the drain threads' check, at the relay's 354, that a campaign message may
go out (docs/design.md §20; the other side, a pause's or a cancel's wait, is
:func:`workers.delivery.lifecycle.stop_sending`).

One session per process, shared by its drain threads (so the guard costs one connection
of the budget, docs/scale-out.md), opened when first used. A thread's check
(:meth:`SendGuard.ask` when the message's SMTP transaction starts, :meth:`SendGuard.granted`
at the relay's 354) runs ``senddock_send_guard`` (migrations 0042 and 0048): it takes the
campaign's shared advisory lock and reads the campaign's status, and the lock is held by
the session until the same thread's :meth:`SendGuard.leave`, after the relay's answer. A
session's own lock requests are granted at once while it holds the lock, so the function
first says no while a pause or cancel waits for the exclusive lock: the messages in
flight finish, no new one starts, and the pause commits.

The session runs in libpq's pipeline mode, so the threads never queue behind each other's
round trips: each writes its statement with its own sync point at once (the session's
lock is held only while writing and reading, never across the wait), a check's answer is
read at the 354 (by then it has usually come), and a leave does not wait at all (its
unlock runs as soon as PostgreSQL reads it, before any later statement of the session).
With one round trip per check and one per leave, taken in turns, the worker drained at
about 70 % of its rate without the guard (docs/performance.md, "The send guard").
Whoever waits reads the results for everyone (one reader at a time); a database error, or
no answer within :data:`ANSWER_TIMEOUT`, says no (the message is not sent, it goes back to
wait) and ends the session, which releases every lock it held.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq

from workers.core import pg

log = logging.getLogger("senddock.lifecycle")

#: ``pg_locks.classid`` of the send guard's advisory locks (their objid is the campaign's).
GUARD_CLASS = 0x5D0C

#: Seconds an enter waits for its answer before it says no and ends the session (the
#: function never waits for a lock, so only a stuck or lost server takes this long).
ANSWER_TIMEOUT = 10.0

_ENTER, _LEAVE = b"senddock_guard_enter", b"senddock_guard_leave"
_INT8 = 20


def guard_key(campaign_id: int) -> int:
    """The campaign's advisory lock key (one bigint: GUARD_CLASS, then the id's low 32
    bits; two campaigns sharing a key only wait for each other's messages)."""
    return (GUARD_CLASS << 32) | (campaign_id & 0xFFFFFFFF)


@dataclass
class _Answer:
    """An enter's answer, filled in by whichever thread reads it."""

    done: bool = False
    granted: bool = False


class SendGuard:
    """The process's guard session (see the module's docstring)."""

    def __init__(self, info: str, application_name: str) -> None:
        self.info = info
        self.application_name = application_name
        self.conn: psycopg.Connection[Any] | None = None
        self.lock = threading.Lock()
        self._answered = threading.Condition(self.lock)
        self.local = threading.local()
        # One entry per statement on the session, in order: an enter's answer, or None
        # (the prepares, a leave) when nobody waits for it.
        self._sent: deque[_Answer | None] = deque()
        self._reading = False  # a thread is waiting for the socket on everyone's behalf
        self._session = 0  # counts sessions: a leave unlocks only on the session it entered

    def ask(self, campaign_id: int) -> None:
        """Write this thread's check for a campaign message without waiting for it:
        :meth:`granted` reads the answer. Asked when the message's SMTP transaction
        starts, the check runs while the relay answers MAIL, RCPT and DATA."""
        key = guard_key(campaign_id)
        answer = _Answer()
        with self.lock:
            try:
                self._send(_ENTER, campaign_id, key, answer)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                self._fail(exc)
                answer.done = True  # says no
            self.local.held = (answer, key, self._session)

    def granted(self) -> bool:
        """True if this thread's :meth:`ask` found the campaign sending: its shared lock
        is then held until this thread's :meth:`leave`. False if it is not, a pause or
        cancel is waiting, or the database did not answer."""
        held = getattr(self.local, "held", None)
        if held is None:
            return False
        answer, _key, session = held
        with self.lock:
            try:
                self._wait(answer, time.monotonic() + ANSWER_TIMEOUT)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                self._fail(exc)
            if answer.granted and session == self._session:
                return True
        self.local.held = None
        return False

    def enter(self, campaign_id: int) -> bool:
        """:meth:`ask` and :meth:`granted`."""
        self.ask(campaign_id)
        return self.granted()

    def leave(self) -> None:
        """Release the lock this thread's check took (if it did): the message has been
        answered. Written to the session, not waited for -- unless the check's own answer
        has not been read yet (the message never reached its 354): the session may hold
        the lock for other threads' messages too, so it is released only if this check
        took it."""
        held = getattr(self.local, "held", None)
        if held is None:
            return
        self.local.held = None
        answer, key, session = held
        with self.lock:
            try:
                if not answer.done:
                    self._wait(answer, time.monotonic() + ANSWER_TIMEOUT)
                if not answer.granted or session != self._session or self.conn is None:
                    return  # not taken, or that session has ended and its locks with it
                self._send(_LEAVE, key, None, None)
                if not self._reading:  # (a reader waits on the socket for what it holds)
                    self._read_ready()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                self._fail(exc)

    def close(self) -> None:
        with self.lock:
            self._close()

    # --- with the lock held ------------------------------------------------------------

    def _open(self) -> pq.abc.PGconn:
        conn = pg.connect(self.info, application_name=self.application_name,
                          autocommit=True)
        pgconn = conn.pgconn
        try:
            pgconn.enter_pipeline_mode()  # psycopg's sessions are non-blocking already
            pgconn.send_prepare(_ENTER, b"SELECT senddock_send_guard($1, $2)",
                                param_types=[_INT8, _INT8])
            pgconn.send_prepare(_LEAVE, b"SELECT pg_advisory_unlock_shared($1)",
                                param_types=[_INT8])
            pgconn.pipeline_sync()
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self._session += 1
        self._sent.append(None)
        return pgconn

    def _send(self, name: bytes, first: int, second: int | None,
              answer: _Answer | None) -> None:
        """Write one statement and its sync point, and flush it."""
        pgconn = self.conn.pgconn if self.conn is not None else self._open()
        params = [str(first).encode()] + ([str(second).encode()] if second is not None else [])
        pgconn.send_query_prepared(name, params)
        pgconn.pipeline_sync()
        self._sent.append(answer)
        deadline = time.monotonic() + ANSWER_TIMEOUT
        while pgconn.flush() == 1:  # the socket's buffer is full: wait for room
            if not self._ready(pgconn.socket, select.POLLOUT, deadline):
                raise TimeoutError("the database took no more statements")

    def _wait(self, answer: _Answer, deadline: float) -> None:
        """Until ``answer`` is read (by this thread or another)."""
        if not answer.done and not self._reading and self.conn is not None:
            self._read_ready()  # usually it has come already: no wait for the socket
        while not answer.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer within {ANSWER_TIMEOUT:.0f}s")
            if self._reading:
                self._answered.wait(remaining)
                continue
            conn = self.conn
            if conn is None:
                return  # the session ended (an answer left unread says no)
            fd = conn.pgconn.socket
            self._reading = True
            self.lock.release()
            try:
                readable = self._ready(fd, select.POLLIN, deadline)
            except (OSError, ValueError):  # the session was closed meanwhile
                readable = False
            finally:
                self.lock.acquire()
                self._reading = False
            try:
                if readable and conn is self.conn:
                    self._read_ready()
            finally:
                self._answered.notify_all()

    def _read_ready(self) -> None:
        """Settle every statement whose sync point has come back (never blocks)."""
        assert self.conn is not None
        pgconn = self.conn.pgconn
        pgconn.consume_input()
        while self._sent and not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                continue  # the end of one statement's results; its sync point follows
            if result.status == pq.ExecStatus.PIPELINE_SYNC:
                answer = self._sent.popleft()
                if answer is not None:
                    answer.done = True
            elif result.status == pq.ExecStatus.TUPLES_OK:
                answer = self._sent[0]
                if answer is not None:
                    answer.granted = result.get_value(0, 0) == b"t"
            elif result.status != pq.ExecStatus.COMMAND_OK:
                raise psycopg.OperationalError(
                    (result.error_message or b"the guard's statement failed").decode(
                        "utf-8", "replace"))

    @staticmethod
    def _ready(fd: int, event: int, deadline: float) -> bool:
        poller = select.poll()  # one system call (a selector costs four)
        poller.register(fd, event)
        return bool(poller.poll(max(0.0, deadline - time.monotonic()) * 1000))

    def _fail(self, exc: BaseException) -> None:
        log.warning("send guard: %s; the message is not sent now, and the guard's session "
                    "ends (releasing its locks)",
                    pg.first_line(exc) if isinstance(exc, psycopg.Error) else exc)
        self._close()

    def _close(self) -> None:
        """End the session (its locks go with it); whoever waits gets no."""
        conn, self.conn = self.conn, None
        for answer in self._sent:
            if answer is not None:
                answer.done = True
        self._sent.clear()
        self._answered.notify_all()
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass
