"""The jobs browser: an admin sees the queue by state, the way Sidekiq's or Oban
Web's users do — waiting (in the order they will be sent), retrying (with their next run),
in flight, held, scheduled campaigns, sent, failed (the inbox), cancelled — with filters,
exact counts and keyset pages; and, as Oban Web, bulk actions on the jobs chosen on a page
(cancel those not yet sent, run retrying ones now). The inbox keeps the actions on failed
jobs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from flask_babel import lazy_gettext as _l
from sqlalchemy.engine import Connection

from webapp.domain import audit, queue_reads
from webapp.domain.errors import Invalid
from webapp.domain.fields import whole_number
from workers import queue
from workers.building.kinds import is_kind_name
from workers.core.i18n import N_
from workers.core.states import (
    BOUNCED,
    CANCELLED,
    FAILED,
    HELD,
    PENDING,
    RETRY,
    SENDING,
    SENT,
)
from workers.queue import ProblemFilter

PAGE_SIZE = 50
TABS = ("waiting", "retrying", "sending", "held", "scheduled", "sent", "failed", "cancelled")
LABELS = {"waiting": _l("Waiting"), "retrying": _l("Retrying"), "sending": _l("In flight"),
          "held": _l("Held"), "scheduled": _l("Scheduled"), "sent": _l("Sent"),
          "failed": _l("Failed"), "cancelled": _l("Cancelled")}
_STATE_OF = {"waiting": PENDING, "retrying": RETRY, "sending": SENDING, "held": HELD,
             "sent": SENT, "cancelled": CANCELLED}
_TIMESTAMP_KEYS = {"available_at", "claimed_at", "created_at", "finished_at"}
# The bulk actions each tab offers on the jobs chosen on it (Oban Web's: cancel what has
# not run, run again now what waits for its retry).
BULK_ACTIONS = {"waiting": ("cancel",), "retrying": ("retry_now", "cancel"),
                "held": ("cancel",), "scheduled": ("cancel",)}


@dataclass
class Filters:
    kind: str | None = None
    campaign_id: int | None = None
    broadcast_id: int | None = None
    email: str | None = None

    def args(self) -> dict[str, str]:
        """The query parameters that name these filters (for links and forms)."""
        out = {}
        if self.kind:
            out["kind"] = self.kind
        if self.campaign_id is not None:
            out["campaign"] = str(self.campaign_id)
        if self.email:
            out["q"] = self.email
        return out


def parse_filters(conn: Connection, args: Any) -> Filters:
    kind = (args.get("kind") or "").strip() or None
    if kind is not None and not is_kind_name(kind):  # kinds are data (docs/design.md §21)
        raise Invalid(N_("kind must be a kind's name, e.g. broadcast, verification, "
                         "onboarding"), fields={"kind": N_("unknown")})
    found = Filters(kind=kind)
    campaign = (args.get("campaign") or "").strip()
    if campaign:
        campaign_id = whole_number(campaign)
        if campaign_id is None:
            raise Invalid(N_("campaign must be a campaign id"),
                          fields={"campaign": N_("not a number")})
        found.campaign_id = campaign_id
        found.broadcast_id = conn.execute(sa.text(
            "SELECT broadcast_id FROM campaigns WHERE id = :id"), {"id": found.campaign_id}
        ).scalar()
    q = (args.get("q") or "").strip()
    if q:
        if partial_address(q):
            raise Invalid(N_("search for a full email address"),
                          fields={"q": N_("not an address")})
        found.email = q
    return found


def partial_address(q: str | None) -> bool:
    """Whether the search ``q`` is something other than a whole address (the browser finds
    an address whole, through its index; support search finds parts of one)."""
    q = (q or "").strip()
    return bool(q) and "@" not in q


def _problem_filter(f: Filters) -> ProblemFilter:
    return ProblemFilter(kind=f.kind, campaign_id=f.campaign_id, email=f.email)


def counts(conn: Connection, f: Filters) -> dict[str, int]:
    """Exact jobs per tab for these filters: from the counters where they answer (no
    filter, a kind, a campaign), else from the address's own rows; ``dismissed`` is the
    failed and bounced jobs dismissed from the inbox (not in the failed tab)."""
    per_state: dict[str, int]
    if f.email:
        per_state = queue_reads.state_counts_for_email(conn, f.email, f.kind)
    elif f.campaign_id is not None:
        per_state = dict.fromkeys(_STATE_OF.values(), 0)
        if f.broadcast_id is not None and f.kind in (None, "broadcast"):
            per_state.update(queue.broadcast_counts(conn, f.broadcast_id))
    else:
        by_kind = queue_reads.jobs_by_kind_and_state(conn)
        kinds = [f.kind] if f.kind else list(by_kind)
        per_state = {}
        for kind in kinds:  # a kind without jobs (or no such kind) has no counters: 0
            for state, n in by_kind.get(kind, {}).items():
                per_state[state] = per_state.get(state, 0) + n
    result = {tab: per_state.get(state, 0) for tab, state in _STATE_OF.items()}
    no_campaign_jobs = f.kind not in (None, "broadcast") or f.email
    later = 0 if f.campaign_id is not None else queue_reads.scheduled_message_count(
        conn, queue_reads.JobFilter(kind=f.kind, email=f.email))
    result["waiting"] = max(0, result["waiting"] - later)  # pending, but not due yet
    result["scheduled"] = later + (0 if no_campaign_jobs else len(
        [c for c in queue_reads.scheduled_campaigns(conn)
         if f.campaign_id is None or c["id"] == f.campaign_id]))
    result["failed"] = queue_reads.count_problems(conn, _problem_filter(f),
                                                  datetime.now(UTC))
    # The failed tab is the inbox: open problems only. The ones dismissed there are still
    # failed or bounced jobs, counted beside it, so that the tabs add up to every job.
    result["dismissed"] = max(0, per_state.get(FAILED, 0) + per_state.get(BOUNCED, 0)
                              - result["failed"])
    return result


def _cursor(tab: str, row: dict[str, Any]) -> str:
    _condition, order = queue_reads.BROWSER_STATES[tab]
    values = [row[col.split(".", 1)[1]] for col in order]
    return json.dumps([v.isoformat() if isinstance(v, datetime) else v for v in values])


def _after(tab: str, cursor: str | None) -> list[Any] | None:
    if not cursor:
        return None
    _condition, order = queue_reads.BROWSER_STATES[tab]
    try:
        raw = json.loads(cursor)
        if not isinstance(raw, list) or len(raw) != len(order):
            raise ValueError(cursor)
        return [datetime.fromisoformat(v) if col.split(".", 1)[1] in _TIMESTAMP_KEYS else
                int(v) for col, v in zip(order, raw, strict=True)]
    except (ValueError, TypeError):
        raise Invalid(N_("that page link is broken; start again from the first page"),
                      fields={"after": N_("invalid cursor")}) from None


def page(conn: Connection, tab: str, f: Filters, cursor: str | None = None
         ) -> dict[str, Any]:
    """One page of the tab: ``rows`` and the ``next`` cursor (None on the last page)."""
    where = queue_reads.JobFilter(kind=f.kind, broadcast_id=f.broadcast_id, email=f.email)
    campaigns: list[dict[str, Any]] = []
    if tab == "scheduled":
        # Scheduled campaigns (their jobs are made when their time comes) above the
        # transactional messages whose send_at is ahead, which page like any tab.
        if not cursor and f.kind in (None, "broadcast") and not f.email:
            campaigns = [c for c in queue_reads.scheduled_campaigns(conn)
                         if f.campaign_id is None or c["id"] == f.campaign_id]
        if f.campaign_id is not None:
            return {"rows": [], "campaigns": campaigns, "next": None}
    if f.campaign_id is not None and f.broadcast_id is None:
        return {"rows": [], "campaigns": [], "next": None}  # not sent yet: no jobs
    rows = queue_reads.jobs_in_state(conn, tab, where, after=_after(tab, cursor),
                                     limit=PAGE_SIZE + 1)
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    return {"rows": rows, "campaigns": campaigns,
            "next": _cursor(tab, rows[-1]) if more and rows else None}


MAX_CHOSEN = 200  # a page shows 50; a crafted form cannot name a million


def chosen_ids(raw: list[str]) -> list[int]:
    """The job ids a bulk form names (digits only, at most MAX_CHOSEN, no repeats)."""
    ids = sorted({int(v) for v in raw if v.isdigit()})
    if not ids:
        raise Invalid(N_("choose at least one job"), fields={"job": N_("required")})
    if len(ids) > MAX_CHOSEN:
        raise Invalid(N_("choose at most %(max)s jobs at once", max=MAX_CHOSEN),
                      fields={"job": N_("too many")})
    return ids


def bulk(conn: Connection, action: str, job_ids: list[int], *, actor: str) -> dict[str, int]:
    """Cancel or retry-now the chosen jobs; ``changed`` and ``unchanged`` (jobs that had
    moved on since the page was shown). Audited with the ids."""
    if action == "cancel":
        done = queue.cancel_chosen(conn, job_ids, f"cancelled by {actor}")
    elif action == "retry_now":
        done = queue.retry_chosen_now(conn, job_ids)
    else:
        raise Invalid(N_("unknown action"), fields={"action": N_("unknown")})
    audit.record(conn, actor, f"jobs.{action}", "jobs", job_ids=done,
                 left=[i for i in job_ids if i not in set(done)])
    return {"changed": len(done), "unchanged": len(job_ids) - len(done)}
