"""docs/design.md §25 against private PostgreSQL clusters (harness/pgcluster.py): the connection
budget, request timeouts, errors by SQLSTATE with their own messages, a full disk, and
failover to a synchronous standby — asserted through PostgreSQL's catalogs
(``pg_stat_activity``), the SMTP sink's record and the processes' own logs."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
import requests

from harness.pgcluster import Clusters, PgCluster
from tests.conftest import Api, Proc, free_port, settings, wait_for
from tests.helpers import Browser, campaign_status, check_final, in_flight, make_campaign
from webapp import create_app, db
from workers.core import pg
from workers.core.settings import load

pytestmark = pytest.mark.slow


def _verification(i: int | str) -> dict[str, str]:
    return {"user_id": f"u-{i}", "email": f"user{i}@example.org",
            "verify_url": f"https://app.example/v?t={i}"}


class ClusterApp:
    """An in-process app on a private cluster, with the engines ``serve`` builds."""

    def __init__(self, url: str, sink_port: int, **overrides: str) -> None:
        self.values = settings(url, sink_port, **overrides)
        self.config = load(self.values)
        self.engine = db.web_engine(pg.conninfo(url), self.config, "web")
        self.app = create_app(self.config, engine=self.engine)
        self.app.config["TESTING"] = True
        from webapp.domain import users

        with self.engine.begin() as conn:
            user = users.create_user(conn, f"admin-{uuid.uuid4().hex[:6]}@example.com",
                                     "correct horse battery", "admin")
            user["token"] = users.create_token(conn, user["id"], "tests")
            user["password"] = "correct horse battery"
        self.user = user
        self.client = self.app.test_client()
        self.api = Api(self.client, user["token"])

    def close(self) -> None:
        self.app.extensions["senddock"].health_probe().close()
        self.engine.dispose()


@pytest.fixture()
def cluster_app(sink: Any) -> Iterator[Callable[..., ClusterApp]]:
    made: list[ClusterApp] = []

    def make(url: str, **overrides: str) -> ClusterApp:
        made.append(ClusterApp(url, sink.port, **overrides))
        return made[-1]

    yield make
    for app in made:
        app.close()


def hog(cluster: PgCluster, limit: int = 200) -> list[psycopg.Connection[Any]]:
    """Open SendDock-role connections until the server refuses more (too many clients)."""
    held = []
    for _ in range(limit):
        try:
            held.append(psycopg.connect(cluster.url(), connect_timeout=5,
                                        application_name="tests-hog"))
        except psycopg.OperationalError as exc:
            assert pg.classify(exc) is pg.TOO_MANY_CONNECTIONS, exc
            return held
    raise AssertionError("the server never ran out of connections")


def release(held: list[psycopg.Connection[Any]]) -> None:
    for conn in held:
        conn.close()
    held.clear()


def ours(cluster: PgCluster) -> dict[str, int]:
    """SendDock's connections per application_name, from pg_stat_activity."""
    rows = cluster.execute("SELECT application_name, count(*) FROM pg_stat_activity "
                           "WHERE application_name LIKE 'senddock-%' GROUP BY 1")
    return {name: n for name, n in rows}


# --- 1. connection budget --------------------------------------------------------------


def test_serve_and_worker_start_into_a_full_database_and_keep_their_budget(
        pg_clusters: Clusters, sink: Any, spawn: Callable[..., Proc]) -> None:
    """max_connections 22 (19 for SendDock's role): serve + worker started while another
    client holds every slot wait with one log line each, start when slots free up, stay
    within the budget (≤ 19 together with defaults), and 20 concurrent API clients get
    ≥ 99 % 202s."""
    cluster = pg_clusters.primary(max_connections=22, superuser_reserved_connections=3)
    held = hog(cluster)
    assert len(held) == 19
    port = free_port()
    values = settings(cluster.url(), sink.port, WORKER_TIMEOUT="10")
    serve = spawn(["serve", "--port", str(port)], values)
    worker = spawn(["worker"], values)
    wait_for(lambda: "too many connections" in serve.output() and
             "too many connections" in worker.output(), timeout=20,
             message="both to say the database is full")
    time.sleep(2)  # a few retries later: still one line each
    release(held)
    wait_for(lambda: "listening on" in serve.output() and "running" in worker.output(),
             timeout=30, message="serve and worker to start once slots are free")
    for proc in (serve, worker):
        out = proc.output()
        assert "Traceback" not in out, out
        assert out.count("database too many connections") == 1, out  # one line, not one per retry
        assert "usable again after" in out, out

    # A token for the API clients, written through the app's own CLI.
    env_values = dict(values)
    token = _cli_token(spawn, env_values)
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: requests.get(f"{base}/healthz", timeout=2).status_code == 200,
             timeout=20, message="/healthz ok")
    peak: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            now = ours(cluster)
            if sum(now.values()) > sum(peak.values()):
                peak.clear()
                peak.update(now)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def client(c: int) -> list[int]:
        with requests.Session() as s:
            s.headers["Authorization"] = f"Bearer {token}"
            return [s.post(f"{base}/api/v1/verifications", json=_verification(f"{c}-{i}"),
                           timeout=30).status_code for i in range(10)]

    with ThreadPoolExecutor(20) as pool:
        codes = Counter(code for codes in pool.map(client, range(20)) for code in codes)
    wait_for(lambda: len(sink.records()) >= codes[202], timeout=30,
             message="the accepted verifications to be delivered")
    stop.set()
    sampler.join()
    print(f"\nmax_connections=22: {dict(codes)} of 200 verification POSTs; peak "
          f"connections {sum(peak.values())}: {peak}")
    assert codes[202] >= 198, codes
    budget = db.budget(load(values))
    assert sum(peak.values()) <= budget.total("serve") + budget.total("worker") <= 16
    roles = {name.split(" ")[0] for name in ours(cluster)}  # liveness: "<name> <worker>"
    assert {"senddock-serve/web", "senddock-worker/liveness"} <= roles, ours(cluster)
    assert worker.terminate() == 0
    assert serve.terminate() == 0


def _cli_token(spawn: Callable[..., Proc], values: dict[str, str]) -> str:
    email = f"api-{uuid.uuid4().hex[:6]}@example.com"
    import subprocess
    import sys

    from tests.conftest import ROOT, process_env

    env = process_env(values)
    subprocess.run([sys.executable, "-m", "webapp", "user", "create", email, "--role",
                    "admin", "--password-stdin"], input="correct horse battery\n",
                   env=env, cwd=ROOT, check=True, capture_output=True, text=True, timeout=60)
    out = subprocess.run([sys.executable, "-m", "webapp", "token", "create", "--user", email],
                         env=env, cwd=ROOT, check=True, capture_output=True, text=True,
                         timeout=60)
    return out.stdout.strip()


def test_too_many_connections_is_a_503_saying_so_and_heals(
        pg_clusters: Clusters, cluster_app: Callable[..., ClusterApp]) -> None:
    cluster = pg_clusters.primary(max_connections=12, superuser_reserved_connections=3)
    site = cluster_app(cluster.url(), DB_IDLE_TIMEOUT="1")
    assert site.api.post("/verifications", _verification(1)).status_code == 202
    time.sleep(2.5)  # idle connections are handed back to the server...
    assert ours(cluster).get("senddock-web/web", 0) == 0, ours(cluster)
    held = hog(cluster)  # ...so another client can take every slot
    r = site.api.post("/verifications", _verification(2))
    assert r.status_code == 503
    assert "too many connections" in r.get_json()["error"]["message"]
    assert r.get_json()["error"]["problem"] == "too_many_connections"
    assert r.headers["Retry-After"] == "5"
    started = time.monotonic()
    health = site.client.get("/healthz")
    # Not a wait for a free connection (the pool's checkout timeout, 30 s); the bound is
    # generous so a busy machine does not make it red.
    assert time.monotonic() - started < 10
    assert health.get_json()["database"] == "too many connections"
    release(held)
    assert site.api.post("/verifications", _verification(3)).status_code == 202


# --- 2. timeouts -----------------------------------------------------------------------


def test_locked_table_every_page_and_api_call_answers_within_its_timeout(
        pg_clusters: Clusters, cluster_app: Callable[..., ClusterApp]) -> None:
    """``delivery_jobs`` locked (ACCESS EXCLUSIVE) for 30 s: pages, 10 concurrent API
    clients (more than the web pool's 3 connections) and /healthz keep answering within
    their timeouts the whole time, 503 "the database is busy" where the table is needed."""
    cluster = pg_clusters.primary()
    site = cluster_app(cluster.url(), DB_STATEMENT_TIMEOUT="2", DB_LOCK_TIMEOUT="1")
    campaign_id = _a_campaign(site)
    browser = Browser(site.app.test_client(), site.user)
    pages = ("/", f"/campaigns/{campaign_id}", "/health/", "/support/?q=u-1")
    locker = psycopg.connect(cluster.url(user="postgres"))
    locker.execute("LOCK TABLE delivery_jobs IN ACCESS EXCLUSIVE MODE")
    locked_at = time.monotonic()
    slowest: dict[str, float] = {}
    statuses: Counter[str] = Counter()

    def post(i: int) -> tuple[int, float, str, str]:
        started = time.monotonic()
        r = Api(site.app.test_client(), site.user["token"]).post(
            "/verifications", _verification(f"lock-{i}"))
        return (r.status_code, time.monotonic() - started,
                r.get_json()["error"]["message"], r.headers.get("Retry-After", ""))

    def timed(name: str, took: float) -> None:
        slowest[name] = max(slowest.get(name, 0.0), took)

    try:
        with ThreadPoolExecutor(10) as pool:
            while time.monotonic() - locked_at < 30:
                for path in pages:
                    started = time.monotonic()
                    r = browser.get(path)
                    timed(path, time.monotonic() - started)
                    statuses[f"{path} {r.status_code}"] += 1
                    assert r.status_code in {200, 503}, (path, r.status_code)
                    if r.status_code == 503:
                        assert "The database is busy" in r.get_data(as_text=True)
                for code, took, message, retry in pool.map(post, range(10)):
                    timed("API POST /verifications", took)
                    statuses[f"API {code}"] += 1
                    assert code == 503 and "busy" in message and retry, (code, message)
                started = time.monotonic()
                health = site.client.get("/healthz")
                timed("/healthz", time.monotonic() - started)
                assert health.status_code == 200
                assert health.get_json()["status"] == "degraded"
    finally:
        held_for = time.monotonic() - locked_at
        locker.close()
    print(f"\nlock held {held_for:.1f} s; slowest answers (s): "
          f"{ {k: round(v, 2) for k, v in slowest.items()} }; {dict(statuses)}")
    # Within the statement timeout (2 s) plus waiting for a web connection (≤ 2 s).
    assert held_for >= 30
    assert max(slowest.values()) < 4.5, slowest
    assert slowest["/healthz"] < 1.0
    # Released: everything works again at once.
    assert site.api.post("/verifications", _verification("after-lock")).status_code == 202


def _a_campaign(site: ClusterApp) -> int:
    campaign = make_campaign(site.engine, ["a@example.org", "b@example.org"], send=False)
    return int(campaign["id"])


# --- 3. a full disk --------------------------------------------------------------------


def test_full_disk_says_so_on_api_page_and_healthz(
        pg_clusters: Clusters, cluster_app: Callable[..., ClusterApp]) -> None:
    cluster = pg_clusters.primary()
    disk = pg_clusters.small_disk("48m")
    cluster.execute(f"CREATE TABLESPACE small LOCATION '{disk.directory('ts')}'",
                    database="postgres")
    cluster.execute("ALTER DATABASE senddock SET TABLESPACE small", database="postgres")
    site = cluster_app(cluster.url())
    assert site.api.post("/verifications", _verification("before")).status_code == 202
    browser = Browser(site.app.test_client(), site.user)
    disk.fill()
    try:
        answers = [site.api.post("/verifications", _verification(f"full-{i}"))
                   for i in range(30)]
        refused = [r for r in answers if r.status_code == 503]
        assert refused, [r.status_code for r in answers]
        assert all(r.status_code in {202, 503} for r in answers)
        body = refused[0].get_json()["error"]
        assert body["problem"] == "disk_full" and "disk is full" in body["message"]
        # A page that only reads still works; one that writes says why it cannot. (The
        # session's once-a-minute touch was this test's write until the login helper's own
        # page view after login took it, before the disk filled.)
        page = browser.post("/admin/suppressions/add",
                            {"emails": "full-disk@example.com", "reason": "manual"})
        assert page.status_code == 503 and "disk is full" in page.get_data(as_text=True)
        time.sleep(0.6)  # past the health answer's reuse
        health = site.client.get("/healthz").get_json()
        assert health["status"] == "degraded" and health["database"] == "disk full", health
        assert "No space left" not in str(health)  # details only for admins
        details = browser.get("/health/").get_data(as_text=True)
        assert "disk full" in details and "No space left on device" in details
    finally:
        disk.free()
    time.sleep(0.6)
    pg.RECENT.clear()
    assert site.client.get("/healthz").get_json()["status"] == "ok"
    assert site.api.post("/verifications", _verification("after")).status_code == 202


# --- 4. failover -----------------------------------------------------------------------


def test_failover_to_a_synchronous_standby_loses_nothing(
        pg_clusters: Clusters, sink: Any, spawn: Callable[..., Proc],
        cluster_app: Callable[..., ClusterApp]) -> None:
    """Primary stopped -m immediate mid-drain, the standby promoted: the worker follows
    the multi-host URL (listener included); 0 lost, duplicates within the in-flight
    bound, a verification posted after the failover delivered within seconds."""
    primary = pg_clusters.primary()
    standby = pg_clusters.standby(primary, synchronous=True)
    url = (f"postgresql://senddock@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/"
           f"senddock?target_session_attrs=read-write")
    site = cluster_app(url)
    emails = [f"f{i}@example.org" for i in range(3000)]
    campaign = make_campaign(site.engine, emails)
    values = settings(url, sink.port, WORKER_TIMEOUT="5", HEARTBEAT_INTERVAL="1")
    worker = spawn(["worker"], values)
    wait_for(lambda: len(sink.records()) >= 600, timeout=60, message="drain under way")
    flying = in_flight(site.engine)
    primary.stop("immediate")
    stopped = time.monotonic()
    standby.promote()
    promoted = time.monotonic()
    # After the failover: a verification through the same URL, to the listener's wake-up.
    r = wait_for(lambda: _try_post(site, "after-failover"), timeout=30,
                 message="the API to accept again")
    accepted = time.monotonic()
    wait_for(lambda: any(rec["rcpt_tos"][0] == "userafter-failover@example.org"
                         for rec in sink.records()), timeout=15,
             message="the verification to be delivered")
    delivered = time.monotonic()
    wait_for(lambda: campaign_status(site.engine, campaign["id"]) == "sent", timeout=120,
             message="the campaign to finish on the promoted standby")
    finished = time.monotonic()
    # The worker's liveness session (which carries its LISTEN) followed the URL to the
    # promoted standby.
    wait_for(lambda: standby.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
        "'senddock-worker/liveness%'") == [(1,)], timeout=5, message="listener on standby")
    assert worker.terminate() == 0
    received = check_final(site.engine, _CampaignOnly(sink, set(emails)), campaign, emails)
    duplicates = sum(n - 1 for n in received.values())
    config = load(values)
    bound = config.workers * config.claim_batch
    out = worker.output()
    print(f"\nfailover: promote took {promoted - stopped:.1f} s; in flight at the stop "
          f"{flying}; duplicates {duplicates} (bound {bound}); verification 202 "
          f"{accepted - promoted:.1f} s after promote, delivered "
          f"{delivered - accepted:.2f} s after its 202; campaign done {finished - promoted:.1f}"
          f" s after promote; lost 0 of {len(emails)}")
    print(out[-3000:])
    assert r.status_code == 202
    assert duplicates <= bound
    assert delivered - accepted < 5
    assert "Traceback" not in out, out
    # The outage in the worker's log: a line when it started (or its kind changed: gone,
    # then read-only while only the standby was up), one when it ended — not one a second.
    started_lines = [line for line in out.splitlines()
                     if "WARNING senddock.worker: delivery " in line]
    assert 1 <= len(started_lines) <= 3, started_lines
    assert out.count("usable again after") == 1, out


class _CampaignOnly:
    """The sink's record without the verification mail sent alongside the campaign."""

    def __init__(self, sink: Any, emails: set[str]) -> None:
        self.sink, self.emails = sink, emails

    def records(self) -> list[dict[str, Any]]:
        return [r for r in self.sink.records() if r["rcpt_tos"][0] in self.emails]


def _try_post(site: ClusterApp, i: str) -> Any:
    r = site.api.post("/verifications", _verification(i))
    return r if r.status_code == 202 else None


def test_healthz_answers_within_a_second_when_the_server_hangs(
        pg_clusters: Clusters, cluster_app: Callable[..., ClusterApp]) -> None:
    """Every process of the cluster frozen (SIGSTOP): no TCP reset, no answer at all."""
    import os
    import signal
    import subprocess

    cluster = pg_clusters.primary()
    site = cluster_app(cluster.url())
    assert site.client.get("/healthz").get_json()["status"] == "ok"
    postmaster = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                              text=True).stdout.split()
    frozen = [postmaster, *map(int, children)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(0.6)  # past the reuse of the last answer
        timings = []
        for _ in range(3):
            started = time.monotonic()
            r = site.client.get("/healthz")
            timings.append(time.monotonic() - started)
            assert r.status_code == 503
            assert r.get_json()["database"] == "not answering", r.get_json()
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    assert max(timings) < 1.0, timings
    wait_for(lambda: site.client.get("/healthz").get_json()["status"] == "ok", timeout=10,
             message="/healthz ok once the server answers again")
