"""The send rate on the database's clock (GCRA per second, minute counts per hour and
day) and the attempt counters per minute (docs/design.md §16)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.queue.relays import PACE_CLEAN_INTERVAL, PACE_STEPS

# --- rate limit ------------------------------------------------------------------------
# On the database's clock, shared by every process and host (docs/design.md §16). Per second: a GCRA
# ("theoretical arrival time") in one row, so sends are spaced 1/rate apart however many
# workers ask and fractional rates work (0.5/s = one send every 2 s). Per hour and per
# day: sends counted per minute over rolling windows. The row lock taken first serializes
# every grant, so two processes can never both take the last permit.


# Grow the paced rate back by one step per clean interval; pacing ends once the rate is
# back above the configured limit (or, without one, above twice where it was halved from).
_PACE_CEILING = f"CASE WHEN :limit > 0 THEN :limit ELSE paced_step * {PACE_STEPS} * 2 END"
_PACE_UP = sa.text(f"""
UPDATE rate_limiter
   SET paced_rate = CASE WHEN paced_rate + paced_step >= {_PACE_CEILING}
                         THEN NULL ELSE paced_rate + paced_step END,
       paced_step = CASE WHEN paced_rate + paced_step >= {_PACE_CEILING}
                         THEN NULL ELSE paced_step END,
       paced_at = now()
 WHERE id = 1 AND paced_rate IS NOT NULL
   AND paced_at <= now() - make_interval(secs => {PACE_CLEAN_INTERVAL})
RETURNING paced_rate
""")



@dataclass
class Permits:
    """Sends this worker may start: the first at ``first_at`` (this process's monotonic
    clock), the following ones ``interval`` seconds apart. ``granted == 0``: ask again in
    ``retry_in`` seconds."""

    granted: int
    first_at: float = 0.0
    interval: float = 0.0
    retry_in: float = 0.0
    rate: float = 0.0  # the per-second rate in force (0: none; a throttling relay's pace)


# Every grant waits for the one before it on the rate row, in a statement of its own: the
# statements after it read what that one took. (A statement that waited on the lock itself
# would read the minute counters with the snapshot it started with, from before that
# grant, and the hour's and day's limits could be handed out twice.)
_RATE_LOCK = sa.text("SELECT 1 FROM rate_limiter WHERE id = 1 FOR UPDATE")

_RATE_STATE = sa.text("""
WITH cur AS (
    SELECT extract(epoch FROM tat)::float8 AS tat,
           extract(epoch FROM clock_timestamp())::float8 AS now, paced_rate
      FROM rate_limiter WHERE id = 1
)
SELECT c.tat, c.now, c.paced_rate,
       (SELECT coalesce(sum(used), 0) FROM rate_minutes
         WHERE minute >= date_trunc('minute', now() - interval '1 hour')) AS hour,
       (SELECT coalesce(sum(used), 0) FROM rate_minutes
         WHERE minute >= date_trunc('minute', now() - interval '1 day')) AS day
  FROM cur c
""")

# Take the granted slots: the next free slot moves past them; the minute is counted.
_RATE_TAKE = sa.text("""
WITH t AS (
    UPDATE rate_limiter SET tat = to_timestamp(:tat) WHERE id = 1
)
INSERT INTO rate_minutes AS m (minute, used) VALUES (date_trunc('minute', now()), :n)
ON CONFLICT (minute) DO UPDATE SET used = m.used + :n
""")


def acquire_permits(conn: Connection, want: int, per_second: float, per_hour: int = 0,
                    per_day: int = 0, horizon: float = 1.0) -> Permits:
    """Permits for up to ``want`` sends, never more than the limits allow (0 = no limit):
    at most ``per_second`` sends per second, ``per_hour`` in any rolling 60 minutes and
    ``per_day`` in any rolling 24 hours, across every process. Per second, the slots lie
    on a grid of ``1/per_second`` aligned to the database clock's whole seconds, so every
    second holds at most ``per_second`` of them and the last leaves ``1/per_second`` for
    the relay's reply before the next second begins. Slots up to ``horizon`` seconds ahead
    are handed out; the caller waits for each. Unused ones go back with
    :func:`refund_permits` in the same transaction."""
    conn.execute(_RATE_LOCK)
    conn.execute(_PACE_UP, {"limit": float(per_second)})
    state = conn.execute(_RATE_STATE).one()
    observed = time.monotonic()  # the database's clock was read before this instant
    if state.paced_rate is not None:  # a throttling relay paces every process
        per_second = min(per_second or math.inf, float(state.paced_rate))
    n, retry_in = want, 1.0
    interval = 1.0 / per_second if per_second > 0 else 0.0
    start = max(state.tat, state.now)
    if interval:
        start = math.ceil(round(start * per_second, 6)) / per_second  # onto the grid
        ahead = start - state.now
        slots = int((horizon - ahead) // interval) + 1 if ahead <= horizon else 0
        n = min(n, slots)
        retry_in = max(0.05, ahead - horizon)
    for limit, used, window in ((per_hour, state.hour, 60.0), (per_day, state.day, 600.0)):
        if limit > 0 and limit - int(used) < n:
            n, retry_in = max(0, limit - int(used)), window
    if n <= 0:
        return Permits(0, retry_in=retry_in, rate=per_second)
    conn.execute(_RATE_TAKE, {"tat": start + interval * n, "n": n})
    return Permits(n, first_at=observed + max(0.0, start - state.now), interval=interval,
                   rate=per_second)


def refund_permits(conn: Connection, permits: Permits, used: int) -> None:
    """Give back the permits a claim did not need (same transaction as the grant, so the
    rate row is still locked by us and nobody was handed a later slot meanwhile)."""
    unused = permits.granted - used
    if unused <= 0:
        return
    conn.execute(sa.text("""
        WITH t AS (UPDATE rate_limiter SET tat = tat - make_interval(secs => :back)
                    WHERE id = 1)
        UPDATE rate_minutes SET used = greatest(0, used - :n)
         WHERE minute = date_trunc('minute', now())"""),
                 {"back": permits.interval * unused, "n": unused})


# The limits and what is used of them, for Queue health.
_RATE_USAGE = sa.text("""
SELECT (SELECT coalesce(sum(used), 0) FROM rate_minutes
         WHERE minute >= date_trunc('minute', now() - interval '1 minute')) AS last_minute,
       (SELECT coalesce(sum(used), 0) FROM rate_minutes
         WHERE minute >= date_trunc('minute', now() - interval '1 hour')) AS hour,
       (SELECT coalesce(sum(used), 0) FROM rate_minutes
         WHERE minute >= date_trunc('minute', now() - interval '1 day')) AS day
""")


def rate_usage(conn: Connection) -> dict[str, int]:
    """Sends counted against the limits: in the current and last minute, the rolling
    hour and the rolling day (whole minutes, so slightly more than the exact window)."""
    row = conn.execute(_RATE_USAGE).one()
    return {"last_minute": int(row.last_minute), "hour": int(row.hour), "day": int(row.day)}


def prune_rate_minutes(conn: Connection) -> None:
    """Forget minutes older than the longest window (maintenance)."""
    conn.execute(sa.text("DELETE FROM rate_minutes WHERE minute < now() - interval '25 hours'"))


# --- minute counters (migration 0035_minute_counters) -----------------------------------

#: How far back attempt_minutes is kept: Queue health's chart shows the last hour.
MINUTES_KEPT = timedelta(hours=2)
PRUNE_BATCH = 10_000

# One batch of counter rows older than the horizon, along the primary key (minute first);
# each batch is its own short statement, so no long lock is held on the rows the
# finishers upsert (which are all newer).
_PRUNE_MINUTES = sa.text("""
DELETE FROM attempt_minutes WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM attempt_minutes
     WHERE minute < now() - make_interval(secs => :kept) LIMIT :batch))
""")


def prune_minutes(conn: Connection, kept: timedelta = MINUTES_KEPT,
                  batch: int = PRUNE_BATCH) -> int:
    """Delete the attempt counters older than ``kept``, ``batch`` rows per statement, each
    committed on its own when ``conn`` is in autocommit; returns how many went."""
    total = 0
    while True:
        gone = conn.execute(_PRUNE_MINUTES, {"kept": kept.total_seconds(),
                                              "batch": batch}).rowcount
        total += gone
        if gone < batch:
            return total
