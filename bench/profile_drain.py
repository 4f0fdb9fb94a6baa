"""Where a drained message's CPU goes: one `senddock worker` (default pool) drains a campaign
to Postfix's smtp-sink while py-spy samples it (``--gil``: only the thread holding the
interpreter, so waits are left out), and the samples are put into the drain's parts --
claiming, building, the SMTP exchange, the send guard, committing the outcome, reading the
reply -- by the innermost frame that names one. Beside it, the CPU per message of the
worker process and of the PostgreSQL server (every backend, triggers and counters
included).

    python -m bench.profile_drain --recipients 30000 --seconds 20

Needs py-spy (``pip install py-spy``; as root, or with ptrace allowed).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

from bench.bench_drain import prepare
from bench.common import env_for, free_port, fresh_database, machine, save, sink_process, table
from workers import queue
from workers.core.states import SENT

# Innermost first: a frame naming one of these decides the sample's part.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("send guard", ("SendGuard.",)),
    ("commit the outcome", ("Finisher.", "_Session.", "Handover.", "finish_document",
                            "finished_ids", "go_ahead")),
    ("build the message", ("Composer.",)),
    ("SMTP exchange", ("SmtpTransport.", "smtplib", "quoteaddr")),
    ("read the reply", ("Judge.", "reply_policy", "classify", "outcome_for")),
    ("claim", ("Claimer.", "claim_batch", "within_caps", "RelayBoard.", "Pool._claim",
               "Lease.", "Transports.")),
]
OTHER = "pool loop, threads, other"


def part_of(stack: list[str]) -> str:
    for frame in reversed(stack):
        for part, markers in PARTS:
            if any(marker in frame for marker in markers):
                return part
    return OTHER


def postgres_cpu() -> float:
    """CPU seconds of every PostgreSQL server process on this machine so far."""
    total = 0.0
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in ("postgres", "postmaster"):
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipients", type=int, default=30_000)
    parser.add_argument("--seconds", type=int, default=20, help="how long py-spy samples")
    parser.add_argument("--stacks", type=Path, help="also keep py-spy's samples (one "
                        "collapsed stack a line, with its count) in this file")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    port = free_port()
    with fresh_database() as url, sink_process("postfix", port), \
            tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        engine, _campaign_id, broadcast_id, _ = prepare(url, args.recipients)
        worker = subprocess.Popen([sys.executable, "-m", "webapp", "worker"],
                                  env=env_for(url, port), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        watched = psutil.Process(worker.pid)
        raw = Path(tmp) / "drain.txt"
        try:
            def sent() -> int:
                with engine.connect() as conn:
                    return queue.broadcast_counts(conn, broadcast_id)[SENT]

            while sent() < 500:  # past the start
                time.sleep(0.2)
            first, pg0 = sent(), postgres_cpu()
            cpu0, t0 = sum(watched.cpu_times()[:2]), time.perf_counter()
            subprocess.run([spy, "record", "--pid", str(worker.pid), "--gil", "--rate", "250",
                            "--duration", str(args.seconds), "--format", "raw", "-o",
                            str(raw)], check=True, capture_output=True)
            done = sent() - first
            worker_cpu = sum(watched.cpu_times()[:2]) - cpu0
            pg_cpu = postgres_cpu() - pg0
            elapsed = time.perf_counter() - t0
        finally:
            worker.terminate()
            worker.wait(60)
            engine.dispose()
        if args.stacks:
            shutil.copyfile(raw, args.stacks)
        parts: Counter[str] = Counter()
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                parts[part_of(stack.split(";"))] += int(count)
    total = sum(parts.values()) or 1
    per_message_ms = worker_cpu * 1000 / max(done, 1)
    rows = [[part, f"{n * 100 / total:.0f} %", f"{per_message_ms * n / total:.3f}"]
            for part, n in parts.most_common()]
    info = machine()
    print(table(f"Where a message's CPU goes in the worker: {done:,} messages in {elapsed:.0f} s "
                f"({done / elapsed:,.0f} msgs/s) while sampled; worker {per_message_ms:.2f} ms "
                f"and PostgreSQL {pg_cpu * 1000 / max(done, 1):.2f} ms of CPU a message "
                f"({info['cpus']} cores, {info['cpu_model']}, load {info['load_1m']})",
                ["part", "share of the worker's interpreter time", "≈ CPU ms a message"], rows))
    saved = save("profile-drain", {"machine": info, "parts": dict(parts), "messages": done,
                                   "worker_cpu_s": worker_cpu, "postgres_cpu_s": pg_cpu,
                                   "seconds": elapsed})
    print(f"\nsaved {saved}")


if __name__ == "__main__":
    main()
