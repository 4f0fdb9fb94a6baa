"""The one request pipeline for transactional mail (docs/design.md §21, §26): ``POST /messages``,
``POST /messages/batch``, ``POST /verifications`` and a verification resend's new job all
end in :func:`submit`, which answers a list of requests with one statement in the common
case (docs/performance.md, "The transactional API").

A kind's rules come from its :class:`~webapp.domain.kinds.KindPolicy` (verification: one
live job per user, disposable addresses held, a request cooldown), never from its name.

The rules themselves are SQL in the engine's one way into the queue,
:mod:`workers.queue` (every job is created there): this module turns a kind's
policy into an :class:`~workers.queue.Ask` and each outcome into the API's
answer:

- an ``Idempotency-Key`` returns the message it created; used again for another user or
  address it is a 409;
- one live job per user for a kind with ``one_live``: asking again for the same address
  returns it (``live``); asking for a *different* address replaces a job still waiting
  (it ends ``cancelled``, the new one is queued: the user corrected their address), and
  is a 409 while the old one is being handed to the relay at that instant;
- a kind's dedupe window: inside it the message that opened it is returned;
- a kind with ``request_cooldown``: no second email to one address inside the cooldown
  since the last one was created, sent or resent, per user and per address whatever the
  user id or letter case (429 + Retry-After), the same rule as the resend buttons, so no
  endpoint walks around it;
- the backlog limit (docs/design.md §22): past ``SENDDOCK_MAX_BACKLOG`` an item is refused with 503.

Idle workers are woken once per statement and kind (a batch of 500 sends one NOTIFY).
Waking them only when no other job was waiting was tried and measured: the delivery
threads that found nothing to claim slept their full second while the queue grew, and
P7's p95 went from 0.7 s to 20 s during a burst (docs/performance.md, "The transactional
API").

Concurrency: the statement reads under its snapshot and inserts with ``ON CONFLICT DO
NOTHING``; a request that lost a race against one committed meanwhile inserts nothing and
is answered by the next round, which sees the winner. Eight parallel requests for one
user and kind therefore create one message (tests/integration/test_api_pipeline.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import flags, kinds, limits
from webapp.domain.errors import Conflict, DomainError, TooMany
from webapp.domain.flags import FLAG_DISPOSABLE, disposable_domain
from workers import queue
from workers.building.kinds import KindSpec
from workers.core.i18n import N_
from workers.core.settings import Config
from workers.core.states import (
    ACTIVE,
    BULK_STEP,
    CLAIMABLE,
    WAITING,
)

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


def _engine_ask(ask: Ask, config: Config, bulk: bool, replace: int | None,
                payload: dict[str, Any]) -> queue.Ask:
    """The ask as the engine's enqueue statement takes it: the kind's policy spelled out
    as rules. ``bulk``: a batch's items, queued :data:`~workers.core.states.BULK_STEP`
    behind the single requests of their class."""
    spec = ask.spec
    policy = kinds.policy(spec)
    found = (FLAG_DISPOSABLE,) if disposable_domain(ask.email) else ()
    return queue.Ask(
        kind=spec.name, email=ask.email, priority=spec.priority + (BULK_STEP if bulk else 0),
        payload=payload, user_ref=ask.user_ref, key=ask.key, flags=found,
        hold=bool(found) and held(spec, list(found), config), send_at=ask.send_at,
        dedupe_window=spec.dedupe_window,
        cooldown=kinds.cooldown_of(spec, config) if policy.request_cooldown else None,
        one_live=policy.one_live, replace_id=replace,
        audit=f"{'verification' if policy.one_live else 'message'}.request",
        version=queue.KindVersion(spec.version, spec.kind_class, spec.dedupe_window,
                                    spec.resend_cooldown))


_JOB = f"""SELECT {queue.JOB_COLUMNS} FROM delivery_jobs"""


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
    error that refuses it. One statement (:func:`workers.queue.enqueue`) when
    nothing raced; at most :data:`ROUNDS`. ``bulk`` (a batch call): new jobs queue behind
    the single requests of their class."""
    state = _Round(asks, bulk)
    for last in [False] * (ROUNDS - 1) + [True]:
        todo = state.open()
        if not todo:
            break
        results = queue.enqueue(conn, [
            _engine_ask(state.asks[i], config, bulk, state.replace.get(i), state.payload(i))
            for i in todo], actor=actor, max_backlog=config.max_backlog)
        for i, result in zip(todo, results, strict=True):
            _settle(conn, config, state, i, result, last)
    return [a if a is not None else Answer(error=_busy()) for a in state.answers]


def _settle(conn: Connection, config: Config, state: _Round, i: int,
            result: queue.Result, last: bool) -> None:
    """Record one ask's answer, or leave it open for the next round."""
    outcome, job, priority = result.outcome, result.job, result.priority
    ask = state.asks[i]
    if outcome == "new":
        state.answers[i] = Answer(job)
        return
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
        state.answers[i] = Answer(job, outcome, _cooldown(job, ask, float(result.wait or 0)))
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


def resend(conn: Connection, config: Config, spec: KindSpec, user_ref: str, email: str,
           payload: dict[str, Any], *, actor: str) -> dict[str, Any]:
    """A resend's new job (the last one is finished): the same address, the kind's rules
    but its dedupe window (a resend is asked for on purpose) and the per-address cooldown
    (another user id's mail to the address moments ago is a 429, as for a request). The
    caller checked the user's own cooldown, the suppression list and the backlog, and
    writes the audit row. Raises :class:`TooMany` or :class:`Conflict`."""
    policy = kinds.policy(spec)
    found = flags.flags_for(conn, email)
    result = queue.enqueue_one(conn, queue.Ask(
        kind=spec.name, email=email, priority=spec.priority, payload=payload,
        user_ref=user_ref, flags=tuple(found), hold=held(spec, found, config),
        cooldown=kinds.cooldown_of(spec, config) if policy.request_cooldown else None),
        actor=actor)
    if result.outcome == "new":
        assert result.job is not None
        return result.job
    if result.outcome == "cooldown":
        assert result.job is not None
        raise _cooldown(result.job, Ask(spec, user_ref, email, {}), float(result.wait or 0))
    raise Conflict(N_("another %(kind)s email for this user was just created; reload and "
                      "try again", kind=spec.name), fields={"user_id": N_("busy")})
