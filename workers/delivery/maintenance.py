"""Maintenance, every second: fire scheduled campaigns, enqueue accepted broadcasts,
complete finished ones."""

from __future__ import annotations

import logging

from sqlalchemy.engine import Engine

from workers.core import pg
from workers.delivery import queue
from workers.delivery.services import DB_ERRORS, Service

log = logging.getLogger("senddock.worker")


class Maintenance(Service):
    name = "maintenance"
    interval = 1.0

    def __init__(self, engine: Engine, outage: pg.Outage) -> None:
        self.engine = engine
        self.outage = outage

    def run(self) -> None:
        try:
            with self.engine.begin() as conn:
                queue.start_due_campaigns(conn)
            with self.engine.connect() as conn:
                waiting = queue.broadcasts_to_enqueue(conn)
            for broadcast_id in waiting:
                with self.engine.begin() as conn:
                    summary = queue.enqueue_broadcast(conn, broadcast_id)
                    if summary is not None:
                        queue.notify_new_jobs(conn, "broadcast")
                        log.info("broadcast %d enqueued: %s", broadcast_id, summary)
            with self.engine.begin() as conn:
                for campaign_id in queue.complete_finished_campaigns(conn):
                    log.info("campaign %d finished", campaign_id)
            self.outage.ok()
        except DB_ERRORS as exc:
            self.outage.failed(exc)
