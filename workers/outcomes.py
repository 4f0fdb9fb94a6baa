"""From an SMTP result to a job's next state: the one place the reply classes of SPEC
section 2 turn into statuses, retries and suppressions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from workers.classify import ReplyClass
from workers.queue import ClaimedJob, Outcome
from workers.retry import next_delay

if TYPE_CHECKING:
    from workers.smtp import SendResult


def reply_line(result: SendResult) -> str:
    parts = [str(result.code) if result.code else "", result.text.strip()]
    return " ".join(p for p in parts if p) or f"no reply ({result.stage})"


def outcome_for(job: ClaimedJob, result: SendResult, schedule: tuple[int, ...],
                jitter: float, started_at: datetime) -> Outcome:
    """The job's outcome for this SMTP result.

    - sent / hard bounce / rejected end the job (the bounce also suppresses the address);
    - transient failures retry on the kind's schedule, then fail;
    - relay trouble (P6) puts the job back to `pending` without using an attempt.
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
        return make("sent", error=None)
    if cls is ReplyClass.HARD_BOUNCE:
        return make("bounced")
    if cls is ReplyClass.REJECTED:
        return make("failed")
    if cls is ReplyClass.TRANSIENT:
        # The schedule restarts at a manual retry (retry_base); the attempt numbers go on.
        delay = next_delay(schedule, job.attempts - job.retry_base + 1, jitter)
        return make("failed") if delay is None else make("retry", delay=delay)
    return make("pending", counted=False, error=f"relay: {reply}")


def skipped(job: ClaimedJob) -> Outcome:
    """The address was suppressed after the job was enqueued: never sent, not an attempt."""
    return Outcome(job_id=job.id, claim_token=job.claim_token, status="skipped",
                   counted=False, reply_class="suppressed",
                   error="address is on the suppression list", started_at=datetime.now(UTC))


def released(job: ClaimedJob) -> Outcome:
    """Claimed but not attempted (shutdown, relay down mid-batch): back to `pending`."""
    return Outcome(job_id=job.id, claim_token=job.claim_token, status="pending",
                   counted=False)


def build_failed(job: ClaimedJob, message: str, stage: str = "build") -> Outcome:
    """The message could not be built (a template error at render time, a header that
    cannot be encoded) or handing it over raised: the job fails visibly, with ``message``
    as its error, instead of being retried forever or left `sending`."""
    return Outcome(job_id=job.id, claim_token=job.claim_token, status="failed", counted=True,
                   reply_class="build", error=message[:1000], started_at=datetime.now(UTC),
                   stage=stage)
