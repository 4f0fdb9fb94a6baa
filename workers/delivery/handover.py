"""From a relay's answer to a committed outcome (docs/design.md §14, §16): the claims a
process holds, the hand-over of each outcome to the finisher (or its commit here and now,
with what the reply says beyond its recipient), and the wait until it is committed."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import psycopg
from sqlalchemy.engine import Connection

from workers import queue
from workers.core import pg
from workers.core.jobs import ClaimedJob, Outcome
from workers.core.states import PENDING
from workers.delivery import services
from workers.delivery.finisher import FINISH_TIMEOUT, Finisher
from workers.delivery.outcomes import Aftermath
from workers.delivery.statements import StatementDb

log = logging.getLogger("senddock.worker")

DB_ERRORS = services.DB_ERRORS


class Holdings:
    """Claims in hand, by claim token: the jobs not finished yet. A token is registered
    before its claim statement runs (so the lost-claim release never races it). And each
    drain thread's jobs being sent, or sent with the outcome on its way: never handed
    back."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[int, ClaimedJob]] = {}
        self.sending: dict[int, set[int]] = {}
        self.lock = threading.Lock()

    def hold(self, token: str, jobs: list[ClaimedJob]) -> None:
        with self.lock:
            self.claims[token] = {job.id: job for job in jobs}

    def drop(self, token: str) -> None:
        """The batch under ``token`` is over for this thread."""
        with self.lock:
            self.claims.pop(token, None)
            self.sending.pop(threading.get_ident(), None)

    def busy(self, job: ClaimedJob) -> None:
        """``job`` is being sent, or sent with its outcome on the way: never handed back."""
        with self.lock:
            self.sending.setdefault(threading.get_ident(), set()).add(job.id)

    def done(self, job: ClaimedJob) -> None:
        """``job``'s outcome is committed (or refused): it is no longer in hand."""
        with self.lock:
            self.sending.get(threading.get_ident(), set()).discard(job.id)
            self.claims.get(job.claim_token, {}).pop(job.id, None)

    def waiting(self) -> list[ClaimedJob]:
        """Claimed jobs that no thread is sending right now (they can be handed back)."""
        with self.lock:
            sending = set().union(*self.sending.values())
            return [job for jobs in self.claims.values() for job in jobs.values()
                    if job.id not in sending]

    def tokens(self) -> list[str]:
        with self.lock:
            return list(self.claims)

    def in_flight(self) -> int:
        with self.lock:
            return sum(len(jobs) for jobs in self.claims.values())


@dataclasses.dataclass
class Handed:
    """An outcome handed to the finisher, not yet known to be committed."""

    job: ClaimedJob
    outcome: Outcome
    future: Future[bool]
    accepted: bool | None = None  # None: not settled yet
    failed: bool = False  # the finisher could not commit it: to be recorded by its thread


class Handover:
    """A drain thread's outcomes on their way to the database."""

    def __init__(self, finisher: Finisher, worker_id: str, holdings: Holdings,
                 stopping: threading.Event, outage: pg.Outage,
                 record_aftermath: Callable[[Connection, Aftermath], None]) -> None:
        self.finisher = finisher
        self.worker_id = worker_id
        self.holdings = holdings
        self.stopping = stopping
        self.outage = outage
        self.record_aftermath = record_aftermath

    def hand_over(self, db: StatementDb, previous: Handed | None, job: ClaimedJob,
                  outcome: Outcome, aftermath: Aftermath | None = None) -> Handed | None:
        """Pass ``job``'s outcome on: to the finisher, or -- with an aftermath to record
        in the same transaction -- committed here and now (after ``previous``)."""
        self.settle(db, previous)
        if aftermath is not None and not aftermath.empty:
            try:
                self.record(db, job, outcome, aftermath)
            finally:
                self.holdings.done(job)
            return None
        self.holdings.busy(job)
        return Handed(job, outcome, self.finisher.submit(outcome))

    def give_back(self, db: StatementDb, handed: Handed | None,
                  unsent: list[ClaimedJob]) -> None:
        """The previous outcome committed, the jobs not sent handed back unsent."""
        self.settle(db, handed)
        with db.connect() as conn:
            queue.release(conn, unsent)

    def settle(self, db: StatementDb, handed: Handed | None, *, record: bool = True) -> bool:
        """Wait until ``handed``'s outcome is committed; True if it was also accepted
        (nothing to wait for counts as accepted). If the database failed it, record it
        here, retrying as long as :meth:`record` does -- or, with ``record=False`` (at
        the relay's 354, where nobody may wait for long), leave it for a later call and
        say False."""
        if handed is None:
            return True
        if handed.accepted is not None:
            return handed.accepted
        if not handed.failed:
            try:
                accepted = self._await(handed.future)
            except DB_ERRORS:
                handed.failed = True
            else:
                handed.accepted = accepted
                if not accepted:
                    refused(handed.job, handed.outcome)
                self.holdings.done(handed.job)
                return accepted
        if not record:
            return False
        try:
            # Recorded here instead (its retries report the outage if it lasts).
            handed.accepted = self.record(db, handed.job, handed.outcome)
        finally:
            if handed.accepted is None:
                handed.accepted = False
            self.holdings.done(handed.job)
        return handed.accepted

    def _await(self, future: Future[bool]) -> bool:
        """The finisher's answer. Bounded: the finish statement has a statement timeout
        and its session TCP timeouts (workers/pg.py), so an answer comes."""
        deadline = time.monotonic() + FINISH_TIMEOUT + 30
        while True:
            try:
                return future.result(timeout=5.0)
            except TimeoutError:
                if not future.done() and (not self.finisher.alive
                                          or time.monotonic() > deadline):
                    raise psycopg.OperationalError("the finisher did not answer") from None

    def record(self, db: StatementDb, job: ClaimedJob, outcome: Outcome,
               aftermath: Aftermath | None = None) -> bool:
        """Commit the outcome now (and the aftermath with it, in one transaction). If the
        database is away, keep trying (bounded by shutdown): what the relay accepted must
        be marked, or it will be sent again."""
        backoff = 0.5
        deadline: float | None = None
        while True:
            try:
                if aftermath is None or aftermath.empty:
                    with db.connect(FINISH_TIMEOUT) as conn:
                        accepted = queue.finish_one(conn, self.worker_id, outcome)
                else:
                    with db.transaction(FINISH_TIMEOUT) as conn:
                        accepted = queue.finish_one(conn, self.worker_id, outcome)
                        if accepted:  # a job taken back meanwhile says nothing of now
                            self.record_aftermath(conn, aftermath)
                if not accepted:
                    refused(job, outcome)
                return accepted
            except DB_ERRORS as exc:
                if self.stopping.is_set():
                    deadline = deadline or time.monotonic() + 15
                    if time.monotonic() > deadline:
                        log.error("giving up marking job %d: database unreachable; it will "
                                  "be taken back after restart", job.id)
                        return False
                self.outage.failed(exc, retrying=f"recording the outcome of job {job.id} "
                                   "retries")
                time.sleep(backoff)
                backoff = min(backoff * 2, 10)


def refused(job: ClaimedJob, outcome: Outcome) -> None:
    """The finish statement refused ``job``'s outcome: it was taken back meanwhile."""
    if outcome.status == PENDING and not outcome.counted:
        # Handed back unsent: nothing was sent, nothing is lost.
        log.debug("job %d was taken back before it was handed back unsent", job.id)
        return
    log.warning("late mark refused: job %d (%s) was taken back while this worker had "
                "it; the %s outcome (%s) is not recorded, and the message may be sent "
                "again", job.id, job.email, outcome.status,
                outcome.reply or outcome.error or "no reply")
