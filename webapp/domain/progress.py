"""What the live campaign page tells a marketer, and only what is true:

- the rate is the finishes of the last :data:`RATE_WINDOW` seconds (never reaching back
  before the jobs existed or the campaign was last resumed), and "nothing finished for N s"
  when that is the case, instead of an old average;
- the ETA covers only the messages that can be sent now; messages waiting on their retry
  backoff are stated apart ("60 waiting to retry, next at 07:51:05"), since no rate makes
  them go sooner;
- a campaign whose From domain is in warm-up and has more left than today's cap lets go
  says so, with the day (and date) by which the schedule's caps let the rest go out, and
  gives no rate-based ETA (docs/design.md §33);
- the percentage is floored, so it reads 100 % only when every recipient has a final state;
- an ETA is given only while the rate is steady: the last :data:`STEADY_WINDOW` seconds
  rate within :data:`STEADY_TOLERANCE` of the whole window's. While the pool ramps up (or
  slows down) the page says it is estimating ("about 3 min 51 s left" at 21 s
  for a campaign done at 96 s, whose rate was still climbing);
- once nothing is left to send (the queue emptied, or only retries on backoff remain) no
  rate is shown at all (it said "164 messages/s" of a queue already empty);
- a retry time that has passed reads "due now", not a time in the past;
- a cancelled campaign's percentage is how far it got before it was stopped (the share of
  recipients that reached sent, failed, bounced or skipped), as listmonk shows it -- never
  "100 % done" for a campaign most of whose recipients were never sent.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import campaigns, queue_reads
from workers import queue
from workers.core.addresses import domain_of
from workers.core.states import (
    BOUNCED,
    CANCELLED,
    FAILED,
    PENDING,
    PROBLEM,
    RETRY,
    SENDING,
    Campaign,
)
from workers.delivery import warmup

RATE_WINDOW = 30.0  # seconds of finishes the rate is taken over
RATE_SAMPLE = 5000  # at most this many finishes are read (bounded cost at any speed)
STALL_AFTER = 5.0  # with no finish for this long, say so instead of showing a rate
MIN_SPAN = 1.0  # a rate over less than a second of sending is noise
STEADY_WINDOW = 10.0  # the recent part of the window an ETA's rate is checked against
STEADY_TOLERANCE = 0.25  # how far the two rates may differ for the ETA to be stated

# The last time the campaign was resumed (the audit log is its record).
_LAST_RESUME = sa.text("""
SELECT max(at) FROM audit_log WHERE target = :target AND action = 'campaign.resume'
""")


def percent_done(done: int, total: int) -> float:
    """``done`` of ``total`` as a percentage floored to one decimal: 9,993 of 9,997 is
    99.9 %, never 100 % while one recipient has no final state."""
    if total <= 0:
        return 0.0
    if done >= total:
        return 100.0
    return min(99.9, math.floor(1000 * done / total) / 10)


def _rate(conn: Connection, campaign: dict[str, Any]) -> dict[str, Any]:
    """The recent rate, or why there is none: {rate, window, stalled_for}."""
    broadcast_id = campaign["broadcast_id"]
    start = campaign["audience"]["enqueued_at"]
    resumed = conn.execute(_LAST_RESUME, {"target": f"campaign:{campaign['id']}"}).scalar()
    if resumed is not None and resumed > start:
        start = resumed
    now = conn.execute(sa.text("SELECT now()")).scalar_one()
    window_start = max(start, now - timedelta(seconds=RATE_WINDOW))
    row = queue_reads.recent_finishes(conn, broadcast_id, window_start, RATE_SAMPLE,
                                      recent=now - timedelta(seconds=STEADY_WINDOW))
    result: dict[str, Any] = {"rate": None, "window": None, "stalled_for": None,
                              "steady": False}
    newest = row.newest if row.newest is not None and row.newest > start else None
    quiet_since = newest or start
    quiet = (row.now - quiet_since).total_seconds()
    if quiet > STALL_AFTER:
        result["stalled_for"] = quiet
        return result
    span_start = row.oldest if row.n >= RATE_SAMPLE and row.oldest else window_start
    span = (row.now - span_start).total_seconds()
    if row.n and span >= MIN_SPAN:
        result["rate"] = row.n / span
        result["window"] = span
        result["steady"] = _steady(row, span_start, result["rate"])
    return result


def _steady(row: Any, span_start: Any, rate: float) -> bool:
    """Whether the last STEADY_WINDOW seconds ran at ``rate`` (within the tolerance): an
    ETA from a rate that is still climbing or falling is a guess. The recent finishes are
    counted in the same sample (``row.n_recent``): they are its newest rows."""
    recent_start = max(span_start, row.now - timedelta(seconds=STEADY_WINDOW))
    recent_span = (row.now - recent_start).total_seconds()
    if recent_span >= (row.now - span_start).total_seconds():
        return True  # the window is the recent part: nothing to compare with
    return abs(row.n_recent / recent_span - rate) <= STEADY_TOLERANCE * rate


def live(conn: Connection, campaign_id: int) -> dict[str, Any]:
    """The campaign with exact counts (P8) plus what the live page shows: ``done``,
    ``remaining``, ``percent``, ``due`` (can be sent now), ``rate`` (finishes per second
    over ``rate_window`` seconds) or ``stalled_for`` (seconds with no finish), ``eta_seconds``
    for the due messages at that rate, ``retry_next_at``/``retry_last_at`` for the jobs on
    backoff, the most frequent error replies, and ``dismissed``: the failed and bounced
    jobs dismissed from the inbox, per state. Every query is bounded."""
    campaign = campaigns.with_counts(conn, campaign_id)
    counts = campaign["counts"]
    campaign["done"] = sum(counts[s] for s in queue.TERMINAL)
    campaign["remaining"] = counts[PENDING] + counts[SENDING] + counts[RETRY]
    campaign["due"] = counts[PENDING] + counts[SENDING]
    # How far it got: the recipients that reached a final state other than cancelled.
    campaign["processed"] = campaign["done"] - counts[CANCELLED]
    campaign["percent"] = percent_done(
        campaign["processed"] if campaign["status"] == Campaign.CANCELLED else campaign["done"],
        campaign["total"])
    campaign.update(rate=None, rate_window=None, stalled_for=None, eta_seconds=None,
                    errors=[], retry_next_at=None, retry_last_at=None,
                    retry_due_now=False, throttled=[], dismissed=dict.fromkeys(PROBLEM, 0))
    broadcast_id = campaign["broadcast_id"]
    if not broadcast_id:
        return campaign
    campaign["errors"] = queue_reads.top_errors(conn, broadcast_id)
    if counts[FAILED] or counts[BOUNCED]:
        campaign["dismissed"] = queue_reads.dismissed_problems(conn, broadcast_id)
    campaign["throttled"] = queue_reads.throttled_waiting(conn, broadcast_id) \
        if campaign["status"] in Campaign.STARTED else []
    if counts[RETRY]:
        next_at, last_at = queue_reads.retry_due(conn, broadcast_id)
        campaign["retry_next_at"], campaign["retry_last_at"] = next_at, last_at
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        campaign["retry_due_now"] = next_at is not None and next_at <= now
    if campaign["status"] == Campaign.SENDING and campaign["enqueued"] and campaign["due"]:
        rate = _rate(conn, campaign)
        campaign["rate"], campaign["rate_window"] = rate["rate"], rate["window"]
        campaign["stalled_for"] = rate["stalled_for"]
        if campaign["rate"] and rate["steady"]:
            campaign["eta_seconds"] = campaign["due"] / campaign["rate"]
    campaign["warmup"] = None
    left = campaign["total"] - campaign["done"]  # jobs not yet made count too
    if campaign["status"] in Campaign.STARTED and left > 0:
        ahead = warmup.outlook(conn, domain_of(campaign["from_addr"]), left)
        if ahead is not None and ahead.held:
            # The caps, not the rate, decide when it ends: no rate-based ETA.
            campaign["warmup"], campaign["eta_seconds"] = ahead, None
    return campaign
