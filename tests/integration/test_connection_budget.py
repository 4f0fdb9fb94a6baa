"""The connection budget (docs/configuration.md, docs/scale-out.md): one ``senddock serve``
and one ``senddock worker`` on defaults fit a PostgreSQL with ``max_connections = 20``
(3 reserved for superusers: 17 for SendDock) with a slot left for a ``psql``, through a
campaign send and 20 API clients posting verifications. Sessions are counted per process
in ``pg_stat_activity`` and compared with what ``db.budget`` computes from the
settings."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
import requests

from harness.pgcluster import Clusters, PgCluster
from tests.conftest import Proc, free_port, settings, wait_for
from tests.helpers import campaign_status, make_campaign
from tests.integration.test_pg_production import _cli_token
from webapp import db
from workers.core import pg
from workers.core.settings import load

pytestmark = pytest.mark.slow

CLIENTS = 20
POSTS = 10  # per client
RECIPIENTS = 300


def _sessions(cluster: PgCluster) -> Counter[str]:
    """SendDock's sessions per process (``senddock-serve/...``, ``senddock-worker/...``)."""
    rows = cluster.execute("SELECT application_name FROM pg_stat_activity "
                           "WHERE application_name LIKE 'senddock-%'")
    return Counter(name.removeprefix("senddock-").split("/")[0] for (name,) in rows)


def _psql(cluster: PgCluster, tries: int = 3) -> int:
    """Connect as an operator's psql would; the try it connected at. A session that has
    just ended keeps its slot until its backend has exited (the sampler's, a moment ago),
    so a refusal for the reserved slots is tried again half a second later, as a person
    would: what SendDock itself holds is the sampler's to count."""
    for attempt in range(1, tries + 1):
        try:
            with psycopg.connect(cluster.url(), connect_timeout=5,
                                 application_name="psql") as psql:
                assert psql.execute("SELECT 1").fetchone() == (1,)
            return attempt
        except psycopg.OperationalError as exc:
            if "reserved" not in str(exc) or attempt == tries:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def test_serve_and_worker_on_defaults_fit_max_connections_20(
        pg_clusters: Clusters, sink: Any, spawn: Callable[..., Proc]) -> None:
    cluster = pg_clusters.primary(max_connections=20, superuser_reserved_connections=3)
    values = settings(cluster.url(), sink.port)
    config = load(values)
    budget = db.budget(config)
    assert budget.total("serve") + budget.total("worker") <= 17 - 1  # one slot for a psql

    setup = db.make_engine(pg.conninfo(cluster.url()), pool_size=1, process="tests")
    campaign = make_campaign(setup, [f"r{i:04d}@example.org" for i in range(RECIPIENTS)])
    setup.dispose()
    port = free_port()
    serve = spawn(["serve", "--port", str(port)], values)
    worker = spawn(["worker"], values)
    wait_for(lambda: "listening on" in serve.output() and "running" in worker.output(),
             timeout=60, message="serve and worker to start")
    token = _cli_token(spawn, dict(values))
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: requests.get(f"{base}/healthz", timeout=2).status_code == 200,
             timeout=20, message="/healthz ok")

    peak: Counter[str] = Counter()
    stop = threading.Event()
    # The sampler's own (superuser) session counts against max_connections too, and a
    # non-superuser is refused while fewer than superuser_reserved_connections slots are
    # free: it holds none while the psql and the test's last checks connect.
    sampling = threading.Lock()

    def sample() -> None:
        while not stop.is_set():
            with sampling:
                _one_sample()
            time.sleep(0.05)

    def _one_sample() -> None:
        now = _sessions(cluster)
        for process, n in now.items():
            peak[process] = max(peak[process], n)
        peak["both"] = max(peak["both"], now["serve"] + now["worker"])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def client(c: int) -> list[int]:
        with requests.Session() as s:
            s.headers["Authorization"] = f"Bearer {token}"
            return [s.post(f"{base}/api/v1/verifications",
                           json={"user_id": f"u-{c}-{i}", "email": f"u{c}-{i}@example.org",
                                 "verify_url": f"https://app.example/v?t={c}-{i}"},
                           timeout=30).status_code for i in range(POSTS)]

    with ThreadPoolExecutor(CLIENTS) as clients:
        codes = Counter(code for answers in clients.map(client, range(CLIENTS))
                        for code in answers)
        # A psql at the busiest moment: there is a slot for it.
        with sampling:
            psql_tries = _psql(cluster)
    wait_for(lambda: len(sink.records()) >= RECIPIENTS + codes[202], timeout=120,
             message="the campaign and the verifications to be delivered")
    stop.set()
    sampler.join()
    check = db.make_engine(pg.conninfo(cluster.url()), pool_size=1, process="tests")
    wait_for(lambda: campaign_status(check, campaign["id"]) == "sent", timeout=30,
             message="the campaign to finish")
    check.dispose()
    print(f"\nmax_connections=20: {dict(codes)} of {CLIENTS * POSTS} verification POSTs; "
          f"peak sessions {dict(peak)}; budget serve {budget.total('serve')} + worker "
          f"{budget.total('worker')}; the psql connected at try {psql_tries}")
    assert codes == Counter({202: CLIENTS * POSTS}), codes
    assert peak["serve"] <= budget.total("serve"), peak
    assert peak["worker"] <= budget.total("worker"), peak
    assert peak["both"] <= 16, peak
    for proc in (serve, worker):
        assert "too many connections" not in proc.output()
        assert "Traceback" not in proc.output(), proc.output()
    assert worker.terminate() == 0
    assert serve.terminate() == 0
