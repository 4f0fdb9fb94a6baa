"""Segmented enqueue: a campaign sent to a segment of a list, side by
side with the same list sent whole, in the same run (docs/design.md §27: ≥ 100,000
recipients/s).

Each run is a fresh database with a list of ``size`` subscribers carrying attributes
(``plan``: pro for 1 in 2; ``country``: ES, MX, US or AR in turn) and membership dates one
a minute apart; a campaign goes to the whole list or to a segment, through the same
chunked, set-based enqueue statement. Reported: list members examined per second and
recipients enqueued per second, with the send request's time through the API.

    python -m bench.bench_segment_enqueue --sizes 1000000
"""

from __future__ import annotations

import argparse
import time
from datetime import date, timedelta
from typing import Any

import sqlalchemy as sa

from bench.common import fresh_database, machine, percentile, save, table
from harness.seed import seed_list
from webapp import create_app, db
from webapp.domain import campaigns, segments, users
from workers import queue
from workers.core.settings import load

VARIANTS: dict[str, list[dict[str, Any]] | None] = {
    "whole list": None,
    "segment: plan is set (all)": [{"field": "attribute", "key": "plan", "op": "exists"}],
    "segment: pro in ES/MX, joined after a date (~20%)": [
        {"field": "attribute", "key": "plan", "op": "eq", "value": "pro"},
        {"field": "attribute", "key": "country", "op": "in", "value": ["ES", "MX"]},
        {"field": "subscribed", "op": "after", "value": "AFTER"}],
}


def _seed(engine: sa.Engine, size: int) -> int:
    list_id = seed_list(engine, size)
    with engine.begin() as conn:
        conn.execute(sa.text("""
            UPDATE subscribers SET attributes = jsonb_build_object(
                'plan', CASE WHEN id % 2 = 0 THEN 'pro' ELSE 'free' END,
                'country', (ARRAY['ES', 'MX', 'US', 'AR'])[1 + (id / 2) % 4])"""))
        # Memberships a minute apart, the newest on 2026-01-01.
        conn.execute(sa.text("""
            UPDATE memberships SET created_at = timestamptz '2026-01-01 00:00+00'
                   - make_interval(mins => (:n - subscriber_id)::int)"""), {"n": size})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE"))  # as a list that has been there a while
    return list_id


def measure(size: int, name: str, conditions: list[dict[str, Any]] | None) -> dict[str, Any]:
    with fresh_database() as url:
        engine = db.make_engine(url)
        list_id = _seed(engine, size)
        with engine.begin() as conn:
            user = users.create_user(conn, "bench@example.com", "benchmark-password", "admin")
            token = users.create_token(conn, user["id"])
            segment_id = None
            expected = size
            count_ms = float("nan")
            if conditions is not None:
                # "AFTER": the day that keeps the newest ~80% of the members.
                after = (date(2026, 1, 1) - timedelta(minutes=int(size * 0.8))).isoformat()
                conditions = [{**c, "value": after} if c.get("value") == "AFTER" else c
                              for c in conditions]
                segment = segments.create(conn, list_id, "bench", conditions)
                segment_id = segment["id"]
                t0 = time.perf_counter()  # the composer's live count, once
                expected = segments.count(conn, list_id, segment["conditions"])["will_receive"]
                count_ms = (time.perf_counter() - t0) * 1000
            campaign = campaigns.create(conn, {
                "name": "Bench", "list_id": list_id, "subject": "Hello {{ name }}",
                "text": "Hi {{ name }} {{ unsubscribe_url }}", "segment_id": segment_id},
                default_from="bench@example.com")
        app = create_app(load({"DATABASE_URL": url, "SECRET_KEY": "bench"}), engine=engine)
        t0 = time.perf_counter()
        response = app.test_client().post(f"/api/v1/campaigns/{campaign['id']}/send",
                                          headers={"Authorization": f"Bearer {token}"})
        request_ms = (time.perf_counter() - t0) * 1000
        assert response.status_code == 202, response.get_json()
        t0 = time.perf_counter()
        with engine.begin() as conn:
            summary = queue.enqueue_broadcast(conn, response.get_json()["broadcast_id"])
        elapsed = time.perf_counter() - t0
        assert summary is not None and summary["total"] == expected, (summary, expected)
        with engine.connect() as conn:
            jobs = conn.execute(sa.text("SELECT count(*) FROM delivery_jobs")).scalar_one()
        assert jobs == expected
        engine.dispose()
    return {"size": size, "variant": name, "recipients": expected, "enqueue_s": elapsed,
            "members_per_s": size / elapsed, "recipients_per_s": expected / elapsed,
            "send_request_ms": request_ms, "live_count_ms": count_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000000")
    parser.add_argument("--rounds", type=int, default=1,
                        help="each variant this many times, interleaved (median reported)")
    args = parser.parse_args()
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name, conditions in VARIANTS.items():
                runs[name].append(measure(size, name, conditions))
        for got in runs.values():
            best = sorted(got, key=lambda r: r["enqueue_s"])[len(got) // 2]
            best["enqueue_s_all"] = [round(r["enqueue_s"], 2) for r in got]
            best["send_request_ms_p50"] = percentile([r["send_request_ms"] for r in got], 50)
            results.append(best)
    info = machine()
    print(table(f"Segmented enqueue ({info['cpus']} cores, PostgreSQL {info['postgres']}, "
                f"load {info['load_1m']})",
                ["list", "audience", "recipients", "enqueue s", "members/s", "recipients/s",
                 "send request ms", "live count ms"],
                [[f"{r['size']:,}", r["variant"], f"{r['recipients']:,}",
                  f"{r['enqueue_s']:.2f}", f"{r['members_per_s']:,.0f}",
                  f"{r['recipients_per_s']:,.0f}", f"{r['send_request_ms_p50']:.1f}",
                  f"{r['live_count_ms']:.0f}"]
                 for r in results]))
    print(f"\nsaved {save('segment_enqueue', {'machine': info, 'results': results})}")


if __name__ == "__main__":
    main()
