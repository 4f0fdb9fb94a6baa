"""What a relay's reply does beyond its recipient (docs/design.md §16, §17): one table from
(reply class, scope) to action, the code that notes an action on the batch's aftermath, and
the code that records an aftermath in the database with the message's outcome.

The table is the whole policy: a reader (and tests/unit/test_reply_policy.py) checks it row
by row. The recipient's own outcome (sent, bounced, retried, put back) is decided by
:func:`workers.delivery.outcomes.outcome_for`; this module decides what else changes.
"""

from __future__ import annotations

import dataclasses
import logging
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from sqlalchemy.engine import Connection

from workers import queue
from workers.core.jobs import ClaimedJob
from workers.core.settings import Config
from workers.delivery import lifecycle
from workers.delivery.classify import MESSAGE_STAGES, RefusalStreak, ReplyClass, ThrottleJudge
from workers.delivery.outcomes import Aftermath, recipient_domain, reply_line

if TYPE_CHECKING:
    from workers.delivery.smtp import SendResult

log = logging.getLogger("senddock.worker")


class Scope(StrEnum):
    """Whose message a reply answers, as far as the policy cares."""

    MESSAGE = "message"  # a message under a shared From: transactional, or a campaign's envelope
    CAMPAIGN_FROM = "campaign_from"  # a campaign message sent under the campaign's own From
    TEST_SEND = "test_send"  # a marketer's test send (fails visibly, nobody else waits)


class Action(StrEnum):
    """What a reply changes beyond its recipient."""

    NONE = "none"  # about the recipient alone: its outcome says it all
    # The relay is marked down (its stream fails over or pauses) and the batch stops; after
    # a refusal at a message stage it is probed with that recipient.
    RELAY_DOWN = "relay_down"
    SENDER_DOWN = "sender_down"  # the relay refuses the shared From: as RELAY_DOWN
    PACE_RELAY = "pace_relay"  # every process paces at a lower rate; the batch stops
    THROTTLE_DOMAIN = "throttle_domain"  # the recipient's domain waits; the batch holds its mail
    PAUSE_CAMPAIGN = "pause_campaign"  # the campaign pauses; its From is probed until accepted


_RECIPIENT_ONLY = (ReplyClass.SENT, ReplyClass.HARD_BOUNCE, ReplyClass.REJECTED,
                   ReplyClass.TRANSIENT)

#: (reply class, scope) -> action: the reply policy, every pair listed.
POLICY: dict[tuple[ReplyClass, Scope], Action] = {
    **{(cls, scope): Action.NONE for cls in _RECIPIENT_ONLY for scope in Scope},
    **{(ReplyClass.RELAY, scope): Action.RELAY_DOWN for scope in Scope},
    **{(ReplyClass.RELAY_THROTTLE, scope): Action.PACE_RELAY for scope in Scope},
    **{(ReplyClass.DOMAIN_THROTTLE, scope): Action.THROTTLE_DOMAIN for scope in Scope},
    (ReplyClass.SENDER, Scope.MESSAGE): Action.SENDER_DOWN,
    (ReplyClass.SENDER, Scope.CAMPAIGN_FROM): Action.PAUSE_CAMPAIGN,
    (ReplyClass.SENDER, Scope.TEST_SEND): Action.NONE,
}


def scope_of(job: ClaimedJob, *, campaign_sender: bool) -> Scope:
    """The scope of a reply to ``job``. ``campaign_sender``: its From is the campaign's own
    (not an envelope sender every message shares)."""
    if job.kind == "test":
        return Scope.TEST_SEND
    if campaign_sender and job.kind == "broadcast" and job.campaign_id is not None:
        return Scope.CAMPAIGN_FROM
    return Scope.MESSAGE


def note(aftermath: Aftermath, job: ClaimedJob, result: SendResult, *,
         campaign_sender: bool, sender: str | None = None) -> Action:
    """Note on ``aftermath`` what ``result`` (for ``job``) means beyond its recipient, by
    the table; ``sender`` (the MAIL FROM) is probed until the relay accepts it again when
    the action pauses a campaign. Returns the action."""
    action = POLICY[(result.reply_class, scope_of(job, campaign_sender=campaign_sender))]
    reply = reply_line(result)
    if action is Action.RELAY_DOWN:
        aftermath.relay_down = reply
        aftermath.login_refused = aftermath.login_refused or result.login_refused
        if result.stage in MESSAGE_STAGES:
            aftermath.probe_recipient = job.email
    elif action is Action.SENDER_DOWN:
        aftermath.relay_down = f"the relay refuses our sender address: {reply}"
        if result.stage in MESSAGE_STAGES:
            aftermath.probe_recipient = job.email
    elif action is Action.PACE_RELAY:
        aftermath.relay_throttle = reply
        aftermath.relay_closed = aftermath.relay_closed or result.code == 421
    elif action is Action.THROTTLE_DOMAIN:
        aftermath.domain_throttles[recipient_domain(job.email)] = reply
    elif action is Action.PAUSE_CAMPAIGN:
        assert job.campaign_id is not None  # the scope says so
        aftermath.paused_campaigns[job.campaign_id] = (
            f"the relay refuses this From address: {reply}")
        if sender:
            aftermath.refused_senders[sender.lower()] = (
                reply, job.email if result.stage in MESSAGE_STAGES else None)
    return action


class Judge:
    """Second looks at a reply before the table reads it (docs/design.md §16, §17): the
    same refusal for many recipients in a row is about us (a relay problem), and a
    throttle is the relay's or one domain's by evidence across domains."""

    def __init__(self, same_refusal_streak: int) -> None:
        self.streak = RefusalStreak(same_refusal_streak)
        self.throttles = ThrottleJudge()

    def judge(self, job: ClaimedJob, result: SendResult, aftermath: Aftermath,
              sender: str) -> SendResult:
        """``result`` as the policy reads it; the jobs it gives back (a streak) and the
        domains it clears go on ``aftermath``."""
        return self._throttle(job, self._streak(job, result, aftermath), aftermath, sender)

    def _streak(self, job: ClaimedJob, result: SendResult,
                aftermath: Aftermath) -> SendResult:
        """The same refusal for many different recipients in a row is about us: this one
        becomes a relay problem and the earlier ones of the row are given back."""
        cls, earlier = self.streak.observe(job.id, job.email, result.reply_class,
                                           result.code, result.text)
        if cls is result.reply_class:
            return result
        aftermath.reprieve.extend(int(i) for i in earlier if isinstance(i, int))
        log.error("the relay refused %d different recipients in a row the same way; "
                  "treating it as a problem with our setup: %s", len(earlier) + 1,
                  reply_line(result))
        return dataclasses.replace(result, reply_class=cls,
                                   text=f"{RefusalStreak.WHY}: {result.text}")

    def _throttle(self, job: ClaimedJob, result: SendResult, aftermath: Aftermath,
                  sender: str) -> SendResult:
        """A throttle reply is the relay's or its recipient domain's by evidence across
        domains (docs/design.md §17); the wording only decides when there is none."""
        cls, lift = self.throttles.judge(result.reply_class, result.code, result.text,
                                         job.email, result.stage, sender)
        aftermath.lift_domains.extend(lift)
        if cls is result.reply_class:
            return result
        return dataclasses.replace(result, reply_class=cls)

    def accepted(self, job: ClaimedJob, sender: str, aftermath: Aftermath) -> None:
        """``job``'s domain accepted mail: a throttle taken for the relay's was another
        domain's (docs/design.md §17): the relay's pace is lifted, that domain waits."""
        wrong = self.throttles.accepted(recipient_domain(job.email), sender)
        if wrong:
            aftermath.unpace = True
            aftermath.domain_throttles.update(wrong)


class Relays(Protocol):
    """What recording a relay's trouble needs of the process's relays
    (:class:`workers.delivery.relay_board.RelayBoard`)."""

    down: set[int]
    fingerprints: dict[int, str]

    def name(self, index: int) -> str | None: ...


class Pacing(Protocol):
    paced: bool


def record(conn: Connection, aftermath: Aftermath, config: Config, relays: Relays,
           pacing: Pacing) -> None:
    """Record ``aftermath`` in the transaction that commits its message's outcome: the
    actions the table chose, applied to the database (and to this process's view of its
    relays and pace, so its threads act at once)."""
    if aftermath.reprieve:
        n = queue.reprieve_jobs(conn, aftermath.reprieve, f"relay: {RefusalStreak.WHY}")
        log.warning("gave back %d job(s) charged for a refusal that was about us", n)
    relay = aftermath.relay
    if aftermath.relay_down is not None:  # RELAY_DOWN, SENDER_DOWN
        relays.down.add(relay)  # this process's threads fail over at once
        queue.mark_relay_down(conn, aftermath.relay_down, login=aftermath.login_refused,
                              fingerprint=relays.fingerprints[relay], relay=relay,
                              probe_recipient=aftermath.probe_recipient,
                              login_interval=config.login_probe_interval,
                              probe_max=config.relay_probe_max)
        name = relays.name(relay)
        if name is not None:
            log.error("relay %s unavailable, its traffic goes to the next relay: %s",
                      name, aftermath.relay_down)
        else:
            log.error("relay unavailable, delivery paused: %s", aftermath.relay_down)
    if aftermath.relay_throttle is not None:  # PACE_RELAY
        rate = queue.throttle_relay(conn, aftermath.relay_throttle,
                                    config.throttle_backoff, rate_limit=config.rate_limit,
                                    pause=aftermath.relay_closed, relay=relay)
        pacing.paced = True
        if rate is not None:
            log.warning("the relay is throttling us: pacing every process at %.2f "
                        "message(s) per second: %s", rate, aftermath.relay_throttle)
    if aftermath.lift_domains:
        queue.lift_domain_throttles(conn, aftermath.lift_domains)
    if aftermath.unpace:
        queue.reset_pacing(conn)
        log.info("another domain is accepted: the throttle was %s's, not the relay's; "
                 "the relay's pace is lifted", ", ".join(aftermath.domain_throttles))
    for domain, reply in aftermath.domain_throttles.items():  # THROTTLE_DOMAIN
        delay = queue.throttle_domain(conn, domain, reply, config.throttle_backoff)
        if delay is not None:
            log.warning("%s is throttling us: its mail waits %.0fs: %s", domain, delay,
                        reply)
    for campaign_id, reason in aftermath.paused_campaigns.items():  # PAUSE_CAMPAIGN
        if lifecycle.pause_campaign(conn, campaign_id, reason, "system"):
            log.error("campaign %d paused: %s", campaign_id, reason)
    for sender, (reply, recipient) in aftermath.refused_senders.items():
        queue.refuse_sender(conn, sender, reply, recipient)
