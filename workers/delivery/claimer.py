"""Claiming a batch (docs/design.md §14, §16, §17): under a rate limit or a throttling
relay's pace, with the permits that say when each message may start; and how late the
claimed transactional mail was, which tells the API whether delivery keeps up (P7)."""

from __future__ import annotations

import threading
import time

from workers import queue
from workers.building import kinds
from workers.core.jobs import ClaimedJob
from workers.core.settings import Config
from workers.core.states import imported
from workers.delivery.statements import StatementDb

PACE_CHECK = 1.0  # seconds between looks at whether a peer's throttle reply paces us
# The pool is behind when transactional mail it claimed had been due for more than
# BEHIND_LAG seconds, as seen at a claim less than LAG_FRESH seconds ago.
BEHIND_LAG = 0.2
LAG_FRESH = 1.0


class Claimer:
    """A process's claims: the same worker identity, sender domain and relays for every
    drain thread; ``timeout`` bounds each claim's statements."""

    def __init__(self, config: Config, worker_id: str, domain: str, relays: int,
                 timeout: float) -> None:
        self.config = config
        self.worker_id = worker_id
        self.domain = domain
        self.relays = relays
        self.timeout = timeout
        # A throttling relay paces every process (queue.throttle_relay); this process
        # learns it at its own throttle reply (reply_policy.record) or within PACE_CHECK
        # seconds of another's.
        self.paced = False
        self._paced_checked = 0.0
        # How late this process's transactional mail is: (monotonic time of the claim, the
        # longest any claimed message had been due). Read by :meth:`behind`.
        self._lag = (0.0, 0.0)

    def rate_limited(self, db: StatementDb) -> bool:
        """A rate limit is configured, or a throttling relay paces us (checked again every
        PACE_CHECK seconds while not paced, so a peer's throttle reaches this process)."""
        config = self.config
        if config.rate_limit > 0 or config.rate_limit_hour > 0 or config.rate_limit_day > 0:
            return True
        if not self.paced and time.monotonic() - self._paced_checked > PACE_CHECK:
            with db.connect(self.timeout) as conn:
                self.paced = queue.paced_rate(conn) is not None
            self._paced_checked = time.monotonic()
        return self.paced

    def claim(self, db: StatementDb, token: str) -> tuple[list[ClaimedJob], list[float], float]:
        """Claim a batch under ``token``; with a rate limit (or a throttling relay's pace),
        also the (monotonic) time each job's send may start, from permits granted on the
        database's clock (docs/design.md §16), and the interval between them."""
        config = self.config
        n = config.claim_batch
        if not self.rate_limited(db):
            with db.session() as session:
                jobs = queue.claim_bounded(session, self.timeout, self.worker_id, n,
                                           self.domain, token, self.relays)
            return jobs, [0.0] * len(jobs), 0.0
        with db.transaction(self.timeout) as conn:
            permits = queue.acquire_permits(conn, n, config.rate_limit,
                                            config.rate_limit_hour, config.rate_limit_day)
            self.paced = permits.rate > 0 and permits.rate != config.rate_limit
            if permits.granted == 0:
                return [], [], 0.0
            jobs = queue.claim_batch(conn, self.worker_id, permits.granted, self.domain, token,
                                     self.relays)
            queue.refund_permits(conn, permits, len(jobs))
        return (jobs, [permits.first_at + i * permits.interval for i in range(len(jobs))],
                permits.interval)

    def note_lag(self, jobs: list[ClaimedJob], asked: int) -> None:
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
        than BEHIND_LAG since it was due (P7)."""
        at, lag = self._lag
        return lag > BEHIND_LAG and time.monotonic() - at < LAG_FRESH


def wait_for_slot(stopping: threading.Event, slot: float, interval: float) -> bool:
    """Wait for a rate-limit slot (a stop ends the wait). False when it has already gone
    by too far (half a slot: a slow previous send) -- sending now would crowd the next
    second, so the job goes back unsent and a fresh permit is asked for."""
    delay = slot - time.monotonic()
    if delay > 0:
        stopping.wait(delay)
        return True
    return not (slot and interval > 0 and -delay > 0.5 * interval)
