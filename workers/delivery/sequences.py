"""The sequence advancer (docs/sequences.md): moves due enrollments through their
steps, making one delivery job per (enrollment, email step).

An enrollment is at a step (``step_id``) due at ``due_at``. Each tick, in one transaction:

1. lock a batch of due enrollments (``status = 'active' AND due_at <= now()``, the
   database's clock) along ``sequence_enrollments_due_idx``, skipping rows another
   advancer holds (``FOR UPDATE SKIP LOCKED``);
2. for each, perform steps while they are due: exit on a goal event, unsubscribe,
   suppression or a hard bounce (or leaving the trigger's list); an email step becomes a
   job (:func:`workers.queue.enqueue_due_steps`, the one way into the queue),
   a wait step moves ``due_at`` ahead, a condition continues, skips ahead or exits;
3. insert the jobs set-based, guarded by ``delivery_jobs_idempotency_idx`` on the key
   ``seq:<enrollment>:<step>`` (ON CONFLICT DO NOTHING), record the visits (primary key
   (enrollment, step)), and write the enrollments' new step and due time.

The job, its visit and the enrollment's move commit together, or none of them does (a
crash rolls the whole tick back, the next tick does it again): each (enrollment, step) has
at most one job, and a step due before a crash is done after it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from workers import queue

log = logging.getLogger("senddock.worker")

KIND = "sequence"
#: Enrollments taken per tick (one transaction).
BATCH = 500
#: Steps one enrollment may perform in one tick (a sequence with no wait runs through).
MAX_HOPS = 50

# The due enrollments, oldest due first, from the partial index on (due_at, id).
DUE = sa.text("""
SELECT e.id, e.sequence_id, e.subscriber_id, e.step_id, e.entered_at
  FROM sequence_enrollments e
 WHERE e.status = 'active' AND e.due_at <= now()
 ORDER BY e.due_at, e.id
 LIMIT :batch
   FOR UPDATE SKIP LOCKED
""")

_SEQUENCES = sa.text("""
SELECT id, status, trigger_type, list_id, goal_event FROM sequences WHERE id = ANY(:ids)
""")

_STEPS = sa.text("""
SELECT id, sequence_id, position, type, wait_seconds, window_start, window_end, condition,
       if_false, skip, removed_at IS NOT NULL AS removed
  FROM sequence_steps WHERE sequence_id = ANY(:ids) ORDER BY sequence_id, position, id
""")

# Each enrolled person's state: what makes them exit, and what conditions read.
_PEOPLE = sa.text("""
SELECT s.id, s.status, s.attributes,
       (SELECT x.reason FROM suppressions x WHERE x.email = lower(s.email)) AS suppression
  FROM subscribers s WHERE s.id = ANY(:ids)
""")

_MEMBERS = sa.text("""
SELECT list_id, subscriber_id FROM memberships
 WHERE subscriber_id = ANY(:subscribers) AND list_id = ANY(:lists)
""")

# Events of the enrolled people since the earliest enrollment of the batch.
_EVENTS = sa.text("""
SELECT subscriber_id, name, at FROM events
 WHERE subscriber_id = ANY(:ids) AND at >= :since
""")

# What each due enrollment did with its messages: per email step, opened (an open or a
# click: a click proves the message was opened) and clicked. Read only when a sequence of
# the batch has an opened/clicked condition.
_SEEN = sa.text("""
SELECT v.enrollment_id, v.step_id, bool_or(x.kind = 'click') AS clicked
  FROM sequence_visits v JOIN sequence_events x ON x.job_id = v.job_id
 WHERE v.enrollment_id = ANY(:ids) AND v.job_id IS NOT NULL
 GROUP BY v.enrollment_id, v.step_id
""")

# --- the advancer ----------------------------------------------------------------------

_VISITS = sa.text("""
INSERT INTO sequence_visits (enrollment_id, step_id, job_id, outcome, at)
SELECT * , now() FROM unnest(CAST(:enrollments AS bigint[]), CAST(:steps AS bigint[]),
                           CAST(:jobs AS bigint[]), CAST(:outcomes AS text[]))
ON CONFLICT (enrollment_id, step_id) DO NOTHING
""")

_MOVE = sa.text("""
UPDATE sequence_enrollments e
   SET status = m.status, exit_reason = m.reason, step_id = m.step_id, due_at = m.due_at,
       finished_at = CASE WHEN m.status IN ('done', 'exited') THEN now() END
  FROM unnest(CAST(:ids AS bigint[]), CAST(:statuses AS text[]), CAST(:reasons AS text[]),
              CAST(:steps AS bigint[]), CAST(:dues AS timestamptz[]))
       AS m(id, status, reason, step_id, due_at)
 WHERE e.id = m.id
""")


@dataclass
class Step:
    id: int
    type: str
    wait_seconds: int | None
    window_start: int | None
    window_end: int | None
    condition: dict[str, Any] | None
    if_false: str | None
    skip: int
    position: int
    removed: bool


@dataclass
class Plan:
    """What one tick decided, written set-based at its end."""

    sends: list[tuple[int, int]] = field(default_factory=list)
    visits: list[tuple[int, int, str]] = field(default_factory=list)
    moves: list[tuple[int, str, str | None, int | None, datetime]] = field(
        default_factory=list)


def next_window(at: datetime, start: int, end: int) -> datetime:
    """``at`` if its UTC hour is inside the window [start:00, end:00) (which may wrap past
    midnight), else the window's next start."""
    hour = at.hour
    inside = start <= hour < end if start < end else (hour >= start or hour < end)
    if inside:
        return at
    begin = at.replace(hour=start, minute=0, second=0, microsecond=0)
    return begin if begin > at else begin + timedelta(days=1)


def _after(steps: list[Step], current: Step, skip: int = 1) -> Step | None:
    """The ``skip``-th live step after ``current`` (by position), or None at the end."""
    later = [s for s in steps if not s.removed and (s.position, s.id) > (current.position,
                                                                        current.id)]
    return later[skip - 1] if len(later) >= skip else None


def _email_before(steps: list[Step], current: Step) -> Step | None:
    """The last live email step before ``current`` (by position): "the previous email"."""
    earlier = [s for s in steps if not s.removed and s.type == "email"
               and (s.position, s.id) < (current.position, current.id)]
    return earlier[-1] if earlier else None


def _condition_holds(cond: dict[str, Any], person: Any, events: list[tuple[str, datetime]],
                     entered_at: datetime, seen: set[str]) -> bool:
    """Whether ``cond`` holds; ``seen``: what the person did with the previous email's
    message ("opened", "clicked")."""
    test = cond.get("test")
    if test in ("opened", "clicked"):
        return test in seen
    if test == "attribute":
        value = (person.attributes or {}).get(str(cond.get("attribute", "")))
        return value is not None and str(value) == str(cond.get("value", ""))
    if test == "event":
        name = cond.get("event")
        return any(n == name and at >= entered_at for n, at in events)
    return False


#: Batches one tick may run back to back while each finds a full batch due.
BATCHES_PER_TICK = 20


def tick(engine: Engine, batch: int = BATCH, batches: int = BATCHES_PER_TICK) -> int:
    """Advance due enrollments, one transaction per batch, until a batch finds fewer than
    ``batch`` due or ``batches`` ran; the number of enrollments moved."""
    moved = 0
    for _ in range(batches):
        with engine.begin() as conn:
            n = advance(conn, batch)
        moved += n
        if n < batch:
            break
    return moved


def advance(conn: Connection, batch: int = BATCH) -> int:
    """Advance up to ``batch`` due enrollments in the caller's transaction."""
    due = conn.execute(DUE, {"batch": batch}).all()
    if not due:
        return 0
    now: datetime = conn.execute(sa.text("SELECT now()")).scalar_one()
    seq_ids = sorted({r.sequence_id for r in due})
    sequences = {r.id: r for r in conn.execute(_SEQUENCES, {"ids": seq_ids})}
    steps: dict[int, list[Step]] = {}
    for r in conn.execute(_STEPS, {"ids": seq_ids}):
        steps.setdefault(r.sequence_id, []).append(Step(
            r.id, r.type, r.wait_seconds, r.window_start, r.window_end, r.condition,
            r.if_false, r.skip, r.position, r.removed))
    people_ids = sorted({r.subscriber_id for r in due})
    people = {r.id: r for r in conn.execute(_PEOPLE, {"ids": people_ids})}
    lists = sorted({s.list_id for s in sequences.values() if s.list_id is not None})
    members = {(r.list_id, r.subscriber_id) for r in conn.execute(
        _MEMBERS, {"subscribers": people_ids, "lists": lists})} if lists else set()
    events: dict[int, list[tuple[str, datetime]]] = {}
    for r in conn.execute(_EVENTS, {"ids": people_ids,
                                    "since": min(r.entered_at for r in due)}):
        events.setdefault(r.subscriber_id, []).append((r.name, r.at))
    seen: dict[tuple[int, int], set[str]] = {}
    if any((s.condition or {}).get("test") in ("opened", "clicked")
           for listed in steps.values() for s in listed):
        for r in conn.execute(_SEEN, {"ids": [e.id for e in due]}):
            seen[(r.enrollment_id, r.step_id)] = {"opened", "clicked"} if r.clicked \
                else {"opened"}
    plan = Plan()
    for e in due:
        _walk(e, sequences[e.sequence_id], steps.get(e.sequence_id, []),
              people.get(e.subscriber_id), members, events.get(e.subscriber_id, []),
              seen, now, plan)
    jobs = queue.enqueue_due_steps(conn, plan.sends)
    if plan.visits:
        conn.execute(_VISITS, {
            "enrollments": [v[0] for v in plan.visits], "steps": [v[1] for v in plan.visits],
            "jobs": [jobs.get((v[0], v[1])) for v in plan.visits],
            "outcomes": [v[2] for v in plan.visits]})
    conn.execute(_MOVE, {
        "ids": [m[0] for m in plan.moves], "statuses": [m[1] for m in plan.moves],
        "reasons": [m[2] for m in plan.moves], "steps": [m[3] for m in plan.moves],
        "dues": [m[4] for m in plan.moves]})
    return len(due)


def _exit_reason(seq: Any, person: Any, members: set[tuple[int, int]],
                 events: list[tuple[str, datetime]], e: Any) -> str | None:
    if person is None:
        return "deleted"
    if person.suppression == "bounced":
        return "hard_bounce"
    if person.suppression is not None:
        return "suppressed"
    if person.status != "active":
        return "unsubscribed"
    if seq.list_id is not None and (seq.list_id, e.subscriber_id) not in members:
        return "left_list"
    if seq.goal_event and any(n == seq.goal_event and at >= e.entered_at for n, at in events):
        return "goal"
    return None


def _walk(e: Any, seq: Any, steps: list[Step], person: Any, members: set[tuple[int, int]],
          events: list[tuple[str, datetime]], seen: dict[tuple[int, int], set[str]],
          now: datetime, plan: Plan) -> None:
    """Perform ``e``'s due steps into ``plan``."""
    by_id = {s.id: s for s in steps}
    current = by_id.get(e.step_id) if e.step_id is not None else None
    if current is not None and current.removed:
        current = _after(steps, current)
    reason = _exit_reason(seq, person, members, events, e)
    if reason is not None:
        plan.moves.append((e.id, "exited", reason, e.step_id, now))
        return
    for _ in range(MAX_HOPS):
        if current is None:
            plan.moves.append((e.id, "done", None, None, now))
            return
        if current.type == "email":
            plan.sends.append((e.id, current.id))
            plan.visits.append((e.id, current.id, "sent"))
            current = _after(steps, current)
        elif current.type == "wait":
            plan.visits.append((e.id, current.id, "waited"))
            due = now + timedelta(seconds=current.wait_seconds or 0)
            if current.window_start is not None and current.window_end is not None:
                due = next_window(due, current.window_start, current.window_end)
            following = _after(steps, current)
            if due > now:
                plan.moves.append((e.id, "active", None,
                                   following.id if following else None, due))
                return
            current = following
        else:
            previous = _email_before(steps, current)
            holds = _condition_holds(current.condition or {}, person, events, e.entered_at,
                                     seen.get((e.id, previous.id), set()) if previous
                                     else set())
            if holds:
                plan.visits.append((e.id, current.id, "continued"))
                current = _after(steps, current)
            elif current.if_false == "exit":
                plan.visits.append((e.id, current.id, "exited"))
                plan.moves.append((e.id, "exited", "condition", current.id, now))
                return
            else:
                plan.visits.append((e.id, current.id, "skipped"))
                current = _after(steps, current, current.skip + 1)
    plan.moves.append((e.id, "active", None, current.id if current else None, now))

