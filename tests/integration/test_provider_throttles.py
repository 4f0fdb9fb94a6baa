"""docs/design.md §17: every row of the provider throttle table (tests/provider_throttles.py, with
its source in docs/reliability.md) said at RCPT by a scripted receiver (the SMTP sink) for one
domain while another domain is accepted: that domain waits on its own backoff, nobody is
charged an attempt, nothing else slows down or stops; once it accepts, it is delivered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import wait_for
from tests.helpers import campaign_status, jobs_by_email, make_campaign, suppressed
from tests.provider_throttles import PROVIDER_THROTTLES
from workers import queue
from workers.core.settings import Config
from workers.delivery.pool import Pool

pytestmark = pytest.mark.slow


def test_every_provider_throttle_backs_off_only_its_domain(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config]) -> None:
    throttled = {f"p{i}.example": row for i, row in enumerate(PROVIDER_THROTTLES)}
    sink.set_rules({"rules": [{"match": f"*@{domain}", "reply": row.reply, "stage": "rcpt"}
                              for domain, row in throttled.items()]})
    emails = ["first@ok.example"]  # accepted first: the evidence the others are judged by
    for i, domain in enumerate(throttled):
        emails += [f"a{i}@{domain}", f"b{i}@{domain}", f"ok{i}@ok.example"]
    campaign = make_campaign(engine, emails)
    ok = [e for e in emails if e.endswith("@ok.example")]
    pool = Pool(engine, config_for(sink.port, WORKERS="1", CLAIM_BATCH="4",
                                   THROTTLE_BACKOFF="600"), node="provider-rows")
    pool.start()
    try:
        wait_for(lambda: len(sink.records()) == len(ok) and "sending" not in {
            j["status"] for j in jobs_by_email(engine, campaign["id"]).values()}, timeout=60)
        jobs = jobs_by_email(engine, campaign["id"])
        with engine.connect() as conn:
            backoffs = {t["domain"]: t for t in queue.domain_throttles(conn)}
            relay = queue.relay_status(conn)
        for domain, row in throttled.items():
            waiting = [jobs[f"{x}{domain[1:-8]}@{domain}"] for x in "ab"]
            where = f"{row.provider}: {row.reply[:40]}"
            assert all(j["status"] == "pending" and j["attempts"] == 0 for j in waiting), where
            assert domain in backoffs and backoffs[domain]["hits"] == 1, where
            assert row.reply[:3] in (backoffs[domain]["last_reply"] or ""), where
        assert {jobs[e]["status"] for e in ok} == {"sent"}
        assert relay["status"] == "ok" and not relay["throttled"]  # the relay never slowed
        assert campaign_status(engine, campaign["id"]) == "sending"  # never paused
        refused = sink.rejections()
        assert len(refused) == len(throttled)  # one try per domain, then it waits
        # the receivers accept again (their backoff is over): everyone is delivered once
        sink.set_rules({"rules": []})
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE domain_throttles SET until = now()"))
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=60)
    finally:
        pool.stop()
    jobs = jobs_by_email(engine, campaign["id"])
    assert all(j["status"] == "sent" and j["attempts"] == 1 for j in jobs.values())
    assert sorted(r["rcpt_tos"][0] for r in sink.records()) == sorted(emails)
    assert suppressed(engine) == set()
