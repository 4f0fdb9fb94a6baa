"""waitress warns "Task queue depth is N" for every request that finds no idle thread: at
a burst of 500 requests a second that is hundreds of log lines a second, formatted on the
event loop that reads every connection (5 % of the interpreter's time in a
``senddock web`` burst, bench/bench_api.py). SendDock says it once a minute, with how many
it did not repeat."""

from __future__ import annotations

import logging

import pytest

from webapp.http_server import QUEUE_WARNING_EVERY, QueueWarnings, make_server


def test_the_queue_warning_is_said_once_a_minute_with_the_count_left_unsaid(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = [1000.0]
    warnings = QueueWarnings(logging.getLogger("waitress.queue"), clock=lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="waitress.queue"):
        warnings.warning("Task queue depth is %d", 3)
        for depth in range(4, 14):
            warnings.warning("Task queue depth is %d", depth)
        clock[0] += QUEUE_WARNING_EVERY - 1
        warnings.warning("Task queue depth is %d", 2)
        clock[0] += 1
        warnings.warning("Task queue depth is %d", 7)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert said[0].startswith("Task queue depth is 3: requests are waiting for a free "
                              "thread")
    assert said[1].startswith("Task queue depth is 7") and "11 more times" in said[1]


def test_the_server_uses_it() -> None:
    server = make_server(lambda environ, start: [], host="127.0.0.1", port=0, threads=2,
                         body_limit=1024, connection_limit=10, head_timeout=10)
    try:
        assert isinstance(server.task_dispatcher.queue_logger, QueueWarnings)
    finally:
        server.close()
