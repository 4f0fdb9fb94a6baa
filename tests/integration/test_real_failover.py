"""Several relays against two real Postfix instances (docs/design.md §17): one of them stopped
mid-drain, the other carries on within seconds; nobody is lost; the only duplicates are
the honest window (a message a thread had in the stopped relay's hands)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from harness import postfix
from harness.postfix import Postfix
from tests.conftest import wait_for
from tests.helpers import campaign_status, jobs_by_email
from tests.integration.test_real_relays import campaign, pools  # noqa: F401  (fixture)
from workers import queue
from workers.core.settings import Config
from workers.delivery.pool import Pool

pytestmark = pytest.mark.slow

WORKERS = 5


@pytest.fixture()
def second_relay(relay: Postfix) -> Iterator[Postfix]:
    with postfix.running() as other:
        yield other


def test_one_of_two_postfix_relays_stopped_mid_drain(
        relay: Postfix, second_relay: Postfix, engine: sa.Engine,
        config_for: Callable[..., Config], pools: Callable[..., Pool]) -> None:  # noqa: F811
    """Two relays for all mail (the first preferred): Postfix A is stopped after 40
    messages; B carries the rest within 10 s; every recipient is delivered, duplicates
    at most one per thread; A, started again, is probed back and takes the traffic back."""
    a, b = relay, second_relay
    emails = [f"r{i:03d}@example.org" for i in range(200)]
    sent = campaign(engine, emails)
    url = f"{a.smtp_url()}&name=a, {b.smtp_url()}&name=b"
    pools(config_for(None, SMTP_URL=url, SMTP_HELO="client.senddock.test",
                     WORKERS=str(WORKERS), RATE_LIMIT="20", RELAY_PROBE_MAX="1"))
    wait_for(lambda: len(a.messages()) >= 40, timeout=60, interval=0.2)
    assert b.messages() == []  # the first relay carries everything while it works
    a.stop()
    stopped = time.monotonic()
    wait_for(lambda: len(b.messages()) >= 1, timeout=30, interval=0.1,
             message="the second relay carries on")
    failover = time.monotonic() - stopped
    with engine.connect() as conn:
        assert queue.relay_states(conn, 2)[0]["status"] == "down"
    wait_for(lambda: len(b.messages()) >= 40, timeout=60, interval=0.2)
    a.start()
    restarted = time.monotonic()
    before = len(a.messages())
    wait_for(lambda: len(a.messages()) > before, timeout=30, interval=0.2,
             message="the first relay takes its traffic back")
    takeback = time.monotonic() - restarted
    wait_for(lambda: campaign_status(engine, sent["id"]) == "sent", timeout=120, interval=0.5)
    jobs = jobs_by_email(engine, sent["id"])
    assert {j["status"] for j in jobs.values()} == {"sent"}
    # one copy per Postfix queue ID: a Postfix stopped mid-delivery delivers that queue
    # file again after its restart (its own duplicate, not one SendDock sent)
    got = Counter(m.recipient for m in {(m.path.parent, m.queue_id): m for m in
                                        a.messages() + b.messages()}.values())
    assert set(got) == set(emails)  # 0 lost
    duplicates = sum(n - 1 for n in got.values())
    print(f"\ntwo Postfix relays: failover in {failover:.1f} s, take-back in {takeback:.1f} s "
          f"after the restart; {len(a.messages())} through a, {len(b.messages())} through b, "
          f"{duplicates} duplicate(s)")
    assert failover < 10
    assert duplicates <= WORKERS  # the honest window: one per thread at the stop
