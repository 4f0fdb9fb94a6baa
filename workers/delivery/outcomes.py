"""From an SMTP result to a job's next state: the one place the reply classes of docs/design.md
§16 turn into statuses, retries and suppressions."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from workers.core.addresses import domain_of
from workers.core.states import BOUNCED, FAILED, PENDING, RETRY, SENT, SKIPPED
from workers.delivery.classify import ReplyClass
from workers.delivery.retry import next_delay
from workers.queue import ClaimedJob, Outcome

if TYPE_CHECKING:
    from workers.delivery.smtp import SendResult


def reply_line(result: SendResult) -> str:
    parts = [str(result.code) if result.code else "", result.text.strip()]
    return " ".join(p for p in parts if p) or f"no reply ({result.stage})"


def outcome_for(job: ClaimedJob, result: SendResult, schedule: tuple[int, ...],
                jitter: float, started_at: datetime) -> Outcome:
    """The job's outcome for this SMTP result.

    - sent / hard bounce / rejected end the job (the bounce also suppresses the address);
    - transient failures retry on the kind's schedule, then fail;
    - relay trouble, throttling and a refused sender (P6, docs/design.md §16) put the job back to
      `pending` without using an attempt -- except a marketer's test send, which fails
      visibly with the reason (there is no campaign to pause and nobody else to wait for).
    """
    cls = result.reply_class
    reply = reply_line(result)

    def make(status: str, counted: bool = True, delay: float | None = None,
             error: str | None = reply) -> Outcome:
        return Outcome(job_id=job.id, claim_token=job.claim_token, status=status,
                       counted=counted, reply_class=cls.value, delay=delay, error=error,
                       code=result.code, enhanced=result.enhanced, reply=reply,
                       stage=result.stage, duration_ms=result.duration_ms,
                       started_at=started_at)

    if cls is ReplyClass.SENT:
        return make(SENT, error=None)
    if cls is ReplyClass.HARD_BOUNCE:
        return make(BOUNCED)
    if cls is ReplyClass.REJECTED:
        return make(FAILED)
    if cls is ReplyClass.TRANSIENT:
        # The schedule restarts at a manual retry (retry_base); the attempt numbers go on.
        delay = next_delay(schedule, job.attempts - job.retry_base + 1, jitter)
        return make(FAILED) if delay is None else make(RETRY, delay=delay)
    if cls is ReplyClass.SENDER and job.kind == "test":
        return make(FAILED, error=f"the relay refuses this From address: {reply}")
    label = {ReplyClass.RELAY_THROTTLE: "relay throttling", ReplyClass.SENDER: "sender refused",
             ReplyClass.DOMAIN_THROTTLE: "domain throttling"}.get(cls, "relay")
    return make(PENDING, counted=False, error=f"{label}: {reply}")


recipient_domain = domain_of  # the name workers.delivery.pool reads


@dataclass
class Aftermath:
    """What a reply says about something other than its recipient (docs/design.md §16): the relay
    (down, login refused, throttling), a recipient domain (throttling), a campaign's From
    address (refused). The pool records it with that message's outcome, and keeps the
    batch's sum to know what to hold back."""

    relay_down: str | None = None
    relay: int = 1  # which relay of SENDDOCK_SMTP_URL the reply came from (docs/design.md §17)
    login_refused: bool = False
    probe_recipient: str | None = None
    relay_throttle: str | None = None
    relay_closed: bool = False  # the throttle was a 421: the relay closed the channel
    domain_throttles: dict[str, str] = field(default_factory=dict)
    paused_campaigns: dict[int, str] = field(default_factory=dict)
    # A refused campaign From -> (the reply, a recipient it was refused for): probed later.
    refused_senders: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    reprieve: list[int] = field(default_factory=list)
    # Domains judged throttled for a reply that turned out to be the relay's (docs/design.md §17).
    lift_domains: list[str] = field(default_factory=list)
    # A throttle judged the relay's on its wording alone, contradicted by another domain's
    # acceptance: the relay's pace is lifted (the domain waits instead, domain_throttles).
    unpace: bool = False

    @property
    def empty(self) -> bool:
        """Nothing beyond the recipients: there is nothing else to record."""
        return not (self.relay_down or self.relay_throttle or self.domain_throttles
                    or self.paused_campaigns or self.reprieve or self.lift_domains
                    or self.unpace)

    def absorb(self, other: Aftermath) -> None:
        """Add what one message's reply said to the batch's view (what stops it, what
        it must hold back)."""
        if other.relay_down or other.relay_throttle:
            self.relay = other.relay
        self.relay_down = other.relay_down or self.relay_down
        self.login_refused = self.login_refused or other.login_refused
        self.probe_recipient = other.probe_recipient or self.probe_recipient
        self.relay_throttle = other.relay_throttle or self.relay_throttle
        self.relay_closed = self.relay_closed or other.relay_closed
        self.refused_senders.update(other.refused_senders)
        self.domain_throttles.update(other.domain_throttles)
        self.paused_campaigns.update(other.paused_campaigns)
        self.reprieve.extend(other.reprieve)
        self.lift_domains.extend(other.lift_domains)
        self.unpace = self.unpace or other.unpace

    @property
    def stops_batch(self) -> bool:
        """Nothing more goes to the relay in this batch."""
        return self.relay_down is not None or self.relay_throttle is not None

    def holds(self, job: ClaimedJob) -> bool:
        """This job must wait: its domain throttles us or its campaign was just paused."""
        return recipient_domain(job.email) in self.domain_throttles or (
            job.campaign_id is not None and job.kind == "broadcast"
            and job.campaign_id in self.paused_campaigns)


def skipped(job: ClaimedJob) -> Outcome:
    """The address was suppressed after the job was enqueued: never sent, not an attempt."""
    return Outcome(job_id=job.id, claim_token=job.claim_token, status=SKIPPED,
                   counted=False, reply_class="suppressed",
                   error="address is on the suppression list", started_at=datetime.now(UTC))


def released(job: ClaimedJob) -> Outcome:
    """Claimed but not attempted (shutdown, relay down mid-batch): back to `pending`."""
    return Outcome(job_id=job.id, claim_token=job.claim_token, status=PENDING,
                   counted=False)


def build_failed(job: ClaimedJob, message: str, stage: str = "build") -> Outcome:
    """The message could not be built (a template error at render time, a header that
    cannot be encoded) or handing it over raised: the job fails visibly, with ``message``
    as its error, instead of being retried forever or left `sending`."""
    return Outcome(job_id=job.id, claim_token=job.claim_token, status=FAILED, counted=True,
                   reply_class="build", error=message[:1000], started_at=datetime.now(UTC),
                   stage=stage)
