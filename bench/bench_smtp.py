"""SMTP submission (docs/smtp.md) under load: ``--clients`` processes, each one STARTTLS +
AUTH session sending ``--messages`` messages of ``--size`` bytes (one recipient each)
through Python's smtplib to a ``senddock smtp`` process; prints the accepted messages/s,
the p50/p95/max of the time from the end of DATA to the final 250 (durable: committed),
and the server's peak RSS; then ``--big-clients`` clients each sending one ``--big-mb`` MB
message at once, and the peak RSS while they do.

    python -m bench.bench_smtp --clients 8 --messages 150
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import smtplib
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import sqlalchemy as sa

from bench.common import env_for, fresh_database, machine, percentile, save
from harness.postfix import make_certificates


def message(n: int, size: int, client: int) -> bytes:
    head = (f"From: Bench <bench@example.com>\r\nTo: r{client}-{n}@example.org\r\n"
            f"Subject: bench {n}\r\nMessage-ID: <b{client}-{n}-{time.time_ns()}@bench>\r\n"
            "X-SendDock-Kind: bench\r\n\r\n").encode()
    line = b"x" * 76 + b"\r\n"
    return head + line * max(1, (size - len(head)) // len(line))


def client(port: int, ca: str, token: str, index: int, count: int, size: int,
           out: Any) -> None:
    context = ssl.create_default_context(cafile=ca)
    waits: list[float] = []
    refused = 0
    with smtplib.SMTP("127.0.0.1", port, timeout=120) as smtp:
        smtp.starttls(context=context)
        smtp.login("bench", token)
        for n in range(count):
            raw = message(n, size, index)
            smtp.mail("bench@example.com")
            smtp.rcpt(f"r{index}-{n}@example.org")
            # smtplib.data sends the whole message, then reads the reply: what it measures
            # past the send is the server's durable acceptance.
            smtp.putcmd("data")
            code, _ = smtp.getreply()
            assert code == 354
            smtp.send(smtplib._quote_periods(raw) + b"\r\n.\r\n")  # type: ignore[attr-defined]
            start = time.perf_counter()
            code, _ = smtp.getreply()
            waits.append(time.perf_counter() - start)
            if code != 250:
                refused += 1
    out.put((waits, refused))


def run_clients(port: int, ca: str, token: str, clients: int, count: int,
                size: int) -> tuple[list[float], int, float]:
    queue: Any = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=client, args=(port, ca, token, i, count, size,
                                                          queue)) for i in range(clients)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    elapsed = time.perf_counter() - start
    for p in procs:
        p.join()
    waits = [w for r in results for w in r[0]]
    return waits, sum(r[1] for r in results), elapsed


class PeakRss:
    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return

    def reset(self) -> None:
        self.peak = self.proc.memory_info().rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--messages", type=int, default=150, help="per client")
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--big-clients", type=int, default=8)
    parser.add_argument("--big-mb", type=int, default=20)
    args = parser.parse_args()
    from webapp.domain import kinds, users

    with fresh_database() as url, tempfile.TemporaryDirectory() as tmp:
        engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        with engine.begin() as conn:
            kind, created = kinds.parse_kind(conn, "bench", {
                "class": "lifecycle", "subject": "s", "text": "t", "dedupe_window": 0})
            kinds.save(conn, kind, actor="bench", created=created)
            user = users.create_user(conn, "bench@example.com", "bench password 123",
                                     "support")
            token = users.create_token(conn, user["id"], "bench")
        engine.dispose()
        ca, cert, key = make_certificates(Path(tmp), "bench.senddock.test")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = env_for(url, 1, SUBMISSION_LISTEN=f"127.0.0.1:{port}",
                      SUBMISSION_CERT=str(cert), SUBMISSION_KEY=str(key),
                      SUBMISSION_HOSTNAME="localhost", MAX_BACKLOG="10000000",
                      SUBMISSION_MAX_SIZE=str((args.big_mb + 5) * 2**20))
        server = subprocess.Popen([sys.executable, "-m", "webapp", "smtp"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.2)
            rss = PeakRss(server.pid)
            waits, refused, elapsed = run_clients(port, str(ca), token, args.clients,
                                                  args.messages, args.size)
            accepted = len(waits) - refused
            small_rss = rss.peak
            rss.reset()
            big_waits, big_refused, big_elapsed = run_clients(
                port, str(ca), token, args.big_clients, 1, args.big_mb * 2**20)
            big_rss = rss.peak
            rss.stop.set()
        finally:
            server.terminate()
            server.wait(30)
    result = {
        "machine": machine(), "clients": args.clients, "messages": len(waits),
        "size": args.size, "accepted": accepted, "refused": refused,
        "accepted_per_s": round(accepted / elapsed, 1),
        "p50_ms": round(percentile(waits, 50) * 1000, 1),
        "p95_ms": round(percentile(waits, 95) * 1000, 1),
        "max_ms": round(max(waits) * 1000, 1), "peak_rss_mb": round(small_rss / 2**20, 1),
        "big": {"clients": args.big_clients, "mb": args.big_mb,
                "refused": big_refused, "seconds": round(big_elapsed, 2),
                "p95_ms": round(percentile(big_waits, 95) * 1000, 1),
                "peak_rss_mb": round(big_rss / 2**20, 1)},
    }
    print(f"{accepted} messages of {args.size} B over {args.clients} STARTTLS sessions in "
          f"{elapsed:.2f} s: {result['accepted_per_s']} msg/s accepted (durable), "
          f"end of DATA -> 250 p50 {result['p50_ms']} ms, p95 {result['p95_ms']} ms, "
          f"max {result['max_ms']} ms; server peak RSS {result['peak_rss_mb']} MB")
    print(f"{args.big_clients} clients x {args.big_mb} MB at once: {big_elapsed:.2f} s, "
          f"{big_refused} refused, p95 {result['big']['p95_ms']} ms, "
          f"server peak RSS {result['big']['peak_rss_mb']} MB")
    print(f"saved {save('smtp', result)}")
    os._exit(0)


if __name__ == "__main__":
    main()
