"""The finisher: one thread and one database session that commit the drain threads'
outcomes as they come (SPEC 10, "The duplicate window is per message").

A drain thread hands its outcome over right after the relay's reply, builds its next
message meanwhile, and waits for the commit before that message goes out, so a crash
resends at most one message per thread. Outcomes that arrive while a commit is running
are committed together by the next statement (group commit): the commits per second do
not grow with the number of threads, one connection of the delivery pool is enough, and
no outcome waits for any other to be sent. An outcome is never held back to fill a group.

If the statement fails (the database is away), every outcome of that group gets the
error and its drain thread retries it itself (:meth:`workers.pool.Pool._record`).
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
IDLE_RELEASE = 2.0  # seconds without an outcome before the session goes back to the pool
STOP_BOUND = 30.0  # seconds stop() waits for the thread (a statement stuck on a lock)

Connect = Callable[[], AbstractContextManager[Connection]]


class Finisher:
    """``submit(outcome)`` returns a future: True once the outcome is committed, False if
    the mark was refused (the job was taken back meanwhile), or the database error."""

    def __init__(self, connect: Connect, worker_id: str) -> None:
        self._connect = connect
        self.worker_id = worker_id
        self._queue: queues.SimpleQueue[tuple[Outcome, Future[bool]] | None] = \
            queues.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._session: ExitStack | None = None
        self._conn: Connection | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="finisher",
                                                daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Commit what was handed over, then end the thread. Outcomes submitted after
        this are committed in the caller's thread."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._queue.put(None)
        if thread is not None:
            thread.join(STOP_BOUND)
            if thread.is_alive():
                log.warning("the finisher is still waiting for the database after %.0fs; "
                            "its outcomes are committed when it answers", STOP_BOUND)

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def submit(self, outcome: Outcome) -> Future[bool]:
        future: Future[bool] = Future()
        with self._lock:
            inline = self._stopped or self._thread is None
            if not inline:
                self._queue.put((outcome, future))
        if inline:
            self._commit_inline([(outcome, future)])
        return future

    # --- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                try:
                    item = self._queue.get(timeout=IDLE_RELEASE)
                except queues.Empty:
                    self._release()
                    continue
                group, last = self._group(item)
                if group:
                    self._commit(group)
                if last:
                    return
        except BaseException:  # never leave a drain thread waiting on a future
            log.exception("the finisher stopped; outcomes are committed by their threads")
            raise
        finally:
            self._release()
            self._commit_leftovers()

    def _group(self, first: tuple[Outcome, Future[bool]] | None
               ) -> tuple[list[tuple[Outcome, Future[bool]]], bool]:
        """``first`` and whatever else is already waiting; True when the stop mark came."""
        group: list[tuple[Outcome, Future[bool]]] = []
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

    def _commit(self, group: Sequence[tuple[Outcome, Future[bool]]]) -> None:
        """On the finisher's own session (opened when needed, dropped after an error)."""
        try:
            if self._conn is None:
                self._session = ExitStack()
                self._conn = self._session.enter_context(self._connect())
            self._resolve(group, self._conn)
        except Exception as exc:
            self._release(exc)
            _fail(group, exc)

    def _commit_inline(self, group: Sequence[tuple[Outcome, Future[bool]]]) -> None:
        """On a connection of the caller's thread (after stop, or left over)."""
        try:
            with self._connect() as conn:
                self._resolve(group, conn)
        except Exception as exc:
            _fail(group, exc)

    def _resolve(self, group: Sequence[tuple[Outcome, Future[bool]]],
                 conn: Connection) -> None:
        accepted = queue.finish(conn, self.worker_id, [o for o, _ in group])
        for outcome, future in group:
            future.set_result(outcome.job_id in accepted)

    def _release(self, exc: BaseException | None = None) -> None:
        """Give the session back to the pool (after an error: so the pool drops it)."""
        session, self._session, self._conn = self._session, None, None
        if session is None:
            return
        try:
            if exc is None:
                session.close()
            else:
                session.__exit__(type(exc), exc, exc.__traceback__)
        except Exception:  # the session is unusable either way; the pool has dropped it
            log.debug("finisher session closed with an error", exc_info=True)

    def _commit_leftovers(self) -> None:
        """Outcomes still queued when the thread ends: committed here, one group."""
        group = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queues.Empty:
                break
            if item is not None:
                group.append(item)
        if group:
            self._commit_inline(group)


def _fail(group: Sequence[tuple[Outcome, Future[bool]]], exc: BaseException) -> None:
    for _, future in group:
        if not future.done():
            future.set_exception(exc)
