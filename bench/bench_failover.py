"""Failover to a streaming standby, synchronous vs asynchronous: what is lost and what is
sent twice. Prints a table (figures for docs/reliability.md).

Each run: a private primary + standby (harness/pgcluster.py, Debian's PostgreSQL
binaries, run as root), one real ``senddock worker`` draining a campaign to the SMTP sink
through the multi-host URL, API clients posting verification emails all along. Mid-drain
the primary's WAL sender is frozen for ``--lag`` seconds (SIGSTOP: an async standby
that far behind, as on a busy network; a synchronous primary's commits wait meanwhile),
the primary is stopped ``-m immediate`` and the standby promoted. Then:

- lost verifications: answered 202 by the API, absent on the promoted standby;
- duplicates: campaign messages the sink received more than once (same Message-ID).

    python bench/bench_failover.py [--runs 1] [--recipients 3000] [--lag 0.3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from bench.common import env_for  # noqa: E402
from harness import pgcluster  # noqa: E402
from harness.seed import make_campaign, seed_list  # noqa: E402
from webapp.pgserver import debian_bindir  # noqa: E402
from workers.core.states import Campaign  # noqa: E402


def _campaign_status(engine: sa.Engine, campaign_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text("SELECT status FROM campaigns WHERE id = :id"),
                                {"id": campaign_id}).scalar_one())


def run_once(clusters: pgcluster.Clusters, synchronous: bool, recipients: int,
             lag: float, workdir: Path) -> dict[str, Any]:
    from webapp import create_app, db
    from webapp.domain import campaigns, users
    from webapp.sink import SinkServer
    from workers.core import pg
    from workers.core.settings import load

    tag = uuid.uuid4().hex[:4]
    primary = clusters.primary(f"primary-{tag}")
    standby = clusters.standby(primary, f"standby_{tag}", synchronous=synchronous)
    url = (f"postgresql://senddock@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/"
           f"senddock?target_session_attrs=read-write")
    sink = SinkServer(host="127.0.0.1", port=0, record_path=workdir / f"sink-{tag}.jsonl")
    sink.start()
    env = env_for(url, sink.port, WORKER_TIMEOUT="5", HEARTBEAT_INTERVAL="1",
                  RETRY_JITTER="0", SMTP_TIMEOUT="5", LOG_LEVEL="INFO")
    config = load({k.removeprefix("SENDDOCK_"): v for k, v in env.items()
                   if k.startswith("SENDDOCK_")})
    engine = db.web_engine(pg.conninfo(url), config, "bench")
    app = create_app(config, engine=engine)
    with engine.begin() as conn:
        user = users.create_user(conn, f"bench-{tag}@example.com", "correct horse battery",
                                 "admin")
        token = users.create_token(conn, user["id"], "bench")
    list_id = seed_list(engine, recipients, name=f"failover-{tag}")
    campaign_id = make_campaign(engine, list_id)
    with engine.begin() as conn:
        campaigns.send(conn, campaign_id)
        emails = list(conn.execute(sa.text(
            "SELECT email FROM delivery_jobs WHERE campaign_id = :id"),
            {"id": campaign_id}).scalars())
    log = open(workdir / f"worker-{tag}.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "webapp", "worker"],
                              env=env, stdout=log, stderr=subprocess.STDOUT,
                              cwd=ROOT)
    accepted: list[str] = []
    stop = threading.Event()

    def post_verifications(poster: int) -> None:
        client = app.test_client()
        headers = {"Authorization": f"Bearer {token}"}
        i = 0
        while not stop.is_set():
            ref = f"v-{tag}-{poster}-{i}"
            i += 1
            r = client.post("/api/v1/verifications", headers=headers, json={
                "user_id": ref, "email": f"{ref}@example.net",
                "verify_url": f"https://app.example/v?t={ref}"})
            if r.status_code == 202:
                accepted.append(ref)
            else:
                time.sleep(0.05)

    posters = [threading.Thread(target=post_verifications, args=(n,), daemon=True)
               for n in range(3)]
    try:
        while len(sink.records()) < recipients // 5:
            time.sleep(0.05)
        for t in posters:
            t.start()
        time.sleep(1.0)
        # Freeze the primary's WAL sender: the standby falls `lag` seconds behind (what
        # the kernel's socket buffers already hold would still reach it, so freezing the
        # receiver would not do). Then the primary dies; the frozen sender with it.
        sender = primary.execute("SELECT pid FROM pg_stat_replication",
                                 database="postgres")[0][0]
        os.kill(sender, signal.SIGSTOP)
        time.sleep(lag)
        stopping = threading.Thread(target=primary.stop, args=("immediate",))
        stopping.start()
        time.sleep(0.1)
        os.kill(sender, signal.SIGKILL)
        stopping.join()
        stopped = time.monotonic()
        standby.promote()
        promoted = time.monotonic()
        deadline = time.monotonic() + 120
        while _campaign_status(engine, campaign_id) != Campaign.SENT and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)
        stop.set()
        for t in posters:
            t.join(10)
        time.sleep(3.0)  # the last verifications' delivery
    finally:
        stop.set()
        worker.terminate()
        worker.wait(30)
        log.close()
    rows = standby.execute("SELECT user_ref FROM delivery_jobs WHERE kind = 'verification'")
    present = {r[0] for r in rows}
    lost = [ref for ref in accepted if ref not in present]
    received = Counter(r["rcpt_tos"][0] for r in sink.records())
    campaign_dups = sum(n - 1 for e, n in received.items() if e in set(emails))
    verify_dups = sum(n - 1 for e, n in received.items() if e.endswith("@example.net"))
    unsent = [e for e in emails if e not in received]
    sink.stop()
    app.extensions["senddock"].health_probe().close()
    engine.dispose()
    primary.stop("immediate")
    standby.stop("immediate")
    return {"mode": "synchronous" if synchronous else "asynchronous",
            "accepted": len(accepted), "lost": len(lost), "campaign_dups": campaign_dups,
            "verify_dups": verify_dups, "unsent": len(unsent),
            "bound": config.workers * config.claim_batch,
            "promote_s": promoted - stopped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--recipients", type=int, default=3000)
    parser.add_argument("--lag", type=float, default=0.3)
    args = parser.parse_args()
    reason = pgcluster.unavailable_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    bindir = debian_bindir()
    assert bindir is not None
    from webapp import db

    workdir = pgcluster.make_root("senddock-bench-failover-")
    results = []
    try:
        with pgcluster.template_cluster(bindir, migrate=db.upgrade) as template:
            for _ in range(args.runs):
                for synchronous in (True, False):
                    clusters = pgcluster.Clusters(bindir, template)
                    try:
                        results.append(run_once(clusters, synchronous, args.recipients,
                                                args.lag, workdir))
                    finally:
                        clusters.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nFailover mid-drain ({args.recipients} recipients, standby frozen {args.lag} s "
          f"before the primary's stop -m immediate, then promoted)\n")
    print("| replication | verifications 202 | lost (202, absent after failover) | "
          "campaign duplicates (bound) | verification duplicates | unsent | promote |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['mode']} | {r['accepted']} | {r['lost']} | {r['campaign_dups']} "
              f"({r['bound']}) | {r['verify_dups']} | {r['unsent']} | "
              f"{r['promote_s']:.1f} s |")


if __name__ == "__main__":
    main()
