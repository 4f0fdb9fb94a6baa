"""Drain throughput end to end: enqueue a campaign, run one `senddock worker` process with
the default pool against a local SMTP sink, and measure messages per second, CPU
milliseconds per message in the SendDock process, and peak RSS.

    python -m bench.bench_drain --recipients 100000 --sink both
    python -m bench.bench_drain --recipients 100000 --sink postfix --serve

``--serve`` adds, beside the worker's row, the drain as a new user runs it: `senddock
serve` on its defaults, the campaign sent through the API (``POST
/api/v1/campaigns/{id}/send``: serve enqueues it itself) and ``GET
/api/v1/campaigns/{id}`` polled once a second until every recipient is sent.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import sqlalchemy as sa

from bench.common import (
    add_settings_option,
    env_for,
    free_port,
    fresh_database,
    machine,
    save,
    settings_from,
    sink_process,
    table,
)
from harness.seed import make_campaign, seed_list
from webapp import db
from webapp.domain import campaigns, users
from workers import queue
from workers.core.states import SENT


def add_dkim_keys(engine: sa.Engine, algorithms: list[str]) -> None:
    """Keys for the bench campaign's From domain: the worker signs every message with them
    (SENDDOCK_SECRET_KEY is env_for's "bench-secret")."""
    from workers.building import dkim

    with engine.begin() as conn:
        for algorithm in algorithms:
            dkim.create_key(conn, "bench-secret", "example.com", algorithm=algorithm)


def prepare(url: str, recipients: int,
            dkim_algorithms: list[str] | None = None, *, send: bool = True
            ) -> tuple[sa.Engine, int, int, dict[str, float]]:
    engine = db.make_engine(url)
    list_id = seed_list(engine, recipients)
    campaign_id = make_campaign(engine, list_id)
    add_dkim_keys(engine, dkim_algorithms or [])
    if not send:
        return engine, campaign_id, 0, {}
    t0 = time.perf_counter()
    with engine.begin() as conn:
        campaign = campaigns.send(conn, campaign_id)
    send_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    with engine.begin() as conn:
        summary = queue.enqueue_broadcast(conn, campaign["broadcast_id"])
    enqueue_s = time.perf_counter() - t0
    assert summary and summary["total"] == recipients, summary
    with engine.connect() as conn:
        conn.execute(sa.text("ANALYZE delivery_jobs"))
    return engine, campaign_id, campaign["broadcast_id"], {
        "send_request_ms": send_ms, "enqueue_s": enqueue_s,
        "enqueue_per_s": recipients / enqueue_s}


def drain(engine: sa.Engine, url: str, broadcast_id: int, recipients: int, port: int,
          workers: int, processes: int = 1, claim_batch: int = 10,
          synchronous_commit: str | None = None,
          settings: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``processes`` worker processes of ``workers`` threads until all is sent.
    ``synchronous_commit`` is set on the workers' sessions (PGOPTIONS) when given;
    ``settings`` are more SENDDOCK_* values for them."""
    envs = [env_for(url, port, **(settings or {}), WORKERS=str(workers), NODE=f"bench-{i}",
                    CLAIM_BATCH=str(claim_batch)) for i in range(processes)]
    if synchronous_commit:
        for env in envs:
            env["PGOPTIONS"] = f"-c synchronous_commit={synchronous_commit}"
    procs = [subprocess.Popen([sys.executable, "-m", "webapp", "worker"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for env in envs]
    watched = [psutil.Process(p.pid) for p in procs]
    peak_rss = 0
    started = time.perf_counter()
    first_sent: float | None = None
    sent = 0
    try:
        while sent < recipients:
            time.sleep(0.25)
            peak_rss = max(peak_rss, max(ps.memory_info().rss for ps in watched))
            with engine.connect() as conn:
                sent = queue.broadcast_counts(conn, broadcast_id)[SENT]
            if sent and first_sent is None:
                first_sent = time.perf_counter()
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(proc.stderr.read().decode() if proc.stderr else "died")
            if time.perf_counter() - started > 1800:
                raise RuntimeError("drain took more than 30 minutes")
        elapsed = time.perf_counter() - (first_sent or started)
        cpu_s = sum(ps.cpu_times().user + ps.cpu_times().system for ps in watched)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)
    return {"recipients": recipients, "seconds": elapsed, "msgs_per_s": recipients / elapsed,
            "cpu_ms_per_msg": cpu_s * 1000 / recipients, "peak_rss_mb": peak_rss / 2**20,
            "processes": processes}


def _call(base: str, token: str, method: str, path: str,
          body: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base}/api/v1{path}", method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def drain_serve(engine: sa.Engine, url: str, campaign_id: int, recipients: int, port: int,
                settings: dict[str, str] | None = None) -> dict[str, Any]:
    """`senddock serve` on defaults: the campaign sent through the API, its counts polled
    once a second (a new user's way), until every recipient is sent."""
    from bench.bench_p7_latency import start_server

    with engine.begin() as conn:
        user = users.create_user(conn, "drain@example.com", "benchmark-password", "admin")
        token = users.create_token(conn, user["id"])
    with tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp:
        log = Path(tmp) / "serve.log"
        server, base = start_server(url, port, log, **(settings or {}))
        return _send_and_poll(server, log, base, token, campaign_id, recipients,
                              cpu_before=0.0)


def _send_and_poll(server: subprocess.Popen[bytes], log: Path, base: str, token: str,
                   campaign_id: int, recipients: int, cpu_before: float) -> dict[str, Any]:
    """Send the campaign through ``server``'s API and poll its counts once a second until
    every recipient is sent; then stop the server. ``cpu_before``: the server's CPU seconds
    not to count."""
    watched = psutil.Process(server.pid)
    peak_rss, sent = 0, 0
    try:
        _call(base, token, "POST", f"/campaigns/{campaign_id}/send")
        started = time.perf_counter()
        while sent < recipients:
            time.sleep(1.0)
            peak_rss = max(peak_rss, watched.memory_info().rss)
            sent = int(_call(base, token, "GET", f"/campaigns/{campaign_id}")
                       ["counts"].get(SENT, 0))
            if server.poll() is not None:
                raise RuntimeError(log.read_text())
            if time.perf_counter() - started > 1800:
                raise RuntimeError("drain took more than 30 minutes")
        elapsed = time.perf_counter() - started
        cpu_s = sum(watched.cpu_times()[:2]) - cpu_before
    finally:
        server.terminate()
        server.wait(60)
    return {"recipients": recipients, "seconds": elapsed, "msgs_per_s": recipients / elapsed,
            "cpu_ms_per_msg": cpu_s * 1000 / recipients, "peak_rss_mb": peak_rss / 2**20,
            "processes": 1}


def drain_serve_tree(tree: Path, recipients: int, port: int,
                     settings: dict[str, str] | None = None) -> dict[str, Any]:
    """`senddock serve` of the checkout ``tree``, as a new user runs it: that tree's own
    migrations and CLI (an admin and a token), then only its HTTP API -- a list, its
    subscribers 10,000 a call, the campaign of :func:`harness.seed.make_campaign`, its
    send, and its counts polled once a second until every recipient is sent. Any two
    trees whose API has these calls compare side by side (``--serve-tree``)."""
    from bench.bench_p7_latency import start_server
    from harness.seed import CAMPAIGN

    with fresh_database(migrate=False) as url, \
            tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp:
        env = env_for(url, port, **(settings or {}))

        def cli(*args: str, stdin: str | None = None) -> str:
            done = subprocess.run([sys.executable, "-m", "webapp", *args], cwd=tree, env=env,
                                  input=stdin, capture_output=True, text=True, check=False)
            if done.returncode:
                raise RuntimeError(f"senddock {' '.join(args)} in {tree}: {done.stderr}")
            return done.stdout

        cli("db", "upgrade")
        cli("user", "create", "drain@example.com", "--role", "admin", "--password-stdin",
            stdin="benchmark-password\n")
        token = cli("token", "create", "--user", "drain@example.com", "--name", "bench").strip()
        log = Path(tmp) / "serve.log"
        server, base = start_server(url, port, log, tree=tree, **(settings or {}))
        try:
            list_id = _call(base, token, "POST", "/lists", {"name": "Bench"})["id"]
            for start in range(0, recipients, 10_000):
                _call(base, token, "POST", f"/lists/{list_id}/subscribers", {"subscribers": [
                    {"email": f"user{i}@example.com", "name": f"User {i}"}
                    for i in range(start, min(start + 10_000, recipients))]})
            campaign_id = _call(base, token, "POST", "/campaigns",
                                {**CAMPAIGN, "list_id": list_id})["id"]
        except BaseException:
            server.terminate()
            server.wait(60)
            raise
        return _send_and_poll(server, log, base, token, campaign_id, recipients,
                              cpu_before=sum(psutil.Process(server.pid).cpu_times()[:2]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipients", type=int, default=100_000)
    parser.add_argument("--sink", choices=["postfix", "senddock", "both"], default="both")
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--processes", type=int, default=1,
                        help="worker processes (each with --workers threads)")
    parser.add_argument("--claim-batch", type=int, default=10,
                        help="SENDDOCK_CLAIM_BATCH (claiming only: outcomes are committed "
                             "one by one)")
    parser.add_argument("--dkim", choices=["none", "rsa", "ed25519", "both"], default="none",
                        help="DKIM-sign every message with an RSA-2048 and/or ed25519 key")
    parser.add_argument("--synchronous-commit", choices=["on", "off", "local"], default=None,
                        help="PostgreSQL synchronous_commit for the workers' sessions")
    parser.add_argument("--serve", action="store_true",
                        help="also drain through `senddock serve` on defaults (the API's "
                             "send, counts polled once a second)")
    parser.add_argument("--serve-tree", action="append", default=[], metavar="PATH",
                        help="instead: `senddock serve` of each checkout PATH (repeatable; "
                             "e.g. a `git worktree` of an earlier commit, and .), "
                             "everything through its CLI and API, alternated --rounds times")
    parser.add_argument("--rounds", type=int, default=1, help="with --serve-tree")
    add_settings_option(parser)
    args = parser.parse_args()
    if args.serve_tree:
        serve_trees(args)
        return
    settings = settings_from(args.setting)
    dkim_algorithms = {"none": [], "rsa": ["rsa"], "ed25519": ["ed25519"],
                       "both": ["rsa", "ed25519"]}[args.dkim]
    sinks = ["postfix", "senddock"] if args.sink == "both" else [args.sink]
    rows, results = [], {}
    modes = ["worker", "serve"] if args.serve else ["worker"]
    for sink in sinks:
        for mode in modes:
            port = free_port()
            with fresh_database() as url, sink_process(sink, port):
                engine, campaign_id, broadcast_id, enq = prepare(
                    url, args.recipients, dkim_algorithms, send=mode == "worker")
                if mode == "serve":
                    res = drain_serve(engine, url, campaign_id, args.recipients, port,
                                      settings)
                else:
                    res = drain(engine, url, broadcast_id, args.recipients, port,
                                args.workers, args.processes, args.claim_batch,
                                args.synchronous_commit, settings)
                engine.dispose()
            res.update(enq)
            results[f"{sink} {mode}"] = res
            rows.append([sink, mode, f"{args.recipients:,}", f"{res['msgs_per_s']:,.0f}",
                         f"{res['cpu_ms_per_msg']:.2f}", f"{res['peak_rss_mb']:.0f}",
                         f"{res['enqueue_per_s']:,.0f}" if enq else "in serve",
                         f"{res['send_request_ms']:.1f}" if enq else "API"])
    info = machine()
    print(table(f"Drain, {args.processes} process(es) x {args.workers} workers, "
                f"claim batch {args.claim_batch}, DKIM {args.dkim}, synchronous_commit "
                f"{args.synchronous_commit or 'server default'}"
                f"{''.join(f', {s}' for s in args.setting)} "
                f"({info['cpus']} cores, "
                f"{info['cpu_model']}, PostgreSQL {info['postgres']}, load {info['load_1m']})",
                ["sink", "mode", "recipients", "msgs/s", "CPU ms/msg", "peak RSS MB", "enqueue/s",
                 "send request ms"], rows))
    print(f"\nsaved {save('drain', {'machine': info, 'args': vars(args), 'results': results})}")


def serve_trees(args: argparse.Namespace) -> None:
    """``--serve-tree``: each checkout's `serve` in turn, round after round, each run with
    the machine's speed just before it."""
    from bench.alternate import loop_seconds

    settings = settings_from(args.setting)
    rows, results = [], []
    for round_ in range(1, args.rounds + 1):
        for tree in args.serve_tree:
            path = Path(tree).resolve()
            revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path,
                                      capture_output=True, text=True,
                                      check=False).stdout.strip() or "?"
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   cwd=path, capture_output=True, text=True,
                                   check=False).stdout.strip()
            label = f"{path.name} ({revision}{'+changes' if dirty else ''})"
            loop = loop_seconds()
            port = free_port()
            with sink_process(args.sink if args.sink != "both" else "postfix", port):
                res = drain_serve_tree(path, args.recipients, port, settings)
            results.append({"round": round_, "tree": label, "loop_s": loop, **res})
            rows.append([round_, label, f"{loop:.2f}", f"{args.recipients:,}",
                         f"{res['msgs_per_s']:,.0f}", f"{res['cpu_ms_per_msg']:.2f}",
                         f"{res['peak_rss_mb']:.0f}"])
            print(f"round {round_}, {label}: {res['msgs_per_s']:,.0f} msgs/s", file=sys.stderr)
    info = machine()
    print(table(f"`senddock serve` through its API, trees alternated ({info['cpus']} cores, "
                f"{info['cpu_model']}, PostgreSQL {info['postgres']}, load {info['load_1m']}; "
                "loop = seconds for 10M iterations before each run)",
                ["round", "tree", "loop s", "recipients", "msgs/s", "CPU ms/msg",
                 "peak RSS MB"], rows))
    print(f"\nsaved {save('drain-trees', {'machine': info, 'args': vars(args), 'runs': results})}")


if __name__ == "__main__":
    main()
