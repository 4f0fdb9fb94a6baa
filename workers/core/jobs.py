"""A claimed job and the outcome of one attempt at it (docs/design.md §14): what the queue
hands a worker and what the worker hands back. Defined here, in the engine's core, because
building (a claimed job into bytes), delivery and the queue all speak them;
:mod:`workers.queue` imports them for its own statements and re-exports them to its callers."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class ClaimedJob:
    id: int
    kind: str
    email: str
    claim_token: str
    attempts: int
    correlation_id: str
    message_id: str
    campaign_id: int | None
    subscriber_id: int | None
    broadcast_id: int | None
    user_ref: str | None
    payload: dict[str, Any]
    suppressed: bool
    name: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    # The subscriber's consent to open and click tracking (docs/privacy.md).
    tracking: bool = True
    priority: int = 0  # from the kind's class at enqueue (workers.core.states.CLASS_PRIORITY)
    # The campaign's updated_at at the claim: compiled templates are cached under it.
    campaign_version: str | None = None
    # Counted attempts when the job was last retried by hand: the retry schedule restarts
    # there, the attempt numbers go on.
    retry_base: int = 0
    waited: float = 0.0  # seconds it was due before this claim (the pool's lag)


@dataclass
class Outcome:
    """How one claimed job ends this round. ``counted`` is False for outcomes that are not
    an attempt at the recipient (relay trouble, skip, release on shutdown)."""

    job_id: int
    claim_token: str
    status: str
    counted: bool
    reply_class: str | None = None
    delay: float | None = None
    error: str | None = None
    code: int | None = None
    enhanced: str | None = None
    reply: str | None = None
    stage: str | None = None
    duration_ms: float = 0.0
    started_at: datetime | None = None
