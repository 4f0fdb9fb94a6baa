"""Chaos for sequences (docs/sequences.md, "exactly once"): a drip of ``--enrollments``
people through three email steps with one-second waits, advanced and sent by real
``senddock worker`` processes that are SIGKILLed at random moments and restarted, against
a recording SMTP sink run as its own process.

    python -m bench.chaos_sequences --enrollments 100000 --kills 30 [--workers 2]

At the end it prints the enrollments, the (enrollment, step) pairs and the jobs made for
them (one each, must be equal), the steps that never reached the sink (must be 0), the
duplicates and the bound they must stay under (the jobs the victims held in ``sending``
at their kills, as bench/chaos.py counts them), and exits 1 when a promise is broken.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import sqlalchemy as sa

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaos import Fleet, Kill, make_sink, process_env
from bench.common import DEFAULT_SERVER, fresh_database, machine, table
from workers.core.states import SENT

STEPS = [{"type": "email", "subject": f"Step {k} for {{{{ email }}}}", "text_body": str(k)}
         for k in (1, 2, 3)]
STEPS.insert(2, {"type": "wait", "wait_seconds": 1})
STEPS.insert(1, {"type": "wait", "wait_seconds": 1})
EMAIL_STEPS = 3


def _progress(engine: sa.Engine) -> tuple[int, int]:
    """(enrollments done, sequence jobs not yet sent)."""
    with engine.connect() as conn:
        row = conn.execute(sa.text(f"""
            SELECT (SELECT count(*) FROM sequence_enrollments WHERE status = 'done'),
                   (SELECT count(*) FROM delivery_jobs
                     WHERE kind = 'sequence' AND status <> '{SENT}')""")).one()
    return int(row[0]), int(row[1])


def _enrol(engine: sa.Engine, n: int) -> None:
    from webapp.domain import sequences

    with engine.begin() as conn:
        list_id = conn.execute(sa.text(
            "INSERT INTO lists (name) VALUES ('drip') RETURNING id")).scalar_one()
        sequences.create_sequence(conn, {"name": "Drip", "trigger_type": "list_add",
                                         "list_id": list_id, "steps": STEPS}, "chaos")
        conn.execute(sa.text("""
            INSERT INTO subscribers (email)
            SELECT 'drip' || g || '@example.org' FROM generate_series(1, :n) g"""), {"n": n})
        conn.execute(sa.text("""
            INSERT INTO memberships (list_id, subscriber_id)
            SELECT :l, id FROM subscribers WHERE email LIKE 'drip%@example.org'"""),
            {"l": list_id})


def run(args: argparse.Namespace) -> int:
    from webapp import db

    rng = random.Random(args.seed)
    kills: list[Kill] = []
    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="chaos-seq-"))
        stack.callback(shutil.rmtree, work, True)
        url = stack.enter_context(fresh_database(args.database_url))
        engine = db.make_engine(url, pool_size=3)
        stack.callback(engine.dispose)
        sink = make_sink("senddock", work)
        sink.start()
        stack.callback(sink.stop)
        t0 = time.monotonic()
        _enrol(engine, args.enrollments)
        enrol_s = time.monotonic() - t0
        fleet = Fleet(engine, process_env(url, sink.port, WORKERS=str(args.threads),
                                          LOG_LEVEL="INFO"), args.workers, work)
        stack.callback(fleet.stop_all)
        started = time.monotonic()
        for slot in range(args.workers):
            fleet.start(slot)
        deadline = started + args.timeout
        while time.monotonic() < deadline:
            done, unsent = _progress(engine)
            if done == args.enrollments and unsent == 0:
                break
            time.sleep(rng.uniform(*args.gap))
            slots = fleet.running_slots() if len(kills) < args.kills else []
            if slots:
                slot = rng.choice(slots)
                kills.append(fleet.kill(slot, started))
                time.sleep(rng.uniform(0, 0.5))
                fleet.start(slot)
        drain_s = time.monotonic() - started
        died = fleet.unexpected_exits()
        fleet.stop_all()
        records = sink.records()
        with engine.connect() as conn:
            jobs, pairs = conn.execute(sa.text(
                "SELECT count(*), count(DISTINCT idempotency_key) FROM delivery_jobs "
                "WHERE kind = 'sequence'")).one()
            visits = int(conn.execute(sa.text(
                "SELECT count(*) FROM sequence_visits WHERE job_id IS NOT NULL")).scalar_one())
            email_of = {r.id: r.email for r in conn.execute(sa.text(
                "SELECT id, email FROM delivery_jobs WHERE kind = 'sequence'"))}
        done, unsent = _progress(engine)
    received = Counter((r["rcpt_tos"][0], r["subject"].split(" for ")[0]) for r in records)
    expected = args.enrollments * EMAIL_STEPS
    missing = expected - len(set(received))
    duplicates = sum(c - 1 for c in received.values())
    per_address = Counter(r["rcpt_tos"][0] for r in records)
    for kill in kills:  # a duplicate is put down to a kill whose victim held its job
        kill.duplicates = sum(1 for j in kill.victim_jobs
                              if per_address.get(email_of.get(j, ""), 0) > EMAIL_STEPS)
    bound = sum(k.victim_in_flight for k in kills)
    checks = [
        (jobs == pairs == visits == expected,
         f"{jobs} jobs, {pairs} distinct (enrollment, step) keys and {visits} visits with a "
         f"job for {expected} email steps: not one each"),
        (done == args.enrollments, f"{args.enrollments - done} enrollment(s) not done"),
        (unsent == 0, f"{unsent} sequence job(s) not sent"),
        (missing == 0, f"{missing} step(s) never reached the sink"),
        (duplicates <= bound, f"{duplicates} duplicates exceed the in-flight bound {bound}"),
        (not died, f"worker(s) {died} died unasked"),
    ]
    broken = [message for ok, message in checks if not ok]
    info = machine()
    print(table(f"Sequence chaos ({info['cpus']} cores, {info['cpu_model']}, load "
                f"{info['load_1m']})", ["measure", "value"], [
        ("enrollments (three email steps each)", f"{args.enrollments:,}"),
        ("enrolled from one list add (s)", f"{enrol_s:.1f}"),
        ("SIGKILLs", len(kills)),
        ("jobs / distinct (enrollment, step) keys / visits with a job",
         f"{jobs:,} / {pairs:,} / {visits:,}"),
        ("steps at the sink (distinct) / expected", f"{len(received):,} / {expected:,}"),
        ("duplicates / bound (victims' jobs in sending at the kills)",
         f"{duplicates} / {bound}"),
        ("in flight at a kill: victim max", max((k.victim_in_flight for k in kills),
                                                 default=0)),
        ("workers that died unasked", len(died)),
        ("drain time (s)", f"{drain_s:.1f}"),
    ]))
    print("\n" + ("all promises held" if not broken else "BROKEN: " + "; ".join(broken)))
    return 0 if not broken else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--enrollments", type=int, default=100_000)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--threads", type=int, default=5, help="SENDDOCK_WORKERS each")
    parser.add_argument("--gap", type=float, nargs=2, default=(1.0, 4.0),
                        metavar=("MIN", "MAX"), help="seconds between kills (uniform)")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
