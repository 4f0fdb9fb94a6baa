"""Maintenance, every second: fire scheduled campaigns, enqueue accepted broadcasts (chunk
by chunk, each committed on its own, so the workers start sending after the first),
complete finished ones; and at the first tick and then hourly, prune the per-minute
counters (attempt_minutes, rate_minutes), which otherwise grow a few rows every minute
forever, and the domain throttles that ended more than a day ago; every minute, delete
the CSV files checked first and never imported once they expired (docs/design.md §35)."""

from __future__ import annotations

import logging
import threading
import time

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from workers import queue
from workers.core import pg
from workers.delivery import retention
from workers.delivery.services import DB_ERRORS, Service

log = logging.getLogger("senddock.worker")


class Maintenance(Service):
    name = "maintenance"
    interval = 1.0
    prune_every = 3600.0  # seconds
    forget_imports_every = 60.0  # seconds

    def __init__(self, engine: Engine, outage: pg.Outage, stopping: threading.Event) -> None:
        self.engine = engine
        self.outage = outage
        self.stopping = stopping
        self._prune_at = 0.0  # time.monotonic() of the next prune: the first tick prunes
        self._imports_at = 0.0  # likewise for the expired import files

    def run(self) -> None:
        try:
            with self.engine.begin() as conn:
                queue.start_due_campaigns(conn)
            with self.engine.connect() as conn:
                waiting = queue.broadcasts_to_enqueue(conn)
            for broadcast_id in waiting:
                self._enqueue(broadcast_id)
            with self.engine.begin() as conn:
                for campaign_id in queue.complete_finished_campaigns(conn):
                    log.info("campaign %d finished", campaign_id)
            if time.monotonic() >= self._prune_at:
                self._prune()
            if time.monotonic() >= self._imports_at:
                self._forget_imports()
            self.outage.ok()
        except DB_ERRORS as exc:
            self.outage.failed(exc)

    def _prune(self) -> None:
        """Forget counter minutes no reader looks at any more, in bounded batches each
        committed on its own (the finishers upsert only the newest minutes), and the domain
        throttles that ended more than a day ago."""
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            pruned = queue.prune_minutes(conn)
            queue.prune_rate_minutes(conn)
            queue.prune_domain_throttles(conn)
        self._prune_at = time.monotonic() + self.prune_every
        if pruned:
            log.info("pruned %d attempt counter row(s)", pruned)

    def _forget_imports(self) -> None:
        with self.engine.begin() as conn:
            forgotten = retention.forget_expired_imports(conn)
        self._imports_at = time.monotonic() + self.forget_imports_every
        if forgotten:
            log.info("deleted %d expired import file(s) checked and never imported",
                     forgotten)

    def _enqueue(self, broadcast_id: int) -> None:
        """Enqueue the broadcast chunk by chunk, each committed on its own (the workers
        start sending after the first)."""
        while not self.stopping.is_set():
            with self.engine.begin() as conn:
                step = queue.enqueue_chunk(conn, broadcast_id)
                if step is None:
                    return
                if step.added:
                    queue.notify_new_jobs(conn, "broadcast")
            if step.done:
                log.info("broadcast %d enqueued: %s", broadcast_id, step.summary())
                self._analyze_jobs()
                return

    def _analyze_jobs(self) -> None:
        """Refresh the jobs table's statistics after a big enqueue, instead of waiting for
        autovacuum: planned on the statistics of an emptier table, the claim's and the
        pages' per-broadcast reads chose delivery_jobs_broadcast_idx and sorted every
        waiting job (the 1M bench's jobs browser: 3.7 s a page; 1 ms once analyzed)."""
        with self.engine.connect() as conn:
            conn.execute(sa.text("ANALYZE delivery_jobs"))
            conn.commit()
