"""Verification emails (docs/design.md §21): request, resend with a cooldown, disposable-domain
policy, and the history support staff read. Shared by the API and the support console.

Guarantees kept here:

- one live verification job per user: asking again (or with the same ``Idempotency-Key``)
  returns the existing job instead of adding one;
- a resend is refused inside the cooldown (``TooMany`` → 429 + ``Retry-After``), reuses a
  still-waiting job instead of adding a row, and is always written to the audit log with
  who asked, in the same transaction;
- a disposable-domain address is flagged on the job, and held for support under the
  ``hold`` policy; support may release (→ ``pending``) or drop (→ ``cancelled``) it.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Connection

from webapp.domain import audit, flags, intake, kinds, limits, queue_reads
from webapp.domain import fields as rules
from webapp.domain.errors import Conflict, DomainError, Invalid, NotFound, TooMany
from webapp.domain.lists import check_email
from webapp.i18n import dt
from workers import queue
from workers.after_acceptance import feedback
from workers.core.addresses import domain_of
from workers.core.i18n import N_, word
from workers.core.settings import Config
from workers.core.states import (
    BOUNCED,
    CANCELLED,
    FAILED,
    HELD,
    PENDING,
    RETRY,
    SENDING,
    SENT,
    SKIPPED,
)
from workers.delivery.classify import ReplyClass, humanize

KIND = "verification"
FLAG_DISPOSABLE, FLAG_SUPPRESSED = flags.FLAG_DISPOSABLE, flags.FLAG_SUPPRESSED
MAX_USER_ID = 255
MIN_INT_USER_ID, MAX_INT_USER_ID = -(2**63), 2**63 - 1
MAX_URL = 2048
MAX_IDEMPOTENCY_KEY = 255


@dataclass(frozen=True)
class VerificationRequest:
    user_ref: str
    email: str
    verify_url: str


# --- input -----------------------------------------------------------------------------

def check_user_id(raw: Any) -> str:
    """The SaaS's user id as text: a non-empty string or an integer, else :class:`Invalid`."""
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        message = "required" if raw is None else "must be a string or an integer"
        raise Invalid(f"user_id {message}", fields={"user_id": message})
    if isinstance(raw, int) and not MIN_INT_USER_ID <= raw <= MAX_INT_USER_ID:
        problem = "an integer user_id must fit in 64 bits"
        raise Invalid(f"user_id: {problem}", fields={"user_id": problem})
    text = str(raw)
    if not text.strip():
        raise Invalid("user_id is required", fields={"user_id": "required"})
    if len(text) > MAX_USER_ID or rules.control_character(text):
        problem = f"at most {MAX_USER_ID} characters, no control characters"
        raise Invalid(f"user_id must be {problem}", fields={"user_id": problem})
    return text.strip()


def check_verify_url(raw: Any) -> str:
    """An absolute http(s) URL without spaces, else :class:`Invalid`."""
    if not isinstance(raw, str) or not raw.strip():
        raise Invalid("verify_url is required", fields={"verify_url": "required"})
    url = raw
    # The pattern (published in the OpenAPI document) requires the scheme and a host part.
    if not rules.matches(rules.HTTP_URL, url) or len(url) > MAX_URL:
        problem = f"must be an absolute http:// or https:// URL (at most {MAX_URL} characters)"
        raise Invalid(f"verify_url {problem}", fields={"verify_url": problem})
    return url


def parse_request(data: dict[str, Any]) -> VerificationRequest:
    """Validate a request body; one :class:`Invalid` names every offending field."""
    fields: dict[str, str] = {}
    values: dict[str, str] = {}
    for name, check in (("user_id", check_user_id), ("email", check_email),
                        ("verify_url", check_verify_url)):
        try:
            values[name] = check(data.get(name))
        except Invalid as exc:
            fields[name] = exc.fields.get(name, exc.message)
    if fields:
        raise Invalid("invalid verification request: " + "; ".join(
            f"{name}: {problem}" for name, problem in fields.items()), fields=fields)
    return VerificationRequest(values["user_id"], values["email"], values["verify_url"])


def check_idempotency_key(raw: str | None, *, field: str = "Idempotency-Key") -> str | None:
    """The ``Idempotency-Key`` header (None when absent), else :class:`Invalid` naming
    ``field`` (a batch item's ``idempotency_key``)."""
    if raw is None:
        return None
    key = raw.strip()
    if len(key) > MAX_IDEMPOTENCY_KEY or not rules.matches(rules.PRINTABLE_ASCII_NOT_BLANK, key):
        problem = f"1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters"
        raise Invalid(f"{field} must be {problem}", fields={field: problem})
    return key


# --- flags -----------------------------------------------------------------------------
# (what they are: webapp.domain.flags; how support reads them: below)

@dataclass(frozen=True)
class FlagView:
    flag: str
    label: str
    reason: str


def explain_flags(job: dict[str, Any]) -> list[FlagView]:
    """Each of the job's flags with a sentence a non-engineer understands."""
    views = []
    for flag in job.get("flags") or []:
        if flag == FLAG_DISPOSABLE:
            listed = flags.disposable_domain(job["email"]) or domain_of(job["email"])
            reason = N_("%(domain)s is a throwaway-mail domain on the disposable-email-domains "
                        "list; the email is held until support releases or drops it.",
                        domain=listed) if job["status"] == HELD else \
                N_("%(domain)s is a throwaway-mail domain on the disposable-email-domains "
                   "list.", domain=listed)
            views.append(FlagView(flag, N_("Disposable address"), reason))
        elif flag == FLAG_SUPPRESSED:
            views.append(FlagView(flag, N_("Suppressed address"), N_(
                "the address was on the suppression list when the email was requested, so "
                "it will not be sent.")))
        else:
            views.append(FlagView(str(flag), str(flag), ""))
    return views


# --- request, resend, release, drop ----------------------------------------------------

def request(conn: Connection, config: Config, req: VerificationRequest, *,
            idempotency_key: str | None = None, actor: str) -> tuple[dict[str, Any], bool]:
    """``POST /verifications``: a thin adapter over the one pipeline (the built-in kind's
    policy does the rest, :mod:`webapp.domain.intake`). Returns (job, existing)."""
    ask = intake.Ask(kinds.active(conn, KIND), req.user_ref, req.email,
                     {"verify_url": req.verify_url}, key=idempotency_key)
    answer = intake.submit(conn, config, [ask], actor=actor)[0]
    if answer.error is not None:
        raise answer.error
    assert answer.job is not None
    return answer.job, bool(answer.why)


def _check_resendable(conn: Connection, latest: dict[str, Any] | None, user_ref: str) -> None:
    if latest is None:
        raise NotFound(N_("no verification email was ever requested for user %(user)s",
                          user=user_ref), fields={"user_id": N_("unknown user")})
    if latest["status"] == HELD:
        raise Conflict(N_("the last verification email is held for support (disposable "
                          "address): release or drop it instead of resending"),
                       fields={"user_id": N_("held")}, job_id=latest["id"])
    suppression = flags.suppression(conn, latest["email"])
    if suppression is not None:
        raise Conflict(N_("%(email)s is on the suppression list (%(reason)s), so a resend "
                          "would not be delivered; an admin must remove it from the list "
                          "first", email=latest["email"], reason=word(suppression["reason"])),
                       fields={"user_id": N_("address suppressed")}, job_id=latest["id"])
    left = float(latest["cooldown_left"])
    if left > 0:
        wait = math.ceil(left)
        raise TooMany(N_("a verification email was sent to this user moments ago; you can "
                         "resend in %(seconds)s s", seconds=str(wait)), retry_after=wait,
                      retry_at=latest["cooldown_until"].isoformat(), job_id=latest["id"])


def resend(conn: Connection, config: Config, user_ref: str, *,
           actor: str) -> tuple[dict[str, Any], bool]:
    """Send the user's verification email again. Returns (job, reused): a job still waiting
    is made due now and returned instead of adding a row. Raises :class:`TooMany` inside the
    cooldown, :class:`NotFound` for a user without verification mail, :class:`Conflict` for
    a held job or a suppressed address. Every resend is in the audit log with ``actor``."""
    queue.lock_user(conn, KIND, user_ref)
    kind = kinds.get(conn, KIND)  # read once: its cooldown, and a single request's priority
    cooldown = kinds.cooldown_of(kind, config)
    latest = queue.latest_job_for_user(conn, KIND, user_ref, cooldown)
    _check_resendable(conn, latest, user_ref)
    assert latest is not None  # _check_resendable raised NotFound otherwise
    job = None
    if latest["status"] in (PENDING, SENDING, RETRY):
        job = queue.mark_resent(conn, latest["id"], kind.priority)
        if job is None:
            # The user lock keeps other requests out, not workers: one finished the job
            # between the two statements. Judge again from what it became (sent moments
            # ago: the cooldown answers; failed: a new job is enqueued below).
            latest = queue.latest_job_for_user(conn, KIND, user_ref, cooldown)
            _check_resendable(conn, latest, user_ref)
            assert latest is not None
    if job is not None:
        if job["status"] != SENDING:
            queue.notify_new_jobs(conn, KIND)
        reused = True
    else:
        limits.check_backlog(conn, config)
        spec = kinds.active(conn, KIND)
        ask = intake.Ask(spec, user_ref, latest["email"], {
            "verify_url": (latest["payload"] or {}).get("verify_url", "")})
        job = intake.resend(conn, config, spec, user_ref, latest["email"],
                            intake.payload_of(ask), actor=actor)
        reused = False
    audit.record(conn, actor, "verification.resend", f"user:{user_ref}", job_id=job["id"],
                 reused=reused, previous_job_id=latest["id"],
                 previous_status=latest["status"], email=job["email"])
    return job, reused


def _not_held(conn: Connection, job_id: int) -> DomainError:
    job = queue_reads.get_job(conn, job_id)
    if job is None or job["kind"] != KIND:
        return NotFound(N_("verification email %(id)s does not exist", id=str(job_id)))
    return Conflict(N_("verification email %(id)s is no longer held (it is %(status)s); "
                       "reload to see its state", id=str(job_id), status=word(job["status"])),
                    user_ref=job["user_ref"])



def release(conn: Connection, job_id: int, *, actor: str) -> dict[str, Any]:
    """Send a held job after all: it becomes ``pending`` and due now."""
    job = queue.release_held(conn, job_id, KIND)
    if job is None:
        raise _not_held(conn, job_id)
    queue.notify_new_jobs(conn, KIND)
    audit.record(conn, actor, "verification.release", f"user:{job['user_ref']}",
                 job_id=job_id, email=job["email"])
    return job


def drop(conn: Connection, job_id: int, *, actor: str) -> dict[str, Any]:
    """Never send a held job: it ends ``cancelled``, with who dropped it as its last error."""
    job = queue.drop_held(conn, job_id, f"dropped by {actor} (held: disposable address)", KIND)
    if job is None:
        raise _not_held(conn, job_id)
    audit.record(conn, actor, "verification.drop", f"user:{job['user_ref']}",
                 job_id=job_id, email=job["email"])
    return job


def as_json(job: dict[str, Any]) -> dict[str, Any]:
    """The API's view of a verification job."""
    return {"id": job["id"], "status": job["status"], "correlation_id": job["correlation_id"],
            "flags": job["flags"], "email": job["email"], "user_id": job["user_ref"],
            "created_at": job["created_at"]}


# --- the support console ---------------------------------------------------------------

def search(conn: Connection, q: str) -> list[dict[str, Any]]:
    """Users matching ``q`` exactly as an email address (any case), a correlation ID or a
    user id; failing that, users whose address or user id contains ``q`` (3+ characters)."""
    q = q.strip()
    if not q:
        return []
    try:
        correlation_id: str | None = str(uuid.UUID(q))
    except ValueError:
        correlation_id = None
    exact = queue_reads.search_users(conn, None, email=q if "@" in q else None,
                                     correlation_id=correlation_id, user_ref=q[:MAX_USER_ID])
    if exact or correlation_id or len(q) < MIN_PARTIAL:
        return exact
    # Nothing exact: any address or user id containing what was typed (a prefix too).
    escaped = q.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return queue_reads.search_users_like(conn, None, f"%{escaped[:MAX_USER_ID]}%")


MIN_PARTIAL = 3  # a trigram search needs three characters


@dataclass
class JobView:
    """One job as support sees it: the raw facts plus plain-language explanations."""

    job: dict[str, Any]
    state: str
    attempts: list[dict[str, Any]]
    flags: list[FlagView]


@dataclass
class UserHistory:
    user_ref: str
    email: str
    jobs: list[JobView]
    cooldown_until: datetime | None
    cooldown_left: int
    resend_block: str | None  # why the resend button is unavailable (besides the cooldown)
    suppression: dict[str, Any] | None = None
    latest_status: str = ""


def user_history(conn: Connection, config: Config, user_ref: str, *, kind: str = KIND,
                 cooldown: int | None = None, max_attempts: int | None = None) -> UserHistory:
    """Every job of the kind (verification unless told) for the user with its attempts,
    explained; :class:`NotFound` when the user has none. ``cooldown`` and ``max_attempts``
    are the kind's (default: the settings')."""
    jobs = queue_reads.jobs_for_user(conn, kind, user_ref)
    if not jobs:
        raise NotFound(N_("no %(kind)s emails for user %(user)s", kind=word(kind),
                          user=user_ref))
    cooldown = config.resend_cooldown if cooldown is None else cooldown
    latest = queue.latest_job_for_user(conn, kind, user_ref, cooldown)
    assert latest is not None
    attempts = queue_reads.attempts_for_jobs(conn, [j["id"] for j in jobs])
    # Bounces and complaints reported after acceptance (docs/design.md §18), shown with the
    # attempts.
    events = feedback.events_for_jobs(conn, [j["id"] for j in jobs])
    for job in jobs:
        job["events"] = events[job["id"]]
    if max_attempts is None:
        max_attempts = len(config.retry_schedule[KIND]) + 1
    now = datetime.now(UTC)
    views = [JobView(job, describe(job, attempts[job["id"]], max_attempts, now),
                     [dict(a, phrase=reply_phrase(a)) for a in attempts[job["id"]]],
                     explain_flags(job)) for job in jobs]
    suppression = flags.suppression(conn, latest["email"])
    block = None
    if latest["status"] == HELD:
        block = N_("The last email is held for support: release or drop it below.")
    elif suppression is not None:
        block = N_("The address is on the suppression list (%(reason)s); an admin must "
                   "remove it before a resend can be delivered.",
                   reason=word(suppression["reason"]))
    left = math.ceil(float(latest["cooldown_left"]))
    return UserHistory(user_ref, latest["email"], views,
                       latest["cooldown_until"] if left > 0 else None, left, block,
                       suppression, latest["status"])


# --- plain words -----------------------------------------------------------------------

STATUS_LABELS = {
    PENDING: N_("waiting"), SENDING: N_("sending"), RETRY: N_("will retry"),
    SENT: N_("sent"), FAILED: N_("failed"), BOUNCED: N_("bounced"),
    SKIPPED: N_("not sent"), CANCELLED: N_("dropped"), HELD: N_("held"),
}


def reply_phrase(attempt: dict[str, Any]) -> str:
    """A short phrase for one attempt's outcome (never the server's own text)."""
    outcome = str(attempt.get("outcome") or "")
    if outcome == "build":
        return N_("the message could not be built from its template")
    try:
        reply_class = ReplyClass(outcome)
    except ValueError:
        return outcome or N_("unknown outcome")
    return humanize(reply_class, attempt.get("smtp_code"), attempt.get("enhanced_code"),
                    attempt.get("reply") or "", attempt.get("stage"))


def when(moment: datetime | None, now: datetime) -> str:
    """``14:32 UTC`` today, ``2026-05-03 14:32 UTC`` otherwise (the day as the page's
    language writes it)."""
    if moment is None:
        return N_("an unknown time")
    if moment.astimezone(UTC).date() == now.astimezone(UTC).date():
        return dt(moment, "%H:%M UTC")
    return dt(moment, "%Y-%m-%d %H:%M UTC")


def timestamp(moment: datetime | None) -> str:
    """``2026-05-03 14:32:05 UTC`` (the day as the page's language writes it): exact times
    for the attempt timeline."""
    return dt(moment, "%Y-%m-%d %H:%M:%S UTC")


def describe(job: dict[str, Any], attempts: list[dict[str, Any]], max_attempts: int,
             now: datetime) -> str:
    """The job's state in words for people who are not engineers."""
    status = job["status"]
    last = reply_phrase(attempts[-1]) if attempts else None
    n = job["attempts"]
    if status == SENT:
        return N_("accepted by the mail server at %(at)s", at=when(job["finished_at"], now))
    if status == RETRY:
        return N_("%(last)s; will retry at %(at)s (attempt %(next)s of %(max)s)",
                  last=last or N_("not delivered yet"), at=when(job["available_at"], now),
                  next=n + 1, max=max_attempts)
    if status == FAILED:
        if n > 1:
            return N_("gave up after %(count)s attempts: %(last)s", count=n, last=last or "")
        return N_("not delivered: %(why)s (not retried)",
                  why=last or job["last_error"] or N_("unknown error"))
    if status == BOUNCED:
        return N_("the address does not work (%(why)s); it is now on the suppression list",
                  why=last or N_("mailbox does not exist"))
    if status == PENDING:
        if job["available_at"] > now:
            return N_("waiting to be sent at %(at)s", at=when(job["available_at"], now))
        if job.get("last_error_class") in ("relay", "orphan"):
            return N_("waiting to be sent (delivery was interrupted; it will go out by "
                      "itself)")
        return N_("waiting to be sent")
    return {
        SENDING: N_("being handed to the mail server right now"),
        HELD: N_("held for support: release it to send it, or drop it"),
        SKIPPED: N_("not sent: the address is on the suppression list"),
        CANCELLED: job.get("last_error") or N_("cancelled"),
    }.get(status, status)
