"""The LISTEN of a process: wakes idle drain loops the moment a job is enqueued (P7).

It listens on the heartbeat's liveness session (workers/delivery/heartbeat.py) instead of
a connection of its own: a process opens one session fewer (docs/scale-out.md, "PostgreSQL
connections"). The thread waits on the session's socket without holding it, so a renewal
is never delayed by the wait; when the socket has something to read it takes the session
for an instant and reads the notifications (those that arrived during a renewal were kept
by the driver and are read then too). While the session is down (an outage, a reconnect)
the drain loops poll every second, as they do anyway; the heartbeat opens a new session,
LISTENs on it and says so once in its outage line.
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Callable

import psycopg

from workers.delivery.heartbeat import Heartbeat

log = logging.getLogger("senddock.worker")

CHANNEL = "senddock_jobs"


class Listener:
    def __init__(self, heartbeat: Heartbeat, *, stopping: threading.Event,
                 wake: Callable[[], None]) -> None:
        self.heartbeat = heartbeat
        self.stopping = stopping
        self.wake = wake
        self.thread = threading.Thread(target=self.run, name="listen", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        while not self.stopping.is_set():
            raw = self.heartbeat.listening()
            if raw is None:
                self.stopping.wait(0.5)
                continue
            try:
                ready, _, _ = select.select([raw.fileno()], [], [], 1.0)
                if not ready:
                    continue
                woken = False
                for _ in raw.notifies(timeout=0.0):
                    woken = True
                if woken:
                    self.wake()
                else:
                    # Readable and nothing for us: a renewal's answer being read, or the
                    # server closing the session (the next renewal finds out).
                    self.stopping.wait(0.01)
            except (psycopg.Error, OSError, ValueError) as exc:
                if self.stopping.is_set():
                    return
                log.debug("listener: the liveness session failed: %s", exc)
                self.stopping.wait(0.5)
