"""The finisher: a few threads, each with its own database session, that commit the drain
threads' outcomes as they come (SPEC 10, "The duplicate window is per message").

A drain thread hands its outcome over right after the relay's reply, builds its next
message meanwhile, and waits for the commit at the relay's 354, before that message goes
out: so a crash resends at most one message per thread. An outcome is taken up at once by
a session that is free; the outcomes that arrive while every session is busy are
committed together by the next free one (group commit), so the commits per second do not
grow with the number of threads. No outcome is ever held back to fill a group.

If a statement fails (the database is away), every outcome of that group gets the error
and its drain thread retries it itself (:meth:`workers.pool.Pool._record`).
"""

from __future__ import annotations

import logging
import queue as queues
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, ExitStack

from sqlalchemy.engine import Connection

from workers import queue
from workers.queue import Outcome

log = logging.getLogger("senddock.worker")

MAX_GROUP = 100  # outcomes per statement at most
IDLE_RELEASE = 2.0  # seconds without an outcome before a session goes back to the pool
STOP_BOUND = 30.0  # seconds stop() waits for the threads (a statement stuck on a lock)

Connect = Callable[[], AbstractContextManager[Connection]]
Item = tuple[Outcome, "Future[bool]"]


class Finisher:
    """``submit(outcome)`` returns a future: True once the outcome is committed, False if
    the mark was refused (the job was taken back meanwhile), or the database error."""

    def __init__(self, connect: Connect, worker_id: str, sessions: int = 1) -> None:
        self.connect = connect
        self.worker_id = worker_id
        self.sessions = max(1, sessions)
        self._queue: queues.SimpleQueue[Item | None] = queues.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopped = False

    def start(self) -> None:
        with self._lock:
            if self._threads or self._stopped:
                return
            for i in range(self.sessions):
                thread = threading.Thread(target=_Session(self).run, name=f"finisher-{i}",
                                          daemon=True)
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        """Commit what was handed over, then end the threads. Outcomes submitted after
        this are committed in the caller's thread."""
        with self._lock:
            self._stopped = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            thread.join(STOP_BOUND)
        if any(t.is_alive() for t in threads):
            log.warning("the finisher is still waiting for the database after %.0fs; "
                        "its outcomes are committed when it answers", STOP_BOUND)

    @property
    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def submit(self, outcome: Outcome) -> Future[bool]:
        future: Future[bool] = Future()
        with self._lock:
            inline = self._stopped or not self._threads
            if not inline:
                self._queue.put((outcome, future))
        if inline:
            self.commit_inline([(outcome, future)])
        return future

    def commit_inline(self, group: Sequence[Item]) -> None:
        """On a connection of the caller's thread (after stop, or left over)."""
        try:
            with self.connect() as conn:
                self.resolve(group, conn)
        except Exception as exc:
            _fail(group, exc)

    def resolve(self, group: Sequence[Item], conn: Connection) -> None:
        """Commit the group and settle its futures."""
        accepted = queue.finish(conn, self.worker_id, [o for o, _ in group])
        for outcome, future in group:
            future.set_result(outcome.job_id in accepted)

    def take(self, first: Item | None) -> tuple[list[Item], bool]:
        """``first`` and whatever else is already waiting; True when a stop mark came."""
        group: list[Item] = []
        item = first
        while True:
            if item is None:
                return group, True
            group.append(item)
            if len(group) >= MAX_GROUP:
                return group, False
            try:
                item = self._queue.get_nowait()
            except queues.Empty:
                return group, False

    def next(self) -> Item | None:
        """The next outcome; raises queue.Empty after IDLE_RELEASE seconds without one."""
        return self._queue.get(timeout=IDLE_RELEASE)

    def leftovers(self) -> list[Item]:
        """What is queued now (the other threads' stop marks stay queued)."""
        group: list[Item] = []
        marks = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queues.Empty:
                break
            if item is None:
                marks += 1
            else:
                group.append(item)
        for _ in range(marks):
            self._queue.put(None)
        return group


class _Session:
    """One finisher thread and its connection (opened when needed, returned to the pool
    after IDLE_RELEASE idle seconds, dropped after an error)."""

    def __init__(self, finisher: Finisher) -> None:
        self.finisher = finisher
        self._stack: ExitStack | None = None
        self._conn: Connection | None = None

    def run(self) -> None:
        finisher = self.finisher
        try:
            while True:
                try:
                    item = finisher.next()
                except queues.Empty:
                    self._release()
                    continue
                group, last = finisher.take(item)
                if group:
                    self._commit(group)
                if last:
                    return
        except BaseException:  # never leave a drain thread waiting on a future
            log.exception("a finisher thread stopped; outcomes are committed by their "
                          "threads")
            if left := finisher.leftovers():
                finisher.commit_inline(left)
            raise
        finally:
            self._release()

    def _commit(self, group: Sequence[Item]) -> None:
        try:
            if self._conn is None:
                self._stack = ExitStack()
                self._conn = self._stack.enter_context(self.finisher.connect())
            self.finisher.resolve(group, self._conn)
        except Exception as exc:
            self._release(exc)
            _fail(group, exc)

    def _release(self, exc: BaseException | None = None) -> None:
        """Give the connection back to the pool (after an error: so the pool drops it)."""
        stack, self._stack, self._conn = self._stack, None, None
        if stack is None:
            return
        try:
            if exc is None:
                stack.close()
            else:
                stack.__exit__(type(exc), exc, exc.__traceback__)
        except Exception:  # the session is unusable either way; the pool has dropped it
            log.debug("finisher session closed with an error", exc_info=True)


def _fail(group: Sequence[Item], exc: BaseException) -> None:
    for _, future in group:
        if not future.done():
            future.set_exception(exc)
