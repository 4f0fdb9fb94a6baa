"""The same sends through procrastinate, a general-purpose PostgreSQL job queue, next to
SendDock: same database server, same SMTP sink, same message (rendered from the same
compiled template, built by the same MIME builder, sent over a kept-open SMTP connection
per thread), same concurrency. Prints both throughputs and the ratio.

    python -m bench.bench_procrastinate --recipients 20000 --sink postfix
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
import psycopg

from bench.common import (
    DEFAULT_SERVER,
    free_port,
    fresh_database,
    machine,
    save,
    sink_process,
    table,
)
from harness.seed import CAMPAIGN

SUBJECT, TEXT, HTML = CAMPAIGN["subject"], CAMPAIGN["text"], CAMPAIGN["html"]


def build_app(url: str, smtp_port: int) -> Any:
    """A procrastinate app whose one task sends one message like a SendDock worker."""
    import procrastinate

    from workers.building.links import unsubscribe_url
    from workers.building.message import build_mime, compile_campaign
    from workers.core.relays import parse_smtp_url
    from workers.delivery.smtp import SmtpTransport

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    template = compile_campaign(SUBJECT, TEXT, HTML)
    config = parse_smtp_url(f"smtp://127.0.0.1:{smtp_port}?tls=none")
    local = threading.local()

    @app.task(name="send_email")
    def send_email(job_id: int, subscriber_id: int, email: str, name: str) -> None:
        transport = getattr(local, "transport", None)
        if transport is None:
            transport = local.transport = SmtpTransport(config)
        unsub = unsubscribe_url("http://127.0.0.1:5000", "bench-secret", subscriber_id, 1)
        rendered = template.render({"name": name, "email": email, "unsubscribe_url": unsub,
                                    "subscriber": {"email": email, "name": name},
                                    "attributes": {}})
        message = build_mime(from_addr="bench@example.com", to_addr=email,
                             subject=rendered.subject, text=rendered.text, html=rendered.html,
                             message_id=f"<{job_id}.bench@example.com>",
                             headers={"List-Unsubscribe": f"<{unsub}>"})
        result = transport.send("bench@example.com", email, message)
        if not result.ok:
            raise RuntimeError(f"send failed: {result}")

    return app


def run_procrastinate(url: str, recipients: int, port: int, concurrency: int) -> dict[str, Any]:
    app = build_app(url, port)
    with app.open():
        app.schema_manager.apply_schema()
        task = app.tasks["send_email"]
        for start in range(0, recipients, 10_000):
            task.batch_defer(*({"job_id": i, "subscriber_id": i, "email": f"user{i}@example.com",
                                "name": f"User {i}"}
                               for i in range(start, min(recipients, start + 10_000))))
    # The worker runs in its own process, measured like SendDock's.
    code = ("import sys; from bench.bench_procrastinate import build_app; "
            f"app = build_app({url!r}, {port}); "
            f"app.open(); app.run_worker(concurrency={concurrency}, wait=False, "
            "install_signal_handlers=False, delete_jobs='never')")
    env = dict(os.environ, PYTHONPATH=str(os.getcwd()))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    peak, cpu_s = 0, 0.0
    first_done: float | None = None
    done = 0
    # Timed like SendDock's drain: from the first finished job to the last (not the
    # worker's start-up), by polling procrastinate's own table.
    with psycopg.connect(url, autocommit=True) as conn:
        while proc.poll() is None or done < recipients:
            try:
                peak = max(peak, ps.memory_info().rss)
                cpu = ps.cpu_times()
                cpu_s = cpu.user + cpu.system
            except psutil.NoSuchProcess:
                pass
            row = conn.execute("SELECT count(*) FROM procrastinate_jobs "
                               "WHERE status = 'succeeded'").fetchone()
            done = int(row[0]) if row else 0
            if done and first_done is None:
                first_done = time.perf_counter()
            if proc.poll() is not None and done < recipients:
                break
            time.sleep(0.2)
    elapsed = time.perf_counter() - (first_done or time.perf_counter())
    if proc.returncode or done < recipients:
        err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        raise RuntimeError(f"procrastinate finished {done}/{recipients}: {err}")
    return {"msgs_per_s": recipients / elapsed, "seconds": elapsed,
            "cpu_ms_per_msg": cpu_s * 1000 / recipients, "peak_rss_mb": peak / 2**20}


def main() -> None:
    from bench.bench_drain import drain, prepare

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipients", type=int, default=20_000)
    parser.add_argument("--sink", choices=["postfix", "senddock"], default="postfix")
    parser.add_argument("--concurrency", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("BENCH_DATABASE_URL", DEFAULT_SERVER)
    port = free_port()
    with sink_process(args.sink, port):
        with fresh_database() as url:
            engine, _, broadcast_id, _ = prepare(url, args.recipients)
            ours = drain(engine, url, broadcast_id, args.recipients, port, args.concurrency)
            engine.dispose()
        with fresh_database() as url:
            theirs = run_procrastinate(url, args.recipients, port, args.concurrency)
    ratio = ours["msgs_per_s"] / theirs["msgs_per_s"]
    info = machine()
    rows = [["SendDock", f"{ours['msgs_per_s']:,.0f}", f"{ours['cpu_ms_per_msg']:.2f}",
             f"{ours['peak_rss_mb']:.0f}"],
            ["procrastinate", f"{theirs['msgs_per_s']:,.0f}", f"{theirs['cpu_ms_per_msg']:.2f}",
             f"{theirs['peak_rss_mb']:.0f}"]]
    print(table(f"{args.recipients:,} messages to the {args.sink} sink, concurrency "
                f"{args.concurrency} ({info['cpus']} cores, load {info['load_1m']})",
                ["queue", "msgs/s", "CPU ms/msg", "peak RSS MB"], rows))
    print(f"\nSendDock / procrastinate throughput: {ratio:.1f}x")
    payload = {"machine": info, "args": vars(args), "senddock": ours, "procrastinate": theirs,
               "ratio": ratio}
    print(f"saved {save('procrastinate', payload)}")


if __name__ == "__main__":
    main()
