"""Shared pieces of the benchmarks: a fresh database, seeding, sinks, the machine, tables."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def machine() -> dict[str, Any]:
    import psutil

    with psycopg.connect(os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER)) as conn:
        pg = conn.execute("SHOW server_version").fetchone()
    return {"cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "cpu_model": _cpu_model(), "python": platform.python_version(),
            "postgres": pg[0] if pg else "?", "kernel": platform.release(),
            "load_1m": round(os.getloadavg()[0], 2)}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def fresh_database(server: str | None = None, *, migrate: bool = True) -> Iterator[str]:
    """A new migrated database on ``server`` (empty with ``migrate=False``); dropped
    afterwards. ``BENCH_DATABASE_PREFIX`` names it (default ``senddock_bench``), so runs
    sharing a server tell theirs apart."""
    from webapp import db

    server = server or os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER)
    prefix = os.environ.get("BENCH_DATABASE_PREFIX", "senddock_bench")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    url = str(sa.make_url(server).set(database=name).render_as_string(hide_password=False))
    try:
        if migrate:
            db.upgrade(url)
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


@contextmanager
def sink_process(kind: str, port: int,
                 record: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A local SMTP sink: ``postfix`` (/usr/sbin/smtp-sink, C) or ``senddock`` (aiosmtpd)."""
    if kind == "postfix":
        exe = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"
        cmd = [exe, "-c", "-u", "nobody", f"127.0.0.1:{port}", "256"]
    else:
        cmd = [sys.executable, "-m", "webapp", "smtp-sink", "--port", str(port), "--quiet",
               "--record", str(record or Path(os.devnull))]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)


def env_for(url: str, smtp_port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDDOCK_")}
    env.update({"SENDDOCK_DATABASE_URL": url,
                "SENDDOCK_SMTP_URL": f"smtp://127.0.0.1:{smtp_port}?tls=none",
                "SENDDOCK_SECRET_KEY": "bench-secret", "SENDDOCK_LOG_LEVEL": "WARNING",
                "SENDDOCK_FROM": "Bench <bench@example.com>"})
    env.update({f"SENDDOCK_{k}": v for k, v in extra.items()})
    return env


def add_settings_option(parser: argparse.ArgumentParser) -> None:
    """``--setting NAME=VALUE`` (repeatable): more SENDDOCK_* values for the workers;
    :func:`settings_from` turns them into keyword arguments for :func:`env_for`."""
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a SENDDOCK_ setting for the workers, e.g. SMTP_MAX_MESSAGES=1000")


def settings_from(values: Sequence[str]) -> dict[str, str]:
    return dict(value.split("=", 1) for value in values)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
            for r in cells]
    return "\n".join([f"\n{title}\n", line, sep, *body])


def save(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def in_threads(clients: int, run: Callable[[int], None]) -> float:
    """``run(0)`` … ``run(clients - 1)`` each in a thread of its own; the seconds until the
    last has returned."""
    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0
