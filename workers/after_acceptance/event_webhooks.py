"""Delivering outgoing event webhooks (docs/design.md §18), run by the pool on its schedule.

Each delivery is POSTed as JSON, signed per Standard Webhooks (``webhook-id``,
``webhook-timestamp``, ``webhook-signature: v1,<base64 HMAC-SHA256>``, made with the
``standardwebhooks`` package from the endpoint's ``whsec_…`` secret). Every POST goes through
the SSRF guard (:mod:`workers.core.outgoing`): internal addresses are refused unless
``SENDDOCK_OUTGOING_ALLOW`` names them, redirects are not followed, and only the status and
a short sanitized excerpt of the answer are kept. A 2xx answer is
delivered; anything else (an error status, a refused connection, a timeout) is retried on
``SENDDOCK_EVENT_WEBHOOK_RETRY_SCHEDULE`` (about 3 days by default) and, once the
schedule is used up, failed (an admin can retry it). An endpoint that answers no 2xx for
``SENDDOCK_EVENT_WEBHOOK_DISABLE_AFTER_SECONDS`` (3 days, as Stripe) is disabled. Each
outcome is committed right after its POST (the window for a duplicate is one delivery per
crash; receivers dedupe on ``webhook-id``).

Endpoints are delivered independently: each endpoint with due deliveries gets a lane (a
thread) that posts its deliveries in order, and while a lane runs, its endpoint's
deliveries are not claimed again, but every other endpoint's are. A receiver that takes
the whole ``SENDDOCK_EVENT_WEBHOOK_TIMEOUT`` (the deadline for the whole exchange:
connect, headers, body) holds its own lane only; after a failure the lane stops and its
remaining deliveries wait for the retry schedule. At most ``lanes`` endpoints (16) are
called at once by one worker; the rest wait for a free lane, not for a slow one.
"""

from __future__ import annotations

import base64
import functools
import logging
import secrets
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime

from sqlalchemy.engine import Engine
from standardwebhooks.webhooks import Webhook

from workers.after_acceptance import event_queue
from workers.after_acceptance.event_queue import ClaimedDelivery
from workers.core import outgoing
from workers.core.outgoing import Guard

log = logging.getLogger("senddock.events")

USER_AGENT = "SendDock-Webhooks/1"


def new_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` + base64 of 24 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def signed_headers(secret: str, msg_id: str, body: str,
                   when: datetime | None = None) -> dict[str, str]:
    """The three Standard Webhooks headers for ``body``."""
    when = when or datetime.now(UTC)
    signature = Webhook(secret).sign(msg_id, when, body)
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(when.timestamp())),
            "webhook-signature": signature}


def post(url: str, body: str, headers: dict[str, str],
         guard: Guard) -> tuple[int | None, str | None, str | None]:
    """POST once through the SSRF guard: ``(status, short sanitized excerpt, error)``;
    status None when there was no HTTP answer or the URL may not be called."""
    try:
        answer = outgoing.request("POST", url, guard, body=body.encode(), headers={
            **headers, "Content-Type": "application/json", "User-Agent": USER_AGENT})
    except outgoing.Refused as exc:
        return None, None, str(exc)
    return answer.status, answer.excerpt or None, answer.error


class EventDeliverer:
    """Claims due deliveries and posts them, one lane per endpoint. ``start_due()`` starts
    lanes and returns at once (the pool's schedule); ``run_once()`` waits for the lanes it
    started and returns how many deliveries they posted."""

    def __init__(self, engine: Engine, worker_id: str, *, schedule: tuple[int, ...],
                 disable_after: float, guard: Guard, batch: int = 20, lanes: int = 16) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.schedule = schedule
        self.disable_after = disable_after
        self.guard = guard
        self.batch = batch
        self.lanes = lanes
        self._running: dict[int, Future[int]] = {}  # endpoint id -> its lane
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=lanes,
                                            thread_name_prefix="event-webhooks")

    def _delay(self, attempts_before: int) -> float | None:
        """Seconds before the next attempt, None when the schedule is used up."""
        if attempts_before < len(self.schedule):
            return float(self.schedule[attempts_before])
        return None

    def deliver(self, delivery: ClaimedDelivery) -> bool:
        body = event_queue.payload_json(delivery)
        headers = signed_headers(delivery.secret, delivery.msg_id, body)
        code, text, error = post(delivery.url, body, headers, self.guard)
        ok = code is not None and 200 <= code < 300
        with self.engine.begin() as conn:
            disabled = event_queue.finish_delivery(
                conn, delivery, ok=ok, code=code, response=text, error=None if ok else error,
                delay=None if ok else self._delay(delivery.attempts),
                disable_after=self.disable_after)
        if disabled:
            log.warning("event webhook endpoint %d (%s) disabled: no 2xx for %.0f s",
                        delivery.endpoint_id, event_queue.display_url(delivery.url),
                        self.disable_after)
        elif not ok:
            log.info("event webhook %s to %s failed: %s", delivery.msg_id,
                     event_queue.display_url(delivery.url), error)
        return ok

    def _lane(self, deliveries: list[ClaimedDelivery]) -> int:
        """Post one endpoint's deliveries in order; after a failure the rest wait for the
        retry schedule. Returns how many were posted."""
        for posted, delivery in enumerate(deliveries, 1):
            if not self.deliver(delivery):
                rest = deliveries[posted:]
                if rest:
                    with self.engine.begin() as conn:
                        event_queue.release_deliveries(conn, rest, delay=float(
                            self.schedule[0] if self.schedule else 10))
                return posted
        return len(deliveries)

    def _lane_ended(self, endpoint_id: int, lane: Future[int]) -> None:
        with self._lock:
            if self._running.get(endpoint_id) is lane:
                del self._running[endpoint_id]
        error = lane.exception()
        if error is not None:  # its claims run out and are taken again (the lease)
            log.warning("event webhook lane for endpoint %d: %s: %s", endpoint_id,
                        type(error).__name__, error)

    def start_due(self) -> dict[int, Future[int]]:
        """Claim the due deliveries of endpoints without a lane running, start a lane for
        each endpoint (as many as there are free lanes), and return the lanes started by
        endpoint id."""
        with self._lock:
            busy = list(self._running)
        free = self.lanes - len(busy)
        if free <= 0:
            return {}
        # A lease covers a whole lane: each of its deliveries may take the deadline.
        with self.engine.begin() as conn:
            claimed = event_queue.claim_deliveries(
                conn, self.worker_id, self.batch, busy=busy,
                lease=max(60.0, self.guard.timeout * (self.batch + 1)))
        by_endpoint: dict[int, list[ClaimedDelivery]] = {}
        for delivery in claimed:
            by_endpoint.setdefault(delivery.endpoint_id, []).append(delivery)
        started: dict[int, Future[int]] = {}
        waiting: list[ClaimedDelivery] = []
        for endpoint_id, deliveries in by_endpoint.items():
            if len(started) >= free:
                waiting.extend(deliveries)  # no free lane: claimed again next time
                continue
            lane = self._executor.submit(self._lane, deliveries)
            with self._lock:
                self._running[endpoint_id] = lane
            lane.add_done_callback(functools.partial(self._lane_ended, endpoint_id))
            started[endpoint_id] = lane
        if waiting:
            with self.engine.begin() as conn:
                event_queue.release_deliveries(conn, waiting, delay=0.0)
        return started

    def run_once(self) -> int:
        """Start the due lanes and wait for them: how many deliveries were posted."""
        return sum(lane.result() for lane in self.start_due().values())

    def close(self) -> None:
        """Stop taking lanes; running ones finish (each within the deadline)."""
        self._executor.shutdown(wait=False)
