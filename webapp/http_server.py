"""waitress, set up to survive slow clients (docs/deployment.md).

waitress reads every connection on one event loop and hands only complete requests to its
threads, so a client trickling bytes never holds a thread — but it does hold one of the
server's connection slots, and waitress's own timeout (``channel_timeout``) counts from
the last byte received, so one byte every 2 s keeps a connection forever; at the
connection limit waitress stops accepting, and every new client waits (slowloris).

Here a client gets ``SENDDOCK_WEB_HEAD_TIMEOUT`` seconds for a request's line and headers,
counted from its first byte (or, on a kept-alive connection, from the end of the previous
answer); a connection past that deadline is closed whatever it trickles. A request body
is not under this deadline (a large CSV upload on a slow line is legitimate), only under
waitress's inactivity timeout. The connection limit is ``SENDDOCK_WEB_CONNECTION_LIMIT``
(1,000; waitress's default is 100), on ``poll()`` rather than ``select()``, which cannot
watch descriptors past 1,024.

waitress warns "Task queue depth is N" for every request that finds no idle thread; in a
burst that is hundreds of lines a second, formatted on the event loop. It is said once a
minute here (:class:`QueueWarnings`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from waitress import create_server
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser


class _TimedParser(HTTPRequestParser):
    """A request being read, with the moment its first byte arrived."""

    def __init__(self, adj: Any) -> None:
        super().__init__(adj)
        self.started = time.monotonic()


class _Channel(HTTPChannel):
    parser_class = _TimedParser

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_since = time.monotonic()  # accepted: the first request's head is due

    def head_started(self) -> float | None:
        """When the head now being waited for started to count, None when no head is
        being waited for (a request is being served, or its body is being read)."""
        if self.requests:
            return None
        request = self.request
        if request is None:
            return self.idle_since
        if request.headers_finished:
            return None
        return float(request.started)

    def _flush_some(self, *args: Any, **kwargs: Any) -> bool:
        flushed: bool = super()._flush_some(*args, **kwargs)
        self.idle_since = time.monotonic()  # an answer went out: the next head is due
        return flushed


QUEUE_WARNING_EVERY = 60.0  # seconds between two "Task queue depth" warnings


class QueueWarnings:
    """Stands in for waitress's queue logger: the first warning of a minute is logged,
    with how many were left unsaid since the last; the others cost a clock read."""

    def __init__(self, logger: logging.Logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.clock = clock
        self._lock = threading.Lock()
        self._said_at: float | None = None
        self._unsaid = 0

    def warning(self, message: str, *args: Any) -> None:
        now = self.clock()
        with self._lock:
            if self._said_at is not None and now - self._said_at < QUEUE_WARNING_EVERY:
                self._unsaid += 1
                return
            self._said_at, unsaid, self._unsaid = now, self._unsaid, 0
        more = f" (and {unsaid} more times since the last such warning)" if unsaid else ""
        self.logger.warning(message + ": requests are waiting for a free thread%s; said at "
                            "most once a minute", *args, more)


def close_slow_heads(server: Any, head_timeout: float, now: float | None = None) -> int:
    """Mark every connection whose request head is overdue to be closed; how many."""
    now = time.monotonic() if now is None else now
    closed = 0
    for channel in list(server.active_channels.values()):
        started = channel.head_started() if isinstance(channel, _Channel) else None
        if started is not None and now - started > head_timeout and not channel.will_close:
            channel.will_close = True
            closed += 1
    return closed


def make_server(app: Any, *, host: str, port: int, threads: int, body_limit: int,
                connection_limit: int, head_timeout: float) -> Any:
    """A waitress server for ``app`` with the slow-client defences above."""
    server = create_server(app, host=host, port=port, threads=threads, ident="SendDock",
                           max_request_body_size=body_limit,
                           connection_limit=connection_limit, asyncore_use_poll=True,
                           cleanup_interval=1, channel_timeout=max(30, int(head_timeout)))
    server.channel_class = _Channel
    server.task_dispatcher.queue_logger = QueueWarnings(logging.getLogger("waitress.queue"))
    waitress_maintenance = server.maintenance

    def maintenance(now: float) -> None:  # every cleanup_interval, on the event loop
        waitress_maintenance(now)
        close_slow_heads(server, head_timeout)

    server.maintenance = maintenance
    return server
