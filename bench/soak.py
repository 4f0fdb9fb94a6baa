"""Soak: one `senddock serve` process under steady mixed load for --minutes (default 10).

    python bench/soak.py [--minutes 10] [--recipients 100000] [--viewers 4]
                         [--verify-rate 2] [--database-url URL|embedded]

Load: a campaign of --recipients (a new one on the same list whenever the last finished),
a steady stream of verification emails through POST /api/v1/verifications, and several
logged-in dashboard viewers polling GET / and the campaign page like the HTMX fragments.
Every --interval seconds it samples: messages sent in the interval (campaign and
verification), the serve process's RSS (psutil), HTTP answers and errors, and the time
from 202 to `sent` of verification mail (P7). At the end it prints the table, the RSS
growth from the first to the last third of the run, and every error; exits 1 on errors
or on memory growth above --max-growth-mb.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaos import ROOT, SinkProcess, process_env, wait_port
from bench.common import DEFAULT_SERVER, free_port, fresh_database, percentile, table
from harness.seed import make_campaign, seed_list
from webapp.pgserver import private_postgres
from workers.core.states import SENT, Campaign

PASSWORD = "soak password 1234"


@dataclass
class Sample:
    minute: float
    campaign_sent: int
    verifications_sent: int
    rss_mb: float
    requests: int
    errors: int
    verify_p95_s: float
    page_p95_ms: float
    load_1m: float


@dataclass
class Traffic:
    """What the load threads saw; shared, guarded by ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    answers: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    page_ms: list[float] = field(default_factory=list)
    _taken: tuple[int, int] = (0, 0)

    def record(self, what: str, status: int | None, ms: float, detail: str = "") -> None:
        with self.lock:
            self.answers[f"{what} {status}"] += 1
            if what.startswith("GET"):
                self.page_ms.append(ms)
            if status is None or status >= 400:
                self.errors.append(f"{time.strftime('%H:%M:%S')} {what} {status} {detail}"[:300])

    def take(self) -> tuple[int, int, list[float]]:
        """Answers, errors and page times since the last call."""
        with self.lock:
            total, errors = sum(self.answers.values()), len(self.errors)
            pages, self.page_ms = self.page_ms, []
        since = (total - self._taken[0], errors - self._taken[1])
        self._taken = (total, errors)
        return since[0], since[1], pages


@contextmanager
def serve_process(url: str, smtp_port: int, work: Path) -> Iterator[tuple[str, Any]]:
    """`senddock serve` on a free port; yields its base URL and psutil handle."""
    import psutil

    port = free_port()
    env = process_env(url, smtp_port, LOG_LEVEL="WARNING", BASE_URL=f"http://127.0.0.1:{port}")
    with open(work / "serve.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "webapp", "serve", "--port", str(port)],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_port(port, timeout=60)
        yield f"http://127.0.0.1:{port}", psutil.Process(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _login(base: str, email: str) -> Any:
    import requests

    session = requests.Session()
    page = session.get(f"{base}/login", timeout=30).text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token is not None, "no CSRF token on the login page"
    session.post(f"{base}/login", data={"email": email, "password": PASSWORD,
                                        "csrf_token": token[1]}, timeout=30)
    return session


def viewer(base: str, email: str, campaign: list[int], traffic: Traffic,
           stop: threading.Event) -> None:
    """A marketer with the dashboard and the campaign page open (2 s polling)."""
    session = _login(base, email)
    paths = ["/", "/?fragment=campaigns", "/campaigns/{c}", "/campaigns/{c}?fragment=live"]
    while not stop.is_set():
        for path in paths:
            _get(session, base + path.format(c=campaign[0]), f"GET {path}", traffic)
        stop.wait(2.0)


def _get(session: Any, url: str, what: str, traffic: Traffic) -> None:
    import requests

    started = time.perf_counter()
    try:
        r = session.get(url, timeout=30)
        traffic.record(what, r.status_code, (time.perf_counter() - started) * 1000,
                       r.text[:120] if r.status_code >= 400 else "")
    except requests.RequestException as exc:
        traffic.record(what, None, 0.0, str(exc))


def verifier(base: str, token: str, rate: float, traffic: Traffic,
             stop: threading.Event) -> None:
    """A SaaS backend asking for ``rate`` verification emails per second."""
    import requests

    headers = {"Authorization": f"Bearer {token}"}
    session = requests.Session()
    while not stop.is_set():
        user = uuid.uuid4().hex[:12]
        body = {"user_id": f"soak-{user}", "email": f"v-{user}@example.com",
                "verify_url": f"https://app.example.com/verify/{user}"}
        try:
            r = session.post(f"{base}/api/v1/verifications", json=body, headers=headers,
                             timeout=30)
            traffic.record("POST verifications", r.status_code, 0.0,
                           r.text[:120] if r.status_code != 202 else "")
        except requests.RequestException as exc:
            traffic.record("POST verifications", None, 0.0, str(exc))
        stop.wait(1.0 / rate)


@dataclass
class SoakOptions:
    minutes: float = 10.0
    recipients: int = 100_000
    viewers: int = 4
    verify_rate: float = 2.0
    interval: float = 10.0
    database_url: str = DEFAULT_SERVER
    max_growth_mb: float = 50.0


@dataclass
class SoakReport:
    samples: list[Sample] = field(default_factory=list)
    campaigns: int = 0
    answers: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    verifications_unsent: int = 0
    rss_growth_mb: float = 0.0
    broken: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.broken

    def render(self) -> str:
        rows = [(f"{s.minute:.1f}", s.campaign_sent, s.verifications_sent, f"{s.rss_mb:.0f}",
                 s.requests, s.errors, f"{s.verify_p95_s:.2f}", f"{s.page_p95_ms:.0f}",
                 f"{s.load_1m:.1f}") for s in self.samples]
        text = table("Soak (per interval)", ["min", "campaign sent", "verif. sent", "RSS MB",
                                             "HTTP", "errors", "verif. p95 s", "page p95 ms",
                                             "load 1m"], rows)
        sent = sum(s.campaign_sent for s in self.samples)
        span = max(1e-9, self.samples[-1].minute * 60) if self.samples else 1.0
        text += (f"\n\ncampaigns started: {self.campaigns}; campaign messages sent: {sent:,} "
                 f"({sent / span:.0f}/s overall); verification emails sent: "
                 f"{sum(s.verifications_sent for s in self.samples):,}, not sent at the end: "
                 f"{self.verifications_unsent}; RSS growth (first to last third): "
                 f"{self.rss_growth_mb:+.1f} MB")
        text += "\nHTTP answers: " + ", ".join(f"{k}: {v}" for k, v in sorted(
            self.answers.items()))
        if self.errors:
            text += "\nerrors (first 20):\n  " + "\n  ".join(self.errors[:20])
        return text + "\n\n" + ("no errors, no growth" if not self.broken
                                else "BROKEN: " + "; ".join(self.broken))


def _sample(engine: sa.Engine, since: Any) -> tuple[Any, int, int, float]:
    """(now, campaign jobs sent, verifications sent, verification p95 seconds) since."""
    with engine.connect() as conn:
        row = conn.execute(sa.text(f"""
            SELECT clock_timestamp() AS now,
                   count(*) FILTER (WHERE kind = 'broadcast') AS campaign,
                   count(*) FILTER (WHERE kind = 'verification') AS verification,
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM
                       finished_at - created_at)) FILTER (WHERE kind = 'verification') AS p95
              FROM delivery_jobs WHERE status = '{SENT}' AND finished_at > :since"""),
            {"since": since}).one()
    return row.now, int(row.campaign), int(row.verification), float(row.p95 or 0.0)


def _relaunch_if_done(engine: sa.Engine, list_id: int, campaign: list[int]) -> bool:
    """Start a new campaign on the list once the current one is `sent`."""
    from webapp.domain import campaigns

    with engine.begin() as conn:
        status = conn.execute(sa.text("SELECT status FROM campaigns WHERE id = :id"),
                              {"id": campaign[0]}).scalar_one()
        if status != Campaign.SENT:
            return False
    campaign_id = make_campaign(engine, list_id)
    with engine.begin() as conn:
        campaigns.send(conn, campaign_id)
    campaign[0] = campaign_id
    return True


def _seed(engine: sa.Engine, recipients: int) -> tuple[int, list[int], str]:
    """The list, the first campaign (sent), a marketer to watch and an API token."""
    from webapp.domain import campaigns, users

    list_id = seed_list(engine, recipients, name="soak")
    campaign_id = make_campaign(engine, list_id)
    with engine.begin() as conn:
        campaigns.send(conn, campaign_id)
        users.create_user(conn, "viewer@example.com", PASSWORD, "marketer")
        admin = users.create_user(conn, "api@example.com", PASSWORD, "admin")
        token = users.create_token(conn, admin["id"], "soak")
    return list_id, [campaign_id], token


def run_soak(options: SoakOptions) -> SoakReport:
    import os
    import tempfile

    from webapp import db

    report = SoakReport()
    traffic = Traffic()
    stop = threading.Event()
    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="soak-"))
        server = options.database_url
        if server == "embedded":
            server = stack.enter_context(private_postgres()).url()
        url = stack.enter_context(fresh_database(server))
        engine = db.make_engine(url, pool_size=2)
        stack.callback(engine.dispose)
        sink = SinkProcess(work)
        sink.start()
        stack.callback(sink.stop)
        list_id, campaign, token = _seed(engine, options.recipients)
        report.campaigns = 1
        base, serve = stack.enter_context(serve_process(url, sink.port, work))
        threads = [threading.Thread(target=viewer, args=(base, "viewer@example.com",
                                                         campaign, traffic, stop), daemon=True)
                   for _ in range(options.viewers)]
        threads.append(threading.Thread(target=verifier, args=(
            base, token, options.verify_rate, traffic, stop), daemon=True))
        for t in threads:
            stack.callback(t.join, 35)
        stack.callback(stop.set)
        for t in threads:
            t.start()
        started = time.monotonic()
        since, *_ = _sample(engine, "infinity")
        while time.monotonic() - started < options.minutes * 60:
            stop.wait(options.interval)
            now, sent, verified, p95 = _sample(engine, since)
            since = now
            requests_, errors, pages = traffic.take()
            report.samples.append(Sample(
                round((time.monotonic() - started) / 60, 2), sent, verified,
                serve.memory_info().rss / 2**20, requests_, errors, p95,
                percentile(pages, 95) if pages else 0.0, os.getloadavg()[0]))
            report.campaigns += _relaunch_if_done(engine, list_id, campaign)
        stop.set()
        time.sleep(3)
        with engine.connect() as conn:
            report.verifications_unsent = int(conn.execute(sa.text(
                "SELECT count(*) FROM delivery_jobs WHERE kind = 'verification' "
                f"AND status <> '{SENT}' AND created_at < now() - interval '30 seconds'"))
                .scalar_one())
    _judge(report, traffic, options)
    return report


def _judge(report: SoakReport, traffic: Traffic, options: SoakOptions) -> None:
    report.answers = dict(traffic.answers)
    report.errors = list(traffic.errors)
    third = max(1, len(report.samples) // 3)
    if report.samples:
        first = sum(s.rss_mb for s in report.samples[:third]) / third
        last = sum(s.rss_mb for s in report.samples[-third:]) / third
        report.rss_growth_mb = last - first
    if report.errors:
        report.broken.append(f"{len(report.errors)} HTTP error(s)")
    if report.rss_growth_mb > options.max_growth_mb:
        report.broken.append(f"RSS grew {report.rss_growth_mb:.0f} MB")
    if report.verifications_unsent:
        report.broken.append(f"{report.verifications_unsent} verification email(s) older "
                             "than 30 s not sent")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--recipients", type=int, default=100_000)
    parser.add_argument("--viewers", type=int, default=4)
    parser.add_argument("--verify-rate", type=float, default=2.0, help="per second")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds per sample")
    parser.add_argument("--database-url", default=DEFAULT_SERVER,
                        help="PostgreSQL server to create the database on, or 'embedded'")
    parser.add_argument("--max-growth-mb", type=float, default=50.0)
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    report = run_soak(SoakOptions(minutes=args.minutes, recipients=args.recipients,
                                  viewers=args.viewers, verify_rate=args.verify_rate,
                                  interval=args.interval, database_url=args.database_url,
                                  max_growth_mb=args.max_growth_mb))
    print(report.render())
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2, default=str))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
