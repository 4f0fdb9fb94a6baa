"""The worker pool, hosted by APScheduler inside the process (docs/design.md §14).

- N drain loops (APScheduler jobs on its thread pool), each with its own SMTP connection,
  claim a batch and hand each message's outcome to the finisher (workers/delivery/finisher.py)
  the moment the relay has answered it: the thread writes the outcome's statement to the
  finisher's one pipelined session itself, and the finisher's thread reads the commits
  back. A thread builds its next message meanwhile and
  waits for that commit at the relay's 354, before the message itself goes out (docs/design.md §16:
  a crash resends at most one message per thread);
- a lease on the database clock, renewed by the heartbeat (workers/heartbeat.py); a drain
  thread starts a message (MAIL FROM, and again at the relay's 354) only while the lease
  is valid by this process's own clock (fencing, workers/lease.py, docs/design.md §15);
- the startup hook and a periodic rescuer that take back dead workers' jobs
  (workers/rescuer.py, P2, P4);
- maintenance: enqueue accepted broadcasts, fire scheduled campaigns, complete finished
  ones (workers/maintenance.py); the probe of a From address the relay refuses
  (workers/delivery/sender_probe.py, docs/design.md §17); the periodic services are
  registered in one place (workers/services.py), and the services of the room after
  delivery are handed in by whoever composes the engine (``hosted``);
- a LISTEN, on the liveness session, that wakes idle loops the moment a job is enqueued
  (P7, workers/delivery/listener.py).

What a reply means beyond its recipient is the reply policy's (workers/delivery/reply_policy.py);
the relays' state is the relay board's (workers/delivery/relay_board.py); one attempt is
workers/delivery/attempt.py, and an outcome's way to the database workers/delivery/handover.py.
The pool schedules: threads, claims, batches, the fence.

``stop()`` (SIGTERM) lets in-flight messages finish and be marked, claims nothing new, and
hands unsent claimed jobs back, within a bounded time. A message still in the relay's hands
when that time is up stays claimed; it is taken back once this process is gone (by this
node's next start) or its lease has expired (by a peer).
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from email.utils import parseaddr
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.date import DateTrigger
from sqlalchemy.engine import Connection, Engine

from workers import queue
from workers.building.compose import Composer
from workers.building.compose import message_id_domain as domain_of
from workers.core import pg
from workers.core.settings import Config
from workers.delivery import (
    lifecycle,
    outcomes,
    reply_policy,
    rescuer,
    retention,
    send_guard,
    sequences,
    services,
    warmup,
)
from workers.delivery.attempt import Fence, Sender, go_ahead
from workers.delivery.claimer import BEHIND_LAG, LAG_FRESH, Claimer, wait_for_slot
from workers.delivery.finisher import FINISH_TIMEOUT, Finisher
from workers.delivery.foreground import Foreground
from workers.delivery.handover import Handed, Handover, Holdings
from workers.delivery.heartbeat import Heartbeat
from workers.delivery.lease import Lease
from workers.delivery.listener import Listener
from workers.delivery.maintenance import Maintenance
from workers.delivery.relay_board import RelayBoard, Transports
from workers.delivery.sender_probe import probe_senders
from workers.delivery.statements import StatementDb

__all__ = ["BEHIND_LAG", "LAG_FRESH", "Hosted", "Pool", "StatementDb"]

BATCH_SLICE = 0.25  # seconds of campaign mail a worker delivers before claiming again
# Seconds a claim (with its permits) and the drain threads' other reads may take: a lock
# held elsewhere (a migration, an operator's transaction) ends them with query_canceled,
# a database error the drain loop backs off from, instead of a wait with no end. The
# network side is bounded by the sessions' keepalives and tcp_user_timeout (pg.py).
CLAIM_TIMEOUT = 10.0
# Python's GIL switch interval in a process that hosts the pool (default 5 ms). A drain
# thread the relay has just answered, and the finisher woken by an outcome or by
# PostgreSQL, wait for the GIL while another thread builds a message; until they have it,
# an accepted message's outcome is in no database. At 0.1 ms an outcome reached
# PostgreSQL 0.29 ms after its hand-over instead of 0.42 (bench_drain; the SIGKILL storms
# moved within their run-to-run spread: docs/performance.md).
SWITCH_INTERVAL = 0.0001

log = logging.getLogger("senddock.worker")

DB_ERRORS = services.DB_ERRORS

#: Services of a later room the pool's scheduler hosts (the bounce mailbox, outgoing event
#: webhooks: workers.after_acceptance), handed in by whoever composes the engine, so
#: delivery never imports the room after it (docs/design.md §11). Called with the
#: scheduler, the engine, the configuration, the worker id and the pool's outage log.
Hosted = Callable[[BackgroundScheduler, Engine, Config, str, pg.Outage], None]


class Pool:
    """Delivery workers for one process. ``start()`` then ``stop()``; or ``run_forever()``."""

    def __init__(self, engine: Engine, config: Config, *, node: str | None = None,
                 maintenance: bool = True, hosted: Hosted | None = None) -> None:
        self.engine = engine
        self.config = config
        self.node = node or config.node or socket.gethostname()
        self.worker_id = f"{self.node}:{os.getpid()}:{secrets.token_hex(3)}"
        # A throttle: the relay's or one domain's; a refusal streak is about us (§16, §17).
        self.judge = reply_policy.Judge(config.same_refusal_streak)
        probe_sender = config.feedback.bounce_address or parseaddr(config.mail_from)[1]
        # The relays of SENDDOCK_SMTP_URL and which are down (docs/design.md §17).
        self.board = RelayBoard(engine, config, probe_sender, self.judge.streak.reset)
        # Claims, their pace and how late the claimed mail was (docs/design.md §14, §17).
        self.claimer = Claimer(config, self.worker_id, domain_of(config.mail_from),
                               len(self.board.relays), CLAIM_TIMEOUT)
        self.composer = Composer(engine, config)
        self._db = StatementDb(engine)  # claims and outcomes, one statement at a time
        # Commits the outcomes, each statement under FINISH_TIMEOUT.
        self.finisher = Finisher(functools.partial(self._db.connect, FINISH_TIMEOUT),
                                 self.worker_id)
        # The pages this process is answering (serve): campaign messages give way to them.
        self.foreground = Foreground()
        self.maintenance = maintenance
        self.hosted = hosted
        self.stopping = threading.Event()
        self._wake = threading.Condition()
        self._scheduler: BackgroundScheduler | None = None
        self.holdings = Holdings()
        self.process = str(config.extra.get("process", "worker"))
        # The check at 354 that a campaign message may go out (pause, cancel): one
        # session for the process, shared by its drain threads, keeping a campaign's
        # lock between its messages.
        self.send_guard = send_guard.SendGuard(pg.engine_conninfo(engine),
                                              pg.application_name(self.process, "send-guard"),
                                              hold=send_guard.HOLD)
        # One line when the database becomes unusable, one when it is back (workers.core.pg).
        self.outage = pg.Outage(f"delivery {self.worker_id}", log)
        self.sender = Sender(self.composer, self.board, self.judge, config, self.outage,
                             self.stopping)
        self.handover = Handover(self.finisher, self.worker_id, self.holdings, self.stopping,
                                 self.outage, self._record_aftermath)
        self.lease = Lease(config.worker_timeout, config.lease_margin)
        self.heartbeat = Heartbeat(engine, worker_id=self.worker_id, lease=self.lease,
                                   interval=config.heartbeat_interval, outage=self.outage,
                                   process=self.process, in_flight=self.holdings.in_flight,
                                   register=self._register)
        self.listener = Listener(self.heartbeat, stopping=self.stopping, wake=self.wake)
        self.settler = lifecycle.Settler(engine, stopping=self.stopping)
        self.retention = retention.Retention(
            engine, config.retention_campaign_days, config.retention_transactional_days,
            stopping=self.stopping)

    @property
    def sent(self) -> int:
        """Messages the relay accepted from this process."""
        return self.sender.sent

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Register with a lease, run the startup hook, start the loops and services.
        While the database is down, full or out of connections, wait and retry (one log
        line per change of state, see :func:`workers.core.pg.wait_until`); a stop() ends the
        wait."""
        relays = self.board.relays

        def register_and_rescue() -> dict[str, int]:
            if self.lease.current() is None:
                self.heartbeat.start()
            with self.engine.begin() as conn:
                queue.ensure_relays(conn, len(relays))
                for relay in relays:
                    if queue.note_smtp_url(conn, self.board.fingerprints[relay.index],
                                           relay.index):
                        log.info("relay %s was marked down with a different SMTP URL: "
                                 "probing at once", relay.name)
            return rescuer.startup(self.engine, me=self.worker_id, node=self.node,
                                   grace=self.config.lease_grace)

        taken = pg.wait_until(register_and_rescue, self.outage, self.stopping,
                              what="delivery is starting")
        if taken is None:
            return
        log.info("worker %s started (%d threads, relay %s); took back %d orphaned job(s)",
                 self.worker_id, self.config.workers,
                 ", ".join(f"{r.name}={r.smtp.redacted()} ({r.role})" if len(relays) > 1
                           else r.smtp.redacted() for r in relays), sum(taken.values()))
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(self.config.workers + 6)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30},
            timezone="UTC")
        self.finisher.start()
        for i in range(self.config.workers):
            scheduler.add_job(self._drain_loop, id=f"drain-{i}", name=f"drain-{i}")
        periodic: list[services.Service] = [
            self.heartbeat,
            rescuer.Rescuer(self.engine, worker_id=self.worker_id, lease=self.lease,
                            grace=self.config.lease_grace, outage=self.outage,
                            held_tokens=self.holdings.tokens)]
        if self.maintenance:
            periodic.append(Maintenance(self.engine, self.outage, self.stopping))
            # The lifecycle's periodic services, each bounded per tick (docs/design.md §26).
            periodic.append(services.Periodic("settler", 1, self.settler.tick, self.outage))
            periodic.append(services.Periodic("retention", 60, self.retention.tick,
                                              self.outage))
            # Refused From addresses probed on their backoff (docs/design.md §17).
            periodic.append(services.Periodic(
                "sender_probe", 1, functools.partial(probe_senders, self.engine, self.board),
                self.outage))
            # Sequences' due steps become jobs (docs/design.md §29).
            periodic.append(services.Periodic(
                "sequences", 1, functools.partial(sequences.tick, self.engine), self.outage))
        services.schedule(scheduler, periodic)
        if self.maintenance and self.hosted is not None:
            self.hosted(scheduler, self.engine, self.config, self.worker_id, self.outage)
        scheduler.start()
        self._scheduler = scheduler
        self.listener.start()

    def stop(self, timeout: float | None = None) -> None:
        """Graceful stop: finish in-flight messages, claim nothing new, release the rest."""
        if self.stopping.is_set():
            return
        log.info("worker %s stopping: finishing in-flight messages", self.worker_id)
        self.stopping.set()
        self.wake()
        finished = True
        if self._scheduler is not None:
            deadline = timeout if timeout is not None else self.config.smtp_timeout + 10
            _await_one_off_jobs(self._scheduler)
            waiter = threading.Thread(target=self._scheduler.shutdown, kwargs={"wait": True},
                                      daemon=True)
            waiter.start()
            waiter.join(deadline)
            finished = not waiter.is_alive()
        # What was handed over is committed; a thread still at the relay commits its own.
        self.finisher.stop()
        left = 0
        try:
            with self.engine.begin() as conn:
                if not finished:
                    queue.release(conn, self.holdings.waiting())
                left = queue.mark_worker_stopped(conn, self.worker_id)
        except DB_ERRORS as exc:
            log.warning("could not mark worker stopped: %s", exc)
        if left:
            log.warning("%d message(s) still in the relay's hands after the stop bound; "
                        "they are taken back once this process has exited (by this "
                        "node's next start) or its lease expired (by a peer)", left)
        self.send_guard.close()
        self.heartbeat.close()
        log.info("worker %s stopped after sending %d message(s)", self.worker_id, self.sent)

    def wake(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def run_forever(self) -> None:
        self.start()
        while not self.stopping.wait(1.0):
            pass

    def status(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "threads": self.config.workers,
                "running": self._scheduler is not None and not self.stopping.is_set()}

    def _register(self, conn: Connection) -> int:
        return queue.register_worker(conn, worker_id=self.worker_id, node=self.node,
                                     hostname=socket.gethostname(), pid=os.getpid(),
                                     threads=self.config.workers,
                                     lease=self.config.worker_timeout)

    def _idle(self, seconds: float) -> None:
        with self._wake:
            self._wake.wait(seconds)

    def _record_aftermath(self, conn: Connection, aftermath: outcomes.Aftermath) -> None:
        reply_policy.record(conn, aftermath, self.config, self.board, self.claimer)

    # --- claiming ----------------------------------------------------------------------

    def _drain_loop(self) -> None:
        transport = Transports(self.board, self.send_guard)
        db = self._db
        backoff = 0.5
        try:
            while not self.stopping.is_set():
                try:
                    worked = self._drain_once(transport, db)
                    backoff = 0.5
                    if not worked:
                        self._idle(1.0)
                except DB_ERRORS as exc:
                    self.outage.failed(exc, retrying="delivery retries")
                    self.stopping.wait(backoff)
                    backoff = min(backoff * 2, 30)
                except Exception:
                    log.exception("drain loop error; continuing")
                    self.stopping.wait(1.0)
        finally:
            transport.close()

    def _claim(self, db: StatementDb,
               token: str) -> tuple[list[queue.ClaimedJob], list[float], float]:
        return self.claimer.claim(db, token)

    def _note_lag(self, jobs: list[queue.ClaimedJob], asked: int) -> None:
        self.claimer.note_lag(jobs, asked)

    def behind(self) -> bool:
        """Transactional mail claimed within the last LAG_FRESH seconds had waited more
        than BEHIND_LAG since it was due: this process's delivery threads are not keeping
        up with what is being accepted (P7). The API paces new mail while this holds
        (:func:`webapp.context.yield_to_delivery`)."""
        return self.claimer.behind()

    # --- delivering a batch ------------------------------------------------------------

    def _drain_once(self, transport: Transports, db: StatementDb) -> bool:
        """Claim one batch and deliver it message by message. Returns False when there was
        nothing to do. Every job of the batch leaves `sending`: marked with its outcome,
        handed back unsent, or (if the database is lost meanwhile) put back by the
        heartbeat as a lost claim once its token is no longer held."""
        term = self.lease.current()
        if term is None:
            return False  # no lease confirmed: claim nothing, send nothing (docs/design.md §15)
        token = str(uuid.uuid4())
        self.holdings.hold(token, [])
        try:
            self.board.watch(db, CLAIM_TIMEOUT, transport)
            jobs, slots, interval = self._claim(db, token)
            jobs, slots = warmup.within_caps(db, jobs, slots, CLAIM_TIMEOUT)
            if not any(slots):  # a rate limit's wait is not the pool falling behind
                self._note_lag(jobs, self.config.claim_batch)
            self.holdings.hold(token, jobs)
            if not jobs:
                self.board.probe_due(transport)
                return False
            self._deliver(transport, db, jobs, slots, interval, Fence(term, self.lease))
            return True
        finally:
            self.holdings.drop(token)

    def _deliver(self, transport: Transports, db: StatementDb, jobs: list[queue.ClaimedJob],
                 slots: list[float], interval: float, fence: Fence) -> None:
        """Send the batch one message at a time. Each outcome goes to the finisher the
        moment the relay has answered, and is committed before the next message goes out
        (docs/design.md §16); the next message is built meanwhile. What a reply says beyond its
        recipient (relay down or throttling, a domain throttling, a refused From) is
        committed with its outcome, in one transaction. After a reply that stops the
        batch, the rest is handed back; so it is when the lease the batch was claimed
        under is no longer valid, or the previous outcome was not committed and accepted
        by the relay's 354 (fencing, docs/design.md §15)."""
        batch = outcomes.Aftermath()
        # A batch of campaign mail yields after BATCH_SLICE seconds (slow templates, a slow
        # relay): its unstarted jobs go back, and the next claim takes verification mail
        # first (P7). Not under a rate limit, whose permits already pace the batch.
        yield_at = time.monotonic() + BATCH_SLICE if not any(slots) else float("inf")
        handover = self.handover
        handed: Handed | None = None  # the previous outcome, on its way to the database
        try:
            for index, (job, slot) in enumerate(zip(jobs, slots, strict=True)):
                if batch.stops_batch or self.stopping.is_set() or \
                        not fence.allows():
                    handover.give_back(db, handed, jobs[index:])
                    return
                if batch.holds(job) or job.campaign_id in fence.stopped or (
                        job.kind == "broadcast" and time.monotonic() > yield_at):
                    handed = handover.hand_over(db, handed, job, outcomes.released(job))
                    continue
                if not wait_for_slot(self.stopping, slot, interval):
                    # The slot went by (a slow previous send): sending now would crowd
                    # the next second, so the rest goes back and fresh permits are asked.
                    handover.give_back(db, handed, jobs[index:])
                    return
                if job.kind == "broadcast":
                    self.foreground.give_way()  # a page being answered goes first
                self.holdings.busy(job)
                this = outcomes.Aftermath()
                outcome = self.sender.attempt(transport, job, this, fence, functools.partial(
                    go_ahead, handover, db, handed, fence, self.stopping))
                handed = handover.hand_over(db, handed, job, outcome, this)
                batch.absorb(this)
        finally:
            handover.settle(db, handed)


def _await_one_off_jobs(scheduler: BackgroundScheduler, longest: float = 2.0) -> None:
    """Wait (``longest`` seconds at most) until the scheduler has started its one-off jobs
    (the drain loops). It submits each and then removes it from its store; a shutdown in
    between made the removal raise JobLookupError in the scheduler's thread (a pool
    stopped moments after its start)."""
    deadline = time.monotonic() + longest
    while any(isinstance(job.trigger, DateTrigger) for job in scheduler.get_jobs()) \
            and time.monotonic() < deadline:
        time.sleep(0.005)
