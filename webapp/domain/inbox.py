"""The failed-jobs inbox (docs/design.md §22): failed and bounced jobs of every kind, newest first,
with filters and search; retry one, retry all matching, dismiss. Every action is audited.

The SQL is in :mod:`workers.queue` ("inbox and health"); this module turns the admin's
input into a :class:`~workers.queue.ProblemFilter` and the results into clear answers.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import sqlalchemy as sa
from flask_babel import gettext, ngettext
from sqlalchemy.engine import Connection

from webapp.domain import audit, queue_reads, suppressions
from webapp.domain.errors import Conflict, Invalid, NotFound
from webapp.domain.fields import whole_number
from workers import queue
from workers.after_acceptance import feedback
from workers.building.kinds import is_kind_name
from workers.core.i18n import N_, word

PAGE_SIZE = 50
ERROR_CLASSES = ("hard_bounce", "rejected", "transient", "build")


@dataclass
class InboxPage:
    rows: list[dict[str, Any]]
    next_cursor: str | None


def _day(raw: str | None, field: str) -> date | None:
    if not raw:
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise Invalid(N_("%(field)s must be a date (YYYY-MM-DD)", field=field),
                      fields={field: N_("invalid date")}) from None


def parse_filter(args: dict[str, str]) -> queue.ProblemFilter:
    """The filter named by query parameters ``kind``, ``campaign``, ``class``, ``from``,
    ``to`` (days, inclusive) and ``q`` (an email, a correlation ID or a job id)."""
    where = queue.ProblemFilter()
    kind = args.get("kind") or None
    if kind is not None and not is_kind_name(kind):  # kinds are data (docs/design.md §21)
        raise Invalid(N_("kind must be a kind's name, e.g. broadcast, verification, "
                         "onboarding"), fields={"kind": N_("unknown")})
    where.kind = kind
    campaign = args.get("campaign") or None
    if campaign is not None:
        campaign_id = whole_number(campaign)
        if campaign_id is None:
            raise Invalid(N_("campaign must be a campaign id"),
                          fields={"campaign": N_("not a number")})
        where.campaign_id = campaign_id
    where.error_class = args.get("class") or None
    start, end = _day(args.get("from"), "from"), _day(args.get("to"), "to")
    where.since = datetime.combine(start, time(), UTC) if start else None
    where.until = datetime.combine(end + timedelta(days=1), time(), UTC) if end else None
    _apply_search(where, (args.get("q") or "").strip())
    return where


def _apply_search(where: queue.ProblemFilter, q: str) -> None:
    if not q:
        return
    if (job_id := whole_number(q)) is not None:
        where.job_id = job_id
        return
    try:
        where.correlation_id = str(uuid.UUID(q))
        return
    except ValueError:
        pass
    if "@" not in q:
        raise Invalid(N_("search for a full email address, a correlation ID or a job id"),
                      fields={"q": N_("not an address, correlation ID or job id")})
    where.email = q


def _cursor_of(row: dict[str, Any]) -> str:
    return f"{row['finished_at'].isoformat()}|{row['id']}"


def _parse_cursor(cursor: str | None) -> tuple[datetime, int] | None:
    if not cursor:
        return None
    try:
        at, job_id = cursor.split("|")
        return datetime.fromisoformat(at), int(job_id)
    except ValueError:
        raise Invalid(N_("that page link is broken; start again from the first page"),
                      fields={"after": N_("invalid cursor")}) from None


def page(conn: Connection, where: queue.ProblemFilter, after: str | None = None,
         limit: int = PAGE_SIZE) -> InboxPage:
    """One page of the inbox after ``after`` (a cursor from the previous page)."""
    rows = queue_reads.problem_jobs(conn, where, after=_parse_cursor(after), limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return InboxPage(rows, _cursor_of(rows[-1]) if more and rows else None)


def detail(conn: Connection, job_id: int) -> dict[str, Any]:
    """The job with its attempt timeline, its campaign's name and its suppression entry."""
    job = queue_reads.get_job(conn, job_id)
    if job is None:
        raise NotFound(N_("job %(id)s does not exist", id=str(job_id)))
    job["timeline"] = queue_reads.job_attempts(conn, job_id)
    job["events"] = feedback.events_for_jobs(conn, [job_id])[job_id]
    job["suppression"] = suppressions.get(conn, job["email"])
    job["audit"] = audit.entries(conn, target=f"job:{job_id}", limit=20)
    job["campaign_name"] = conn.execute(sa.text("SELECT name FROM campaigns WHERE id = :id"),
                                        {"id": job["campaign_id"]}).scalar()
    return job


def _refusal(result: dict[str, Any], job: dict[str, Any] | None) -> Conflict:
    if job is None:
        return Conflict(N_("that job does not exist"))
    if result["suppressed"]:
        return Conflict(N_(
            "%(email)s is still on the suppression list, so a retry would be skipped. "
            "Clear the address on the suppression list first, then retry.",
            email=job["email"]), fields={"email": N_("suppressed")})
    if result["cancelled"]:
        return Conflict(N_("the job's campaign was cancelled; its mail is not sent again"))
    if result["busy"]:
        return Conflict(N_(
            "the user of job %(id)s (%(user)s) already has a live %(kind)s email on its way: "
            "that one is sent instead. Retrying this job as well would make two.",
            id=str(job["id"]), user=str(job.get("user_ref")), kind=word(job["kind"])),
            fields={"user_ref": N_("has a live job")})
    if job.get("dismissed_at") is not None:
        return Conflict(N_("job %(id)s was dismissed", id=str(job["id"])))
    return Conflict(N_("job %(id)s is %(status)s, not failed or bounced: nothing to retry",
                       id=str(job["id"]), status=word(job["status"])),
                    fields={"status": job["status"]})


def retry(conn: Connection, job_id: int, *, actor: str) -> dict[str, Any]:
    """Retry one failed or bounced job now (fresh schedule, history kept). A job whose
    address is still suppressed is refused with a message saying so, never queued to be
    skipped silently."""
    result = _retry(conn, queue.ProblemFilter(job_id=job_id), datetime.now(UTC))
    if not result["retried"]:
        raise _refusal(result, queue_reads.get_job(conn, job_id))
    audit.record(conn, actor, "job.retry", f"job:{job_id}")
    queue.notify_new_jobs(conn, result["kinds"][0])
    return result


def retry_all(conn: Connection, where: queue.ProblemFilter, as_of: datetime, *,
              actor: str) -> dict[str, Any]:
    """Retry every open problem matching ``where`` that finished by ``as_of`` (when the
    admin saw the page): set-based, and a second click retries nothing twice."""
    result = _retry(conn, where, as_of)
    filters = {k: v for k, v in asdict(where).items() if v is not None}
    audit.record(conn, actor, "job.retry_all", "inbox", filters=filters, as_of=as_of,
                 retried=result["retried"], left_suppressed=result["suppressed"],
                 left_cancelled=result["cancelled"], left_busy=result["busy"])
    for kind in result["kinds"]:
        queue.notify_new_jobs(conn, kind)
    return result


def _retry(conn: Connection, where: queue.ProblemFilter, as_of: datetime) -> dict[str, Any]:
    """The set-based retry. Jobs whose user has a live job of the same kind are left out
    by the statement; a live job created by a request in the very same instant makes it
    violate the one-live-job index instead, and then it runs once more (it finds that job
    and leaves the user out)."""
    for last in (False, True):
        try:
            with conn.begin_nested():
                return queue.retry_problem_jobs(conn, where, as_of)
        except sa.exc.IntegrityError as exc:
            if last or "delivery_jobs_one_active_idx" not in str(exc.orig):
                raise
    raise AssertionError("unreachable")


def dismiss(conn: Connection, job_id: int, *, actor: str) -> None:
    """Take the job out of the inbox; its state and history stay."""
    row = queue.dismiss_job(conn, job_id)
    if row is None:
        job = queue_reads.get_job(conn, job_id)
        if job is None:
            raise NotFound(N_("job %(id)s does not exist", id=str(job_id)))
        raise Conflict(N_("job %(id)s is not an open failed or bounced job", id=str(job_id)))
    audit.record(conn, actor, "job.dismiss", f"job:{job_id}", email=row["email"],
                 status=row["status"])


def dismiss_chosen(conn: Connection, job_ids: list[int], *, actor: str) -> int:
    """Dismiss those of the chosen jobs that are open problems; returns how many."""
    done = [i for i in job_ids if queue.dismiss_job(conn, i) is not None]
    audit.record(conn, actor, "job.dismiss_chosen", "inbox", job_ids=done)
    return len(done)


def describe_retry(result: dict[str, Any]) -> str:
    """What a retry did, in one sentence an admin can act on (in the page's language)."""
    n = result["retried"]
    parts = [ngettext("Retried %(count)s job; the workers are sending them now.",
                      "Retried %(count)s jobs; the workers are sending them now.", n,
                      count=f"{n:,}") if n else gettext("No job was retried.")]
    if result["suppressed"]:
        examples = ", ".join(result["suppressed_examples"])
        more = "…" if result["suppressed"] > len(result["suppressed_examples"]) else ""
        parts.append(gettext("%(count)s were left out because their addresses are still "
                             "suppressed (%(examples)s): clear them on the suppression list "
                             "first.", count=f"{result['suppressed']:,}",
                             examples=examples + more))
    if result["cancelled"]:
        parts.append(gettext("%(count)s belong to cancelled campaigns and were left out.",
                             count=f"{result['cancelled']:,}"))
    if result["busy"]:
        parts.append(gettext("%(count)s were left out because their users already have a live "
                             "email of the same kind on its way (that one is sent instead).",
                             count=f"{result['busy']:,}"))
    return " ".join(parts)


def campaign_choices(conn: Connection, limit: int = 200) -> list[dict[str, Any]]:
    """Recent campaigns that were sent, for the inbox's campaign filter."""
    rows = conn.execute(sa.text("""
        SELECT id, name FROM campaigns WHERE broadcast_id IS NOT NULL
         ORDER BY id DESC LIMIT :limit"""), {"limit": limit})
    return [dict(r) for r in rows.mappings()]
