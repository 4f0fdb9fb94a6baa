"""The reply policy (docs/design.md §16, §17), row by row: for each reply class and scope,
the action the table names and what noting it does to the batch's aftermath -- what is
recorded with the outcome, whether the batch stops, which of its other jobs wait."""

from __future__ import annotations

from dataclasses import replace

import pytest

from workers.core.jobs import ClaimedJob
from workers.delivery.classify import ReplyClass
from workers.delivery.outcomes import Aftermath
from workers.delivery.reply_policy import POLICY, Action, Scope, note, scope_of
from workers.delivery.smtp import SendResult

C = ReplyClass
S = Scope
A = Action

#: The policy as a reader states it: (reply class, scope, action).
ROWS = [
    (C.SENT, S.MESSAGE, A.NONE),
    (C.SENT, S.CAMPAIGN_FROM, A.NONE),
    (C.SENT, S.TEST_SEND, A.NONE),
    (C.HARD_BOUNCE, S.MESSAGE, A.NONE),
    (C.HARD_BOUNCE, S.CAMPAIGN_FROM, A.NONE),
    (C.HARD_BOUNCE, S.TEST_SEND, A.NONE),
    (C.REJECTED, S.MESSAGE, A.NONE),
    (C.REJECTED, S.CAMPAIGN_FROM, A.NONE),
    (C.REJECTED, S.TEST_SEND, A.NONE),
    (C.TRANSIENT, S.MESSAGE, A.NONE),
    (C.TRANSIENT, S.CAMPAIGN_FROM, A.NONE),
    (C.TRANSIENT, S.TEST_SEND, A.NONE),
    (C.RELAY, S.MESSAGE, A.RELAY_DOWN),
    (C.RELAY, S.CAMPAIGN_FROM, A.RELAY_DOWN),
    (C.RELAY, S.TEST_SEND, A.RELAY_DOWN),
    (C.RELAY_THROTTLE, S.MESSAGE, A.PACE_RELAY),
    (C.RELAY_THROTTLE, S.CAMPAIGN_FROM, A.PACE_RELAY),
    (C.RELAY_THROTTLE, S.TEST_SEND, A.PACE_RELAY),
    (C.DOMAIN_THROTTLE, S.MESSAGE, A.THROTTLE_DOMAIN),
    (C.DOMAIN_THROTTLE, S.CAMPAIGN_FROM, A.THROTTLE_DOMAIN),
    (C.DOMAIN_THROTTLE, S.TEST_SEND, A.THROTTLE_DOMAIN),
    (C.SENDER, S.MESSAGE, A.SENDER_DOWN),
    (C.SENDER, S.CAMPAIGN_FROM, A.PAUSE_CAMPAIGN),
    (C.SENDER, S.TEST_SEND, A.NONE),
]

CAMPAIGN = 7
SENDER = "News@Example.com"


def job(scope: Scope, job_id: int = 1, email: str = "ada@example.org") -> ClaimedJob:
    kind = {S.MESSAGE: "verification", S.CAMPAIGN_FROM: "broadcast",
            S.TEST_SEND: "test"}[scope]
    return ClaimedJob(id=job_id, kind=kind, email=email, claim_token="t", attempts=1,
                      correlation_id="c", message_id="m",
                      campaign_id=None if scope is S.MESSAGE else CAMPAIGN,
                      subscriber_id=None, broadcast_id=None, user_ref=None, payload={},
                      suppressed=False)


def reply(cls: ReplyClass, stage: str = "rcpt") -> SendResult:
    code = {C.SENT: 250, C.HARD_BOUNCE: 550, C.REJECTED: 554, C.TRANSIENT: 450,
            C.RELAY: 421, C.RELAY_THROTTLE: 451, C.DOMAIN_THROTTLE: 452,
            C.SENDER: 553}[cls]
    return SendResult(reply_class=cls, code=code, enhanced=None, text=f"reply {cls.value}",
                      stage=stage, duration_ms=1.0)


def test_the_table_names_every_pair_once_as_the_rows_say() -> None:
    assert len(ROWS) == len(ReplyClass) * len(Scope)
    assert POLICY == {(cls, scope): action for cls, scope, action in ROWS}


@pytest.mark.parametrize("scope", list(Scope))
def test_a_job_has_its_scope(scope: Scope) -> None:
    assert scope_of(job(scope), campaign_sender=scope is S.CAMPAIGN_FROM) is scope


def test_a_campaign_under_a_shared_from_is_a_message() -> None:
    # An envelope sender every message shares: a refusal is about us, not the campaign.
    assert scope_of(job(S.CAMPAIGN_FROM), campaign_sender=False) is S.MESSAGE
    assert scope_of(replace(job(S.CAMPAIGN_FROM), campaign_id=None),
                    campaign_sender=True) is S.MESSAGE


@pytest.mark.parametrize(("cls", "scope", "action"), ROWS,
                         ids=[f"{c.value}-{s.value}" for c, s, _ in ROWS])
def test_each_row_does_what_its_action_says(cls: ReplyClass, scope: Scope,
                                            action: Action) -> None:
    aftermath = Aftermath()
    this = job(scope)
    assert note(aftermath, this, reply(cls), campaign_sender=scope is S.CAMPAIGN_FROM,
                sender=SENDER) is action
    line = f"{reply(cls).code} reply {cls.value}"
    neighbour = job(scope, job_id=2, email="bob@example.org")  # same domain, same campaign
    elsewhere = replace(job(S.MESSAGE, job_id=3, email="cy@example.net"), campaign_id=None)
    expected = Aftermath()
    if action is A.NONE:
        assert aftermath.empty
    elif action is A.RELAY_DOWN:
        expected.relay_down = line
        expected.probe_recipient = this.email  # refused at a message stage
    elif action is A.SENDER_DOWN:
        expected.relay_down = f"the relay refuses our sender address: {line}"
        expected.probe_recipient = this.email
    elif action is A.PACE_RELAY:
        expected.relay_throttle = line
    elif action is A.THROTTLE_DOMAIN:
        expected.domain_throttles = {"example.org": line}
    elif action is A.PAUSE_CAMPAIGN:
        expected.paused_campaigns = {CAMPAIGN: f"the relay refuses this From address: {line}"}
        expected.refused_senders = {SENDER.lower(): (line, this.email)}
    assert aftermath == expected
    # What the rest of the batch does: everything stops at the relay's trouble; a
    # domain's or a campaign's trouble holds only that domain's or campaign's jobs.
    assert aftermath.stops_batch is (action in (A.RELAY_DOWN, A.SENDER_DOWN, A.PACE_RELAY))
    assert aftermath.holds(neighbour) is (action is A.THROTTLE_DOMAIN or (
        action is A.PAUSE_CAMPAIGN and neighbour.kind == "broadcast"))
    assert not aftermath.holds(elsewhere)


def test_a_refusal_before_any_recipient_is_probed_without_one() -> None:
    for cls, scope in ((C.RELAY, S.MESSAGE), (C.SENDER, S.MESSAGE),
                       (C.SENDER, S.CAMPAIGN_FROM)):
        aftermath = Aftermath()
        note(aftermath, job(scope), reply(cls, stage="mail"),
             campaign_sender=scope is S.CAMPAIGN_FROM, sender=SENDER)
        assert aftermath.probe_recipient is None
        assert all(recipient is None for _, recipient in aftermath.refused_senders.values())


def test_a_421_throttle_closes_the_channel() -> None:
    aftermath = Aftermath()
    note(aftermath, job(S.MESSAGE), replace(reply(C.RELAY_THROTTLE), code=421),
         campaign_sender=False)
    assert aftermath.relay_closed
    assert not _closed_by(451)


def _closed_by(code: int) -> bool:
    aftermath = Aftermath()
    note(aftermath, job(S.MESSAGE), replace(reply(C.RELAY_THROTTLE), code=code),
         campaign_sender=False)
    return aftermath.relay_closed
