"""APScheduler's warning about a skipped run is noise for the every-second ticks (the next
one waits) and stays a warning for every other job."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from apscheduler.triggers.interval import IntervalTrigger

from workers.delivery.pool import SKIPPED_TICKS

MESSAGE = 'Execution of job "%s" skipped: maximum number of running instances reached (%d)'


# The pool's jobs and their intervals in seconds (workers/delivery/pool.py,
# workers/after_acceptance/pool.py).
INTERVALS = {"maintenance": 1, "event-webhooks": 1, "heartbeat": 5, "rescuer": 10}


def job(job_id: str) -> SimpleNamespace:
    return SimpleNamespace(id=job_id, trigger=IntervalTrigger(seconds=INTERVALS[job_id]))


def record(job_id: str) -> logging.LogRecord:
    return logging.LogRecord("apscheduler.scheduler", logging.WARNING, __file__, 1, MESSAGE,
                             (job(job_id), 1), None)


def test_an_every_second_tick_that_overran_is_not_a_warning() -> None:
    assert SKIPPED_TICKS.filter(record("maintenance")) is False
    assert SKIPPED_TICKS.filter(record("event-webhooks")) is False


def test_other_jobs_and_other_messages_are_kept() -> None:
    assert SKIPPED_TICKS.filter(record("heartbeat")) is True
    assert SKIPPED_TICKS.filter(record("rescuer")) is True
    other = logging.LogRecord("apscheduler.scheduler", logging.WARNING, __file__, 1,
                              "Run time of job %s was missed", (job("maintenance"),),
                              None)
    assert SKIPPED_TICKS.filter(other) is True
