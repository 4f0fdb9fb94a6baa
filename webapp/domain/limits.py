"""The backlog limit (docs/design.md §22): above it new work is refused with a clear answer instead
of growing without bound."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from webapp.domain.errors import Overloaded
from workers import queue
from workers.core.i18n import N_
from workers.core.settings import Config


def check_backlog(conn: Connection, config: Config, adding: int = 1) -> None:
    """Raise :class:`Overloaded` (503 + Retry-After) if ``adding`` more jobs would push the
    waiting transactional backlog past ``SENDDOCK_MAX_BACKLOG`` (campaign jobs do not
    count: a big campaign must not stop verification mail, P7)."""
    waiting = queue.transactional_backlog(conn)
    if waiting + adding > config.max_backlog:
        raise Overloaded(
            N_("the queue is full: %(waiting)s messages are waiting and the limit is "
               "%(limit)s (SENDDOCK_MAX_BACKLOG). Try again once it has drained.",
               waiting=waiting, limit=config.max_backlog),
            retry_after=60, backlog=waiting, limit=config.max_backlog)
