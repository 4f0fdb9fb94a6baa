"""A pool stopped moments after it started stops cleanly: no thread of the scheduler dies
on the way (APScheduler submits each one-off drain job and then removes it from its store;
a shutdown in between made that removal raise JobLookupError in its thread)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from workers.core.settings import Config
from workers.delivery.pool import Pool


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_pool_stopped_right_after_its_start_stops_cleanly(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config]) -> None:
    for n in range(10):
        pool = Pool(engine, config_for(sink.port), node=f"start-stop-{n}")
        pool.start()
        pool.stop(timeout=30)
