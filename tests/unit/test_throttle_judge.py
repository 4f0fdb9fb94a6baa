"""docs/design.md §17: whom a throttle reply concerns is decided by evidence across domains; the
wording (the table's class) is only the hint."""

from __future__ import annotations

import pytest

from tests.provider_throttles import PROVIDER_THROTTLES, ProviderReply
from workers.delivery.classify import ReplyClass, ThrottleJudge, classify_reply

DOMAIN = ReplyClass.DOMAIN_THROTTLE
RELAY = ReplyClass.RELAY_THROTTLE
ISSUE_REPLY = "4.7.0 Rate limit exceeded for this domain, try again later"
ANVIL_REPLY = "4.7.1 <a@x.example>: Recipient address rejected: too many recipients from 127.0.0.1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def judged(judge: ThrottleJudge, code: int, text: str, recipient: str,
           stage: str = "rcpt") -> tuple[ReplyClass, list[str]]:
    return judge.judge(classify_reply(code, text, stage), code, text, recipient, stage)


def test_one_domain_throttled_while_others_are_accepted_is_that_domains() -> None:
    """The issue's case: the wording says "rate limit exceeded" (the table's hint: the
    relay), but another domain was just accepted: that domain throttles us."""
    judge = ThrottleJudge(clock=Clock())
    assert classify_reply(450, ISSUE_REPLY, "rcpt") is RELAY  # the hint alone
    judge.accepted("fast.example")
    assert judged(judge, 450, ISSUE_REPLY, "a@slow.example") == (DOMAIN, [])
    assert judged(judge, 450, ISSUE_REPLY, "b@slow.example") == (DOMAIN, [])


def test_the_same_reply_for_a_second_domain_is_the_relay_and_lifts_the_first() -> None:
    """Postfix's anvil throttles every domain alike: once the same reply comes for a second
    domain it is the relay's, and the domain judged throttled before is handed back."""
    judge = ThrottleJudge(clock=Clock())
    judge.accepted("one.example")
    first = ANVIL_REPLY.replace("a@x.example", "a@two.example")
    assert judged(judge, 450, first, "a@two.example") == (DOMAIN, [])
    second = ANVIL_REPLY.replace("a@x.example", "b@three.example")
    assert judged(judge, 450, second, "b@three.example") == (RELAY, ["two.example"])


def test_without_evidence_the_wording_decides() -> None:
    judge = ThrottleJudge(clock=Clock())
    assert judged(judge, 450, ANVIL_REPLY, "a@x.example")[0] is RELAY
    gmail = "4.7.28 Our system has detected an unusual rate of unsolicited mail"
    assert judged(judge, 421, gmail, "a@gmail.example")[0] is DOMAIN


def test_evidence_is_forgotten_after_the_window() -> None:
    clock = Clock()
    judge = ThrottleJudge(window=5.0, clock=clock)
    judge.accepted("fast.example")
    clock.now += 6
    assert judged(judge, 450, ANVIL_REPLY, "a@x.example")[0] is RELAY  # no fresh evidence
    clock.now += 6
    judge.accepted("fast.example")
    assert judged(judge, 450, ANVIL_REPLY, "b@y.example")[0] is DOMAIN  # x.example is old


def test_a_throttle_before_rcpt_is_always_the_relays() -> None:
    judge = ThrottleJudge(clock=Clock())
    judge.accepted("fast.example")
    assert judge.judge(RELAY, 421, "4.7.0 Try later", "a@slow.example", "mail") == (RELAY, [])


def test_a_temporary_sender_refusal_for_one_domain_is_that_domains_throttle() -> None:
    """Proofpoint Essentials' inbound limit answers "450 4.7.1 Sender address rejected":
    when the same From was accepted for another domain just now, it is that domain's
    throttle, not a refusal of our sender (which would pause the campaign)."""
    judge = ThrottleJudge(clock=Clock())
    reply = "4.7.1 <news@example.com>: Sender address rejected"
    cls = classify_reply(450, reply, "rcpt")
    assert cls is ReplyClass.SENDER
    assert judge.judge(cls, 450, reply, "a@pp.example", "rcpt", "news@example.com")[0] is cls
    judge.accepted("other.example", "news@example.com")
    assert judge.judge(cls, 450, reply, "a@pp.example", "rcpt",
                       "news@example.com")[0] is DOMAIN
    # another sender's acceptance is no evidence for this one; a 5xx is never a throttle
    assert judge.judge(cls, 450, reply, "a@pp.example", "rcpt", "other@example.com")[0] is cls
    assert judge.judge(cls, 554, reply, "a@pp.example", "rcpt", "news@example.com")[0] is cls


def test_other_classes_pass_through() -> None:
    judge = ThrottleJudge(clock=Clock())
    judge.accepted("fast.example")
    for cls in (ReplyClass.TRANSIENT, ReplyClass.RELAY, ReplyClass.HARD_BOUNCE):
        assert judge.judge(cls, 450, "4.2.1 Mailbox busy", "a@x.example", "rcpt") == (cls, [])


def test_a_hint_contradicted_by_another_domains_acceptance_is_handed_back() -> None:
    """At the very start nothing was accepted yet, so the wording decides ("rate limit
    exceeded": the relay). Another domain accepted right after, with no other domain given
    that reply: it was that domain's throttle, handed back with its reply."""
    judge = ThrottleJudge(clock=Clock())
    assert judged(judge, 450, ISSUE_REPLY, "a@slow.example") == (RELAY, [])
    assert judge.accepted("slow.example") == {}  # the same domain proves nothing
    wrong = judge.accepted("fast.example")
    assert list(wrong) == ["slow.example"] and "Rate limit exceeded" in wrong["slow.example"]
    assert judge.accepted("other.example") == {}  # handed back once


def test_a_hint_confirmed_by_a_second_domain_stays_the_relays() -> None:
    judge = ThrottleJudge(clock=Clock())
    assert judged(judge, 450, ANVIL_REPLY, "a@one.example")[0] is RELAY
    assert judged(judge, 450, ANVIL_REPLY, "b@two.example") == (RELAY, ["one.example"])
    assert judge.accepted("three.example") == {}


@pytest.mark.parametrize("row", PROVIDER_THROTTLES, ids=lambda r: f"{r.provider}-{r.reply[:9]}")
def test_every_documented_provider_throttle_is_a_throttle(row: ProviderReply) -> None:
    """Every row of the provider table (docs/reliability.md): the table alone already
    calls it a throttle (or, for Proofpoint's inbound limit, a refused sender), never a
    recipient's failure; with another domain accepted just now it is that domain's."""
    code, text = int(row.reply[:3]), row.reply[4:]
    hint = classify_reply(code, text, "rcpt")
    assert hint in (DOMAIN, RELAY, ReplyClass.SENDER), hint
    judge = ThrottleJudge(clock=Clock())
    judge.accepted("ok.example", "news@example.com")
    assert judge.judge(hint, code, text, "s0@provider.example", "rcpt",
                       "news@example.com") == (DOMAIN, [])


def test_memory_stays_bounded_by_the_window() -> None:
    clock = Clock()
    judge = ThrottleJudge(window=5.0, clock=clock)
    for i in range(50_000):
        clock.now += 0.01  # 100 acceptances a second, each at another domain
        judge.accepted(f"d{i}.example", "news@example.com")
    # 500 domains in the 5 s window, in both maps, plus the slack before the next pruning
    assert len(judge._accepted) + len(judge._senders) <= 4000
    judge.accepted("fast.example")
    assert judged(judge, 450, ISSUE_REPLY, "a@slow.example")[0] is DOMAIN
