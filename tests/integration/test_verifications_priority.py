"""P7: a verification email never waits behind a campaign. With 20,000 campaign jobs queued
and draining through a real pool and SMTP sink, a verification enqueued afterwards reaches
the sink within the next few hundred messages, long before the campaign is done."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api, wait_for
from webapp.domain import campaigns
from workers import queue
from workers.core.settings import Config
from workers.delivery.pool import Pool

CAMPAIGN_SIZE = 20_000
VERIFY_TO = "verify-me@example.net"


def queue_campaign(engine: sa.Engine, n: int) -> int:
    """A list of ``n`` subscribers (set-based) and its campaign sent and enqueued; returns
    the broadcast id."""
    with engine.begin() as conn:
        list_id = conn.execute(sa.text(
            "INSERT INTO lists (name) VALUES ('P7 list') RETURNING id")).scalar_one()
        conn.execute(sa.text("""
            WITH s AS (
                INSERT INTO subscribers (email, name)
                SELECT 'reader' || g || '@example.org', 'Reader ' || g
                  FROM generate_series(1, :n) g RETURNING id)
            INSERT INTO memberships (list_id, subscriber_id) SELECT :list_id, id FROM s"""),
            {"n": n, "list_id": list_id})
        campaign = campaigns.create(conn, {"name": "Big campaign", "list_id": list_id,
                                           "subject": "News", "text": "Hello {{ name }}"},
                                    default_from="news@example.com")
        sent = campaigns.send(conn, campaign["id"])
        summary = queue.enqueue_broadcast(conn, sent["broadcast_id"])
    assert summary is not None and summary["total"] == n
    return int(sent["broadcast_id"])


def accepted_lines(sink: Any) -> list[bytes]:
    if not sink.record_path.exists():
        return []
    return [line for line in sink.record_path.read_bytes().splitlines()
            if line and b'"rejected"' not in line]


@pytest.mark.slow
def test_verification_overtakes_a_draining_campaign(engine: sa.Engine, sink: Any, api: Api,
                                                    config_for: Callable[..., Config]) -> None:
    broadcast_id = queue_campaign(engine, CAMPAIGN_SIZE)
    pool = Pool(engine, config_for(sink.port), node="p7-test")
    pool.start()
    try:
        wait_for(lambda: len(accepted_lines(sink)) >= 300, timeout=120,
                 message="the campaign to be draining")
        r = api.post("/verifications", {"user_id": "p7", "email": VERIFY_TO,
                                        "verify_url": "https://app.example/verify?t=p7"})
        assert r.status_code == 202
        before = len(accepted_lines(sink))
        wait_for(lambda: VERIFY_TO.encode() in sink.record_path.read_bytes(), timeout=60,
                 message="the verification email at the sink")
    finally:
        pool.stop(timeout=30)
    lines = accepted_lines(sink)
    position = next(i for i, line in enumerate(lines) if VERIFY_TO.encode() in line)
    # At most the batches already claimed (workers x claim batch) plus the ones in the
    # relay's hands can go first; everything else of the campaign waits.
    assert position - before < 300, (position, before)
    assert position < CAMPAIGN_SIZE // 2
    with engine.connect() as conn:
        waiting = queue.broadcast_counts(conn, broadcast_id)["pending"]
    assert waiting > 0, "the campaign finished first: the test proves nothing"
