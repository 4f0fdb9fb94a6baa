"""APScheduler's warning about a skipped run is noise for the pool's registered services
(heartbeat, rescuer, maintenance: an overrun means a slow or cut database, which the
pool's outage line says once) and for every-second ticks; it stays a warning for every
other job."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from apscheduler.triggers.interval import IntervalTrigger

from workers.delivery import services
from workers.delivery.services import SKIPPED_TICKS

MESSAGE = 'Execution of job "%s" skipped: maximum number of running instances reached (%d)'


# Jobs and their intervals in seconds (workers/delivery/services.py,
# workers/after_acceptance/pool.py).
INTERVALS = {"maintenance": 1, "event-webhooks": 1, "heartbeat": 5, "rescuer": 5,
             "bounce-mailbox": 60}


def job(job_id: str) -> SimpleNamespace:
    return SimpleNamespace(id=job_id, trigger=IntervalTrigger(seconds=INTERVALS[job_id]))


def record(job_id: str) -> logging.LogRecord:
    return logging.LogRecord("apscheduler.scheduler", logging.WARNING, __file__, 1, MESSAGE,
                             (job(job_id), 1), None)


class _Scheduler:
    def __init__(self) -> None:
        self.jobs: list[str] = []

    def add_job(self, func: Any, trigger: str, **kw: Any) -> None:
        self.jobs.append(kw["id"])


class _Tick(services.Service):
    name = "heartbeat"
    interval = 5.0

    def run(self) -> None:
        pass


def test_an_every_second_tick_that_overran_is_not_a_warning() -> None:
    assert SKIPPED_TICKS.filter(record("maintenance")) is False
    assert SKIPPED_TICKS.filter(record("event-webhooks")) is False


def test_a_registered_service_that_overran_is_not_a_warning() -> None:
    scheduler = _Scheduler()
    services.schedule(scheduler, [_Tick()])
    assert scheduler.jobs == ["heartbeat"]
    assert SKIPPED_TICKS.filter(record("heartbeat")) is False


def test_other_jobs_and_other_messages_are_kept() -> None:
    assert SKIPPED_TICKS.filter(record("bounce-mailbox")) is True
    other = logging.LogRecord("apscheduler.scheduler", logging.WARNING, __file__, 1,
                              "Run time of job %s was missed", (job("maintenance"),),
                              None)
    assert SKIPPED_TICKS.filter(other) is True
