"""One delivery attempt (docs/design.md §15, §16): build the message, send it through its
relay while the batch's fence allows, and read the reply -- its outcome for the recipient,
and on the aftermath what it says beyond (workers/delivery/reply_policy.py)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from workers.building.compose import Composer
from workers.building.message import TemplateError
from workers.core import pg
from workers.core.jobs import ClaimedJob, Outcome
from workers.core.settings import Config
from workers.delivery import outcomes, reply_policy, services
from workers.delivery.classify import ReplyClass
from workers.delivery.handover import Handed, Handover
from workers.delivery.lease import Lease
from workers.delivery.relay_board import RelayBoard, Transports
from workers.delivery.statements import StatementDb

log = logging.getLogger("senddock.worker")

DB_ERRORS = services.DB_ERRORS


class NotSent(Exception):
    """The drain stopped while a message waited at the relay's 354: it is not sent."""


@dataclasses.dataclass
class Fence:
    """A batch's right to start messages: the lease term it was claimed under, and why it
    may start no more (None while it may)."""

    term: int
    lease: Lease
    broken: str | None = None
    # Campaigns found paused or cancelled at a message's 354: the batch's other messages
    # of them go back unsent without trying.
    stopped: set[int] = dataclasses.field(default_factory=set)

    def allows(self) -> bool:
        """May the batch start its next message? Its lease term must be valid now (by
        this process's clock) and nothing may have broken the fence."""
        if self.broken is None and not self.lease.valid(self.term):
            self.broken = "the lease it was claimed under is no longer confirmed"
        return self.broken is None


def go_ahead(handover: Handover, db: StatementDb, previous: Handed | None, fence: Fence,
             stopping: threading.Event) -> None:
    """At the relay's 354: the previous outcome must be committed before this message
    is (docs/design.md §16) and accepted (a refused mark means the batch was taken back:
    this worker's lease lapsed), and the lease must still be valid (docs/design.md §15);
    otherwise, or after a stop meanwhile, the message is not sent at all (the connection
    is dropped mid-transaction) and the rest of the batch goes back."""
    if not handover.settle(db, previous, record=False) and fence.broken is None:
        fence.broken = "the previous outcome was not committed and accepted"
    if not fence.allows() or stopping.is_set():
        raise NotSent


@dataclasses.dataclass
class Sender:
    """Attempts messages for a process's drain threads; counts what the relay accepted."""

    composer: Composer
    board: RelayBoard
    judge: reply_policy.Judge
    config: Config
    outage: pg.Outage
    stopping: threading.Event
    sent: int = 0

    def attempt(self, transports: Transports, job: ClaimedJob, aftermath: outcomes.Aftermath,
                fence: Fence, before_send: Callable[[], None]) -> Outcome:
        """This job's outcome (and, in ``aftermath``, what its reply says beyond its
        recipient). Never raises for one message's trouble: whatever goes wrong building
        or sending it fails that message, with the error in words. It is not started
        (MAIL FROM) unless ``fence`` still allows it; ``before_send`` runs once the relay is
        ready for the message (354), just before it goes out, and raises NotSent to keep
        it unsent."""
        if job.suppressed:
            return outcomes.skipped(job)
        try:
            envelope = self.composer.build(job)
        except TemplateError as exc:
            return outcomes.build_failed(job, f"template error: {exc}")
        except DB_ERRORS as exc:
            # The build read the database (a cache miss) and it did not answer: not the
            # message's fault. Back to `pending` unsent and uncounted, never failed.
            self.outage.failed(exc, retrying=f"job {job.id} goes back unsent")
            return outcomes.released(job)
        except Exception as exc:
            log.exception("could not build the message of job %d", job.id)
            return outcomes.build_failed(job, f"could not build the message: "
                                              f"{type(exc).__name__}: {exc}")
        if self.stopping.is_set() or not fence.allows():
            return outcomes.released(job)  # stopped or fenced while it was built: not sent
        relay = self.board.for_job(job)
        transport = transports.get(relay)
        aftermath.relay = relay.index
        started = datetime.now(UTC)
        guard = transports.guard
        campaign = job.campaign_id if job.kind == "broadcast" else None

        def go_ahead() -> None:
            before_send()
            # The campaign's check, asked when the SMTP transaction started: its lock is
            # held from then until the relay has answered (workers/delivery/send_guard.py).
            if campaign is not None and not guard.granted():
                fence.stopped.add(campaign)
                raise NotSent

        try:
            if campaign is not None:
                guard.ask(campaign)
            result = transport.send(envelope.mail_from, job.email, envelope.message,
                                    before_data=go_ahead)
        except NotSent:
            return outcomes.released(job)
        except Exception as exc:
            log.exception("could not send the message of job %d", job.id)
            transport.close()  # its state is unknown: the next message reconnects
            return outcomes.build_failed(job, f"could not send the message: "
                                              f"{type(exc).__name__}: {exc}", stage="send")
        finally:
            guard.leave()  # before anything records: a pause there waits for this lock
        result = self.judge.judge(job, result, aftermath, envelope.mail_from)
        reply_policy.note(aftermath, job, result, campaign_sender=envelope.campaign_sender,
                          sender=envelope.mail_from)
        if result.reply_class is ReplyClass.SENT:
            self.sent += 1
            self.judge.accepted(job, envelope.mail_from, aftermath)
        return outcomes.outcome_for(job, result, self.composer.retry_schedule(job.kind),
                                    self.config.retry_jitter, started)
