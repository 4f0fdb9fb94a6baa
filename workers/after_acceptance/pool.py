"""The pool's jobs for what happens after acceptance (docs/design.md §18): polling the bounce
mailbox and delivering outgoing event webhooks. Each runs on the pool's scheduler as its own job,
never inside the drain loops, and survives a database or mailbox outage (logged, retried
on the next run).

:func:`worker_pool` composes the engine from this, the last room, down: the delivery pool
with these jobs handed in, so delivery never imports the room after it (docs/design.md §11)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from workers.after_acceptance.event_webhooks import EventDeliverer
from workers.after_acceptance.feedback import Thresholds
from workers.after_acceptance.mailbox import BouncePoller
from workers.core import pg
from workers.core.settings import Config
from workers.delivery.pool import Pool
from workers.delivery.services import DB_ERRORS

log = logging.getLogger("senddock.worker")

RECEIPT_DAYS = 30


def worker_pool(engine: Engine, config: Config, *, node: str | None = None,
                maintenance: bool = True) -> Pool:
    """A process's delivery pool hosting the after-acceptance jobs (:func:`schedule`):
    what `senddock worker`, `serve` and the demo run."""
    return Pool(engine, config, node=node, maintenance=maintenance, hosted=schedule)


def thresholds(config: Config) -> Thresholds:
    f = config.feedback
    return Thresholds(soft_limit=f.soft_bounce_limit, soft_window=f.soft_bounce_window,
                      complaint_alarm=f.complaint_alarm_rate,
                      complaint_pause=f.complaint_pause_rate,
                      complaint_min_sent=f.complaint_min_delivered)


def poller(engine: Engine, config: Config) -> BouncePoller | None:
    f = config.feedback
    if not f.bounce_mailbox:
        return None
    return BouncePoller(engine, f.bounce_mailbox, secret_key=config.secret_key,
                        bounce_address=f.bounce_address, thresholds=thresholds(config),
                        ca_file=f.bounce_mailbox_ca_file,
                        processed_folder=f.bounce_mailbox_processed,
                        unreadable_folder=f.bounce_mailbox_unreadable)


def deliverer(engine: Engine, config: Config, worker_id: str) -> EventDeliverer:
    f = config.feedback
    return EventDeliverer(engine, worker_id, schedule=f.event_webhook_retry_schedule,
                          disable_after=f.event_webhook_disable_after,
                          guard=f.guard())


def schedule(scheduler: Any, engine: Engine, config: Config, worker_id: str,
             outage: pg.Outage | None = None) -> None:
    """Add the bounce-mailbox poll (when configured) and the event-webhook deliverer to
    the pool's scheduler. Database errors go to ``outage`` (the pool's: one log line per
    outage, not one per second)."""
    events = deliverer(engine, config, worker_id)
    outage = outage or pg.Outage(f"after acceptance {worker_id}", log)

    def deliver_events() -> None:
        try:
            # Lanes run on their own: a slow endpoint holds its lane, never this job.
            while events.start_due():
                pass
        except DB_ERRORS as exc:
            outage.failed(exc, retrying="event webhooks retry")

    scheduler.add_job(deliver_events, "interval", seconds=1, id="event-webhooks")

    def forget_old_receipts() -> None:
        # A replayed signed request older than SENDDOCK_WEBHOOK_MAX_AGE is refused as stale
        # anyway, and provider event ids stay unique in job_events: receipts can go after
        # RECEIPT_DAYS (a bounce-mailbox message is moved long before that).
        try:
            with engine.begin() as conn:
                conn.execute(sa.text("DELETE FROM feedback_receipts WHERE received_at < "
                                     "now() - make_interval(days => :d)"), {"d": RECEIPT_DAYS})
        except DB_ERRORS as exc:
            outage.failed(exc, retrying="receipt cleanup retries")

    scheduler.add_job(forget_old_receipts, "interval", seconds=3600, id="receipt-cleanup")
    schedule_reports(scheduler, engine, config, outage)
    mailbox = poller(engine, config)
    if mailbox is None:
        return

    def poll_mailbox() -> None:
        try:
            result = mailbox.poll_once()
            if result is not None and result.seen:
                log.info("bounce mailbox %s: %s", mailbox.url.redacted(), result)
        except DB_ERRORS as exc:
            outage.failed(exc, retrying="bounce mailbox retries")
        except Exception as exc:  # the mailbox server: unreachable, login refused, TLS
            log.warning("bounce mailbox %s: %s: %s", mailbox.url.redacted(),
                        type(exc).__name__, exc)

    scheduler.add_job(poll_mailbox, "interval", seconds=config.feedback.bounce_mailbox_interval,
                      id="bounce-mailbox", next_run_time=datetime.now(UTC))


def schedule_reports(scheduler: Any, engine: Engine, config: Config,
                     outage: pg.Outage) -> None:
    """The report mailbox poll (SENDDOCK_REPORT_MAILBOX), when configured."""
    from workers.after_acceptance.receiver_reports.mailbox import ReportPoller

    r = config.reports
    if not r.mailbox:
        return
    reports = ReportPoller(engine, r.mailbox, ca_file=r.ca_file, processed_folder=r.processed,
                           unreadable_folder=r.unreadable)

    def poll_reports() -> None:
        try:
            result = reports.poll_once()
            if result is not None and result.seen:
                log.info("report mailbox %s: %s", reports.url.redacted(), result)
        except DB_ERRORS as exc:
            outage.failed(exc, retrying="report mailbox retries")
        except Exception as exc:  # the mailbox server: unreachable, login refused, TLS
            log.warning("report mailbox %s: %s: %s", reports.url.redacted(),
                        type(exc).__name__, exc)

    scheduler.add_job(poll_reports, "interval", seconds=r.interval, id="report-mailbox",
                      next_run_time=datetime.now(UTC))
