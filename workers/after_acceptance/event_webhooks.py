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
"""

from __future__ import annotations

import base64
import logging
import secrets
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
    """Claims due deliveries and posts them. ``run_once()`` returns how many it handled."""

    def __init__(self, engine: Engine, worker_id: str, *, schedule: tuple[int, ...],
                 disable_after: float, guard: Guard, batch: int = 20) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.schedule = schedule
        self.disable_after = disable_after
        self.guard = guard
        self.batch = batch

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

    def run_once(self) -> int:
        with self.engine.begin() as conn:
            claimed = event_queue.claim_deliveries(conn, self.worker_id, self.batch,
                                                   lease=max(60.0, self.guard.timeout * 6))
        failing: set[int] = set()
        skipped: list[ClaimedDelivery] = []
        for delivery in claimed:
            if delivery.endpoint_id in failing:
                skipped.append(delivery)
            elif not self.deliver(delivery):
                failing.add(delivery.endpoint_id)
        if skipped:
            with self.engine.begin() as conn:
                event_queue.release_deliveries(conn, skipped, delay=float(
                    self.schedule[0] if self.schedule else 10))
        return len(claimed) - len(skipped)
