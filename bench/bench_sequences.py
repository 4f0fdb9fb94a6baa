"""Sequences at size: enrolment by a list add, the advancer's throughput and its
due query, the person's timeline, and events through the API.

A fresh database; ``--enrollments`` subscribers are added to a list in one statement (the
statement-level trigger enrols them all in the same transaction), timed against the same
add with no sequence; then the advancer (``workers.delivery.sequences.tick``, as the pool
runs it) makes the first email step's jobs of ``--advance`` of them; the due query is
timed with every enrollment waiting a day; a person's timeline is read; and ``--events``
events are posted through the API (Flask's test client, one process), one a request and
then ``--batch`` a request; last, single events from ``--http-clients`` keep-alive
clients against a real ``senddock web``, as the team's app would post them.

    python -m bench.bench_sequences --enrollments 1000000
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.bench_api import burst
from bench.bench_p7_latency import start_server
from bench.common import free_port, fresh_database, in_threads, machine, percentile, save, table
from webapp import create_app, db
from webapp.domain import sequences, users
from workers.core.settings import load
from workers.delivery import sequences as advancer

STEPS = [{"type": "email", "subject": "Welcome {{ name }}", "text_body": "Hi {{ email }}"},
         {"type": "wait", "wait_seconds": 86400},
         {"type": "email", "subject": "Day two", "text_body": "Again"}]


def _add(engine: sa.Engine, n: int, name: str, with_sequence: bool) -> float:
    with engine.begin() as conn:
        list_id = conn.execute(sa.text("INSERT INTO lists (name) VALUES (:n) RETURNING id"),
                               {"n": name}).scalar_one()
        conn.execute(sa.text("""
            INSERT INTO subscribers (email, name)
            SELECT 'u' || g || '-' || :tag || '@example.com', 'User ' || g
              FROM generate_series(1, :n) g"""), {"n": n, "tag": list_id})
        if with_sequence:
            sequences.create_sequence(conn, {"name": name, "trigger_type": "list_add",
                                             "list_id": list_id, "steps": STEPS}, "bench")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE subscribers"))
    t0 = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(sa.text("""
            INSERT INTO memberships (list_id, subscriber_id)
            SELECT :l, id FROM subscribers WHERE email LIKE '%-' || :tag || '@example.com'"""),
            {"l": list_id, "tag": str(list_id)})
    return time.perf_counter() - t0


def _batched_http(base: str, token: str, calls: int, batch: int,
                  clients: int = 4) -> dict[str, Any]:
    """``calls`` requests of ``batch`` events each (every one a new person enrolled) from
    ``clients`` threads with a connection each, against a running ``senddock web``."""
    host, port = base.removeprefix("http://").split(":")
    latencies: list[float] = []
    created: list[int] = []
    lock = threading.Lock()

    def run(c: int) -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        for n in range(c, calls, clients):
            body = json.dumps({"events": [
                {"email": f"hb{n}-{i}@example.org", "name": "trial", "data": {"i": i}}
                for i in range(batch)]})
            t0 = time.perf_counter()
            connection.request("POST", "/api/v1/events", body=body, headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            response = connection.getresponse()
            answer = json.loads(response.read())
            with lock:
                latencies.append((time.perf_counter() - t0) * 1000)
                created.append(len(answer.get("events", [])) if response.status == 201 else 0)
        connection.close()

    seconds = in_threads(clients, run)
    return {"calls": calls, "batch": batch, "clients": clients, "events": sum(created),
            "events_per_s": sum(created) / seconds, "p50": percentile(latencies, 50),
            "p95": percentile(latencies, 95),
            "not_201": sum(1 for n in created if n != batch)}


def _http_events(url: str, token: str, clients: int, seconds: float, batch: int,
                 batch_calls: int) -> dict[str, Any]:
    """Events, one a request, from ``clients`` keep-alive HTTP clients (two processes) for
    ``seconds`` against a real ``senddock web`` (waitress): every one a new person enrolled;
    then ``batch_calls`` requests of ``batch`` events from four clients."""
    with tempfile.TemporaryDirectory() as tmp:
        server, base = start_server(url, free_port(), Path(tmp) / "web.log", command="web")
        try:
            single = burst(base, "/api/v1/events", token, clients, seconds, prefix="evt",
                           kind="event", ok=201)
            return {**single, "batched": _batched_http(base, token, batch_calls, batch)}
        finally:
            server.terminate()
            server.wait(timeout=30)


def measure(n: int, advance: int, events: int, batch: int = 100, http_clients: int = 0,
            http_seconds: float = 10, batch_calls: int = 200) -> dict[str, Any]:
    with fresh_database() as url:
        engine = db.make_engine(url)
        plain_s = _add(engine, n, "plain", with_sequence=False)
        enrol_s = _add(engine, n, "welcome", with_sequence=True)
        with engine.connect() as conn:
            enrolled = conn.execute(sa.text(
                "SELECT count(*) FROM sequence_enrollments")).scalar_one()
        assert enrolled == n, (enrolled, n)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE"))
        t0 = time.perf_counter()
        moved = 0
        while moved < advance:
            moved += advancer.tick(engine)
        advance_s = time.perf_counter() - t0
        with engine.begin() as conn:  # everyone waiting a day: nothing due
            conn.execute(sa.text("UPDATE sequence_enrollments SET due_at = now() + "
                                 "interval '1 day'"))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE sequence_enrollments"))
        with engine.begin() as conn:
            plan = "\n".join(r[0] for r in conn.execute(sa.text(
                "EXPLAIN ANALYZE " + str(advancer.DUE.text)), {"batch": advancer.BATCH}))
        due_ms = float(plan.rsplit("Execution Time: ", 1)[1].split()[0])
        with engine.connect() as conn:
            email = conn.execute(sa.text(
                "SELECT s.email FROM sequence_enrollments e JOIN subscribers s "
                "ON s.id = e.subscriber_id ORDER BY e.id LIMIT 1")).scalar_one()
            t0 = time.perf_counter()
            person = sequences.person(conn, email)
            person_ms = (time.perf_counter() - t0) * 1000
            t0 = time.perf_counter()
            funnel = sequences.funnel(conn, 1)
            funnel_ms = (time.perf_counter() - t0) * 1000
        assert person["enrollments"] and funnel["steps"]
        with engine.begin() as conn:
            sequences.create_sequence(conn, {"name": "trial", "trigger_type": "event",
                                             "trigger_event": "trial", "steps": STEPS},
                                      "bench")
            user = users.create_user(conn, "bench@example.com", "benchmark-password", "admin")
            token = users.create_token(conn, user["id"])
        client = create_app(load({"DATABASE_URL": url, "SECRET_KEY": "bench"}),
                            engine=engine).test_client()
        headers = {"Authorization": f"Bearer {token}"}
        t0 = time.perf_counter()
        for i in range(events):
            r = client.post("/api/v1/events", headers=headers, json={
                "email": f"event{i}@example.org", "name": "trial", "data": {"i": i}})
            assert r.status_code == 201, r.get_json()
        events_s = time.perf_counter() - t0
        # The same number of events again, ``batch`` to a request (one statement each).
        t0 = time.perf_counter()
        for start in range(0, events, batch):
            r = client.post("/api/v1/events", headers=headers, json={"events": [
                {"email": f"batch{i}@example.org", "name": "trial", "data": {"i": i}}
                for i in range(start, min(start + batch, events))]})
            assert r.status_code == 201, r.get_json()
        batched_s = time.perf_counter() - t0
        http = _http_events(url, token, http_clients, http_seconds, batch,
                            batch_calls) if http_clients else {}
        engine.dispose()
    return {"enrollments": n, "add_plain_s": plain_s, "add_enrol_s": enrol_s,
            "enrolled_per_s": n / enrol_s, "advanced": moved, "advance_s": advance_s,
            "advanced_per_s": moved / advance_s, "due_query_ms": due_ms,
            "due_plan": plan, "person_ms": person_ms, "funnel_ms": funnel_ms,
            "events": events, "events_per_s": events / events_s, "batch": batch,
            "batched_per_s": events / batched_s, "http": http}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--enrollments", type=int, default=1_000_000)
    parser.add_argument("--advance", type=int, default=50_000)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100, help="events per request, for "
                        "the batched figure")
    parser.add_argument("--http-clients", type=int, default=16,
                        help="keep-alive clients posting single events to `senddock web` "
                        "(0: skip)")
    parser.add_argument("--http-seconds", type=float, default=10)
    parser.add_argument("--http-batches", type=int, default=200,
                        help="requests of --batch events each, from 4 HTTP clients")
    args = parser.parse_args()
    r = measure(args.enrollments, args.advance, args.events, args.batch, args.http_clients,
                args.http_seconds, args.http_batches)
    info = machine()
    print(table(f"Sequences ({info['cpus']} cores, PostgreSQL {info['postgres']}, "
                f"load {info['load_1m']})",
                ["enrollments", "list add s (no sequence)", "list add + enrol s",
                 "enrolled/s", "advanced (1 email job each)", "advanced/s", "due query ms",
                 "person ms", "funnel ms", "events/s (API, 1 a request)",
                 f"events/s (API, {r['batch']} a request)"],
                [[f"{r['enrollments']:,}", f"{r['add_plain_s']:.2f}",
                  f"{r['add_enrol_s']:.2f}", f"{r['enrolled_per_s']:,.0f}",
                  f"{r['advanced']:,}", f"{r['advanced_per_s']:,.0f}",
                  f"{r['due_query_ms']:.2f}", f"{r['person_ms']:.1f}",
                  f"{r['funnel_ms']:.1f}", f"{r['events_per_s']:,.0f}",
                  f"{r['batched_per_s']:,.0f}"]]))
    if r["http"]:
        h = r["http"]
        print("\n" + table(f"Single events through `senddock web`, {args.http_clients} "
                           "keep-alive clients (one enrolment each)",
                           ["requests", "events/s", "p50 ms", "p95 ms", "p99 ms", "not 201",
                            "clients CPU s"],
                           [[f"{h['requests']:,}", f"{h['rps']:,.0f}", f"{h['p50']:.1f}",
                             f"{h['p95']:.1f}", f"{h['p99']:.1f}", h["non_202"],
                             f"{h['client_cpu_s']:.1f}"]]))
        b = h["batched"]
        print("\n" + table(f"Events through `senddock web`, {b['batch']} a request, "
                           f"{b['clients']} clients (one enrolment each)",
                           ["requests", "events", "events/s", "p50 ms", "p95 ms",
                            "requests not 201"],
                           [[f"{b['calls']:,}", f"{b['events']:,}",
                             f"{b['events_per_s']:,.0f}", f"{b['p50']:.1f}",
                             f"{b['p95']:.1f}", b["not_201"]]]))
    print("\nThe due query with every enrollment waiting:\n" + r["due_plan"])
    print(f"\nsaved {save('sequences', {'machine': info, 'results': [r]})}")


if __name__ == "__main__":
    main()
