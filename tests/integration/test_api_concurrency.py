"""Every API request holds at most one pooled connection (docs/scale-out.md): the token
check's connection goes back to the pool before a view takes its own, so a `senddock web`
on defaults (as many request threads as pooled connections) answers as many concurrent
clients as it has threads without one request waiting on another's connection. Before,
five requests each held the token check's connection while waiting for a second one, and
all of them waited out the pool timeout (503 "database busy")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
import sqlalchemy as sa

from tests.conftest import Proc, free_port, settings, wait_for
from webapp.domain import sequences

pytestmark = pytest.mark.slow

CLIENTS = 12
REQUESTS = 8  # per client


def test_concurrent_api_requests_never_wait_on_each_others_connections(
        db_url: str, engine: sa.Engine, sink: Any, spawn: Callable[..., Proc],
        make_user: Callable[..., dict[str, Any]]) -> None:
    with engine.begin() as conn:
        sequences.create_sequence(conn, {"name": "Trial", "trigger_type": "event",
                                         "trigger_event": "trial", "steps": [
                                             {"type": "email", "subject": "Hi",
                                              "text_body": "Hello"}]}, "tests")
    token = make_user("admin")["token"]
    port = free_port()
    web = spawn(["web", "--port", str(port)], settings(db_url, sink.port))
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: "listening on" in web.output(), timeout=60, message="web to start")

    def client(c: int) -> list[int]:
        codes = []
        with requests.Session() as s:
            s.headers["Authorization"] = f"Bearer {token}"
            for i in range(REQUESTS):
                if i % 2:
                    r = s.get(f"{base}/api/v1/lists", timeout=60)
                else:
                    r = s.post(f"{base}/api/v1/events", timeout=60, json={
                        "email": f"p{c}-{i}@example.org", "name": "trial"})
                codes.append(r.status_code)
        return codes

    with ThreadPoolExecutor(CLIENTS) as pool:
        codes = Counter(code for answers in pool.map(client, range(CLIENTS))
                        for code in answers)
    assert codes == Counter({201: CLIENTS * REQUESTS // 2, 200: CLIENTS * REQUESTS // 2}), \
        codes
    assert "database busy" not in web.output()
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT count(*) FROM sequence_enrollments")).scalar_one() == CLIENTS * 4
