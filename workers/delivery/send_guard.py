"""The send guard: the drain threads' check, at the relay's 354, that a campaign message may
go out (docs/design.md §20; the other side, a pause's or a cancel's wait, is
:func:`workers.delivery.lifecycle.stop_sending`).

One session per process, shared by its drain threads (so the guard costs one connection
of the budget, docs/scale-out.md), opened when first used. A campaign message is sent only
while that session holds the campaign's shared advisory lock, from the check
(:meth:`SendGuard.ask` when the message's SMTP transaction starts, :meth:`SendGuard.granted`
at the relay's 354) until the same thread's :meth:`SendGuard.leave`, after the relay's
answer. A pause or cancel takes the lock exclusively before it moves the campaign's row,
so it waits for every message then in flight, and none starts after it commits.

The lock is taken by ``senddock_send_guard`` (migrations 0042 and 0048), which reads the
campaign's status under it. A session's own lock requests are granted at once while it
holds the lock, so the function first says no while a pause or cancel waits for the
exclusive lock: the messages in flight finish, no new one starts, and the pause commits.

How long the session keeps the lock is ``hold``:

- ``hold = 0``: the lock is given back as soon as no message of the campaign is in flight
  in this process, and every message's check is a statement.
- ``hold > 0`` (the pool's :data:`HOLD`): the lock is kept between messages, so a thread
  whose campaign the session holds goes ahead without a statement (while the lock is held
  the status cannot move: moving it needs the exclusive lock). A keeper thread looks for
  a waiting pause or cancel every :data:`CHECK_EVERY` seconds (one ``pg_locks`` read for
  all campaigns); from then on checks are statements again (and say no), and the lock is
  given back once the messages in flight are answered. It is also given back after
  ``hold`` seconds with none in flight. A pause therefore waits for the messages in flight
  and at most a few checks more; it never commits while one is being sent.

The session runs in libpq's pipeline mode, so the threads never queue behind each other's
round trips: each writes its statement with its own sync point at once (the session's
lock is held only while writing and reading, never across the wait), a check's answer is
read at the 354 (by then it has usually come), and a release does not wait at all (its
unlock runs as soon as PostgreSQL reads it, before any later statement of the session).
Whoever waits reads the results for everyone (one reader at a time); a database error, or
no answer within :data:`ANSWER_TIMEOUT`, says no (the message is not sent, it goes back to
wait) and ends the session, which releases every lock it held. Measured in
docs/performance.md ("The send guard").
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

#: The pool's ``hold``: seconds a campaign's lock is kept with none of its messages in
#: flight (a drain sends the next one long before).
HOLD = 0.25

#: Seconds between the keeper's looks for a waiting pause or cancel while a lock is held.
CHECK_EVERY = 0.01

_ENTER = b"senddock_guard_enter"
_RELEASE = b"senddock_guard_release"
_WAITERS = b"senddock_guard_waiters"
_INT8 = 20

# Each statement's text, prepared on the session once.
_STATEMENTS = (
    (_ENTER, b"SELECT senddock_send_guard($1, $2)", [_INT8, _INT8]),
    (_RELEASE, b"SELECT pg_advisory_unlock_shared($1) FROM generate_series(1, $2)",
     [_INT8, _INT8]),
    # (Advisory locks are per database; pg_locks lists every database's.)
    (_WAITERS, b"SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
               b" AND objsubid = 1 AND classid = CAST($1 AS oid) AND database = "
               b"(SELECT oid FROM pg_database WHERE datname = current_database())", [_INT8]),
)


def guard_key(campaign_id: int) -> int:
    """The campaign's advisory lock key (one bigint: GUARD_CLASS, then the id's low 32
    bits; two campaigns sharing a key only wait for each other's messages)."""
    return (GUARD_CLASS << 32) | (campaign_id & 0xFFFFFFFF)


@dataclass
class _Answer:
    """A check's answer, filled in by whichever thread reads it."""

    key: int
    done: bool = False
    granted: bool = False


@dataclass
class _Hold:
    """A campaign's lock as the session holds it."""

    count: int = 0  # times the session took it (each needs its unlock)
    users: int = 0  # messages in flight under it
    idle_since: float = 0.0  # when ``users`` last went to 0
    waited: bool = False  # the keeper's last look found a pause or cancel waiting


class _Look:
    """The keeper's look for waiters, as an entry of the session's statements."""


_LOOK = _Look()


class SendGuard:
    """The process's guard session (see the module's docstring)."""

    def __init__(self, info: str, application_name: str, hold: float = 0.0) -> None:
        self.info = info
        self.application_name = application_name
        self.hold = hold
        self.conn: psycopg.Connection[Any] | None = None
        self.lock = threading.Lock()
        self._answered = threading.Condition(self.lock)
        self._kept = threading.Condition(self.lock)
        self.local = threading.local()
        # One entry per statement on the session, in order: a check's answer, the
        # keeper's look, or None (the prepares, a release) when nobody waits for it.
        self._sent: deque[_Answer | _Look | None] = deque()
        self._reading = False  # a thread is waiting for the socket on everyone's behalf
        self._session = 0  # counts sessions: a leave counts only on the session it entered
        self._holds: dict[int, _Hold] = {}  # by key, on the current session
        self._looking = False  # a look is on its way
        self._keeper: threading.Thread | None = None
        self.written = 0  # statements written (prepares aside), for tests and benches

    def ask(self, campaign_id: int) -> None:
        """Start this thread's check for a campaign message without waiting for it:
        :meth:`granted` reads the answer. Asked when the message's SMTP transaction
        starts, a check that is a statement runs while the relay answers MAIL, RCPT and
        DATA."""
        key = guard_key(campaign_id)
        answer = _Answer(key)
        with self.lock:
            hold = self._holds.get(key) if self.hold else None
            if hold is not None and not hold.waited:
                hold.users += 1  # held, no pause seen waiting: nothing to ask
                answer.done = answer.granted = True
            else:
                try:
                    self._send(_ENTER, campaign_id, key, answer)
                except (psycopg.Error, OSError, TimeoutError) as exc:
                    self._fail(exc)
                    answer.done = True  # says no
            self.local.held = (answer, self._session)

    def granted(self) -> bool:
        """True if this thread's :meth:`ask` found the campaign sending: its shared lock
        is then held until this thread's :meth:`leave`. False if it is not, a pause or
        cancel is waiting, or the database did not answer."""
        held = getattr(self.local, "held", None)
        if held is None:
            return False
        answer, session = held
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
        """This thread's message has been answered (or was never sent): it no longer
        keeps the campaign's lock. Waits for nothing -- unless the check's own answer has
        not been read yet (the message never reached its 354): whether this message was
        counted under the lock must be known before it stops counting."""
        held = getattr(self.local, "held", None)
        if held is None:
            return
        self.local.held = None
        answer, session = held
        with self.lock:
            try:
                if not answer.done:
                    self._wait(answer, time.monotonic() + ANSWER_TIMEOUT)
                hold = self._holds.get(answer.key)
                if not answer.granted or session != self._session or hold is None:
                    return  # not taken, or that session has ended and its locks with it
                hold.users -= 1
                if hold.users == 0:
                    if hold.waited or not self.hold:
                        self._release(answer.key, hold)
                    else:
                        hold.idle_since = time.monotonic()
                if not self._reading:  # (a reader waits on the socket for what it holds)
                    self._read_ready()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                self._fail(exc)

    def close(self) -> None:
        with self.lock:
            self._close()

    # --- the keeper (hold > 0) ---------------------------------------------------------

    def _keep(self) -> None:
        """While the session lasts: every :data:`CHECK_EVERY` seconds that it holds a
        lock, give back the locks no message needs and look for waiting pauses."""
        with self.lock:
            while self.conn is not None:
                if not self._holds:
                    self._kept.wait()
                    continue
                self._kept.wait(CHECK_EVERY)
                if self.conn is None:
                    break
                try:
                    self._tend(time.monotonic())
                except (psycopg.Error, OSError, TimeoutError) as exc:
                    self._fail(exc)
            self._keeper = None

    def _tend(self, now: float) -> None:
        if not self._reading:
            self._read_ready()  # the last look's answer, usually back by now
        for key, hold in list(self._holds.items()):
            if hold.users == 0 and (hold.waited or now - hold.idle_since >= self.hold):
                self._release(key, hold)
        if self._holds and not self._looking:
            self._send(_WAITERS, GUARD_CLASS, None, _LOOK)
            self._looking = True

    # --- with the lock held ------------------------------------------------------------

    def _open(self) -> pq.abc.PGconn:
        conn = pg.connect(self.info, application_name=self.application_name,
                          autocommit=True)
        pgconn = conn.pgconn
        try:
            pgconn.enter_pipeline_mode()  # psycopg's sessions are non-blocking already
            for name, text, types in _STATEMENTS:
                pgconn.send_prepare(name, text, param_types=types)
            pgconn.pipeline_sync()
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self._session += 1
        self._sent.append(None)
        if self.hold and self._keeper is None:
            self._keeper = threading.Thread(target=self._keep, daemon=True,
                                            name="send-guard-keeper")
            self._keeper.start()
        return pgconn

    def _release(self, key: int, hold: _Hold) -> None:
        """Give back every time the session took ``key``'s lock."""
        del self._holds[key]
        self._send(_RELEASE, key, hold.count, None)

    def _send(self, name: bytes, first: int, second: int | None,
              entry: _Answer | _Look | None) -> None:
        """Write one statement and its sync point, and flush it."""
        pgconn = self.conn.pgconn if self.conn is not None else self._open()
        params = [str(first).encode()] + ([str(second).encode()] if second is not None else [])
        pgconn.send_query_prepared(name, params)
        pgconn.pipeline_sync()
        self._sent.append(entry)
        self.written += 1
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
                entry = self._sent.popleft()
                if isinstance(entry, _Answer):
                    entry.done = True
                elif entry is _LOOK:
                    self._looking = False
            elif result.status == pq.ExecStatus.TUPLES_OK:
                self._settle(self._sent[0], result)
            elif result.status != pq.ExecStatus.COMMAND_OK:
                raise psycopg.OperationalError(
                    (result.error_message or b"the guard's statement failed").decode(
                        "utf-8", "replace"))

    def _settle(self, entry: _Answer | _Look | None, result: pq.abc.PGresult) -> None:
        """A statement's rows: a check's answer (a lock taken is counted at once, in the
        session's order, whoever waits for it) or the keeper's look."""
        if isinstance(entry, _Answer):
            entry.granted = result.get_value(0, 0) == b"t"
            if entry.granted:
                hold = self._holds.get(entry.key)
                if hold is None:
                    hold = self._holds[entry.key] = _Hold()
                    self._kept.notify()
                hold.count += 1
                hold.users += 1
                hold.waited = False  # (the function says no while a pause waits)
        elif entry is _LOOK:
            waiting = {(GUARD_CLASS << 32) | int(result.get_value(row, 0) or 0)
                       for row in range(result.ntuples)}
            for key, hold in self._holds.items():
                hold.waited = key in waiting

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
        for entry in self._sent:
            if isinstance(entry, _Answer):
                entry.done = True
        self._sent.clear()
        self._holds.clear()
        self._looking = False
        self._answered.notify_all()
        self._kept.notify_all()
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass
