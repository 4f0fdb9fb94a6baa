"""Queue health and alarms (docs/design.md §22): what the health page, the banner on every page and
``/metrics`` show. Everything here is cheap enough to run on every page view: counts come
from counters and small indexes; attempts per minute from attempt_minutes, kept by a
trigger (a few rows a minute however fast a campaign drains).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection, Engine

from webapp.domain import deliverability, queue_reads
from workers import queue
from workers.after_acceptance import event_queue, feedback
from workers.core import pg
from workers.core.i18n import N_, Text
from workers.core.relays import parse_relays
from workers.core.settings import Config
from workers.core.states import Campaign
from workers.delivery import warmup

WINDOW = timedelta(minutes=15)  # failure rate, attempts by class
CHART = timedelta(hours=1)  # the sent-per-minute chart (within queue.MINUTES_KEPT)
ADMINS = ("admin",)  # the roles shown an alarm only an admin can act on
MIN_FINISHED_FOR_RATE = 20  # a failure rate over fewer finished jobs is noise


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def sent_per_minute(conn: Connection) -> list[dict[str, Any]]:
    """The last 60 minutes (``CHART``), oldest first: {minute, sent, failed} (failed =
    counted attempts that did not deliver: bounces, rejections, transient failures)."""
    now = _minute(datetime.now(UTC))
    count = int(CHART / timedelta(minutes=1))
    minutes = [now - timedelta(minutes=count - 1 - i) for i in range(count)]
    series: dict[datetime, dict[str, Any]] = {m: {"minute": m, "sent": 0, "failed": 0}
                                              for m in minutes}
    until = now + timedelta(minutes=1)
    for minute, _kind, outcome, n in queue_reads.attempts_per_minute(conn, minutes[0], until):
        if minute in series:
            series[minute]["sent" if outcome == "sent" else "failed"] += n
    return list(series.values())


def attempts_in_window(conn: Connection) -> dict[tuple[str, str], int]:
    """Counted attempts over the last 15 minutes per (kind, outcome class)."""
    now = datetime.now(UTC)
    totals: dict[tuple[str, str], int] = {}
    for _minute_at, kind, outcome, n in queue_reads.attempts_per_minute(
            conn, _minute(now - WINDOW), _minute(now) + timedelta(minutes=1)):
        totals[(kind, outcome)] = totals.get((kind, outcome), 0) + n
    return totals


@dataclass
class Alarm:
    name: str
    message: str
    severity: str = "error"  # error | warn
    # Who is shown it: everyone, or only the roles that can act on it (a
    # marketer cannot enable an event webhook, so its alarm is not theirs).
    roles: tuple[str, ...] | None = None

    def shown_to(self, role: str | None) -> bool:
        return self.roles is None or role in self.roles


def _failure_rate(conn: Connection) -> tuple[float, int]:
    """(share of the last 15 minutes' finished jobs that failed or bounced, finished)."""
    failed = queue_reads.problems_since(conn, datetime.now(UTC) - WINDOW)
    sent = sum(n for (_kind, outcome), n in attempts_in_window(conn).items()
               if outcome == "sent")
    finished = failed + sent
    return (failed / finished if finished else 0.0), finished


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def compute_alarms(conn: Connection, config: Config) -> list[Alarm]:
    """Relay down, oldest due job too old, failure rate too high, no live worker while
    mail is waiting. Thresholds: SENDDOCK_ALARM_OLDEST_PENDING, SENDDOCK_ALARM_FAILURE_RATE
    (0 disables either)."""
    alarms: list[Alarm] = []
    relays = relays_with_state(conn, config)
    relay = relays[0]["state"]
    if len(relays) > 1:
        alarms.extend(_several_relays_alarms(relays))
    elif relay.get("status") == "down":
        since = relay.get("since")
        when = N_(" since %(at)s UTC", at=f"{since:%Y-%m-%d %H:%M:%S}") if since \
            else Text.verbatim("")
        last = relay.get("last_error") or N_("unknown")
        if relay.get("reason") == "login":
            # A 535 never heals by itself: say what to do (docs/design.md §16).
            alarms.append(Alarm("relay_down", N_(
                "Login refused — check the credentials (SENDDOCK_SMTP_URL)%(since)s. Delivery "
                "is paused; the relay is probed at most every %(every)s (Queue health: Retry "
                "now). Last error: %(last)s", since=when,
                every=_age(config.login_probe_interval), last=last)))
        else:
            alarms.append(Alarm("relay_down", N_(
                "The SMTP relay is down%(since)s: delivery is paused and resumes by itself. "
                "Last error: %(last)s", since=when, last=last)))
    paused = [r["state"] for r in relays if r["state"].get("paused")]
    for state in paused:
        until = state["throttled_until"]
        alarms.append(Alarm("relay_throttled", N_(
            "The relay is throttling us: delivery is slowed down until %(until)s UTC (no "
            "attempt is used). Last reply: %(reply)s", until=f"{until:%H:%M:%S}",
            reply=state.get("throttle_reply") or N_("unknown")), "warn"))
    if not paused and relay.get("paced_rate") is not None:
        alarms.append(Alarm("relay_throttled", N_(
            "The relay is throttling us: delivery is paced at %(rate)s messages per second "
            "and speeds up again while the relay accepts (no attempt is used). Last reply: "
            "%(reply)s", rate=f"{relay['paced_rate']:.2f}",
            reply=relay.get("throttle_reply") or N_("unknown")), "warn"))
    for refused in queue.sender_refusals(conn):
        alarms.append(Alarm("sender_refused", N_(
            "The relay refuses the From address %(sender)s since %(since)s UTC: its campaigns "
            "are paused and resume by themselves once the relay accepts it (probed again at "
            "%(next)s UTC). Last reply: %(reply)s", sender=refused["sender"],
            since=f"{refused['since']:%Y-%m-%d %H:%M:%S}",
            next=f"{refused['next_probe_at']:%H:%M:%S}",
            reply=refused["last_reply"] or N_("unknown")), "warn"))
    oldest = queue_reads.oldest_due_age(conn)
    if config.alarm_oldest_pending > 0 and oldest > config.alarm_oldest_pending:
        alarms.append(Alarm("oldest_pending", N_(
            "The oldest waiting message has waited %(age)s (alarm above %(limit)s).",
            age=_age(oldest), limit=_age(config.alarm_oldest_pending))))
    rate, finished = _failure_rate(conn)
    if config.alarm_failure_rate > 0 and finished >= MIN_FINISHED_FOR_RATE \
            and rate > config.alarm_failure_rate:
        alarms.append(Alarm("failure_rate", N_(
            "%(rate)s of the %(count)s messages finished in the last 15 minutes failed or "
            "bounced (alarm above %(limit)s).", rate=f"{rate:.0%}", count=finished,
            limit=f"{config.alarm_failure_rate:.0%}"), "warn"))
    stranded, overdue = queue_reads.stranded(conn)
    if stranded:
        alarms.append(Alarm("lease_expired", N_(
            "%(count)s message(s) are in flight under a worker whose lease expired %(age)s "
            "ago (its host vanished, was cut off or froze); they are taken back %(grace)s "
            "after the expiry.", count=stranded, age=_age(overdue),
            grace=_age(config.lease_grace))))
    if oldest > 0 and not any(w["live"] for w in queue_reads.running_workers(conn)):
        alarms.append(Alarm("no_workers", N_(
            "No delivery worker is running: messages are waiting. Start `senddock worker` "
            "or `senddock serve`.")))
    alarms.extend(feedback_alarms(conn, config))
    alarms.extend(deliverability.alarms(conn, config))
    return alarms


def feedback_alarms(conn: Connection, config: Config) -> list[Alarm]:
    """docs/design.md §18: a campaign whose complaint rate reached SENDDOCK_COMPLAINT_ALARM_RATE,
    and an event-webhook endpoint disabled because it keeps failing."""
    alarms: list[Alarm] = []
    level = config.feedback.complaint_alarm_rate
    for c in feedback.complaint_rates(conn):
        if level > 0 and c["rate"] >= level:
            message = N_("Campaign “%(name)s” paused with a complaint rate of %(rate)s "
                         "(%(complaints)s of %(delivered)s delivered; alarm at %(alarm)s, "
                         "pause at %(pause)s).", **_complaints(c, level, config)) \
                if c["status"] == Campaign.PAUSED else \
                N_("Campaign “%(name)s” is sending with a complaint rate of %(rate)s "
                   "(%(complaints)s of %(delivered)s delivered; alarm at %(alarm)s, pause "
                   "at %(pause)s).", **_complaints(c, level, config))
            alarms.append(Alarm("complaint_rate", message, "warn"))
    senders = feedback.sender_bounces(conn)
    if senders:
        total = sum(int(b["n"]) for b in senders)
        kinds = ", ".join(f"{b['reason']}: {b['n']}" for b in senders)
        alarms.append(Alarm("sender_bounces", N_(
            "%(count)s bounces in the last 24 hours say receivers refuse our sending, not the "
            "recipients (%(kinds)s): check the sending IP's blocklist listings, reputation and "
            "rate. No recipient was suppressed or counted for them. Last: %(last)s",
            count=total, kinds=kinds, last=str(senders[0]["last_reason"] or "")[:300]),
            "warn"))
    unreadable = feedback.unreadable_mail(conn, limit=1, window=86400)
    if unreadable:
        alarms.append(Alarm("mailbox_unreadable", N_(
            "The bounce mailbox received mail that could not be read (moved to the folder "
            "%(folder)s; Queue health lists it). Last: %(error)s",
            folder=unreadable[0]["folder"], error=unreadable[0]["error"][:200]), "warn"))
    alarms.extend(event_webhook_alarms(conn, config))
    return alarms


def event_webhook_alarms(conn: Connection, config: Config) -> list[Alarm]:
    """For admins only, and naming the endpoint without its credentials or query string: an
    endpoint disabled after failing for days, and (a warning) one failing for a while."""
    f = config.feedback
    alarms = [Alarm("event_webhook_disabled", N_(
        "Event webhook %(url)s was disabled after answering no 2xx since %(since)s UTC "
        "(last error: %(why)s). Its events wait until an admin enables it again.",
        url=event_queue.display_url(e["url"]),
        since=f"{e['failing_since'] or e['disabled_at']:%Y-%m-%d %H:%M}",
        why=str(e["disabled_reason"] or "")), roles=ADMINS)
        for e in event_queue.disabled_endpoints(conn)]
    if f.event_webhook_warn_after > 0:
        for e in event_queue.failing_endpoints(conn, f.event_webhook_warn_after):
            until = e["failing_since"] + timedelta(seconds=f.event_webhook_disable_after)
            message = N_(
                "Event webhook %(url)s has answered no 2xx since %(since)s UTC: its events "
                "are retried with backoff, and it is disabled if it still fails at "
                "%(until)s UTC.", url=event_queue.display_url(e["url"]),
                since=f"{e['failing_since']:%Y-%m-%d %H:%M}",
                until=f"{until:%Y-%m-%d %H:%M}") if f.event_webhook_disable_after > 0 else N_(
                "Event webhook %(url)s has answered no 2xx since %(since)s UTC: its events "
                "are retried with backoff.", url=event_queue.display_url(e["url"]),
                since=f"{e['failing_since']:%Y-%m-%d %H:%M}")
            alarms.append(Alarm("event_webhook_failing", message, "warn", roles=ADMINS))
    return alarms


def _complaints(c: dict[str, Any], level: float, config: Config) -> dict[str, Any]:
    return {"name": c["name"], "rate": f"{c['rate']:.2%}", "complaints": c["complaints"],
            "delivered": c["delivered"], "alarm": f"{level:.1%}",
            "pause": f"{config.feedback.complaint_pause_rate:.1%}"}


ALARM_NAMES = ("relay_down", "relay_throttled", "sender_refused", "oldest_pending",
               "failure_rate", "lease_expired", "no_workers", "complaint_rate",
               "event_webhook_disabled", "event_webhook_failing", "sender_bounces",
               "mailbox_unreadable", "dmarc_alignment")
_ALARM_TTL = 5.0
_alarm_cache: dict[str, tuple[float, list[Alarm]]] = {}
_alarm_lock = threading.Lock()


def cached_alarms(engine: Engine, config: Config) -> list[Alarm]:
    """:func:`compute_alarms`, computed at most every 5 s per process and database (the
    banner runs on every page view). An unreachable database is itself the alarm."""
    key = str(engine.url)
    now = time.monotonic()
    with _alarm_lock:
        hit = _alarm_cache.get(key)
    if hit is not None and now - hit[0] < _ALARM_TTL:
        return hit[1]
    try:
        with engine.connect() as conn:
            alarms = compute_alarms(conn, config)
    except Exception as exc:
        problem = pg.classify(exc)
        if problem is None:
            raise
        alarms = [Alarm("database", problem.message)]
    else:
        # Reads work, but this process's writes may not (a full disk, a read-only standby).
        recent = pg.RECENT.within(_ALARM_TTL * 3)
        if recent is not None and recent[0].writes_only:
            alarms.insert(0, Alarm("database", recent[0].message))
    with _alarm_lock:
        _alarm_cache[key] = (now, alarms)
    return alarms


def queue_health(conn: Connection, config: Config) -> dict[str, Any]:
    """Everything the queue health page shows."""
    by_kind = queue_reads.jobs_by_kind_and_state(conn)
    return {
        "by_kind": by_kind,
        "totals": {s: sum(k[s] for k in by_kind.values())
                   for s in next(iter(by_kind.values()))},
        "oldest_due": queue_reads.oldest_due_age(conn),
        # Pending includes messages asked for later; "due now" leaves those out.
        "scheduled": queue_reads.scheduled_message_count(conn, queue_reads.JobFilter()),
        "backlog": queue.backlog(conn),
        "max_backlog": config.max_backlog,
        "chart": sent_per_minute(conn),
        "workers": queue_reads.running_workers(conn),
        "stranded": queue_reads.stranded(conn),
        "relay": queue.relay_status(conn),
        "relays": relays_with_state(conn, config),
        "domain_throttles": queue.domain_throttles(conn),
        "rate": rate_limits(conn, config),
        "warmups": warmup.all_today(conn),
        "login_probe_interval": config.login_probe_interval,
        "alarms": compute_alarms(conn, config),
        "unreadable": feedback.unreadable_mail(conn),
        "thresholds": {"oldest_pending": config.alarm_oldest_pending,
                       "failure_rate": config.alarm_failure_rate},
    }


def relays_with_state(conn: Connection, config: Config) -> list[dict[str, Any]]:
    """Each relay of SENDDOCK_SMTP_URL (docs/design.md §17): name, role, redacted URL and its state
    row (``relay_state``), in the configured (failover) order."""
    specs = parse_relays(config.smtp_url)  # it parsed when the settings were loaded
    states = queue.relay_states(conn, len(specs))
    return [{"name": spec.name, "role": spec.role, "url": spec.smtp.redacted(),
             "state": state} for spec, state in zip(specs, states, strict=True)]


def _several_relays_alarms(relays: list[dict[str, Any]]) -> list[Alarm]:
    """One alarm per relay that is down: its traffic goes through the others meanwhile."""
    alarms = []
    for relay in relays:
        state = relay["state"]
        if state.get("status") != "down":
            continue
        since = state.get("since")
        at = f"{since:%Y-%m-%d %H:%M:%S}" if since else "?"
        last = state.get("last_error") or N_("unknown")
        if state.get("reason") == "login":
            alarms.append(Alarm("relay_down", N_(
                "Relay %(name)s (%(role)s) refused our login since %(since)s UTC — check its "
                "credentials in SENDDOCK_SMTP_URL. Its traffic goes through the other relays "
                "meanwhile. Last error: %(last)s", name=relay["name"], role=relay["role"],
                since=at, last=last)))
        else:
            alarms.append(Alarm("relay_down", N_(
                "Relay %(name)s (%(role)s) is down since %(since)s UTC: its traffic goes "
                "through the other relays and comes back once it answers. Last error: "
                "%(last)s", name=relay["name"], role=relay["role"], since=at, last=last)))
    return alarms


def rate_limits(conn: Connection, config: Config) -> dict[str, Any]:
    """The configured rate limits (0 = none) and what is used of them, on the database's
    clock: sends in the last minute, the rolling hour and the rolling day."""
    limited = config.rate_limit > 0 or config.rate_limit_hour > 0 or config.rate_limit_day > 0
    return {"per_second": config.rate_limit, "per_hour": config.rate_limit_hour,
            "per_day": config.rate_limit_day, "limited": limited,
            "used": queue.rate_usage(conn) if limited else None}


def chart_bars(chart: Sequence[dict[str, Any]], width: int = 1100,
               height: int = 160) -> dict[str, Any]:
    """Geometry of the server-rendered SVG bar chart: one stacked bar (sent below,
    failed above) per minute, scaled to the busiest minute."""
    peak = max((p["sent"] + p["failed"] for p in chart), default=0) or 1
    step = width / max(len(chart), 1)
    bars = []
    for i, p in enumerate(chart):
        sent_h = height * p["sent"] / peak
        failed_h = height * p["failed"] / peak
        bars.append({"x": round(i * step + 1, 1), "w": round(max(step - 2, 1), 1),
                     "sent_y": round(height - sent_h, 1), "sent_h": round(sent_h, 1),
                     "failed_y": round(height - sent_h - failed_h, 1),
                     "failed_h": round(failed_h, 1), "minute": p["minute"],
                     "sent": p["sent"], "failed": p["failed"]})
    return {"bars": bars, "peak": peak, "width": width, "height": height,
            "total_sent": sum(p["sent"] for p in chart),
            "total_failed": sum(p["failed"] for p in chart)}
