"""The one request pipeline for transactional mail (docs/design.md §21, §26): ``POST /messages``,
``POST /messages/batch``, ``POST /verifications`` and a verification resend's new job all
end in :func:`submit`, which answers a list of requests with one statement in the common
case (docs/performance.md, "The transactional API").

A kind's rules come from its :class:`~webapp.domain.kinds.KindPolicy` (verification: one
live job per user, disposable addresses held, a request cooldown), never from its name.

Guarantees kept here, all in the database so they hold across processes:

- an ``Idempotency-Key`` returns the message it created, whatever its state; used again for
  another user or address it is a 409 (``delivery_jobs_idempotency_idx``);
- one live job per user for a kind with ``one_live`` (``delivery_jobs_one_active_idx``);
  asking again for the same address returns it (``live``); asking for a *different*
  address replaces a job still waiting (it ends ``cancelled``, the new one is queued: the
  user corrected their address, as a new Postmark/SES send would go to the new one), and
  is a 409 while the old one is being handed to the relay at that instant;
- a kind's dedupe window: one message per user and window (``delivery_jobs_dedupe_excl``);
  inside it the message that opened it is returned (``dedupe_window``);
- a kind with ``request_cooldown``: no second email to the same address inside the
  cooldown since the last one was created, sent or resent (429 + Retry-After), the same
  rule as the resend buttons, so no endpoint walks around it;
- the backlog limit (docs/design.md §22): past ``SENDDOCK_MAX_BACKLOG`` an item is refused with 503;
- each new message is written with its audit row in the same statement, and idle workers
  are woken once per statement and kind (a batch of 500 sends one NOTIFY). Waking them
  only when no other job was waiting was tried and measured: the delivery threads that
  found nothing to claim slept their full second while the queue grew, and P7's p95 went
  from 0.7 s to 20 s during a burst (docs/performance.md, "The transactional API"). In
  autocommit (the API) the NOTIFY is a statement of its own just after the insert's: in
  the insert's commit it serialized every request's commit in PostgreSQL (:data:`_WAKE`).

Concurrency: the statement reads under its snapshot and inserts with ``ON CONFLICT DO
NOTHING``; a request that lost a race against one committed meanwhile inserts nothing and
is answered by the next round, which sees the winner. Eight parallel requests for one
user and kind therefore create one message (tests/integration/test_api_pipeline.py).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import kinds, limits
from webapp.domain.errors import Conflict, DomainError, TooMany
from webapp.domain.flags import FLAG_DISPOSABLE, disposable_domain
from workers.building.kinds import KindSpec
from workers.core import fastjson, pg
from workers.core.i18n import N_
from workers.core.settings import Config
from workers.core.states import (
    ACTIVE,
    BULK_STEP,
    CANCELLED,
    CLAIMABLE,
    HELD,
    PENDING,
    SENT,
    WAITING,
    sql_list,
)
from workers.delivery import queue

ROUNDS = 4  # statements at most per request: a lost race, a replaced address, a changed kind


@dataclass(frozen=True)
class Ask:
    """One message asked for, already validated."""

    spec: KindSpec
    user_ref: str
    email: str
    data: dict[str, Any]
    event: dict[str, Any] | None = None
    send_at: datetime | None = None
    key: str | None = None


@dataclass
class Answer:
    """What became of one :class:`Ask`: the job and why it was not new (``""``: it is), or
    the error that refused it."""

    job: dict[str, Any] | None = None
    why: str = ""
    error: DomainError | None = None


def held(spec: KindSpec, flags: list[str], config: Config) -> bool:
    """The hold rule (docs/design.md §21), written once: a kind that holds disposable addresses, a
    flagged address, and the ``hold`` policy."""
    return kinds.policy(spec).hold_disposable and FLAG_DISPOSABLE in flags \
        and config.disposable_policy == "hold"


def payload_of(ask: Ask) -> dict[str, Any]:
    """The job's payload: what the template sees and what support reads."""
    payload: dict[str, Any] = {"data": ask.data, "kind_version": ask.spec.version}
    if kinds.policy(ask.spec).verify_url:
        payload["verify_url"] = ask.data["verify_url"]
    if ask.event is not None:
        payload["event"] = ask.event
    if ask.send_at is not None:
        payload["send_at"] = ask.send_at.isoformat()
    return payload


def _kind_row(spec: KindSpec, k: int, config: Config, bulk: bool) -> dict[str, Any]:
    """What the statement needs of a kind (``k``: the items' reference to it): sent once
    per kind in a call, not per item. ``bulk``: a batch's items, queued
    :data:`~workers.core.states.BULK_STEP` behind the single requests of their class."""
    policy = kinds.policy(spec)
    row = {"k": k, "name": spec.name, "version": spec.version,
           "priority": spec.priority + (BULK_STEP if bulk else 0),
           "kind_class": spec.kind_class, "dedupe_window": spec.dedupe_window,
           "kind_cooldown": -1 if spec.resend_cooldown is None else spec.resend_cooldown,
           "one_live": policy.one_live,
           "cooldown": kinds.cooldown_of(spec, config) if policy.request_cooldown else None,
           "action": f"{'verification' if policy.one_live else 'message'}.request"}
    return {k: v for k, v in row.items() if v is not None}


def _row(ask: Ask, i: int, k: int, config: Config, replace: int | None,
         payload: dict[str, Any]) -> dict[str, Any]:
    """One ask as the statement reads it; what every ask of its kind shares is in
    :func:`_kind_row`. A missing key is NULL to jsonb_to_recordset (and the JSON is written
    without a walk looking for NaN when it has no null: workers.core.fastjson)."""
    row: dict[str, Any] = {"i": i, "k": k, "user_ref": ask.user_ref,
                           "email": ask.email, "payload": payload}
    if disposable_domain(ask.email):
        row["flags"] = [FLAG_DISPOSABLE]
        if held(ask.spec, row["flags"], config):
            row["hold"] = True
    if ask.key is not None:
        row["key"] = ask.key
    if "send_at" in payload:
        row["send_at"] = payload["send_at"]
    if replace is not None:
        row["replace_id"] = replace
    return row


_JOB = f"""SELECT {queue.JOB_COLUMNS} FROM delivery_jobs"""
# A new job comes back as columns, without its payload: the payload is the one the
# statement was given (as jsonb it is the same value), and reading 500 of them back as
# JSON was the largest part of a batch's Python (issue 27).
_NEW_COLUMNS = queue.job_columns(without=("payload",))
_NEW_NAMES = [name for name in queue.JOB_FIELDS if name != "payload"]

# One statement for a list of asks (one ask: a single POST). Each ask's earlier answer is
# looked up by the same predicates as the constraints that guard the insert; the asks left
# are admitted while the backlog has room, inserted (a conflict with a request committed
# after this statement's snapshot inserts nothing: the caller's next round answers it),
# audited in the same statement, and workers woken (one NOTIFY per kind). A kind
# changed since the caller read it (its version, class, window or cooldown) answers
# ``stale`` and is read again. A replaced job (another address) is cancelled first: the
# insert reads `replaced`, so the old job has left the one-live index before the new row
# is checked against it.
_SUBMIT = f"""
WITH item AS (
    SELECT x.i, k.name AS kind, k.priority, k.version, k.kind_class, k.dedupe_window,
           k.kind_cooldown, x.user_ref, x.email, x.key, x.payload,
           coalesce(x.flags, '[]') AS flags, coalesce(x.hold, false) AS hold, x.send_at,
           k.one_live, k.cooldown, x.replace_id, k.action
      FROM jsonb_to_recordset(CAST(:items AS jsonb)) AS x(
               i int, k int, user_ref text, email text, key text, payload jsonb,
               flags jsonb, hold boolean, send_at timestamptz, replace_id bigint)
      JOIN jsonb_to_recordset(CAST(:kinds AS jsonb)) AS k(
               k int, name text, priority int, version int, kind_class text,
               dedupe_window int, kind_cooldown int, one_live boolean, cooldown int,
               action text)
        ON k.k = x.k
), stale AS (
    SELECT i.i FROM item i
     WHERE NOT EXISTS (SELECT 1 FROM kinds k
                        WHERE k.name = i.kind AND k.version = i.version AND k.active
                          AND k.class = i.kind_class AND k.dedupe_window = i.dedupe_window
                          AND coalesce(k.resend_cooldown, -1) = i.kind_cooldown)
), earlier AS (
    SELECT i.i, e.id, e.why, e.wait FROM item i CROSS JOIN LATERAL (
        SELECT * FROM (
            (SELECT j.id, 'idempotency_key' AS why, NULL::float8 AS wait, 1 AS rank
               FROM delivery_jobs j
              WHERE i.key IS NOT NULL AND j.kind = i.kind AND j.idempotency_key = i.key)
            UNION ALL
            (SELECT j.id, 'live', NULL, 2 FROM delivery_jobs j
              WHERE i.one_live AND j.kind = i.kind AND j.user_ref = i.user_ref
                AND j.status IN {sql_list(ACTIVE)} AND j.id IS DISTINCT FROM i.replace_id)
            UNION ALL
            (SELECT j.id, 'dedupe_window', NULL, 3 FROM delivery_jobs j
              WHERE i.dedupe_window > 0 AND j.kind = i.kind AND j.user_ref = i.user_ref
                AND j.dedupe_until > now() AND j.status <> '{CANCELLED}'
              ORDER BY j.created_at DESC, j.id DESC LIMIT 1)
            UNION ALL
            (SELECT l.id, 'cooldown',
                    extract(epoch FROM l.last + make_interval(secs => i.cooldown) - now()), 4
               FROM (SELECT j.id, j.email,
                            greatest(j.created_at,
                                     CASE WHEN j.status = '{SENT}' THEN j.finished_at END,
                                     CAST(j.payload ->> 'resent_at' AS timestamptz)) AS last
                       FROM delivery_jobs j
                      WHERE i.cooldown IS NOT NULL AND j.kind = i.kind
                        AND j.user_ref = i.user_ref AND j.status <> '{CANCELLED}'
                      ORDER BY j.created_at DESC, j.id DESC LIMIT 1) l
              WHERE lower(l.email) = lower(i.email)
                AND l.last + make_interval(secs => i.cooldown) > now())
        ) c ORDER BY rank LIMIT 1) e
     WHERE i.i NOT IN (SELECT i FROM stale)
), fresh AS (
    -- The correlation id is also how the rows the insert returns find their ask.
    SELECT i.*, row_number() OVER (ORDER BY i.i) AS nth,
           gen_random_uuid() AS correlation_id FROM item i
     WHERE i.i NOT IN (SELECT i FROM stale) AND i.i NOT IN (SELECT i FROM earlier)
), admitted AS (
    SELECT f.* FROM fresh f
     WHERE ({queue.TRANSACTIONAL_BACKLOG_COUNT}) + f.nth <= :max_backlog
/*REPLACED*/), inserted AS (
    INSERT INTO delivery_jobs (kind, priority, status, email, user_ref, idempotency_key,
                               payload, flags, requested_by, available_at, dedupe_until,
                               correlation_id)
    SELECT a.kind, a.priority, CASE WHEN a.hold THEN '{HELD}' ELSE '{PENDING}' END, a.email,
           a.user_ref, a.key, a.payload,
           a.flags || CASE WHEN EXISTS (SELECT 1 FROM suppressions s
                                          WHERE s.email = lower(a.email))
                           THEN '["suppressed"]'::jsonb ELSE '[]'::jsonb END,
           :actor, coalesce(a.send_at, now()),
           CASE WHEN a.dedupe_window > 0 THEN now() + make_interval(secs => a.dedupe_window)
           END, a.correlation_id
      FROM admitted a
     WHERE /*ADMIT*/
    ON CONFLICT DO NOTHING
    RETURNING {_NEW_COLUMNS}
), audited AS (
    INSERT INTO audit_log (actor, action, target, details)
    SELECT :actor, a.action, 'user:' || a.user_ref,
           jsonb_build_object('kind', a.kind, 'email', a.email,
                              'send_at', a.payload -> 'send_at',
                              'event', a.payload -> 'event' -> 'name',
                              'event_id', a.payload -> 'event' -> 'id',
                              'job_id', n.id, 'status', n.status, 'flags', n.flags,
                              'replaced_job_id', a.replace_id)
      FROM inserted n JOIN admitted a ON a.correlation_id = CAST(n.correlation_id AS uuid)
    RETURNING 1
), woken AS (
    SELECT k.kind, CASE WHEN :notify THEN pg_notify('senddock_jobs', k.kind) END
      FROM (SELECT DISTINCT n.kind FROM inserted n
             WHERE n.status = '{PENDING}' AND n.available_at <= now()) k
)
SELECT i.i,
       CASE WHEN s.i IS NOT NULL THEN 'stale' WHEN e.id IS NOT NULL THEN e.why
            WHEN n.id IS NOT NULL THEN 'new'
            WHEN f.i IS NOT NULL AND a.i IS NULL THEN 'full' ELSE 'busy' END AS outcome,
       e.wait, {", ".join(f"n.{c}" for c in _NEW_NAMES)},
       (SELECT to_jsonb(d) FROM (SELECT {queue.JOB_COLUMNS}, priority FROM delivery_jobs
                                  WHERE id = e.id) d) AS earlier,
       (SELECT array_agg(kind) FROM woken) AS woken
  FROM item i
  LEFT JOIN stale s ON s.i = i.i
  LEFT JOIN earlier e ON e.i = i.i
  LEFT JOIN fresh f ON f.i = i.i
  LEFT JOIN admitted a ON a.i = i.i
  LEFT JOIN inserted n ON CAST(n.correlation_id AS uuid) = a.correlation_id
 ORDER BY i.i
"""
# Only when an ask replaces a job: an UPDATE, even of no row, runs the jobs table's
# statement triggers (counts, outcomes, event webhooks), which the common case skips.
_REPLACED = f"""), replaced AS (
    UPDATE delivery_jobs j
       SET status = '{CANCELLED}', finished_at = now(), last_error_class = '{CANCELLED}',
           last_error = 'replaced: the user asked again for another address'
      FROM admitted a
     WHERE j.id = a.replace_id AND j.status IN {sql_list(WAITING)}
    RETURNING j.id
"""


def _driver(sql: str) -> str:
    """``:name`` parameters as psycopg's ``%(name)s`` (the statements run on the driver:
    :func:`workers.core.pg.driver_rows`)."""
    assert "%" not in sql
    return re.sub(r"(?<![:\w]):(items|kinds|actor|max_backlog|notify)\b", r"%(\1)s", sql)


_SUBMIT_NEW = _driver(_SUBMIT.replace("/*REPLACED*/", "").replace("/*ADMIT*/", "true"))
_SUBMIT_REPLACING = _driver(_SUBMIT.replace("/*REPLACED*/", _REPLACED).replace(
    "/*ADMIT*/", "a.replace_id IS NULL OR a.replace_id IN (SELECT id FROM replaced)"))

# The NOTIFY of an autocommitted intake statement, sent just after it in a transaction of
# its own. In the statement it serialized every request's commit: PostgreSQL's
# PreCommit_Notify holds one database-wide lock until the commit is flushed, so no two of
# those commits could share a WAL flush (pgbench, 16 clients, an insert each, this 2-core
# machine: 600 to 810 commits/s without the NOTIFY, 165 to 190 with it). A transaction
# that only notifies writes nothing and is not flushed: the lock is held for microseconds.
_WAKE = "SELECT pg_notify('senddock_jobs', k) FROM unnest(CAST(%(kinds)s AS text[])) k"

_TIMES = ("created_at", "available_at", "finished_at")


def _job(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    for name in _TIMES:
        if isinstance(value.get(name), str):
            value[name] = datetime.fromisoformat(value[name])
    return value


def _same_request(job: dict[str, Any], ask: Ask) -> DomainError | None:
    if job["user_ref"] != ask.user_ref or job["email"].lower() != ask.email.lower():
        return Conflict("this Idempotency-Key was already used for a different request "
                        f"(user {job['user_ref']}, job {job['id']})",
                        fields={"Idempotency-Key": "already used for another request"})
    return None


def _cooldown(job: dict[str, Any], ask: Ask, wait: float) -> TooMany:
    seconds = max(1, math.ceil(wait))
    return TooMany(N_("an email of kind %(kind)s was sent to this address moments ago; you "
                      "can ask again in %(seconds)s s", kind=ask.spec.name,
                      seconds=str(seconds)), retry_after=seconds, job_id=job["id"])


def _in_flight(job: dict[str, Any]) -> Conflict:
    return Conflict(N_("the email to %(email)s is being handed to the mail server right now; "
                       "ask again in a few seconds to send it to the new address",
                       email=job["email"]),
                    fields={"email": N_("another address is being sent to right now")},
                    retry_after=5, job_id=job["id"])


def _busy() -> Conflict:
    return Conflict("another request for this user is in progress; try again",
                    fields={"user_id": "busy"})


class _Round:
    """The asks still open and what each needs on the next statement."""

    def __init__(self, asks: list[Ask], bulk: bool) -> None:
        self.asks = list(asks)
        self.bulk = bulk
        self.answers: list[Answer | None] = [None] * len(asks)
        self.replace: dict[int, int] = {}
        self.payloads: dict[int, dict[str, Any]] = {}

    def payload(self, i: int) -> dict[str, Any]:
        """The ask's payload, built once (a new job is answered with it)."""
        payload = self.payloads.get(i)
        if payload is None or payload["kind_version"] != self.asks[i].spec.version:
            payload = self.payloads[i] = payload_of(self.asks[i])
        return payload

    def open(self) -> list[int]:
        return [i for i, a in enumerate(self.answers) if a is None]


def submit(conn: Connection, config: Config, asks: list[Ask], *,
           actor: str, bulk: bool = False) -> list[Answer]:
    """Answer every ask (in order): a new job, the earlier job that answers it, or the
    error that refuses it. One statement when nothing raced; at most :data:`ROUNDS`.
    ``bulk`` (a batch call): new jobs queue behind the single requests of their class."""
    state = _Round(asks, bulk)
    # In autocommit each statement is committed when it returns, and the workers are woken
    # by a statement of its own (:data:`_WAKE`); in the caller's transaction the statement
    # notifies, delivered at that transaction's commit.
    committed = bool(conn.connection.driver_connection.autocommit)  # type: ignore[union-attr]
    for last in [False] * (ROUNDS - 1) + [True]:
        todo = state.open()
        if not todo:
            break
        statement = _SUBMIT_REPLACING if state.replace else _SUBMIT_NEW
        specs: dict[int, int] = {}  # id(spec) -> k: an ask's kind, read once per call
        kind_rows: list[dict[str, Any]] = []
        items: list[dict[str, Any]] = []
        for i in todo:
            ask = state.asks[i]
            k = specs.get(id(ask.spec))
            if k is None:
                k = specs[id(ask.spec)] = len(kind_rows)
                kind_rows.append(_kind_row(ask.spec, k, config, bulk))
            payload = state.payload(i)
            items.append(_row(ask, i, k, config, state.replace.get(i), payload))
        rows = pg.driver_rows(conn, statement, {
            "items": fastjson.dumps(items, default=str) or json.dumps(items, default=str),
            "kinds": json.dumps(kind_rows), "actor": actor,
            "max_backlog": config.max_backlog, "notify": not committed})
        if committed and rows and rows[0]["woken"]:
            pg.driver_rows(conn, _WAKE, {"kinds": rows[0]["woken"]})
        for row in rows:
            _settle(conn, config, state, row, last)
    return [a if a is not None else Answer(error=_busy()) for a in state.answers]


def _settle(conn: Connection, config: Config, state: _Round, row: Any, last: bool) -> None:
    """Record one statement row's answer, or leave the ask open for the next round."""
    i, outcome = row["i"], row["outcome"]
    ask = state.asks[i]
    if outcome == "new":
        state.answers[i] = Answer({**{c: row[c] for c in _NEW_NAMES},
                                   "payload": state.payloads[i]})
        return
    job = _job(row["earlier"])
    priority = job.pop("priority") if job is not None else None
    if outcome == "idempotency_key":
        assert job is not None
        state.answers[i] = Answer(job, outcome, _same_request(job, ask))
    elif outcome == "live" and job is not None and job["email"].lower() != ask.email.lower():
        if job["status"] in WAITING and i not in state.replace and not last:
            state.replace[i] = int(job["id"])  # another address: replace it, next round
        else:
            state.answers[i] = Answer(job, outcome, _in_flight(job))
    elif outcome in ("live", "dedupe_window"):
        state.answers[i] = Answer(job, outcome)
        if job is not None and not state.bulk and priority is not None \
                and priority > ask.spec.priority and job["status"] in CLAIMABLE:
            # Imported, and now asked for by the user: it stops waiting behind the import.
            queue.hurry(conn, int(job["id"]), ask.spec.priority)
    elif outcome == "cooldown":
        assert job is not None
        state.answers[i] = Answer(job, outcome, _cooldown(job, ask, float(row["wait"])))
    elif outcome == "stale":
        try:
            state.asks[i] = Ask(**{**ask.__dict__, "spec": kinds.active(conn, ask.spec.name,
                                                                        fresh=True)})
        except DomainError as exc:
            state.answers[i] = Answer(error=exc)
    elif outcome == "full":
        try:
            limits.check_backlog(conn, config)
        except DomainError as exc:
            state.answers[i] = Answer(error=exc)
    elif i in state.replace:
        # The replaced job left the waiting states meanwhile: being sent now (say so), or
        # finished (nothing to replace any more: the next round asks afresh).
        current = conn.execute(sa.text(f"{_JOB} WHERE id = :id"),
                               {"id": state.replace[i]}).mappings().first()
        if current is not None and current["status"] in ACTIVE:
            state.answers[i] = Answer(dict(current), "live", _in_flight(dict(current)))
        else:
            state.replace.pop(i)
