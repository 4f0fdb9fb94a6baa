"""The jobs table's write side, one module per concern (docs/design.md §13): nothing
outside this package inserts, moves or deletes a job (tests/unit/test_layout.py).

Each statement carries a line saying what it guarantees. The job states are
``pending → sending → sent | retry → sending … | failed | bounced | skipped | cancelled``
(and ``held`` for verification mail held by policy). Functions take a SQLAlchemy
``Connection``; the caller owns the transaction. Callers outside the package write
``from workers import queue`` and ``queue.claim_batch(...)``: the names below are the
package's public ones; the modules import from each other directly.
"""

from __future__ import annotations

from workers.core.jobs import ClaimedJob, Outcome
from workers.core.states import PRIORITY, TERMINAL
from workers.queue import audience
from workers.queue.campaigns import (
    backlog,
    broadcast_counts,
    broadcast_counts_slow,
    complete_finished_campaigns,
    many_broadcast_counts,
    settle_window,
    start_broadcast,
    start_due_campaigns,
    transactional_backlog,
)
from workers.queue.claim import (
    claim_batch,
    claim_bounded,
    hold_claimed,
)
from workers.queue.common import (
    JOB_COLUMNS,
    custom_plan,
    notify_new_jobs,
)
from workers.queue.enqueue_audience import (
    broadcasts_to_enqueue,
    enqueue_broadcast,
    enqueue_chunk,
    enqueue_due_steps,
)
from workers.queue.enqueue_messages import (
    ENQUEUE,
    Ask,
    KindVersion,
    Result,
    enqueue,
    enqueue_one,
    enqueue_test,
)
from workers.queue.finishing import (
    FINISH_PIPELINED,
    bounce_sent,
    finish,
    finish_document,
    finish_one,
    finished_ids,
)
from workers.queue.inbox import (
    ProblemFilter,
    dismiss_job,
    retry_problem_jobs,
)
from workers.queue.leases import (
    end_stale_sessions,
    mark_worker_stopped,
    node_peers,
    register_worker,
    release,
    release_lost_claims,
    renew_lease,
    take_back,
)
from workers.queue.rate_limit import (
    MINUTES_KEPT,
    acquire_permits,
    prune_minutes,
    prune_rate_minutes,
    rate_usage,
    refund_permits,
)
from workers.queue.relays import (
    PACE_CLEAN_INTERVAL,
    ensure_relays,
    mark_relay_down,
    mark_relay_ok,
    note_smtp_url,
    paced_rate,
    probe_now,
    relay_states,
    relay_status,
    reset_pacing,
    take_probe_turn,
    throttle_relay,
)
from workers.queue.retention import (
    DROPPED,
    KEPT,
    delete_transactional_chunk,
    erase_address,
    roll_up_chunk,
)
from workers.queue.senders import (
    refuse_sender,
    sender_accepted,
    sender_refusals,
    sender_still_refused,
    take_sender_probe,
)
from workers.queue.support import (
    cancel_chosen,
    cancel_waiting,
    drop_held,
    hurry,
    in_flight_for_user,
    latest_job_for_user,
    lock_user,
    mark_resent,
    release_held,
    retry_chosen_now,
)
from workers.queue.throttles import (
    domain_throttles,
    lift_domain_throttles,
    prune_domain_throttles,
    reprieve_jobs,
    throttle_domain,
)

__all__ = [
    "DROPPED",
    "ENQUEUE",
    "FINISH_PIPELINED",
    "JOB_COLUMNS",
    "KEPT",
    "MINUTES_KEPT",
    "PACE_CLEAN_INTERVAL",
    "PRIORITY",
    "TERMINAL",
    "Ask",
    "ClaimedJob",
    "KindVersion",
    "Outcome",
    "ProblemFilter",
    "Result",
    "acquire_permits",
    "audience",
    "backlog",
    "bounce_sent",
    "broadcast_counts",
    "broadcast_counts_slow",
    "broadcasts_to_enqueue",
    "cancel_chosen",
    "cancel_waiting",
    "claim_batch",
    "claim_bounded",
    "complete_finished_campaigns",
    "custom_plan",
    "delete_transactional_chunk",
    "dismiss_job",
    "domain_throttles",
    "drop_held",
    "end_stale_sessions",
    "enqueue",
    "enqueue_broadcast",
    "enqueue_chunk",
    "enqueue_due_steps",
    "enqueue_one",
    "enqueue_test",
    "ensure_relays",
    "erase_address",
    "finish",
    "finish_document",
    "finish_one",
    "finished_ids",
    "hold_claimed",
    "hurry",
    "in_flight_for_user",
    "latest_job_for_user",
    "lift_domain_throttles",
    "lock_user",
    "many_broadcast_counts",
    "mark_relay_down",
    "mark_relay_ok",
    "mark_resent",
    "mark_worker_stopped",
    "node_peers",
    "note_smtp_url",
    "notify_new_jobs",
    "paced_rate",
    "probe_now",
    "prune_domain_throttles",
    "prune_minutes",
    "prune_rate_minutes",
    "rate_usage",
    "refund_permits",
    "refuse_sender",
    "register_worker",
    "relay_states",
    "relay_status",
    "release",
    "release_held",
    "release_lost_claims",
    "renew_lease",
    "reprieve_jobs",
    "reset_pacing",
    "retry_chosen_now",
    "retry_problem_jobs",
    "roll_up_chunk",
    "sender_accepted",
    "sender_refusals",
    "sender_still_refused",
    "settle_window",
    "start_broadcast",
    "start_due_campaigns",
    "take_back",
    "take_probe_turn",
    "take_sender_probe",
    "throttle_domain",
    "throttle_relay",
    "transactional_backlog",
]
