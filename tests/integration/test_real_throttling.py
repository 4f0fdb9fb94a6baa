"""docs/design.md §17 against a real Postfix (harness.postfix): throttling slows what it concerns
and never stops everything. Judged by Postfix's own clock and mailbox.

- Postfix's anvil (20 recipients / 5 s): the relay's limit is met by pacing every
  process, within twice the ideal time, nobody failed, no attempt used by throttling;
- one domain refused with a rate-limit reply while the others are accepted: only that
  domain waits, the others go at full speed, the campaign page says so (en and es);
- a refused From: probed with the same MAIL FROM, the campaign resumes by itself once
  Postfix accepts it again, and the alarm says which sender and since when."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from harness.postfix import Postfix
from tests.conftest import wait_for
from tests.helpers import Browser, attempts_of, campaign_status, jobs_by_email, suppressed
from tests.integration.test_real_relays import (
    campaign,
    delivered_once,
    pools,  # noqa: F401  (fixture)
    relay_config,
    relay_row,
    statuses,
)
from workers import queue
from workers.core.settings import Config
from workers.delivery.pool import Pool

pytestmark = pytest.mark.slow

ANVIL_LIMIT, ANVIL_WINDOW, ANVIL_MESSAGES = 20, 5, 90


def web_client(config: Config, engine: sa.Engine, make_user: Any,
               role: str = "admin") -> Browser:
    from webapp import create_app

    return Browser(create_app(config, engine=engine).test_client(), make_user(role))


def test_anvil_limit_is_met_by_pacing(relay: Postfix, engine: sa.Engine,
                                      config_for: Callable[..., Config],
                                      pools: Callable[..., Pool]) -> None:  # noqa: F811
    """smtpd_client_recipient_rate_limit = 20 per 5 s against 5 threads that could send
    far faster: "450 4.7.1 Error: too many recipients from 127.0.0.1" halves the pace of
    every process, which grows back while Postfix accepts. 90 messages delivered once
    each within 2x the ideal time, 0 failed, one attempt each (throttling used none)."""
    relay.configure(smtpd_client_recipient_rate_limit=str(ANVIL_LIMIT),
                    anvil_rate_time_unit=f"{ANVIL_WINDOW}s")
    emails = [f"a{i:02d}@example.org" for i in range(ANVIL_MESSAGES)]
    sent = campaign(engine, emails)
    started = time.monotonic()
    pools(relay_config(config_for, relay, WORKERS="5", THROTTLE_BACKOFF="30"))
    wait_for(lambda: campaign_status(engine, sent["id"]) == "sent", timeout=120,
             interval=0.5)
    took = time.monotonic() - started
    jobs = jobs_by_email(engine, sent["id"])
    assert statuses(engine, sent["id"]) == {"sent": ANVIL_MESSAGES}
    assert all(j["attempts"] == 1 for j in jobs.values())  # throttling used no attempt
    delivered_once(relay, emails)
    times = sorted(relay.accepted_times())
    span = (times[-1] - times[0]).total_seconds()
    # Ideal: the first window's 20 at once, then 20 per window: the last batch starts
    # (ceil(90/20) - 1) windows after the first message.
    ideal = (math.ceil(ANVIL_MESSAGES / ANVIL_LIMIT) - 1) * ANVIL_WINDOW
    throttled = relay.count(r"Recipient address rate limit exceeded")
    print(f"\nanvil {ANVIL_LIMIT}/{ANVIL_WINDOW}s: {ANVIL_MESSAGES} delivered over {span:.1f} s "
          f"by Postfix's clock (ideal {ideal} s, ratio {span / ideal:.2f}); {throttled} "
          f"throttled RCPTs; {took:.1f} s from start to 'sent'; pace now "
          f"{relay_row(engine)['paced_rate']}")
    assert throttled >= 1 and relay_row(engine)["throttle_hits"] >= 1
    assert span <= 2 * ideal
    assert relay_row(engine)["status"] == "ok"  # slowed down, never stopped


ISSUE_REPLY = "450 4.7.0 Rate limit exceeded for this domain, try again later"


def test_a_throttled_domain_delays_only_its_own_recipients(
        relay: Postfix, engine: sa.Engine, config_for: Callable[..., Config],
        pools: Callable[..., Pool], make_user: Any) -> None:  # noqa: F811
    """The issue's case: one domain answers "450 4.7.0 Rate limit exceeded for this
    domain, try again later" at RCPT, every other domain is accepted. By that evidence it
    is the domain's backoff (the wording alone would say the relay's): the other domain's
    300 messages go at full speed, unpaced; the throttled domain's wait, unattempted, and
    the campaign page says how many wait for it and until when; once the domain accepts
    again they are delivered once each."""
    relay.write_map("recipient_access", {"slow.example": ISSUE_REPLY})
    fast = [f"f{i:03d}@fast.example" for i in range(300)]
    slow = [f"s{i}@slow.example" for i in range(10)]
    sent = campaign(engine, fast[:20] + slow + fast[20:])
    config = relay_config(config_for, relay, WORKERS="5", THROTTLE_BACKOFF="20,20")
    pools(config)
    wait_for(lambda: len(relay.messages()) == len(fast), timeout=90, interval=0.5)
    wait_for(lambda: "sending" not in statuses(engine, sent["id"]), timeout=30)
    jobs = jobs_by_email(engine, sent["id"])
    assert {jobs[e]["status"] for e in fast} == {"sent"}
    assert all(jobs[e]["status"] == "pending" and jobs[e]["attempts"] == 0 for e in slow)
    row = relay_row(engine)
    # The relay itself is not slowed down: at the very start (nothing accepted yet) the
    # wording may pace it for a moment, lifted at the other domain's first acceptance.
    assert row["status"] == "ok" and row["paced_rate"] is None and not row["throttled"]
    assert row["throttle_hits"] <= 1
    times = sorted(relay.accepted_times())
    span = (times[-1] - times[0]).total_seconds()
    refused = relay.count(r"reject: RCPT from .*Rate limit exceeded for this domain")
    print(f"\nthrottled domain: 300 fast.example messages over {span:.1f} s, "
          f"{refused} refused RCPTs for slow.example, its 10 waiting")
    assert refused <= 5  # the first tries (one per thread at most), then it waits
    with engine.connect() as conn:
        [throttle] = queue.domain_throttles(conn)
    assert throttle["domain"] == "slow.example" and throttle["hits"] == 1

    web = web_client(config, engine, make_user, "marketer")
    url = f"/campaigns/{sent['id']}?fragment=live"
    english = web.get(url, headers={"Accept-Language": "en"}).get_data(as_text=True)
    assert re.search(r"10 waiting for slow\.example \(throttled until \d\d:\d\d:\d\d", english)
    spanish = web.get(url, headers={"Accept-Language": "es"}).get_data(as_text=True)
    assert re.search(r"10 esperando a slow\.example \(frenado hasta las \d\d:\d\d:\d\d",
                     spanish), spanish[-2000:]

    relay.write_map("recipient_access", {})
    wait_for(lambda: campaign_status(engine, sent["id"]) == "sent", timeout=90, interval=0.5)
    delivered_once(relay, fast + slow)
    jobs = jobs_by_email(engine, sent["id"])
    assert all(j["attempts"] == 1 for j in jobs.values())
    assert suppressed(engine) == set()


def test_a_refused_sender_resumes_by_itself(relay: Postfix, engine: sa.Engine,
                                            config_for: Callable[..., Config],
                                            pools: Callable[..., Pool],  # noqa: F811
                                            make_user: Any) -> None:
    """Postfix's check_sender_access refuses one campaign's From (at RCPT): the campaign
    pauses with the reason and nobody is charged; the alarm names the sender and since
    when; the same MAIL FROM is probed on a backoff, and once the map no longer refuses it
    the campaign resumes by itself (within 60 s, at the default probe ceiling)."""
    relay.write_map("sender_access", {"blocked@example.com": "554 5.7.1 not allowed here"})
    emails = [f"b{i}@example.org" for i in range(5)]
    sent = campaign(engine, emails, from_addr="Blocked <blocked@example.com>")
    config = relay_config(config_for, relay, RELAY_PROBE_MAX="60")
    pools(config)
    wait_for(lambda: campaign_status(engine, sent["id"]) == "paused", timeout=30)
    time.sleep(8)  # several probes, each refused: still paused, escalating
    assert campaign_status(engine, sent["id"]) == "paused"
    jobs = jobs_by_email(engine, sent["id"])
    assert all(j["attempts"] == 0 and attempts_of(engine, j["id"]) == []
               for j in jobs.values())
    with engine.connect() as conn:
        [refusal] = queue.sender_refusals(conn)
    assert refusal["sender"] == "blocked@example.com" and refusal["failures"] >= 2
    probes = relay.count(r"reject: RCPT from .*Sender address rejected")
    assert 2 <= probes <= 12  # backed off, not hammered
    health = web_client(config, engine, make_user).get("/health/").get_data(as_text=True)
    assert 'data-alarm="sender_refused"' in health
    assert re.search(r"refuses the From address blocked@example\.com since "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", health)

    relay.write_map("sender_access", {})
    lifted = time.monotonic()
    wait_for(lambda: campaign_status(engine, sent["id"]) == "sent", timeout=90, interval=0.5)
    resumed_in = time.monotonic() - lifted
    print(f"\nsender refusal lifted: campaign sent {resumed_in:.1f} s later "
          f"({probes} refused probes/tries before)")
    assert resumed_in < 60
    delivered_once(relay, emails)
    assert all(j["attempts"] == 1 for j in jobs_by_email(engine, sent["id"]).values())
    with engine.connect() as conn:
        assert queue.sender_refusals(conn) == []
        reason = conn.execute(sa.text("SELECT paused_reason FROM campaigns WHERE id = :id"),
                              {"id": sent["id"]}).scalar_one()
    assert reason is None
