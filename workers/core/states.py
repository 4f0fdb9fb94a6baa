"""The job vocabulary: every state a delivery job can be in, which of them end it, and the
moves between them. The engine owns it; the models' CHECK constraints, the queue's SQL
builders and the tests all read this module, so adding a state is a one-place change.

    pending ──claim──▶ sending ──▶ sent | failed | bounced
       ▲                  │
       │                  ├──▶ retry ──(due)──▶ sending …
       └──(relay, lost)───┘
    pending | retry | held ──▶ skipped (suppressed) | cancelled (campaign cancelled)
    held ──(support releases)──▶ pending
    sent ──(a later bounce report: a DSN or a provider webhook)──▶ bounced
    failed | bounced ──(an admin retries)──▶ pending
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

PENDING, SENDING, RETRY, HELD = "pending", "sending", "retry", "held"
SENT, FAILED, BOUNCED, SKIPPED, CANCELLED = "sent", "failed", "bounced", "skipped", "cancelled"

#: Every state, in the order the pages show them.
STATES: tuple[str, ...] = (PENDING, SENDING, RETRY, SENT, FAILED, BOUNCED, SKIPPED,
                           CANCELLED, HELD)
#: A job in one of these is finished: nothing in the engine moves it again by itself.
TERMINAL: tuple[str, ...] = (SENT, FAILED, BOUNCED, SKIPPED, CANCELLED)
#: Not finished: waiting, in flight, waiting to retry, or held for support.
ACTIVE: tuple[str, ...] = (PENDING, SENDING, RETRY, HELD)
#: Waiting for a worker (the claim reads only these).
CLAIMABLE: tuple[str, ...] = (PENDING, RETRY)
#: Not yet handed to a worker: what cancelling a user's messages can still end.
WAITING: tuple[str, ...] = (PENDING, RETRY, HELD)
#: What the failed-jobs inbox lists and an admin may retry.
PROBLEM: tuple[str, ...] = (FAILED, BOUNCED)
#: A campaign's jobs in these states are on the address index (delivery_jobs_email_idx)
#: with every transactional job: the jobs browser's address filter searches only those.
ADDRESS_INDEXED: tuple[str, ...] = (RETRY, FAILED, BOUNCED)
#: The per-broadcast counters kept by the count triggers (campaigns never hold jobs).
COUNTED: tuple[str, ...] = (PENDING, SENDING, RETRY, SENT, FAILED, BOUNCED, SKIPPED,
                            CANCELLED)

#: The moves the engine and the domain functions make; anything else is a bug.
TRANSITIONS: dict[str, frozenset[str]] = {
    PENDING: frozenset({SENDING, SKIPPED, CANCELLED}),
    SENDING: frozenset({SENT, FAILED, BOUNCED, RETRY, PENDING, SKIPPED}),
    RETRY: frozenset({SENDING, PENDING, SKIPPED, CANCELLED, FAILED}),
    HELD: frozenset({PENDING, CANCELLED, SKIPPED}),
    SENT: frozenset({BOUNCED}),
    FAILED: frozenset({PENDING}),
    BOUNCED: frozenset({PENDING}),
    SKIPPED: frozenset(),
    CANCELLED: frozenset(),
}

#: Kinds of job the engine itself knows. ``test`` is a test send (of a campaign or a
#: kind), ``sequence`` a step of a sequence (workers.delivery.sequences); admins add
#: transactional kinds as rows of ``kinds`` (docs/design.md §21), named like this:
KINDS: tuple[str, ...] = ("broadcast", "verification", "test", "sequence")
KIND_NAME = "^[a-z][a-z0-9_-]{0,39}$"
#: The same rule as the CHECK on every job row, in the form PostgreSQL evaluates fastest:
#: its regex engine spent 1.7 us a row on the bounded repetition and spends 0.2 us on an
#: open one plus a length (a sixth of each 1M-job enqueue chunk; docs/performance.md).
KIND_CHECK = "kind ~ '^[a-z][a-z0-9_-]*$' AND length(kind) <= 40"
#: Claim order by class: lower is served first. Critical kinds (verification) first, then
#: lifecycle kinds (onboarding, churn), then campaigns (P7: transactional mail never waits
#: behind a campaign). A job's priority is set at enqueue from its kind's class (a batch's
#: items BULK_STEP behind it); it only ever moves up, to its class's, when the user asks
#: for an imported message again (webapp.domain.intake, queue.mark_resent).
CLASS_PRIORITY: dict[str, int] = {"critical": 0, "lifecycle": 5, "campaign": 10}
#: Items of ``POST /messages/batch`` (an import) queue this far behind the single requests
#: of their class, still ahead of the next class: a signup's verification never waits
#: behind 20,000 imported ones (P7). Less than the gap between classes.
BULK_STEP = 1
#: Every priority a job can have, in claim order.
PRIORITIES: tuple[int, ...] = tuple(sorted(
    {*CLASS_PRIORITY.values()}
    | {p + BULK_STEP for c, p in CLASS_PRIORITY.items() if c != "campaign"}))
PRIORITY: dict[str, int] = {"verification": CLASS_PRIORITY["critical"],
                            "test": CLASS_PRIORITY["critical"],
                            "broadcast": CLASS_PRIORITY["campaign"],
                            "sequence": CLASS_PRIORITY["lifecycle"]}


def imported(priority: int) -> bool:
    """Whether a job at ``priority`` came in a batch (``BULK_STEP`` behind its class)."""
    return priority not in CLASS_PRIORITY.values()


def can_move(old: str, new: str) -> bool:
    """Whether a job may go from ``old`` to ``new``."""
    return new in TRANSITIONS.get(old, frozenset())


def sql_list(values: Iterable[str]) -> str:
    """``('a', 'b')`` for an SQL ``IN``: the states are constants of this module, never
    user input, so inlining them keeps the statements readable (and index predicates
    matchable by the planner)."""
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


class Campaign:
    """The campaign vocabulary (``campaigns.status``), beside the jobs' (its words overlap
    theirs — a campaign is `sending` while its jobs go `pending → sending → sent` — so
    they live in their own namespace). The moves are made by :mod:`workers.delivery.lifecycle`
    (pause, resume, cancel) and the queue (start, finish, reopen on a retry)::

        draft ⇄ scheduled ──(due)──▶ sending ⇄ paused
        draft ──(send now)──▶ sending ──(every job terminal)──▶ sent ──(a retry)──▶ sending
        draft | scheduled | sending | paused ──(cancel)──▶ cancelled
    """

    DRAFT, SCHEDULED, SENDING, PAUSED = "draft", "scheduled", "sending", "paused"
    CANCELLED, SENT = "cancelled", "sent"
    #: Every state (the CHECK constraint's list).
    STATES: tuple[str, ...] = (DRAFT, SCHEDULED, SENDING, PAUSED, CANCELLED, SENT)
    #: Its content may still change.
    EDITABLE: tuple[str, ...] = (DRAFT, SCHEDULED)
    #: Not over yet: it may still send (the ones From-domain checks look at).
    OPEN: tuple[str, ...] = (DRAFT, SCHEDULED, SENDING, PAUSED)
    #: Its jobs exist or are being created (the enqueue runs for these).
    STARTED: tuple[str, ...] = (SENDING, PAUSED)
    #: The moves any code makes; anything else is a bug.
    TRANSITIONS: ClassVar[dict[str, frozenset[str]]] = {
        DRAFT: frozenset({SCHEDULED, SENDING, CANCELLED}),
        SCHEDULED: frozenset({DRAFT, SENDING, CANCELLED}),
        SENDING: frozenset({PAUSED, CANCELLED, SENT}),
        PAUSED: frozenset({SENDING, CANCELLED}),
        SENT: frozenset({SENDING}),
        CANCELLED: frozenset(),
    }


class Sequence:
    """The sequences vocabulary (docs/sequences.md): a sequence is active, paused
    or archived; an enrollment (one person's way through one) is active, paused (its
    sequence is), done or exited (with a reason). Beside the jobs' and campaigns' words,
    some of which it shares."""

    ACTIVE, PAUSED, ARCHIVED = "active", "paused", "archived"
    DONE, EXITED = "done", "exited"
    #: A sequence's states (the CHECK constraint's list).
    STATES: tuple[str, ...] = (ACTIVE, PAUSED, ARCHIVED)
    #: An enrollment's states.
    ENROLLMENT_STATES: tuple[str, ...] = (ACTIVE, PAUSED, DONE, EXITED)
    #: An enrollment still in its sequence (at most one per person and sequence).
    OPEN: tuple[str, ...] = (ACTIVE, PAUSED)
