"""Chaos: a campaign drained by real ``senddock worker`` processes that are SIGKILLed at
random moments and restarted, against a recording SMTP sink run as its own process
(P2, P3, P4, P8; with --db-restart and --relay-outage also P6 and the reconnect paths).

    python bench/chaos.py --recipients 30000 --kills 50 [--workers 2] [--duration 120]
                          [--db-restart 30] [--relay-outage 120] [--database-url URL|embedded]

At the end it prints the recipients, how many were delivered at least once, how many
were lost (must be 0), the duplicates and the bound they must stay under, the jobs not
terminal (must be 0) and the campaign counts against the sink's record; it exits 1 when
a promise is broken.

How the bound is measured: a victim is frozen (SIGSTOP), the jobs it holds in `sending`
are counted, then it is SIGKILLed. Only those jobs can have been accepted by the relay
without being marked `sent` (P3), so duplicates <= their sum over all kills. Each
duplicate is also put down to the kill that left its job accepted and unmarked
(harness/duplicates.py): outcomes are committed per message (docs/design.md §16), so no
kill may cause more duplicates than the victim has worker threads. ``--sink postfix`` uses
Postfix's smtp-sink (the zero-latency relay) instead of our scripted sink. With
--relay-outage the sink itself is stopped mid-conversation; a message whose final dot
reached it but whose 250 never came back is SMTP's own at-least-once window, counted
separately (jobs with a transient attempt at stage data_end) and added to the bound.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    DEFAULT_SERVER,
    add_settings_option,
    free_port,
    fresh_database,
    settings_from,
    table,
)
from harness.duplicates import blame
from harness.seed import make_campaign as make_bench_campaign
from harness.seed import seed_list
from webapp.pgserver import PostgresServer, private_postgres
from workers.core.states import BOUNCED, FAILED, PENDING, RETRY, SENDING, SENT, Campaign

ROOT = Path(__file__).resolve().parent.parent


# --- the processes --------------------------------------------------------------------


def wait_port(port: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout}s")


class SinkProcess:
    """``senddock smtp-sink`` as a separate process; stop() and start() again on the same
    port and record file (the record is appended to)."""

    def __init__(self, work: Path, rules: dict[str, Any] | None = None) -> None:
        self.port = free_port()
        self.record = work / "sink.jsonl"
        self.rules_path = work / "sink-rules.json"
        self.rules_path.write_text(json.dumps(rules or {}))
        self.log_path = work / "sink.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "webapp", "smtp-sink", "--port", str(self.port),
                 "--quiet", "--record", str(self.record), "--rules", str(self.rules_path)],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        wait_port(self.port)

    def set_rules(self, rules: dict[str, Any]) -> None:
        self.rules_path.write_text(json.dumps(rules))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)
        self.proc = None

    def records(self) -> list[dict[str, Any]]:
        from webapp.sink import read_records

        return [r for r in read_records(self.record) if "rejected" not in r]


class PostfixSinkProcess:
    """Postfix's ``smtp-sink`` (C, answers at once: the zero-latency relay of docs/design.md §16) as
    its own process, appending every accepted transaction to one dump file (``-D``); the
    same interface as SinkProcess (no scripted rules)."""

    def __init__(self, work: Path, rules: dict[str, Any] | None = None) -> None:
        self.exe = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"
        if not Path(self.exe).exists():
            raise RuntimeError("Postfix's smtp-sink is missing: apt-get install postfix")
        self.port = free_port()
        self.work = work
        self.record = work / "smtp-sink.dump"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # smtp-sink drops privileges to -u; the dump must be writable by that user.
        self.work.chmod(0o777)
        args = [self.exe, "-u", "nobody", "-D", str(self.record),
                f"127.0.0.1:{self.port}", "256"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def set_rules(self, rules: dict[str, Any]) -> None:
        raise NotImplementedError("smtp-sink answers 250 to everything")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)
        self.proc = None

    def records(self) -> list[dict[str, Any]]:
        """One entry per accepted message: its recipient and Message-ID (the dump's
        X-Rcpt-Args line and the message's own header)."""
        if not self.record.exists():
            return []
        entries: list[dict[str, Any]] = []
        current: dict[str, Any] | None = None
        with open(self.record, encoding="utf-8", errors="replace") as dump:
            for line in dump:
                if line.startswith("X-Client-Addr:"):
                    current = {"rcpt_tos": [], "message_id": None}
                    entries.append(current)
                elif current is None:
                    continue
                elif line.startswith("X-Rcpt-Args:"):
                    current["rcpt_tos"].append(line.split(":", 1)[1].strip().strip("<>")
                                               .split(">")[0])
                elif current["message_id"] is None and line.lower().startswith("message-id:"):
                    current["message_id"] = line.split(":", 1)[1].strip()
        return [e for e in entries if e["rcpt_tos"]]


def make_sink(kind: str, work: Path) -> SinkProcess | PostfixSinkProcess:
    """``senddock`` (our scripted sink) or ``postfix`` (Postfix's smtp-sink)."""
    return PostfixSinkProcess(work) if kind == "postfix" else SinkProcess(work)


def process_env(url: str, smtp_port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDDOCK_")}
    env.update({"SENDDOCK_DATABASE_URL": url,
                "SENDDOCK_SMTP_URL": f"smtp://127.0.0.1:{smtp_port}?tls=none",
                "SENDDOCK_SECRET_KEY": "chaos-secret-not-for-production",
                "SENDDOCK_FROM": "Chaos <chaos@example.com>", "PYTHONUNBUFFERED": "1"})
    env.update({f"SENDDOCK_{k}": v for k, v in extra.items()})
    return env


@dataclass
class Kill:
    """One SIGKILL: the victim's claimed-but-unmarked jobs, and everyone's."""

    at: float
    slot: int
    pid: int
    victim_in_flight: int
    all_in_flight: int
    victim_jobs: list[int] = field(default_factory=list)
    records_at_kill: int = 0  # messages in the sink's record once the victim was dead
    duplicates: int = 0  # copies of the victim's jobs it left accepted and unmarked


class Fleet:
    """N worker slots, each a ``senddock worker`` process with its own node name, so a
    restarted slot is its predecessor's next incarnation (the startup hook, P4)."""

    def __init__(self, engine: sa.Engine, env: dict[str, str], slots: int, work: Path) -> None:
        self.engine = engine
        self.env = env
        self.work = work
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * slots
        self.started: list[int] = []

    def start(self, slot: int) -> None:
        env = dict(self.env, SENDDOCK_NODE=f"chaos-{slot}")
        with open(self.work / f"worker-{slot}.log", "ab") as log:
            self.procs[slot] = subprocess.Popen([sys.executable, "-m", "webapp", "worker"],
                                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                                cwd=ROOT)
        self.started.append(self.procs[slot].pid)  # type: ignore[union-attr]

    def kill(self, slot: int, started: float, sink: SinkProcess | PostfixSinkProcess) -> Kill:
        """Freeze the slot's process, count what it holds, SIGKILL it; then note how far
        the sink's record has come (before the slot restarts and takes its jobs back)."""
        proc = self.procs[slot]
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.2)  # let a COMMIT it already sent land before we count
        with self.engine.connect() as conn:
            victim = list(conn.execute(sa.text(f"""
                SELECT d.id FROM delivery_jobs d JOIN workers w ON w.id = d.claimed_by
                 WHERE d.status = '{SENDING}' AND w.pid = :pid AND w.node = :node"""),
                {"pid": proc.pid, "node": f"chaos-{slot}"}).scalars())
            everyone = conn.execute(sa.text(
                f"SELECT count(*) FROM delivery_jobs WHERE status = '{SENDING}'")).scalar_one()
        proc.kill()
        proc.wait(15)
        self.procs[slot] = None
        return Kill(round(time.monotonic() - started, 2), slot, proc.pid, len(victim),
                    int(everyone), victim_jobs=victim, records_at_kill=len(sink.records()))

    def running_slots(self) -> list[int]:
        """Slots whose process has registered as a worker (its pool is draining)."""
        pids = {p.pid: slot for slot, p in enumerate(self.procs) if p is not None}
        with self.engine.connect() as conn:
            live = conn.execute(sa.text(
                "SELECT pid FROM workers WHERE stopped_at IS NULL AND pid = ANY(:pids)"),
                {"pids": list(pids)}).scalars()
            return sorted(pids[pid] for pid in live)

    def unexpected_exits(self) -> list[int]:
        """Processes that ended although nobody killed them."""
        return [p.pid for p in self.procs if p is not None and p.poll() is not None]

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            if proc is not None:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


# --- the run --------------------------------------------------------------------------


@dataclass
class ChaosOptions:
    recipients: int = 30_000
    kills: int = 50
    duration: float = 0.0  # stop killing after this many seconds (0: after `kills`)
    workers: int = 2  # processes
    threads: int = 5  # SENDDOCK_WORKERS per process
    gap: tuple[float, float] = (0.3, 2.0)  # seconds between kills, uniform
    database_url: str = DEFAULT_SERVER  # a server to create the database on, or "embedded"
    db_restart: float = 0.0  # stop the (private) PostgreSQL this long, once, mid-drain
    relay_outage: float = 0.0  # stop the sink this long, once, mid-drain
    drain_timeout: float = 600.0
    seed: int | None = None
    work_dir: Path | None = None
    sink: str = "senddock"  # or "postfix": Postfix's smtp-sink, the zero-latency relay
    settings: dict[str, str] = field(default_factory=dict)  # more SENDDOCK_* for workers


@dataclass
class ChaosReport:
    recipients: int = 0
    delivered: int = 0
    lost: int = 0
    duplicates: int = 0
    in_flight_bound: int = 0
    relay_side_window: int = 0
    threads: int = 0
    kills: list[Kill] = field(default_factory=list)
    not_terminal: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    sink_accepted: int = 0
    sink_distinct: int = 0
    message_id_mismatches: int = 0
    unexpected_exits: list[int] = field(default_factory=list)
    drain_seconds: float = 0.0
    events: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.broken

    @property
    def max_duplicates_per_kill(self) -> int:
        return max((k.duplicates for k in self.kills), default=0)

    @property
    def mean_duplicates_per_kill(self) -> float:
        return sum(k.duplicates for k in self.kills) / len(self.kills) if self.kills else 0.0

    def render(self) -> str:
        k = self.kills
        rows = [
            ("recipients", self.recipients), ("delivered at least once", self.delivered),
            ("lost (must be 0)", self.lost), ("duplicates", self.duplicates),
            ("bound: claimed-unmarked at the kills", self.in_flight_bound),
            ("bound: relay lost its 250 (SMTP window)", self.relay_side_window),
            ("kills (SIGKILL)", len(k)),
            ("duplicates per kill: max / mean (bound: threads per process)",
             f"{self.max_duplicates_per_kill} / {self.mean_duplicates_per_kill:.2f} "
             f"(<= {self.threads})"),
            ("in flight at a kill: victim max / all max",
             f"{max((x.victim_in_flight for x in k), default=0)} / "
             f"{max((x.all_in_flight for x in k), default=0)}"),
            ("jobs not terminal (must be 0)", self.not_terminal),
            ("campaign counts", " ".join(f"{s}={n}" for s, n in self.counts.items() if n)),
            ("sink accepted / distinct recipients", f"{self.sink_accepted} / "
                                                    f"{self.sink_distinct}"),
            ("copies with another Message-ID", self.message_id_mismatches),
            ("workers that died unasked", len(self.unexpected_exits)),
            ("drain time (s)", round(self.drain_seconds, 1)),
        ]
        text = table("Chaos run", ["measure", "value"], rows)
        text += "\n\nevents: " + "; ".join(self.events) if self.events else ""
        verdict = "all promises held" if self.ok else "BROKEN: " + "; ".join(self.broken)
        return text + "\n\n" + verdict


def run_chaos(options: ChaosOptions) -> ChaosReport:
    """Run one chaos campaign from a fresh database to the verdict; cleans up after."""
    from webapp import db

    rng = random.Random(options.seed)
    report = ChaosReport(threads=options.threads)
    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="chaos-", dir=options.work_dir))
        if options.work_dir is None:
            stack.callback(shutil.rmtree, work, True)
        server: PostgresServer | None = None
        server_url = options.database_url
        if server_url == "embedded" or options.db_restart:
            server = stack.enter_context(private_postgres())
            server_url = server.url()
        url = stack.enter_context(fresh_database(server_url))
        engine = db.make_engine(url, pool_size=3)
        stack.callback(engine.dispose)
        sink = make_sink(options.sink, work)
        sink.start()
        stack.callback(sink.stop)
        campaign_id = _start_campaign(engine, options.recipients)
        fleet = Fleet(engine, process_env(url, sink.port, **options.settings,
                                          WORKERS=str(options.threads),
                                          LOG_LEVEL="INFO"), options.workers, work)
        stack.callback(fleet.stop_all)
        started = time.monotonic()
        for slot in range(options.workers):
            fleet.start(slot)
        _wreak_havoc(options, rng, fleet, sink, server, engine, campaign_id, report, started)
        _wait_finished(engine, campaign_id, options.drain_timeout)
        report.drain_seconds = time.monotonic() - started
        report.unexpected_exits = fleet.unexpected_exits()
        fleet.stop_all()
        _verify(engine, campaign_id, sink.records(), report)
        if options.work_dir is not None:
            report.events.append(f"logs in {work}")
    return report


def _start_campaign(engine: sa.Engine, recipients: int) -> int:
    from webapp.domain import campaigns

    list_id = seed_list(engine, recipients, name="chaos")
    campaign_id = make_bench_campaign(engine, list_id)
    with engine.begin() as conn:
        campaigns.send(conn, campaign_id)
    return campaign_id


def _status(engine: sa.Engine, campaign_id: int) -> tuple[str, int]:
    """The campaign's status and how many of its jobs are `sent`."""
    with engine.connect() as conn:
        row = conn.execute(sa.text(f"""
            SELECT c.status, (SELECT count(*) FROM delivery_jobs j
                               WHERE j.campaign_id = c.id AND j.status = '{SENT}') AS sent
              FROM campaigns c WHERE c.id = :id"""), {"id": campaign_id}).one()
    return str(row.status), int(row.sent)


def _wait_finished(engine: sa.Engine, campaign_id: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _status(engine, campaign_id)[0] == Campaign.SENT:
                return
        except sa.exc.OperationalError:
            pass
        time.sleep(0.5)


def _wreak_havoc(options: ChaosOptions, rng: random.Random, fleet: Fleet,
                 sink: SinkProcess | PostfixSinkProcess,
                 server: PostgresServer | None, engine: sa.Engine, campaign_id: int,
                 report: ChaosReport, started: float) -> None:
    """SIGKILL a random worker at random moments and restart it, until the kills (or the
    duration) are used up or the campaign is done. Each outage happens once, when a random
    20-50 % of the campaign is sent; workers keep being killed while the relay is away."""
    outage_at = {kind: rng.uniform(0.2, 0.5) for kind, seconds in
                 (("db", options.db_restart), ("relay", options.relay_outage)) if seconds}
    relay_back_at: float | None = None
    while True:
        status, sent = _status(engine, campaign_id)
        if status == Campaign.SENT:
            break
        now = time.monotonic()
        if relay_back_at is not None and now >= relay_back_at:
            _relay_back(sink, engine, report, started)
            relay_back_at = None
        for kind, fraction in list(outage_at.items()):
            if sent >= fraction * options.recipients:
                del outage_at[kind]
                if kind == "db":
                    assert server is not None
                    _restart_database(server, fleet, engine, options.db_restart, report,
                                      started)
                else:
                    sink.stop()
                    report.events.append(f"{now - started:.1f}s relay stopped")
                    relay_back_at = now + options.relay_outage
        may_kill = len(report.kills) < options.kills and not (
            options.duration and now - started > options.duration)
        if not may_kill and not outage_at and relay_back_at is None:
            break
        time.sleep(rng.uniform(*options.gap))
        # Kills start once delivery is under way, and hit processes that are running
        # (registered), not still importing: a kill before that proves nothing.
        slots = fleet.running_slots() if sent > 0 else []
        if may_kill and slots:
            slot = rng.choice(slots)
            report.kills.append(fleet.kill(slot, started, sink))
            time.sleep(rng.uniform(0, 0.5))
            fleet.start(slot)
    if relay_back_at is not None:
        _relay_back(sink, engine, report, started)


def _relay_back(sink: SinkProcess | PostfixSinkProcess, engine: sa.Engine, report: ChaosReport,
                started: float) -> None:
    from workers import queue

    with engine.connect() as conn:
        state = queue.relay_status(conn)
    report.events.append(f"{time.monotonic() - started:.1f}s relay back (alarm during the "
                         f"outage: relay_state {state['status']!r})")
    if state["status"] != "down":
        report.broken.append("the relay was away but relay_state never said 'down' (P6)")
    sink.start()


def _restart_database(server: PostgresServer, fleet: Fleet, engine: sa.Engine,
                      seconds: float, report: ChaosReport, started: float) -> None:
    """Stop PostgreSQL for ``seconds`` and start it again; no worker may die of it."""
    with engine.connect() as conn:
        flying = conn.execute(sa.text(
            f"SELECT count(*) FROM delivery_jobs WHERE status = '{SENDING}'")).scalar_one()
    alive = [p.pid for p in fleet.procs if p is not None]
    server.stop()
    report.events.append(f"{time.monotonic() - started:.1f}s PostgreSQL stopped "
                         f"({flying} job(s) sending)")
    time.sleep(seconds)
    server.start()
    engine.dispose()  # our own pooled connections died with the server
    report.events.append(f"{time.monotonic() - started:.1f}s PostgreSQL started")
    dead = [pid for pid in alive if pid in fleet.unexpected_exits()]
    if dead:
        report.broken.append(f"worker process(es) {dead} died while PostgreSQL was away")


def _verify(engine: sa.Engine, campaign_id: int, records: list[dict[str, Any]],
            report: ChaosReport) -> None:
    """Compare the queue with the sink's record and name every broken promise."""
    from workers import queue

    with engine.connect() as conn:
        status, broadcast_id = conn.execute(sa.text(
            "SELECT status, broadcast_id FROM campaigns WHERE id = :id"),
            {"id": campaign_id}).one()
        jobs = {r.email: r.message_id for r in conn.execute(sa.text(
            "SELECT email, message_id FROM delivery_jobs WHERE campaign_id = :id"),
            {"id": campaign_id})}
        report.counts = queue.broadcast_counts(conn, broadcast_id)
        slow = queue.broadcast_counts_slow(conn, broadcast_id)
        report.relay_side_window = int(conn.execute(sa.text("""
            SELECT count(DISTINCT a.job_id) FROM job_attempts a
              JOIN delivery_jobs j ON j.id = a.job_id
             WHERE j.campaign_id = :id AND a.outcome = 'transient'
               AND a.stage IN ('send', 'data_end')"""), {"id": campaign_id}).scalar_one())
        suppressed = int(conn.execute(sa.text("SELECT count(*) FROM suppressions")).scalar_one())
    copies: dict[str, list[int]] = defaultdict(list)  # each address's places in the record
    for position, r in enumerate(records):
        copies[r["rcpt_tos"][0]].append(position)
    received = Counter({email: len(places) for email, places in copies.items()})
    report.recipients = len(jobs)
    report.delivered = len(set(received) & set(jobs))
    report.lost = report.recipients - report.delivered
    report.duplicates = sum(n - 1 for n in received.values())
    emails = {r.id: r.email for r in conn_rows(engine, campaign_id)}
    caused = blame([(k.victim_jobs, k.records_at_kill) for k in report.kills],
                   {job_id: copies.get(email, []) for job_id, email in emails.items()})
    for kill, duplicates in zip(report.kills, caused, strict=True):
        kill.duplicates = duplicates
    report.in_flight_bound = sum(k.victim_in_flight for k in report.kills)
    report.not_terminal = sum(report.counts[s] for s in (PENDING, SENDING, RETRY))
    report.sink_accepted = len(records)
    report.sink_distinct = len(received)
    report.message_id_mismatches = sum(
        1 for r in records if jobs.get(r["rcpt_tos"][0]) != r["message_id"])
    checks = [
        (report.recipients > 0, "the campaign has no jobs"),
        (report.lost == 0, f"{report.lost} recipient(s) lost (P2)"),
        (report.not_terminal == 0, f"{report.not_terminal} job(s) not terminal (P2)"),
        (status == Campaign.SENT, f"campaign status is {status!r}, not 'sent' (P8)"),
        (report.duplicates <= report.in_flight_bound + report.relay_side_window,
         f"{report.duplicates} duplicates exceed the in-flight bound (P3)"),
        (report.max_duplicates_per_kill <= report.threads,
         f"a kill caused {report.max_duplicates_per_kill} duplicates, more than one per "
         f"worker thread ({report.threads}) (docs/design.md §16)"),
        (report.message_id_mismatches == 0, "a copy carried another Message-ID (P3)"),
        (report.counts == slow, "counters differ from GROUP BY status (P8)"),
        (report.counts[SENT] == report.delivered == report.sink_distinct,
         "campaign counts differ from the sink's record (P8)"),
        (report.counts[FAILED] + report.counts[BOUNCED] == 0 and suppressed == 0,
         "a recipient was failed, bounced or suppressed for our own trouble (P5/P6)"),
        (not report.unexpected_exits, f"worker(s) {report.unexpected_exits} died unasked"),
    ]
    report.broken.extend(message for ok, message in checks if not ok)


def conn_rows(engine: sa.Engine, campaign_id: int) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT id, email FROM delivery_jobs WHERE campaign_id = :id"), {"id": campaign_id}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipients", type=int, default=30_000)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--duration", type=float, default=0.0,
                        help="stop killing after this many seconds (default: after --kills)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--threads", type=int, default=5, help="SENDDOCK_WORKERS each")
    parser.add_argument("--database-url", default=DEFAULT_SERVER,
                        help="PostgreSQL server to create the database on, or 'embedded'")
    parser.add_argument("--db-restart", type=float, default=0.0, metavar="SECONDS",
                        help="stop a private PostgreSQL this long mid-drain, then start it")
    parser.add_argument("--relay-outage", type=float, default=0.0, metavar="SECONDS",
                        help="stop the SMTP sink this long mid-drain, then start it")
    parser.add_argument("--gap", type=float, nargs=2, default=(0.3, 2.0),
                        metavar=("MIN", "MAX"), help="seconds between kills (uniform)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--sink", choices=["senddock", "postfix"], default="senddock",
                        help="the relay: our scripted sink or Postfix's smtp-sink")
    parser.add_argument("--keep-logs", type=Path, default=None, metavar="DIR",
                        help="keep the processes' logs in a new directory under DIR")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    add_settings_option(parser)
    args = parser.parse_args(argv)
    options = ChaosOptions(recipients=args.recipients, kills=args.kills,
                           duration=args.duration, workers=args.workers, threads=args.threads,
                           database_url=args.database_url, db_restart=args.db_restart,
                           relay_outage=args.relay_outage, seed=args.seed,
                           gap=(args.gap[0], args.gap[1]),
                           work_dir=args.keep_logs, sink=args.sink,
                           settings=settings_from(args.setting))
    report = run_chaos(options)
    print(report.render())
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2, default=str))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
