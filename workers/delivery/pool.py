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
  ones (workers/maintenance.py); the probe of a From address the relay refuses (docs/design.md §17);
  the periodic services are registered in one place
  (workers/services.py);
- a LISTEN, on the liveness session, that wakes idle loops the moment a job is enqueued
  (P7, workers/delivery/listener.py).

``stop()`` (SIGTERM) lets in-flight messages finish and be marked, claims nothing new, and
hands unsent claimed jobs back, within a bounded time. A message still in the relay's hands
when that time is up stays claimed; it is taken back once this process is gone (by this
node's next start) or its lease has expired (by a peer).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import logging
import os
import secrets
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import parseaddr
from typing import Any

import psycopg
import sqlalchemy as sa
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.date import DateTrigger
from sqlalchemy.engine import Connection, Engine

from workers.after_acceptance import pool as after_acceptance
from workers.building import kinds
from workers.building.compose import Composer
from workers.building.compose import message_id_domain as domain_of
from workers.building.message import TemplateError
from workers.core import pg
from workers.core.settings import Config
from workers.core.states import PENDING, imported
from workers.delivery import lifecycle, outcomes, queue, rescuer, retention, sequences, services
from workers.delivery.classify import RefusalStreak, ReplyClass, ThrottleJudge
from workers.delivery.finisher import FINISH_TIMEOUT, Finisher
from workers.delivery.foreground import Foreground
from workers.delivery.heartbeat import Heartbeat
from workers.delivery.lease import Lease
from workers.delivery.listener import Listener
from workers.delivery.maintenance import Maintenance
from workers.delivery.smtp import (
    LoginGate,
    RelaySpec,
    SendResult,
    SmtpTransport,
    parse_relays,
    route,
)
from workers.delivery.warmup import any_warmup, hold_over_cap

PACE_CHECK = 1.0  # seconds between looks at whether a peer's throttle reply paces us
RELAY_CHECK = 1.0  # seconds between looks at which relays the other processes saw down
SENDER_PROBE_MAX = 30.0  # seconds: the longest wait between probes of a refused From
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
# The pool is behind (Pool.behind) when transactional mail it claimed had been due for more
# than BEHIND_LAG seconds, as seen at a claim less than LAG_FRESH seconds ago.
BEHIND_LAG = 0.2
LAG_FRESH = 1.0

log = logging.getLogger("senddock.worker")

DB_ERRORS = services.DB_ERRORS


class Pool:
    """Delivery workers for one process. ``start()`` then ``stop()``; or ``run_forever()``."""

    def __init__(self, engine: Engine, config: Config, *, node: str | None = None,
                 maintenance: bool = True) -> None:
        self.engine = engine
        self.config = config
        self.node = node or config.node or socket.gethostname()
        self.worker_id = f"{self.node}:{os.getpid()}:{secrets.token_hex(3)}"
        # The relays of SENDDOCK_SMTP_URL (docs/design.md §17): a stream goes through the first of
        # its route that is not down; each relay has its own state row, login gate (one failed
        # AUTH per process and relay) and fingerprint (a keyed hash of its URL, never the
        # password itself).
        self.relays = parse_relays(config.smtp_url)
        self.fingerprints = {r.index: hmac.new(config.secret_key.encode(), r.url.encode(),
                                               hashlib.sha256).hexdigest()[:16]
                             for r in self.relays}
        self.login_gates = {r.index: LoginGate() for r in self.relays}
        self._relays_down: set[int] = set()  # as this process last saw them
        self._relays_checked = 0.0
        self._probed_at = 0.0
        self.streak = RefusalStreak(config.same_refusal_streak)
        self.judge = ThrottleJudge()  # a throttle: the relay's or one domain's (docs/design.md §17)
        # A throttling relay paces every process (queue.throttle_relay); this process
        # learns it at its own throttle reply or within PACE_CHECK seconds of another's.
        self._paced = False
        self._paced_checked = 0.0
        # How late this process's transactional mail is: (monotonic time of the claim, the
        # longest any claimed message had been due). Read by :meth:`behind`.
        self._lag = (0.0, 0.0)
        self.domain = domain_of(config.mail_from)
        self.composer = Composer(engine, config)
        self._db = StatementDb(engine)  # claims and outcomes, one statement at a time
        # Commits the outcomes, each statement under FINISH_TIMEOUT.
        self.finisher = Finisher(functools.partial(self._db.connect, FINISH_TIMEOUT),
                                 self.worker_id)
        # The pages this process is answering (serve): campaign messages give way to them.
        self.foreground = Foreground()
        self.maintenance = maintenance
        self.stopping = threading.Event()
        self._wake = threading.Condition()
        self._scheduler: BackgroundScheduler | None = None
        self.sent = 0
        self.probe_sender = config.feedback.bounce_address or parseaddr(config.mail_from)[1]
        # Claims in hand, by claim token: the jobs not finished yet. A token is registered
        # before its claim statement runs (so the lost-claim release never races it).
        self._claims: dict[str, dict[int, queue.ClaimedJob]] = {}
        # Drain thread -> the jobs it is sending, or has sent with the outcome on its way.
        self._sending: dict[int, set[int]] = {}
        self._holding_lock = threading.Lock()
        self.process = str(config.extra.get("process", "worker"))
        # The check at 354 that a campaign message may go out (pause, cancel): one
        # session for the process, shared by its drain threads.
        self.send_guard = lifecycle.SendGuard(pg.engine_conninfo(engine),
                                              pg.application_name(self.process, "send-guard"))
        # One line when the database becomes unusable, one when it is back (workers.core.pg).
        self.outage = pg.Outage(f"delivery {self.worker_id}", log)
        self.lease = Lease(config.worker_timeout, config.lease_margin)
        self.heartbeat = Heartbeat(engine, worker_id=self.worker_id, lease=self.lease,
                                   interval=config.heartbeat_interval, outage=self.outage,
                                   process=self.process, in_flight=self._in_flight,
                                   register=self._register)
        self.listener = Listener(self.heartbeat, stopping=self.stopping, wake=self.wake)
        self.settler = lifecycle.Settler(engine, stopping=self.stopping)
        self.retention = retention.Retention(
            engine, config.retention_campaign_days, config.retention_transactional_days,
            stopping=self.stopping)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Register with a lease, run the startup hook, start the loops and services.
        While the database is down, full or out of connections, wait and retry (one log
        line per change of state, see :func:`workers.core.pg.wait_until`); a stop() ends the
        wait."""

        def register_and_rescue() -> dict[str, int]:
            if self.lease.current() is None:
                self.heartbeat.start()
            with self.engine.begin() as conn:
                queue.ensure_relays(conn, len(self.relays))
                for relay in self.relays:
                    if queue.note_smtp_url(conn, self.fingerprints[relay.index], relay.index):
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
                 ", ".join(f"{r.name}={r.smtp.redacted()} ({r.role})" if len(self.relays) > 1
                           else r.smtp.redacted() for r in self.relays), sum(taken.values()))
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
                            held_tokens=self._held_tokens)]
        if self.maintenance:
            periodic.append(Maintenance(self.engine, self.outage, self.stopping))
            # The lifecycle's periodic services, each bounded per tick (docs/design.md §26).
            periodic.append(services.Periodic("settler", 1, self.settler.tick, self.outage))
            periodic.append(services.Periodic("retention", 60, self.retention.tick,
                                              self.outage))
            # Refused From addresses probed on their backoff (docs/design.md §17).
            periodic.append(services.Periodic("sender_probe", 1, self._probe_senders,
                                              self.outage))
            # Sequences' due steps become jobs (issue 42, docs/sequences.md).
            periodic.append(services.Periodic(
                "sequences", 1, functools.partial(sequences.tick, self.engine), self.outage))
        services.schedule(scheduler, periodic)
        if self.maintenance:
            after_acceptance.schedule(scheduler, self.engine, self.config, self.worker_id,
                                      self.outage)
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
                    queue.release(conn, self._waiting_jobs())
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

    def _waiting_jobs(self) -> list[queue.ClaimedJob]:
        """Claimed jobs that no thread is sending right now (they can be handed back)."""
        with self._holding_lock:
            sending = set().union(*self._sending.values())
            return [job for jobs in self._claims.values() for job in jobs.values()
                    if job.id not in sending]

    def wake(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def run_forever(self) -> None:
        self.start()
        while not self.stopping.wait(1.0):
            pass

    # --- liveness ----------------------------------------------------------------------

    def _register(self, conn: Connection) -> int:
        return queue.register_worker(conn, worker_id=self.worker_id, node=self.node,
                                     hostname=socket.gethostname(), pid=os.getpid(),
                                     threads=self.config.workers,
                                     lease=self.config.worker_timeout)

    def _held_tokens(self) -> list[str]:
        with self._holding_lock:
            return list(self._claims)

    def _in_flight(self) -> int:
        with self._holding_lock:
            return sum(len(jobs) for jobs in self._claims.values())

    # --- wake-ups ----------------------------------------------------------------------

    def _idle(self, seconds: float) -> None:
        with self._wake:
            self._wake.wait(seconds)

    # --- delivery ----------------------------------------------------------------------

    def _transport(self, relay: RelaySpec) -> SmtpTransport:
        config = self.config
        return SmtpTransport(relay.smtp, timeout=config.smtp_timeout,
                             local_hostname=config.smtp_helo, ca_file=config.smtp_ca_file,
                             max_messages=config.smtp_max_messages, max_age=config.smtp_max_age,
                             login_gate=self.login_gates[relay.index])

    def _relay_for(self, job: queue.ClaimedJob) -> RelaySpec:
        """The relay for ``job``: the first of its stream's route (campaign mail and test
        sends: the campaign stream; everything else: transactional) that this process
        does not know to be down; the first of the route when all are."""
        stream = "campaign" if job.kind in ("broadcast", "test") else "transactional"
        candidates = route(self.relays, stream)
        return next((r for r in candidates if r.index not in self._relays_down),
                    candidates[0])

    def _watch_relays(self, db: StatementDb) -> None:
        """Every RELAY_CHECK seconds, learn which relays are down (another process may have
        seen it, or probed one back up). A relay this process sees go down is marked at
        once (:meth:`_record_aftermath`): its threads fail over without waiting."""
        if len(self.relays) == 1 or time.monotonic() - self._relays_checked < RELAY_CHECK:
            return
        with db.connect(CLAIM_TIMEOUT) as conn:
            states = queue.relay_states(conn, len(self.relays))
        self._relays_down = {s["id"] for s in states if s["status"] == "down" or s["paused"]}
        self._relays_checked = time.monotonic()

    def _drain_loop(self) -> None:
        transport = _Transports(self)
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

    def _rate_limited(self, db: StatementDb) -> bool:
        """A rate limit is configured, or a throttling relay paces us (checked again every
        PACE_CHECK seconds while not paced, so a peer's throttle reaches this process)."""
        config = self.config
        if config.rate_limit > 0 or config.rate_limit_hour > 0 or config.rate_limit_day > 0:
            return True
        if not self._paced and time.monotonic() - self._paced_checked > PACE_CHECK:
            with db.connect(CLAIM_TIMEOUT) as conn:
                self._paced = queue.paced_rate(conn) is not None
            self._paced_checked = time.monotonic()
        return self._paced

    def _claim(self, db: StatementDb,
               token: str) -> tuple[list[queue.ClaimedJob], list[float], float]:
        """Claim a batch under ``token``; with a rate limit (or a throttling relay's pace),
        also the (monotonic) time each job's send may start, from permits granted on the
        database's clock (docs/design.md §16), and the interval between them."""
        n = self.config.claim_batch
        config = self.config
        if not self._rate_limited(db):
            with db.connect(CLAIM_TIMEOUT) as conn:
                jobs = queue.claim_batch(conn, self.worker_id, n, self.domain, token,
                                         len(self.relays))
            return jobs, [0.0] * len(jobs), 0.0
        with db.transaction(CLAIM_TIMEOUT) as conn:
            permits = queue.acquire_permits(conn, n, config.rate_limit,
                                            config.rate_limit_hour, config.rate_limit_day)
            self._paced = permits.rate > 0 and permits.rate != config.rate_limit
            if permits.granted == 0:
                return [], [], 0.0
            jobs = queue.claim_batch(conn, self.worker_id, permits.granted, self.domain, token,
                                     len(self.relays))
            queue.refund_permits(conn, permits, len(jobs))
        return (jobs, [permits.first_at + i * permits.interval for i in range(len(jobs))],
                permits.interval)

    def _within_warmup(self, db: StatementDb, jobs: list[queue.ClaimedJob],
                       slots: list[float]) -> tuple[list[queue.ClaimedJob], list[float]]:
        """The claimed jobs that sending domains in warm-up may send now; the rest wait,
        handed back unsent (docs/design.md §33)."""
        if not jobs:
            return jobs, slots
        with db.transaction(CLAIM_TIMEOUT) as conn:
            if not any_warmup(conn):
                return jobs, slots
            going = {j.id for j in hold_over_cap(conn, jobs)}
        kept = [(j, s) for j, s in zip(jobs, slots, strict=True) if j.id in going]
        return [j for j, _ in kept], [s for _, s in kept]

    def _note_lag(self, jobs: list[queue.ClaimedJob], asked: int) -> None:
        """Remember how long the claimed transactional mail had been due; a claim that
        found less than it asked for and no transactional mail has caught up. Imported
        mail (a batch's, BULK_STEP behind its class) waits by design: claiming it means no
        single request of its class was due, so those have caught up too."""
        transactional = [j for j in jobs if j.kind not in kinds.RESERVED]
        waited = [j.waited for j in transactional if not imported(j.priority)]
        if waited:
            self._lag = (time.monotonic(), max(waited))
        elif len(jobs) < asked or transactional:  # transactional, all of it imported
            self._lag = (time.monotonic(), 0.0)

    def behind(self) -> bool:
        """Transactional mail claimed within the last LAG_FRESH seconds had waited more
        than BEHIND_LAG since it was due: this process's delivery threads are not keeping
        up with what is being accepted (P7). The API paces new mail while this holds
        (:func:`webapp.context.yield_to_delivery`)."""
        at, lag = self._lag
        return lag > BEHIND_LAG and time.monotonic() - at < LAG_FRESH

    def _drain_once(self, transport: _Transports, db: StatementDb) -> bool:
        """Claim one batch and deliver it message by message. Returns False when there was
        nothing to do. Every job of the batch leaves `sending`: marked with its outcome,
        handed back unsent, or (if the database is lost meanwhile) put back by the
        heartbeat as a lost claim once its token is no longer held."""
        term = self.lease.current()
        if term is None:
            return False  # no lease confirmed: claim nothing, send nothing (docs/design.md §15)
        token = str(uuid.uuid4())
        with self._holding_lock:
            self._claims[token] = {}
        try:
            self._watch_relays(db)
            if len(self.relays) > 1 and self._relays_down \
                    and time.monotonic() - self._probed_at > RELAY_CHECK:
                # a relay is down while another carries its traffic: probe it meanwhile
                self._probed_at = time.monotonic()
                self._maybe_probe_relay(transport)
            jobs, slots, interval = self._claim(db, token)
            jobs, slots = self._within_warmup(db, jobs, slots)
            if not any(slots):  # a rate limit's wait is not the pool falling behind
                self._note_lag(jobs, self.config.claim_batch)
            with self._holding_lock:
                self._claims[token] = {job.id: job for job in jobs}
            if not jobs:
                self._maybe_probe_relay(transport)
                return False
            self._deliver(transport, db, jobs, slots, interval, _Fence(term))
            return True
        finally:
            with self._holding_lock:
                self._claims.pop(token, None)
                self._sending.pop(threading.get_ident(), None)

    def _wait_for_slot(self, slot: float, interval: float) -> bool:
        """Wait for a rate-limit slot. False when it has already gone by too far (half a
        slot: a slow previous send) -- sending now would crowd the next second, so the job
        goes back unsent and a fresh permit is asked for."""
        delay = slot - time.monotonic()
        if delay > 0:
            self.stopping.wait(delay)
            return True
        return not (slot and interval > 0 and -delay > 0.5 * interval)

    def _deliver(self, transport: _Transports, db: StatementDb, jobs: list[queue.ClaimedJob],
                 slots: list[float], interval: float, fence: _Fence) -> None:
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
        handed: _Handed | None = None  # the previous outcome, on its way to the database
        try:
            for index, (job, slot) in enumerate(zip(jobs, slots, strict=True)):
                if batch.stops_batch or self.stopping.is_set() or \
                        not self._may_start(fence):
                    self._give_back(db, handed, jobs[index:])
                    return
                if batch.holds(job) or job.campaign_id in fence.stopped or (
                        job.kind == "broadcast" and time.monotonic() > yield_at):
                    handed = self._hand_over(db, handed, job, outcomes.released(job))
                    continue
                if not self._wait_for_slot(slot, interval):
                    # The slot went by (a slow previous send): sending now would crowd
                    # the next second, so the rest goes back and fresh permits are asked.
                    self._give_back(db, handed, jobs[index:])
                    return
                if job.kind == "broadcast":
                    self.foreground.give_way()  # a page being answered goes first
                self._busy(job)
                this = outcomes.Aftermath()
                outcome = self._attempt(transport, job, this, fence,
                                        functools.partial(self._go_ahead, db, handed, fence))
                handed = self._hand_over(db, handed, job, outcome, this)
                batch.absorb(this)
        finally:
            self._settle(db, handed)

    def _give_back(self, db: StatementDb, handed: _Handed | None,
                   unsent: list[queue.ClaimedJob]) -> None:
        """The previous outcome committed, the jobs not sent handed back unsent."""
        self._settle(db, handed)
        with db.connect() as conn:
            queue.release(conn, unsent)

    def _busy(self, job: queue.ClaimedJob) -> None:
        """``job`` is being sent, or sent with its outcome on the way: never handed back."""
        with self._holding_lock:
            self._sending.setdefault(threading.get_ident(), set()).add(job.id)

    def _done(self, job: queue.ClaimedJob) -> None:
        """``job``'s outcome is committed (or refused): it is no longer in hand."""
        with self._holding_lock:
            self._sending.get(threading.get_ident(), set()).discard(job.id)
            self._claims.get(job.claim_token, {}).pop(job.id, None)

    def _hand_over(self, db: StatementDb, previous: _Handed | None, job: queue.ClaimedJob,
                   outcome: queue.Outcome,
                   aftermath: outcomes.Aftermath | None = None) -> _Handed | None:
        """Pass ``job``'s outcome on: to the finisher, or -- with an aftermath to record
        in the same transaction -- committed here and now (after ``previous``)."""
        self._settle(db, previous)
        if aftermath is not None and not aftermath.empty:
            try:
                self._record(db, job, outcome, aftermath)
            finally:
                self._done(job)
            return None
        self._busy(job)
        return _Handed(job, outcome, self.finisher.submit(outcome))

    def _may_start(self, fence: _Fence) -> bool:
        """May the batch start its next message? Its lease term must be valid now (by
        this process's clock) and nothing may have broken the batch's fence."""
        if fence.broken is None and not self.lease.valid(fence.term):
            fence.broken = "the lease it was claimed under is no longer confirmed"
        return fence.broken is None

    def _settle(self, db: StatementDb, handed: _Handed | None, *,
                record: bool = True) -> bool:
        """Wait until ``handed``'s outcome is committed; True if it was also accepted
        (nothing to wait for counts as accepted). If the database failed it, record it
        here, retrying as long as :meth:`_record` does -- or, with ``record=False`` (at
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
                    self._refused(handed.job, handed.outcome)
                self._done(handed.job)
                return accepted
        if not record:
            return False
        try:
            # Recorded here instead (its retries report the outage if it lasts).
            handed.accepted = self._record(db, handed.job, handed.outcome)
        finally:
            if handed.accepted is None:
                handed.accepted = False
            self._done(handed.job)
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

    def _attempt(self, transports: _Transports, job: queue.ClaimedJob,
                 aftermath: outcomes.Aftermath,
                 fence: _Fence, before_send: Callable[[], None]) -> queue.Outcome:
        """This job's outcome (and, in ``aftermath``, what its reply says beyond its
        recipient). Never raises for one message's trouble: whatever goes wrong building
        or sending it fails that message, with the error in words. It is not started
        (MAIL FROM) unless ``fence`` still allows it; ``before_send`` runs once the relay is
        ready for the message (354), just before it goes out, and raises _NotSent to keep
        it unsent."""
        if job.suppressed:
            return outcomes.skipped(job)
        try:
            envelope = self.composer.build(job)
        except TemplateError as exc:
            return outcomes.build_failed(job, f"template error: {exc}")
        except DB_ERRORS as exc:
            # The build read the database (a cache miss) and it did not answer: not the
            # message's fault. Back to `pending` unsent and uncounted, never failed.
            self.outage.failed(exc, retrying=f"job {job.id} goes back unsent")
            return outcomes.released(job)
        except Exception as exc:
            log.exception("could not build the message of job %d", job.id)
            return outcomes.build_failed(job, f"could not build the message: "
                                              f"{type(exc).__name__}: {exc}")
        if self.stopping.is_set() or not self._may_start(fence):
            return outcomes.released(job)  # stopped or fenced while it was built: not sent
        relay = self._relay_for(job)
        transport = transports.get(relay)
        aftermath.relay = relay.index
        started = datetime.now(UTC)
        guard = transports.guard
        campaign = job.campaign_id if job.kind == "broadcast" else None

        def go_ahead() -> None:
            before_send()
            # Last: nothing may wait between the campaign's check and the message going
            # out, and its lock is held until the relay has answered (lifecycle).
            if campaign is not None and not guard.enter(campaign):
                fence.stopped.add(campaign)
                raise _NotSent

        try:
            result = transport.send(envelope.mail_from, job.email, envelope.message,
                                    before_data=go_ahead)
        except _NotSent:
            return outcomes.released(job)
        except Exception as exc:
            log.exception("could not send the message of job %d", job.id)
            transport.close()  # its state is unknown: the next message reconnects
            return outcomes.build_failed(job, f"could not send the message: "
                                              f"{type(exc).__name__}: {exc}", stage="send")
        finally:
            guard.leave()  # before anything records: a pause there waits for this lock
        result = self._judge_streak(job, result, aftermath)
        result = self._judge_throttle(job, result, aftermath, envelope.mail_from)
        aftermath.note(job, result, campaign_sender=envelope.campaign_sender,
                       sender=envelope.mail_from)
        if result.reply_class is ReplyClass.SENT:
            self.sent += 1
            wrong = self.judge.accepted(outcomes.recipient_domain(job.email),
                                        envelope.mail_from)
            if wrong:  # a throttle taken for the relay's was that domain's (docs/design.md §17)
                aftermath.unpace = True
                aftermath.domain_throttles.update(wrong)
        return outcomes.outcome_for(job, result, self.composer.retry_schedule(job.kind),
                                    self.config.retry_jitter, started)

    def _go_ahead(self, db: StatementDb, previous: _Handed | None, fence: _Fence) -> None:
        """At the relay's 354: the previous outcome must be committed before this message
        is (docs/design.md §16) and accepted (a refused mark means the batch was taken back: this
        worker's lease lapsed), and the lease must still be valid (docs/design.md §15); otherwise,
        or after a stop meanwhile, the message is not sent at all (the connection is
        dropped mid-transaction) and the rest of the batch goes back."""
        if not self._settle(db, previous, record=False) and fence.broken is None:
            fence.broken = "the previous outcome was not committed and accepted"
        if not self._may_start(fence) or self.stopping.is_set():
            raise _NotSent

    def _judge_streak(self, job: queue.ClaimedJob, result: SendResult,
                      aftermath: outcomes.Aftermath) -> SendResult:
        """The same refusal for many different recipients in a row is about us: this one
        becomes a relay problem and the earlier ones of the row are given back."""
        cls, earlier = self.streak.observe(job.id, job.email, result.reply_class,
                                           result.code, result.text)
        if cls is result.reply_class:
            return result
        aftermath.reprieve.extend(int(i) for i in earlier if isinstance(i, int))
        log.error("the relay refused %d different recipients in a row the same way; "
                  "treating it as a problem with our setup: %s", len(earlier) + 1,
                  outcomes.reply_line(result))
        return dataclasses.replace(result, reply_class=cls,
                                   text=f"{RefusalStreak.WHY}: {result.text}")

    def _judge_throttle(self, job: queue.ClaimedJob, result: SendResult,
                        aftermath: outcomes.Aftermath, sender: str) -> SendResult:
        """A throttle reply is the relay's or its recipient domain's by evidence across
        domains (docs/design.md §17); the wording only decides when there is none."""
        cls, lift = self.judge.judge(result.reply_class, result.code, result.text, job.email,
                                     result.stage, sender)
        aftermath.lift_domains.extend(lift)
        if cls is result.reply_class:
            return result
        return dataclasses.replace(result, reply_class=cls)

    def _record_aftermath(self, conn: Connection, aftermath: outcomes.Aftermath) -> None:
        config = self.config
        if aftermath.reprieve:
            n = queue.reprieve_jobs(conn, aftermath.reprieve, f"relay: {RefusalStreak.WHY}")
            log.warning("gave back %d job(s) charged for a refusal that was about us", n)
        relay = aftermath.relay
        if aftermath.relay_down is not None:
            self._relays_down.add(relay)  # this process's threads fail over at once
            queue.mark_relay_down(conn, aftermath.relay_down, login=aftermath.login_refused,
                                  fingerprint=self.fingerprints[relay], relay=relay,
                                  probe_recipient=aftermath.probe_recipient,
                                  login_interval=config.login_probe_interval,
                                  probe_max=config.relay_probe_max)
            if len(self.relays) > 1:
                log.error("relay %s unavailable, its traffic goes to the next relay: %s",
                          self.relays[relay - 1].name, aftermath.relay_down)
            else:
                log.error("relay unavailable, delivery paused: %s", aftermath.relay_down)
        if aftermath.relay_throttle is not None:
            rate = queue.throttle_relay(conn, aftermath.relay_throttle,
                                        config.throttle_backoff, rate_limit=config.rate_limit,
                                        pause=aftermath.relay_closed, relay=relay)
            self._paced = True
            if rate is not None:
                log.warning("the relay is throttling us: pacing every process at %.2f "
                            "message(s) per second: %s", rate, aftermath.relay_throttle)
        if aftermath.lift_domains:
            queue.lift_domain_throttles(conn, aftermath.lift_domains)
        if aftermath.unpace:
            queue.reset_pacing(conn)
            log.info("another domain is accepted: the throttle was %s's, not the relay's; "
                     "the relay's pace is lifted", ", ".join(aftermath.domain_throttles))
        for domain, reply in aftermath.domain_throttles.items():
            delay = queue.throttle_domain(conn, domain, reply, config.throttle_backoff)
            if delay is not None:
                log.warning("%s is throttling us: its mail waits %.0fs: %s", domain, delay,
                            reply)
        for campaign_id, reason in aftermath.paused_campaigns.items():
            if lifecycle.pause_campaign(conn, campaign_id, reason, "system"):
                log.error("campaign %d paused: %s", campaign_id, reason)
        for sender, (reply, recipient) in aftermath.refused_senders.items():
            queue.refuse_sender(conn, sender, reply, recipient)

    def _record(self, db: StatementDb, job: queue.ClaimedJob, outcome: queue.Outcome,
                aftermath: outcomes.Aftermath | None = None) -> bool:
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
                            self._record_aftermath(conn, aftermath)
                if not accepted:
                    self._refused(job, outcome)
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

    @staticmethod
    def _refused(job: queue.ClaimedJob, outcome: queue.Outcome) -> None:
        if outcome.status == PENDING and not outcome.counted:
            # Handed back unsent: nothing was sent, nothing is lost.
            log.debug("job %d was taken back before it was handed back unsent", job.id)
            return
        log.warning("late mark refused: job %d (%s) was taken back while this worker had "
                    "it; the %s outcome (%s) is not recorded, and the message may be sent "
                    "again", job.id, job.email, outcome.status,
                    outcome.reply or outcome.error or "no reply")

    def _maybe_probe_relay(self, transports: _Transports) -> None:
        """Probe each relay that is down whose turn has come (one process at a time, on
        its backoff). Back up, it takes its traffic back."""
        for relay in self.relays:
            self._probe_relay(relay, transports.get(relay))

    def _probe_relay(self, relay: RelaySpec, transport: SmtpTransport) -> None:
        interval = self.config.login_probe_interval
        with self.engine.begin() as conn:
            state = queue.relay_status(conn, relay.index)
            if state["status"] != "down" or not queue.take_probe_turn(
                    conn, interval, self.config.relay_probe_max, relay.index):
                return
        result = transport.probe(self.probe_sender, state.get("probe_recipient"))
        name = f"relay {relay.name}" if len(self.relays) > 1 else "relay"
        with self.engine.begin() as conn:
            if result.reply_class is ReplyClass.SENT:
                queue.mark_relay_ok(conn, relay.index)
                queue.notify_new_jobs(conn, "relay")
                self._relays_down.discard(relay.index)
                self.streak.reset()
                log.info("%s is back; delivery resumes", name)
            else:
                queue.mark_relay_down(conn, outcomes.reply_line(result),
                                      login=result.login_refused,
                                      fingerprint=self.fingerprints[relay.index],
                                      login_interval=interval,
                                      probe_max=self.config.relay_probe_max, probe=True,
                                      relay=relay.index)
                log.warning("%s still unavailable: %s", name, outcomes.reply_line(result))

    def _probe_senders(self) -> None:
        """Probe refused From addresses whose turn has come, with the same MAIL FROM (and
        RCPT, where the relay reported the refusal): accepted, the campaigns it paused
        resume by themselves (docs/design.md §17)."""
        transport: SmtpTransport | None = None
        try:
            for _ in range(5):  # a few per tick; the rest wait for the next one
                with self.engine.begin() as conn:
                    due = queue.take_sender_probe(conn, min(self.config.relay_probe_max,
                                                            SENDER_PROBE_MAX))
                if due is None:
                    return
                sender, recipient = due
                transport = transport or self._transport(route(self.relays, "campaign")[0])
                result = transport.probe(sender, recipient)
                with self.engine.begin() as conn:
                    if result.reply_class is ReplyClass.SENT:
                        resumed = [c for c in queue.sender_accepted(conn, sender)
                                   if lifecycle.resume_campaign(conn, c, "system")]
                        log.info("the relay accepts %s again; campaign(s) %s resume", sender,
                                 ", ".join(map(str, resumed)) or "none")
                    else:
                        queue.sender_still_refused(conn, sender, outcomes.reply_line(result))
        finally:
            if transport is not None:
                transport.close()

    def status(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "threads": self.config.workers,
                "running": self._scheduler is not None and not self.stopping.is_set()}


def _await_one_off_jobs(scheduler: BackgroundScheduler, longest: float = 2.0) -> None:
    """Wait (``longest`` seconds at most) until the scheduler has started its one-off jobs
    (the drain loops). It submits each and then removes it from its store; a shutdown in
    between made the removal raise JobLookupError in the scheduler's thread (a pool
    stopped moments after its start)."""
    deadline = time.monotonic() + longest
    while any(isinstance(job.trigger, DateTrigger) for job in scheduler.get_jobs()) \
            and time.monotonic() < deadline:
        time.sleep(0.005)


class _Transports:
    """A drain thread's connections: one per relay, opened when first used (docs/design.md §17)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.open: dict[int, SmtpTransport] = {}
        # The check at 354 that a campaign message may go out (pause, cancel): the
        # process's one guard session, shared by the drain threads.
        self.guard = pool.send_guard

    def get(self, relay: RelaySpec) -> SmtpTransport:
        if relay.index not in self.open:
            self.open[relay.index] = self.pool._transport(relay)
        return self.open[relay.index]

    def close(self) -> None:
        for transport in self.open.values():
            transport.close()


class _NotSent(Exception):
    """The drain stopped while a message waited at the relay's 354: it is not sent."""


@dataclasses.dataclass
class _Handed:
    """An outcome handed to the finisher, not yet known to be committed."""

    job: queue.ClaimedJob
    outcome: queue.Outcome
    future: Future[bool]
    accepted: bool | None = None  # None: not settled yet
    failed: bool = False  # the finisher could not commit it: to be recorded by its thread


@dataclasses.dataclass
class _Fence:
    """A batch's right to start messages: the lease term it was claimed under, and why it
    may start no more (None while it may)."""

    term: int
    broken: str | None = None
    # Campaigns found paused or cancelled at a message's 354: the batch's other messages
    # of them go back unsent without trying.
    stopped: set[int] = dataclasses.field(default_factory=set)


class StatementDb:
    """The delivery engine's connections in autocommit, held for one statement (a claim,
    an outcome with its aftermath) or by the finisher while outcomes keep coming, never
    across SMTP, so the drain threads share DB_DELIVERY_POOL connections. A statement is
    its own transaction: committed when it returns. A connection that failed is
    invalidated, never handed out again."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")

    @contextmanager
    def connect(self, statement_timeout: float | None = None) -> Iterator[Connection]:
        """A connection, with ``statement_timeout`` seconds on each statement if given
        (the session's setting is restored before it goes back to the pool)."""
        with self.engine.connect() as conn:
            try:
                if statement_timeout is not None:
                    conn.execute(_SET_TIMEOUT, {"ms": str(int(statement_timeout * 1000))})
                try:
                    yield conn
                finally:
                    if statement_timeout is not None and not conn.invalidated:
                        conn.execute(sa.text("RESET statement_timeout"))
            except DB_ERRORS:
                # The driver may have raised past SQLAlchemy (a prepared statement):
                # make sure the pool drops this session.
                conn.invalidate()
                raise

    @contextmanager
    def transaction(self, statement_timeout: float | None = None) -> Iterator[Connection]:
        """Several statements committed together (BEGIN … COMMIT on one session)."""
        with self.connect(statement_timeout) as conn:
            driver = conn.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            with driver.transaction():
                yield conn


_SET_TIMEOUT = sa.text("SELECT set_config('statement_timeout', :ms, false)")
