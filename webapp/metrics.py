"""``/metrics``: a Prometheus collector that reads the database at scrape time, so every
process reports the same numbers (the queue's, not one process's memory).

Gauges (the queue now): ``senddock_jobs{kind,state}``, ``senddock_oldest_pending_seconds``,
``senddock_backlog`` / ``senddock_max_backlog``, ``senddock_workers_live``,
``senddock_in_flight``, ``senddock_relay_up{relay}``, ``senddock_relay_paced_rate`` (a throttling
relay's pace, 0 when none), ``senddock_alarm{name}``.

Counters and a histogram (cumulative since the database was created, kept by a trigger in
the same transaction as each job's change, so they only grow and ``rate()`` works, and
every process reports the same numbers): ``senddock_messages_total{kind,class,outcome}``
(terminal outcomes: sent, failed, bounced, skipped, cancelled),
``senddock_retries_total{kind,class}`` (transient failures retried on the schedule),
``senddock_time_to_sent_seconds{kind,class}`` (from when a message was due to sent). Per
kind, so onboarding is never averaged into verification (docs/design.md §21).
``senddock_smtp_replies_total{outcome,code}``: SMTP submission sessions and replies, added
by each submission process every few seconds (docs/smtp.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import sqlalchemy as sa
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy.engine import Connection, Engine

from webapp.domain import deliverability, health, queue_reads, submissions
from workers import queue
from workers.after_acceptance import event_queue, feedback
from workers.building.kinds import OUTCOMES, TIME_TO_SENT_BOUNDS, all_kinds
from workers.core.settings import Config
from workers.core.states import RETRY


class QueueCollector(Collector):
    def __init__(self, engine: Engine, config: Config) -> None:
        self.engine = engine
        self.config = config

    def collect(self) -> Iterator[Metric]:
        with self.engine.connect() as conn:
            yield from self._jobs(conn)
            yield from self._attempts(conn)
            yield from self._time_to_sent(conn)
            yield from self._liveness(conn)
            yield from self._after_acceptance(conn)
            yield from deliverability.metrics(conn, self.config)
            yield from self._submission(conn)

    def _submission(self, conn: Connection) -> Iterator[Metric]:
        replies = CounterMetricFamily(
            "senddock_smtp_replies", "SMTP submission replies by outcome (session: a "
            "connection greeted, accepted, refused, auth_failed, auth_locked) and reply code.",
            labels=["outcome", "code"])
        for (outcome, code), n in submissions.reply_counts(conn).items():
            replies.add_metric([outcome, code], n)
        yield replies

    def _jobs(self, conn: Connection) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("senddock_jobs", "Delivery jobs by kind and state.",
                                 labels=["kind", "state"])
        for kind, states in queue_reads.jobs_by_kind_and_state(conn).items():
            for state, n in states.items():
                jobs.add_metric([kind, state], n)
        yield jobs
        yield GaugeMetricFamily("senddock_oldest_pending_seconds",
                                "How long the oldest due (pending or retry) job has waited.",
                                value=queue_reads.oldest_due_age(conn))
        yield GaugeMetricFamily("senddock_backlog", "Jobs waiting to be sent (pending+retry).",
                                value=queue.backlog(conn))
        yield GaugeMetricFamily("senddock_max_backlog",
                                "Backlog above which enqueues are refused (SENDDOCK_MAX_BACKLOG).",
                                value=self.config.max_backlog)

    def _known_series(self, conn: Connection) -> set[tuple[str, str]]:
        """(kind, class) of every kind, so a kind shows zeros before its first message."""
        return {("broadcast", "campaign")} | {(k.name, k.kind_class) for k in all_kinds(conn)}

    def _attempts(self, conn: Connection) -> Iterator[Metric]:
        messages = CounterMetricFamily(
            "senddock_messages_total",
            "Messages that reached an outcome (sent, failed, bounced, skipped, cancelled), "
            "by kind and class.", labels=["kind", "class", "outcome"])
        retries = CounterMetricFamily(
            "senddock_retries_total",
            "Transient failures retried on the kind's schedule.", labels=["kind", "class"])
        counts = queue_reads.outcome_counts(conn)
        series = self._known_series(conn) | {(k, c) for k, c, _ in counts}
        for kind, kind_class in sorted(series):
            for outcome in OUTCOMES:
                messages.add_metric([kind, kind_class, outcome],
                                    counts.get((kind, kind_class, outcome), 0))
            retries.add_metric([kind, kind_class], counts.get((kind, kind_class, RETRY), 0))
        yield messages
        yield retries

    def _time_to_sent(self, conn: Connection) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "senddock_time_to_sent_seconds",
            "Seconds from when a message was due (enqueued, or its send_at) to accepted by "
            "the relay.", labels=["kind", "class"])
        counts = queue_reads.time_to_sent_counts(conn)
        bounds = [*map(str, TIME_TO_SENT_BOUNDS), "+Inf"]
        for key in sorted(self._known_series(conn) | set(counts)):
            per_bucket = counts.get(key, {})
            cumulative, buckets, total = 0, [], 0.0
            for i, le in enumerate(bounds):
                n, seconds = per_bucket.get(i, (0, 0.0))
                cumulative += n
                total += seconds
                buckets.append((le, cumulative))
            family.add_metric(list(key), buckets, sum_value=total)
        yield family

    def _liveness(self, conn: Connection) -> Iterator[Metric]:
        workers = queue_reads.running_workers(conn)
        live = [w for w in workers if w["live"]]
        yield GaugeMetricFamily("senddock_workers_live",
                                "Worker pools with a valid lease.", value=len(live))
        yield GaugeMetricFamily("senddock_in_flight",
                                "Jobs in flight (sending) now, whichever worker holds them.",
                                value=queue_reads.in_flight(conn))
        yield GaugeMetricFamily("senddock_in_flight_lease_expired",
                                "Jobs sending under a worker whose lease expired (a "
                                "vanished, cut-off or frozen host); taken back after the "
                                "grace period.", value=queue_reads.stranded(conn)[0])
        relay = queue.relay_status(conn)
        up = GaugeMetricFamily("senddock_relay_up", "1 if the SMTP relay is usable (one "
                               "sample per relay of SENDDOCK_SMTP_URL).", labels=["relay"])
        for each in health.relays_with_state(conn, self.config):
            up.add_metric([each["name"]], 1 if each["state"].get("status") != "down" else 0)
        yield up
        paced = relay.get("paced_rate")
        yield GaugeMetricFamily(
            "senddock_relay_paced_rate", "Messages per second a throttling relay is paced at "
            "(every process together); 0 while it is not throttling us.",
            value=float(paced) if paced is not None else 0.0)
        alarm = GaugeMetricFamily("senddock_alarm", "1 while the alarm is raised.",
                                  labels=["name"])
        raised = {a.name for a in health.compute_alarms(conn, self.config)}
        for name in health.ALARM_NAMES:
            alarm.add_metric([name], 1 if name in raised else 0)
        yield alarm


    def _after_acceptance(self, conn: Connection) -> Iterator[Metric]:
        """docs/design.md §18: bounce/complaint events by source, type and effect; complaint rate
        per open campaign; outgoing event-webhook deliveries by state."""
        events = GaugeMetricFamily("senddock_feedback_events",
                                   "Bounces and complaints reported after acceptance.",
                                   labels=["source", "type", "effect"])
        for row in conn.execute(sa.text("SELECT source, type, effect, count(*) AS n "
                                        "FROM job_events GROUP BY 1, 2, 3")):
            events.add_metric([row.source, row.type, row.effect], int(row.n))
        yield events
        rate = GaugeMetricFamily("senddock_campaign_complaint_rate",
                                 "Complaints per delivered message of an open campaign.",
                                 labels=["campaign_id"])
        complaints = GaugeMetricFamily("senddock_campaign_complaints",
                                       "Messages of an open campaign with a complaint.",
                                       labels=["campaign_id"])
        for c in feedback.complaint_rates(conn):
            rate.add_metric([str(c["id"])], c["rate"])
            complaints.add_metric([str(c["id"])], int(c["complaints"]))
        yield rate
        yield complaints
        deliveries = GaugeMetricFamily("senddock_event_webhook_deliveries",
                                       "Outgoing event webhook deliveries by state.",
                                       labels=["state"])
        for state, n in event_queue.delivery_counts(conn).items():
            deliveries.add_metric([state], n)
        yield deliveries


def registry_for(engine: Engine, config: Config) -> CollectorRegistry:
    """A registry of its own per app (tests run many apps in one process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(engine, config))
    return registry
