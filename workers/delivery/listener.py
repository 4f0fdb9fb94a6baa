"""The LISTEN connection: wakes idle drain loops the moment a job is enqueued (P7)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg
from sqlalchemy.engine import Engine

from workers.core import pg

log = logging.getLogger("senddock.worker")


class Listener:
    def __init__(self, engine: Engine, *, process: str, stopping: threading.Event,
                 wake: Callable[[], None], outage: pg.Outage) -> None:
        self.info = pg.engine_conninfo(engine)  # the same URL, multi-host included
        self.name = pg.application_name(process, "listener")
        self.stopping = stopping
        self.wake = wake
        self.outage = outage
        self.thread = threading.Thread(target=self.run, name="listen", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        backoff = 0.5
        while not self.stopping.is_set():
            try:
                with pg.connect(self.info, application_name=self.name,
                                autocommit=True) as conn:
                    conn.execute("LISTEN senddock_jobs")
                    if backoff > 0.5:
                        log.debug("listening for new jobs again")
                    backoff = 0.5
                    while not self.stopping.is_set():
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            self.wake()
            except psycopg.Error as exc:
                if self.stopping.is_set():
                    return  # stopping: the database going away now is no outage
                # The pool's one outage line says it (loops poll every second meanwhile).
                self.outage.failed(exc)
                log.debug("listener lost the database, reconnecting with backoff: %s",
                          pg.first_line(exc))
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 10)
