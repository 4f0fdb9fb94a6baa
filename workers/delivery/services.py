"""The pool's periodic services, each a small class in its own module of this package,
registered in one place (:func:`schedule`): the heartbeat that renews the lease
(heartbeat.py), the rescuer that takes back dead workers' jobs (rescuer.py), maintenance
(maintenance.py), the lifecycle's settler and retention (as :class:`Periodic`). The
drain loops and the LISTEN thread (listener.py) are not periodic and are started by the
pool itself.

A service that overruns its interval (a slow database, a cut link) is not news:
APScheduler's "skipped: maximum number of running instances reached" becomes a debug line
for every registered service and every tick of a second or less; what went wrong is said
once by the pool's outage line (workers/core/pg.py, ``Outage``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import psycopg
import sqlalchemy as sa

from workers.core import pg

log = logging.getLogger("senddock.worker")

# What the database going away (or being too slow) looks like to the engine.
DB_ERRORS = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError,
             psycopg.OperationalError)

# Ticks that run every second or more often may well overrun on a busy machine: the next
# one simply waits (coalesced).
EVERY_SECOND = timedelta(seconds=1)

# The ids of the services registered in this process (quiet when they overrun).
QUIET_OVERRUN: set[str] = set()


class Service:
    """A periodic task of the pool: ``run()`` every ``interval`` seconds, under ``name``
    (the scheduler's job id). ``run()`` reports database trouble itself and never
    raises for it."""

    name: ClassVar[str]
    interval: float

    def run(self) -> None:
        raise NotImplementedError


class Periodic(Service):
    """A tick of another module as a service, its database trouble reported through the
    pool's outage line (one line when the database goes, one when it is back)."""

    def __init__(self, name: str, interval: float, tick: Callable[[], Any],
                 outage: pg.Outage) -> None:
        self.name = name  # type: ignore[misc]
        self.interval = interval
        self.tick = tick
        self.outage = outage

    def run(self) -> None:
        try:
            self.tick()
            self.outage.ok()
        except DB_ERRORS as exc:
            self.outage.failed(exc)


def schedule(scheduler: Any, services: list[Service]) -> None:
    """Register ``services`` with the pool's scheduler (one instance of each at a time;
    a run that overran is skipped quietly)."""
    logging.getLogger("apscheduler.scheduler").addFilter(SKIPPED_TICKS)
    for service in services:
        QUIET_OVERRUN.add(service.name)
        scheduler.add_job(service.run, "interval", seconds=service.interval,
                          id=service.name, name=service.name)


class _SkippedTickFilter(logging.Filter):
    """Turns APScheduler's 'skipped: maximum number of running instances reached' for a
    registered service or an every-second tick into a debug line of ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "maximum number of running instances" not in str(record.msg):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        job = args[0] if args else None
        interval = getattr(getattr(job, "trigger", None), "interval", None)
        quiet = getattr(job, "id", None) in QUIET_OVERRUN or (
            isinstance(interval, timedelta) and interval <= EVERY_SECOND)
        if quiet:
            log.debug("tick %s still running; the next one waits", getattr(job, "id", job))
            return False
        return True


SKIPPED_TICKS = _SkippedTickFilter()
