"""Pages ahead of campaign mail in one interpreter (``senddock serve``).

``serve`` answers pages and delivers mail in one process, and its threads share one
interpreter lock. While a campaign drains, every delivery thread wants that lock many
times per message, and a page's thread gets about its share of it among them: a page that
needs a few milliseconds of Python waited several times that for its turns (the
campaign counter fragment, 4 ms of SQL, answered in 113 ms at p95 while 10M drained).

Someone is waiting for a page; nobody waits for one campaign message to leave a few
milliseconds later. So a delivery thread, before it starts a campaign message, waits while
a page is being answered -- at most :data:`LONGEST_WAIT` each time, so pages requested
back to back slow the drain but never stop it. Transactional mail never waits (P7); the
API, tracking and webhook requests are not pages (machines send them, at any volume); a
process without pages (``senddock worker``) never waits.
"""

from __future__ import annotations

import threading
import time

LONGEST_WAIT = 0.05  # seconds a campaign message waits at most for the pages in progress


class Foreground:
    """How many pages this process is answering right now; delivery threads give way."""

    def __init__(self, longest: float = LONGEST_WAIT) -> None:
        self.longest = longest
        self._pages = 0
        self._quiet = threading.Condition()

    def enter(self) -> None:
        """A page request started."""
        with self._quiet:
            self._pages += 1

    def leave(self) -> None:
        """A page request ended (answered, failed or aborted)."""
        with self._quiet:
            self._pages -= 1
            if self._pages <= 0:
                self._pages = 0
                self._quiet.notify_all()

    def give_way(self) -> float:
        """Wait while a page is being answered, at most ``longest`` seconds; returns the
        seconds waited. A plain read first: with no page open it costs no lock."""
        if not self._pages:
            return 0.0
        t0 = time.monotonic()
        with self._quiet:
            self._quiet.wait_for(lambda: self._pages == 0, self.longest)
        return time.monotonic() - t0
