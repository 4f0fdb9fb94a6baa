"""A worker's right to send: a lease on the database clock (docs/design.md §15, P4).

The pool registers with a lease of ``SENDDOCK_WORKER_TIMEOUT`` seconds that its heartbeat
(:class:`workers.services.Heartbeat`) renews; peers take its jobs back only once the lease
expired ``SENDDOCK_LEASE_GRACE`` seconds ago (workers/delivery/services.py, ``Rescuer``). Never a
TCP session or an advisory lock: a host that vanishes keeps its sessions for hours, and a
live host cut off loses them while it still holds messages.

:class:`Lease` is the worker's own view, on its own monotonic clock: a renewal asked at
``t`` that came back makes the lease good for starting messages until ``t + lease -
margin`` (the database's expiry is at least ``lease`` after the moment the renewal ran,
which is after ``t``; the margin covers the SMTP transaction the message then needs). A
drain thread starts a message (MAIL FROM, and again at the relay's 354) only while
:meth:`Lease.valid` holds for the term its batch was claimed under. A renewal after the
lease had lapsed comes back with a new term: whatever was claimed under the old one may
have been taken back, so it is given back, never sent.
"""

from __future__ import annotations

import threading
import time


class Lease:
    """This process's lease as it last confirmed it. Thread-safe."""

    def __init__(self, seconds: float, margin: float) -> None:
        self.seconds = seconds
        self.margin = margin
        self._lock = threading.Lock()
        self._term: int | None = None
        self._until = 0.0  # monotonic: messages may start before this
        self._since = 0.0  # monotonic: start of the current unbroken run of renewals
        self._lost_at: float | None = None  # monotonic: the lease ran out, not renewed

    def confirm(self, asked_at: float, term: int) -> int | None:
        """A renewal asked at monotonic ``asked_at`` came back with ``term``. Returns the
        previous term when this one is new (claims of the old term are void)."""
        with self._lock:
            previous = self._term
            unbroken = previous == term and asked_at < self._until + self.margin
            if not unbroken:
                self._since = asked_at
            self._term = term
            self._until = asked_at + self.seconds - self.margin
            self._lost_at = None
        return previous if previous is not None and previous != term else None

    def valid(self, term: int | None = None) -> bool:
        """May a message start now (under ``term``, the batch's, when given)?"""
        with self._lock:
            return self._term is not None and time.monotonic() < self._until and \
                (term is None or term == self._term)

    def current(self) -> int | None:
        """The term messages may start under now, or None."""
        with self._lock:
            return self._term if time.monotonic() < self._until else None

    def held_for(self) -> float:
        """Seconds the lease has been renewed without a break (0 without a lease)."""
        with self._lock:
            if self._term is None or time.monotonic() >= self._until:
                return 0.0
            return time.monotonic() - self._since

    def ran_out(self) -> float | None:
        """If the lease has run out (by this clock) since the last renewal: the seconds it
        has been out, the first time this is asked; None otherwise or asked again."""
        with self._lock:
            now = time.monotonic()
            if self._term is None or now < self._until or self._lost_at is not None:
                return None
            self._lost_at = now
            return now - self._until
