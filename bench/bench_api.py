"""The transactional API at SaaS speed (docs/design.md §26): side by side in one run,
against the same PostgreSQL with the same client,

1. a minimal queue endpoint (bench/minimal_queue.py: Flask + waitress + psycopg, one
   INSERT per request) and
2. one ``senddock serve`` with default settings, ``POST /api/v1/messages`` (kind
   verification, a new user each time, with an event),

each hammered by ``--clients`` keep-alive HTTP clients for ``--seconds``; then
``POST /api/v1/messages/batch`` (500 messages per call) for its messages/s; P7 — each burst
verification's time from its insert to the relay's acceptance (``finished_at``) — while the
burst ran; P7 of single verifications posted while the batch's messages drain; the serve
process's RSS through the whole run; and last the same burst and batch against ``senddock
web`` (the API with no delivery in the process), to show what the intake costs alone.

    python -m bench.bench_api --clients 16 --seconds 12

The relay is Postfix's smtp-sink (C), so the sink is never what is measured.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import psycopg
import sqlalchemy as sa

from bench.alternate import loop_seconds
from bench.bench_p7_latency import start_server
from bench.common import (
    DEFAULT_SERVER,
    add_settings_option,
    free_port,
    fresh_database,
    in_threads,
    machine,
    percentile,
    save,
    settings_from,
    sink_process,
    table,
)
from webapp import db
from webapp.domain import users
from workers.core import pg
from workers.core.states import CLAIMABLE, SENT, sql_list

INTAKE_ALONE = "the same, intake alone (senddock web)"
PROCESSES = 2  # client processes (the clients' threads spread over them: no GIL ceiling)


def _body(kind: str, user: str) -> str:
    """A request body: a verification message, or an event (``POST /events``) that
    enrols a new person in an event-triggered sequence."""
    if kind == "event":
        return json.dumps({"email": f"{user}@example.net", "name": "trial",
                           "data": {"plan": "pro"}})
    return json.dumps({"kind": "verification", "user_id": user,
                       "email": f"{user}@example.net",
                       "data": {"verify_url": f"https://app.example/v?u={user}"},
                       "event": {"name": "signup", "id": f"evt-{user}"}})


def _client(args: tuple[str, int, str, str, float, int, int, str, str]
            ) -> tuple[list[tuple[float, int]], float]:
    """One client process: ``threads`` keep-alive clients posting for ``seconds``."""
    host, port, path, token, seconds, threads, proc, prefix, kind = args
    results: list[list[tuple[float, int]]] = [[] for _ in range(threads)]
    start = time.time() + 0.5

    def run(t: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        time.sleep(max(0.0, start - time.time()))
        i = 0
        while time.time() < start + seconds:
            user = f"{prefix}-{proc}-{t}-{i}"
            body = _body(kind, user)
            t0 = time.perf_counter()
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            response.read()
            results[t].append(((time.perf_counter() - t0) * 1000, response.status))
            i += 1
        conn.close()

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return [r for per in results for r in per], time.process_time()


class CpuSplit:
    """CPU seconds spent by the server process and by the PostgreSQL backends serving the
    bench's database between :meth:`start` and :meth:`stop` (the clients report their
    own): where a request's cost goes when the machine is the limit."""

    def __init__(self, server_pid: int, url: str) -> None:
        self.server = psutil.Process(server_pid)
        self.url = url
        self.database = sa.make_url(url).database

    def _backends(self) -> float:
        with psycopg.connect(os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER)) as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.database,))]
        total = 0.0
        for pid in pids:
            try:
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
        return total

    def _server(self) -> float:
        times = self.server.cpu_times()
        return times.user + times.system

    def start(self) -> None:
        self.t0 = (self._server(), self._backends())

    def stop(self) -> dict[str, float]:
        return {"server_cpu_s": self._server() - self.t0[0],
                "postgres_cpu_s": self._backends() - self.t0[1]}


class Statements:
    """What the bench's database was asked between :meth:`start` and :meth:`stop`: its
    transactions (``pg_stat_database``, on any server) and, where the server preloads
    ``pg_stat_statements``, its statements by text. A request's round trips to PostgreSQL
    are at least its statements; the counts include whatever else the database served
    meanwhile (a ``senddock web`` burst: nothing else)."""

    TOP = 8

    def __init__(self, url: str) -> None:
        self.url = url
        self.database = sa.make_url(url).database
        self.statements = False
        with psycopg.connect(pg.conninfo(self.url), autocommit=True) as conn:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
                self.statements = True
            except psycopg.Error:
                pass

    def _transactions(self, conn: psycopg.Connection[Any]) -> int:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                           "WHERE datname = %s", (self.database,)).fetchone()
        return int(row[0]) if row else 0

    def start(self) -> None:
        with psycopg.connect(pg.conninfo(self.url), autocommit=True) as conn:
            if self.statements:
                conn.execute("SELECT pg_stat_statements_reset()")
            self.t0 = self._transactions(conn)

    def stop(self) -> dict[str, Any]:
        with psycopg.connect(pg.conninfo(self.url), autocommit=True) as conn:
            transactions = self._transactions(conn) - self.t0 - 1  # the count's own
            top: list[tuple[int, float, str]] = []
            if self.statements:
                top = [(int(calls), float(ms), " ".join(query.split())[:90])
                       for calls, ms, query in conn.execute(
                           """SELECT s.calls,
                                     (s.total_exec_time + s.total_plan_time) / s.calls,
                                     s.query
                                FROM pg_stat_statements s
                                JOIN pg_database d ON d.oid = s.dbid
                               WHERE d.datname = %s AND s.query NOT LIKE '%%pg_stat%%'
                               ORDER BY s.calls DESC""", (self.database,))]
        return {"transactions": transactions,
                "statements": sum(c for c, _, _ in top) if self.statements else None,
                "top_statements": top[:self.TOP]}


def burst(base: str, path: str, token: str, clients: int, seconds: float,
          prefix: str = "burst", cpu: CpuSplit | None = None, kind: str = "message",
          ok: int = 202, statements: Statements | None = None) -> dict[str, Any]:
    host, port = base.removeprefix("http://").split(":")
    per = [clients // PROCESSES + (1 if p < clients % PROCESSES else 0)
           for p in range(PROCESSES)]
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        if statements is not None:
            statements.start()
        if cpu is not None:
            cpu.start()
        parts = pool.map(_client, [(host, int(port), path, token, seconds, n, p, prefix,
                                    kind) for p, n in enumerate(per)])
        split = cpu.stop() if cpu is not None else {}
        counted = statements.stop() if statements is not None else {}
    results = [r for part, _ in parts for r in part]
    latencies = [ms for ms, _ in results]
    return {**split, **counted, "client_cpu_s": sum(c for _, c in parts),
            "requests": len(results), "seconds": seconds,
            "rps": len(results) / seconds, "p50": percentile(latencies, 50),
            "p95": percentile(latencies, 95), "p99": percentile(latencies, 99),
            "non_202": sum(1 for _, status in results if status != ok)}


def start_minimal(url: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.minimal_queue", "--port", str(port),
                             "--dsn", url, "--threads", "8"],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"minimal queue did not start: {log.read_text()}")


def batch_rate(base: str, token: str, calls: int, clients: int = 4,
               cpu: CpuSplit | None = None, prefix: str = "batch") -> dict[str, Any]:
    """``calls`` batches of 500 new verifications from ``clients`` threads (with ``cpu``:
    what the server process and the database's backends spent meanwhile, the delivery
    pool sending the batches' mail included)."""
    accepted: list[int] = []
    latencies: list[float] = []
    lock = threading.Lock()

    def run(c: int) -> None:
        for n in range(c, calls, clients):
            items = [{"kind": "verification", "user_id": f"{prefix}-{n}-{i}",
                      "email": f"{prefix}-{n}-{i}@example.net",
                      "data": {"verify_url": f"https://app.example/v?b={n}-{i}"},
                      "event": {"name": "import", "id": f"imp-{n}-{i}"}} for i in range(500)]
            request = urllib.request.Request(
                f"{base}/api/v1/messages/batch", data=json.dumps({"messages": items}).encode(),
                method="POST", headers={"Authorization": f"Bearer {token}",
                                        "Content-Type": "application/json"})
            t0 = time.perf_counter()
            with urllib.request.urlopen(request, timeout=120) as response:
                body = json.loads(response.read())
            with lock:
                latencies.append((time.perf_counter() - t0) * 1000)
                accepted.append(body["accepted"])

    if cpu is not None:
        cpu.start()
    elapsed = in_threads(clients, run)
    split = cpu.stop() if cpu is not None else {}
    return {**split, "calls": calls, "accepted": sum(accepted), "seconds": elapsed,
            "msgs_per_s": sum(accepted) / elapsed, "call_p50": percentile(latencies, 50),
            "call_p95": percentile(latencies, 95)}


def p7(engine: sa.Engine, settle: float = 60, prefix: str = "burst") -> dict[str, Any]:
    """Insert → relay acceptance of the verifications of users ``prefix-*`` (the burst's by
    default; the database's own clocks), after waiting up to ``settle`` s for them to be
    sent."""
    deadline = time.monotonic() + settle
    query = sa.text(f"""
        SELECT count(*) FILTER (WHERE status = '{SENT}') AS sent, count(*) AS total,
               array_agg(extract(epoch FROM finished_at - created_at) * 1000)
                   FILTER (WHERE status = '{SENT}') AS ms,
               array_agg(extract(epoch FROM (SELECT min(a.started_at) FROM job_attempts a
                                              WHERE a.job_id = j.id) - created_at) * 1000)
                   FILTER (WHERE status = '{SENT}') AS claim_ms
          FROM delivery_jobs j
         WHERE user_ref LIKE :pattern""")
    while True:
        with engine.connect() as conn:
            row = conn.execute(query, {"pattern": f"{prefix}-%"}).mappings().one()
        if row["sent"] == row["total"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    ms = [float(v) for v in row["ms"] or []]
    claim = [float(v) for v in row["claim_ms"] or [] if v is not None]
    return {"sent": row["sent"], "total": row["total"], "p50": percentile(ms, 50),
            "claim_p50": percentile(claim, 50), "claim_p95": percentile(claim, 95),
            "p95": percentile(ms, 95), "max": max(ms) if ms else float("nan")}


def singles_during_import(base: str, token: str, engine: sa.Engine, count: int = 30,
                          every: float = 0.1) -> dict[str, Any]:
    """Right after the batch: ``count`` single verifications, one every ``every`` s, while
    the imported mail drains; how much imported mail was still waiting at the first, and
    the singles' insert -> relay acceptance (P7 of a signup during an import)."""
    waiting = sa.text("SELECT count(*) FROM delivery_jobs WHERE user_ref LIKE 'batch-%'"
                      f" AND status IN {sql_list(CLAIMABLE)}")
    with engine.connect() as conn:
        backlog = int(conn.execute(waiting).scalar_one())
    host, port = base.removeprefix("http://").split(":")
    client = http.client.HTTPConnection(host, int(port), timeout=30)
    statuses = []
    for i in range(count):
        user = f"single-{i}"
        client.request("POST", "/api/v1/messages", json.dumps(
            {"kind": "verification", "user_id": user, "email": f"{user}@example.net",
             "data": {"verify_url": f"https://app.example/v?u={user}"}}),
            {"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        response = client.getresponse()
        response.read()
        statuses.append(response.status)
        time.sleep(every)
    client.close()
    return {"import_waiting": backlog, "non_202": sum(1 for s in statuses if s != 202),
            **p7(engine, prefix="single")}


def intake_alone(args: argparse.Namespace, url: str, smtp_port: int, token: str,
                 workdir: Path) -> dict[str, Any]:
    """The same burst and batch against ``senddock web`` (the API without delivery, as in
    a scale-out) on the same database: what the intake costs when no delivery shares
    the cores."""
    server, base = start_server(url, smtp_port, workdir / "web.log", "web",
                                **settings_from(args.setting))
    try:
        burst(base, "/api/v1/messages", token, args.clients, 2, "warm-web")
        single = burst(base, "/api/v1/messages", token, args.clients, args.seconds, "web",
                       cpu=CpuSplit(server.pid, url), statements=Statements(url))
        if args.intake_only:
            return {"burst": single}
        batches = batch_rate(base, token, args.batches, cpu=CpuSplit(server.pid, url),
                             prefix="webbatch")
        return {"burst": single, "batch": batches}
    finally:
        server.terminate()
        server.wait(30)


class RssWatch:
    """The serve process's resident memory (with its children), every second."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(1.0):
            try:
                rss = self.process.memory_info().rss / 2**20
            except psutil.Error:
                return
            self.samples.append((time.monotonic() - t0, rss))

    def mark(self) -> float:
        return self.process.memory_info().rss / 2**20


def _before(args: argparse.Namespace, url: str, smtp_port: int, token: str,
            workdir: Path) -> dict[str, Any] | None:
    """With ``--before DIR``: the same burst against ``senddock serve`` run from another
    checkout (e.g. a worktree of an older commit), on the same database."""
    if not args.before:
        return None
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = args.before
    try:
        server, base = start_server(url, smtp_port, workdir / "before.log")
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
    try:
        burst(base, "/api/v1/messages", token, args.clients, 2, "warm-before")
        return burst(base, "/api/v1/messages", token, args.clients, args.seconds, "before")
    finally:
        server.terminate()
        server.wait(30)


def _admin_token(url: str) -> tuple[sa.Engine, str]:
    """An engine on the bench's database and an admin's API token."""
    engine = db.make_engine(url, pool_size=2)
    with engine.begin() as conn:
        user = users.create_user(conn, "bench@example.com", "benchmark-password", "admin")
        return engine, users.create_token(conn, user["id"])


# --history: the verifications a deployment sent before the run, one every 5 seconds, each
# to a new user, so the intake is measured against a jobs table of a real size
# (its statements' estimated costs grow with the table: docs/performance.md, "JIT").
_HISTORY = f"""
INSERT INTO delivery_jobs (kind, priority, status, email, user_ref, payload, attempts,
                           created_at, available_at, finished_at)
SELECT 'verification', 0, '{SENT}', 'past' || g || '@example.net', 'past-' || g,
       jsonb_build_object('data', jsonb_build_object(
           'verify_url', 'https://app.example/v?u=past-' || g)),
       1, now() - g * interval '5 seconds', now() - g * interval '5 seconds',
       now() - g * interval '5 seconds' + interval '1 second'
  FROM generate_series(1, %(n)s) g
"""


def history(url: str, n: int) -> None:
    """Give the fresh database ``n`` sent verifications (see :data:`_HISTORY`)."""
    if n <= 0:
        return
    with psycopg.connect(pg.conninfo(url), autocommit=True) as conn:
        conn.execute(_HISTORY, {"n": n})
        conn.execute("VACUUM ANALYZE delivery_jobs")


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    smtp_port = free_port()
    with fresh_database() as url, sink_process("postfix", smtp_port):
        history(url, args.history)
        engine, token = _admin_token(url)
        minimal, minimal_base = start_minimal(url, workdir / "minimal.log")
        try:
            server, base = start_server(url, smtp_port, workdir / "serve.log",
                                        **settings_from(args.setting))
        except BaseException:
            minimal.terminate()
            raise
        rss = RssWatch(server.pid)
        try:
            # A short warm-up of each, then the measured bursts, one after the other.
            burst(minimal_base, "/jobs", "", args.clients, 2, "warm")
            burst(base, "/api/v1/messages", token, args.clients, 2, "warm")
            floor = burst(minimal_base, "/jobs", "", args.clients, args.seconds,
                          cpu=CpuSplit(minimal.pid, url))
            rss_before = rss.mark()
            ours = burst(base, "/api/v1/messages", token, args.clients, args.seconds,
                         cpu=CpuSplit(server.pid, url))
            rss_after_burst = rss.mark()
            latency = p7(engine)
            batches = batch_rate(base, token, args.batches, cpu=CpuSplit(server.pid, url))
            rss_after_batch = rss.mark()
            singles = singles_during_import(base, token, engine)
        finally:
            rss.stop.set()
            server.terminate()
            server.wait(30)
        try:  # last, with no delivery running: their undelivered jobs harm no one
            alone = intake_alone(args, url, smtp_port, token, workdir)
            before = _before(args, url, smtp_port, token, workdir)
        finally:
            minimal.terminate()
            minimal.wait(30)
        engine.dispose()
    return {"floor": floor, "senddock": ours, "ratio": ours["rps"] / floor["rps"],
            "before": before, "intake_alone": alone,
            "ratio_intake_alone": alone["burst"]["rps"] / floor["rps"],
            "p7": latency, "batch": batches, "singles_during_import": singles,
            "rss_mb": {"before_burst": rss_before, "after_burst": rss_after_burst,
                       "after_batch": rss_after_batch,
                       "samples": rss.samples}}


def _trees(args: argparse.Namespace) -> list[tuple[str, Path | None]]:
    """The checkouts to measure, in turns: ``--before DIR`` first, then this one."""
    return [*([("before", Path(args.before))] if args.before else []), ("now", None)]


def _web_burst(args: argparse.Namespace, url: str, smtp_port: int, token: str,
               workdir: Path, tree: Path | None, prefix: str) -> dict[str, Any]:
    """A warm-up and the measured burst against ``senddock web`` run from ``tree``."""
    server, base = start_server(url, smtp_port, workdir / f"{prefix}.log", "web", tree,
                                **settings_from(args.setting))
    try:
        burst(base, "/api/v1/messages", token, args.clients, 2, f"warm-{prefix}")
        return burst(base, "/api/v1/messages", token, args.clients, args.seconds, prefix,
                     cpu=CpuSplit(server.pid, url), statements=Statements(url))
    finally:
        server.terminate()
        server.wait(30)


def intake_only(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """``--intake-only``: per round, the minimal endpoint's burst, then ``senddock web``'s
    (with ``--before DIR``, that checkout's first, then this one's), on one fresh
    database, each with its CPU and what it asked PostgreSQL per request."""
    smtp_port = free_port()
    trees = _trees(args)
    runs = []
    with fresh_database() as url, sink_process("postfix", smtp_port):
        history(url, args.history)
        engine, token = _admin_token(url)
        minimal, minimal_base = start_minimal(url, workdir / "minimal.log")
        try:
            burst(minimal_base, "/jobs", "", args.clients, 2, "warm")
            for r in range(args.rounds):
                floor = burst(minimal_base, "/jobs", "", args.clients, args.seconds,
                              cpu=CpuSplit(minimal.pid, url), statements=Statements(url))
                for name, tree in trees:
                    web = _web_burst(args, url, smtp_port, token, workdir, tree,
                                     f"{name}{r}")
                    runs.append({"round": r + 1, "tree": name, "floor": floor, "web": web,
                                 "ratio": web["rps"] / floor["rps"]})
        finally:
            minimal.terminate()
            minimal.wait(30)
        engine.dispose()
    return runs


def _per(r: dict[str, Any], key: str, scale: float = 1.0) -> str:
    value = r.get(key)
    return "—" if value is None else f"{scale * value / r['requests']:.2f}"


_PER_REQUEST = ["transactions / request", "statements / request", "server CPU ms / request",
                "PostgreSQL CPU ms / request"]


def _per_request(r: dict[str, Any]) -> list[str]:
    return [_per(r, "transactions"), _per(r, "statements"), _per(r, "server_cpu_s", 1000),
            _per(r, "postgres_cpu_s", 1000)]


def _statements_table(title: str, web: dict[str, Any]) -> str:
    return table(title, ["calls / request", "ms / call (planning and execution)", "statement"],
                 [[f"{calls / web['requests']:.3f}", f"{ms:.3f}", f"`{query}`"]
                  for calls, ms, query in web.get("top_statements") or []])


def _intake_tables(floor: dict[str, Any], web: dict[str, Any], title: str) -> str:
    """The minimal endpoint beside ``senddock web``: rate, latency, CPU and what each
    request asked PostgreSQL; then the statements ``web`` ran, per request."""
    rows = [[name, f"{r['requests']:,}", f"{r['rps']:,.0f}", f"{r['p95']:.1f}",
             f"{r['rps'] / floor['rps']:.2f}", *_per_request(r)]
            for name, r in (("minimal queue (1 INSERT)", floor), (INTAKE_ALONE, web))]
    out = table(title, ["endpoint", "requests", "req/s", "p95 ms", "ratio", *_PER_REQUEST],
                rows)
    if web.get("top_statements"):
        out += "\n\n" + _statements_table(
            "Statements senddock web ran, per request (pg_stat_statements)", web)
    return out


def _rounds_table(runs: list[dict[str, Any]], title: str) -> str:
    out = table(title, ["round", "tree", "minimal req/s", "web req/s", "web p95 ms", "ratio",
                        *_PER_REQUEST],
                [[r["round"], r["tree"], f"{r['floor']['rps']:,.0f}",
                  f"{r['web']['rps']:,.0f}", f"{r['web']['p95']:.1f}", f"{r['ratio']:.2f}",
                  *_per_request(r["web"])] for r in runs])
    for name in dict.fromkeys(r["tree"] for r in runs):
        last = [r for r in runs if r["tree"] == name][-1]["web"]
        if last.get("top_statements"):
            out += "\n\n" + _statements_table(
                f"Statements senddock web ran per request, {name} (pg_stat_statements, "
                "last round)", last)
    return out


def batch_only(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """``--batch-only``: a warm-up of 8 calls, then ``--repeat`` runs of the batch alone;
    with ``--before DIR``, that checkout's server and this one's in turns, each run
    against both (on one database)."""
    smtp_port = free_port()
    trees = _trees(args)
    with fresh_database() as url, sink_process("postfix", smtp_port):
        history(url, args.history)
        engine, token = _admin_token(url)
        runs = []
        for r in range(args.repeat):
            for name, tree in trees:
                server, base = start_server(url, smtp_port, workdir / f"{name}{r}.log",
                                            args.command, tree,
                                            **settings_from(args.setting))
                try:
                    batch_rate(base, token, 8, prefix=f"warm-{name}{r}")
                    runs.append({"tree": name, **batch_rate(
                        base, token, args.batches, cpu=CpuSplit(server.pid, url),
                        prefix=f"{name}{r}")})
                finally:
                    server.terminate()
                    server.wait(30)
        engine.dispose()
        return runs


def _earlier_jobs(args: argparse.Namespace) -> str:
    return f", {args.history:,} earlier jobs (--history)" if args.history else ""


def _batch_table(title: str, runs: list[dict[str, Any]]) -> str:
    return table(f"{title} (CPU: ms per 500 messages, the delivery pool's included)",
                 ["server", "calls", "accepted", "seconds", "messages/s", "call p50 ms",
                  "call p95 ms", "server CPU", "PostgreSQL CPU"],
                 [[b.get("tree", "this checkout"), b["calls"], f"{b['accepted']:,}",
                   f"{b['seconds']:.1f}", f"{b['msgs_per_s']:,.0f}", f"{b['call_p50']:.0f}",
                   f"{b['call_p95']:.0f}",
                   *(f"{500_000 * b[k] / max(1, b['accepted']):.1f}"
                     for k in ("server_cpu_s", "postgres_cpu_s"))] for b in runs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=12)
    parser.add_argument("--batches", type=int, default=40, help="batch calls of 500")
    add_settings_option(parser)
    parser.add_argument("--before", metavar="DIR",
                        help="also measure POST /messages served from this checkout")
    parser.add_argument("--batch-only", action="store_true",
                        help="only the batch: a warm-up, then --repeat runs of --batches calls")
    parser.add_argument("--repeat", type=int, default=3, help="runs with --batch-only")
    parser.add_argument("--command", choices=("serve", "web"), default="serve",
                        help="with --batch-only: senddock serve (delivery in the process) or "
                             "web (the intake alone)")
    parser.add_argument("--intake-only", action="store_true",
                        help="only the minimal endpoint's burst and senddock web's "
                             "(with --before DIR, that checkout's web too, alternated)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds with --intake-only")
    parser.add_argument("--history", type=int, default=0, metavar="N",
                        help="first give the database N sent verifications, as a "
                             "deployment that has run for a while")
    args = parser.parse_args()
    load_before = machine()["load_1m"]
    if args.intake_only:
        with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
            runs = intake_only(args, Path(tmp))
        info = machine()
        print(_rounds_table(runs, f"POST /messages, {args.clients} clients x {args.seconds:g} "
                                  f"s, senddock web alone beside the minimal endpoint "
                                  f"({info['cpus']} cores, PostgreSQL {info['postgres']}, "
                                  f"loop {loop_seconds():.2f} s, load {load_before} before / "
                                  f"{info['load_1m']} after{_earlier_jobs(args)})"))
        saved = save("api-intake", {"machine": info, "load_before": load_before,
                                    "history": args.history, "runs": runs})
        print(f"\nsaved {saved}")
        return
    if args.batch_only:
        with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
            runs = batch_only(args, Path(tmp))
        info = machine()
        print(_batch_table(f"Batch: POST /messages/batch, 500 per call, 4 clients, senddock "
                           f"{args.command}, loop {loop_seconds():.2f} s, load "
                           f"{load_before} before / {info['load_1m']} after"
                           f"{_earlier_jobs(args)}", runs))
        saved = save("api-batch", {"machine": info, "load_before": load_before,
                                   "history": args.history, "runs": runs})
        print(f"\nsaved {saved}")
        return
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        result = measure(args, Path(tmp))
    info = machine()
    floor, ours, latency, batches = (result["floor"], result["senddock"], result["p7"],
                                     result["batch"])
    print(table(f"Transactional API, {args.clients} clients x {args.seconds:g} s "
                f"({info['cpus']} cores, PostgreSQL {info['postgres']}, load "
                f"{load_before} before / {info['load_1m']} after)",
                ["endpoint", "requests", "req/s", "p50 ms", "p95 ms", "p99 ms", "non-202"],
                [[name, f"{r['requests']:,}", f"{r['rps']:,.0f}", f"{r['p50']:.1f}",
                  f"{r['p95']:.1f}", f"{r['p99']:.1f}", r["non_202"]]
                 for name, r in (("minimal queue (1 INSERT)", floor),
                                 ("SendDock POST /messages", ours),
                                 (INTAKE_ALONE, result["intake_alone"]["burst"]),
                                 ("the same, before (--before)", result["before"]))
                 if r is not None]))
    print(f"\nratio SendDock / minimal: {result['ratio']:.2f} (intake alone, no delivery "
          f"in the process: {result['ratio_intake_alone']:.2f})")
    print(_intake_tables(floor, result["intake_alone"]["burst"],
                         "The intake alone beside the minimal endpoint, per request"))
    print(table("CPU per request during the bursts (ms): where the 2 cores went",
                ["endpoint", "server process", "PostgreSQL backends", "clients", "sum",
                 "all CPU of the burst / requests"],
                [[name, *(f"{1000 * v / r['requests']:.2f}" for v in (
                    r["server_cpu_s"], r["postgres_cpu_s"], r["client_cpu_s"],
                    r["server_cpu_s"] + r["postgres_cpu_s"] + r["client_cpu_s"],
                    info["cpus"] * r["seconds"]))]
                 for name, r in (("minimal queue (1 INSERT)", floor),
                                 ("SendDock POST /messages", ours),
                                 (INTAKE_ALONE, result["intake_alone"]["burst"]))]))
    print(_batch_table("Batch: POST /messages/batch, 500 per call, 4 clients; serve, then "
                       "web (intake alone)", [{**batches, "tree": "serve"},
                                              {**result["intake_alone"]["batch"],
                                               "tree": "web"}]))
    print(table("P7 during the burst: insert -> accepted by the relay",
                ["sent / requested", "p50 ms", "p95 ms", "max ms", "to the attempt's start: p50",
                 "p95"],
                [[f"{latency['sent']:,} / {latency['total']:,}", f"{latency['p50']:.0f}",
                  f"{latency['p95']:.0f}", f"{latency['max']:.0f}",
                  f"{latency['claim_p50']:.0f}", f"{latency['claim_p95']:.0f}"]]))
    singles = result["singles_during_import"]
    print(table("P7 of single verifications posted while the batch's messages drain (one "
                "every 0.1 s)",
                ["imported mail waiting at the first", "sent / requested", "non-202",
                 "p50 ms", "p95 ms", "max ms"],
                [[f"{singles['import_waiting']:,}", f"{singles['sent']} / {singles['total']}",
                  singles["non_202"], f"{singles['p50']:.0f}", f"{singles['p95']:.0f}",
                  f"{singles['max']:.0f}"]]))
    rss = result["rss_mb"]
    print(table("RSS of senddock serve (MB)", ["before burst", "after burst", "after batch"],
                [[f"{rss['before_burst']:.0f}", f"{rss['after_burst']:.0f}",
                  f"{rss['after_batch']:.0f}"]]))
    print(f"\nsaved {save('api', {'machine': info, 'load_before': load_before, **result})}")


if __name__ == "__main__":
    main()
