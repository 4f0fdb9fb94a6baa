"""Checking a CSV file first (the import's dry run) twice, as a marketer does before an
import: a generated file of about --mib MiB (one line in ten an address already stored),
uploaded with "Check first" twice by the same user to the same list through the Flask app
(test client, logged-in session, form parsing and templates included). Reports the seconds
per check, the database's growth after the two checks, the kept uploads, the inserts into
subscribers (pg_stat_user_tables.n_tup_ins) and the peak RSS of this process.

    python -m bench.bench_import_check [--mib 50]
"""

from __future__ import annotations

import argparse
import re
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.bench_admin_pages import logged_in_client
from bench.common import fresh_database, machine, save, table
from webapp import create_app, db
from webapp.domain import lists, users
from workers.core.settings import load

MIB = 1 << 20
EXISTING_EVERY = 10  # one line in ten: an address already stored (an update)


def write_csv(path: Path, mib: float) -> int:
    """A CSV of about ``mib`` MiB (email,name,city,plan); returns its line count."""
    target, size, n = int(mib * MIB), 0, 0
    with path.open("wb") as out:
        out.write(b"email,name,city,plan\n")
        while size < target:
            lines = b"".join(b"person%09d@example%d.org,Person %d,City %d,%s\n"
                             % (i, i % 97, i, i % 500, (b"free", b"pro", b"team")[i % 3])
                             for i in range(n, n + 10_000))
            out.write(lines)
            size, n = size + len(lines), n + 10_000
    return n


def seed_existing(engine: sa.Engine, lines: int) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("""
            INSERT INTO subscribers (email, name)
            SELECT format('person%s@example%s.org', lpad(i::text, 9, '0'), i % 97), 'Stored'
              FROM generate_series(0, :n - 1, :every) i"""),
            {"n": lines, "every": EXISTING_EVERY})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE subscribers"))


def _state(engine: sa.Engine) -> dict[str, int]:
    """Database size, kept uploads, subscribers and inserts into it, once every other
    session has ended (a backend reports its table counts when it exits)."""
    engine.dispose()
    with engine.connect() as conn:
        while conn.execute(sa.text("""
                SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                   AND pid <> pg_backend_pid() AND backend_type = 'client backend'""")
                           ).scalar_one():
            time.sleep(0.05)
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        row = conn.execute(sa.text("""
            SELECT pg_database_size(current_database()) AS db_bytes,
                   (SELECT count(*) FROM import_uploads) AS kept,
                   (SELECT count(*) FROM subscribers) AS subscribers,
                   (SELECT n_tup_ins FROM pg_stat_user_tables
                     WHERE relname = 'subscribers') AS inserted""")).one()
    return {k: int(v) for k, v in row._mapping.items()}


def check(client: Any, list_id: int, path: Path) -> tuple[float, str]:
    token = re.search(r'name="csrf-token" content="([^"]+)"',
                      client.get("/account/").get_data(as_text=True))[1]  # type: ignore[index]
    t0 = time.perf_counter()
    with path.open("rb") as f:
        r = client.post(f"/lists/{list_id}/import", data={
            "csrf_token": token, "action": "check", "file": (f, "people.csv")},
            content_type="multipart/form-data")
    seconds = time.perf_counter() - t0
    page = r.get_data(as_text=True)
    assert r.status_code == 200 and "Dry run" in page, page[:2000]
    counts = {k: re.search(rf'id="import-{k}">([\d,]+)<', page)[1]  # type: ignore[index]
              for k in ("lines", "added", "updated", "rejected")}
    return seconds, " / ".join(f"{v} {k}" for k, v in counts.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=float, default=50.0, help="size of the file (MiB)")
    args = parser.parse_args()
    info = machine()
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as url:
        path = Path(tmp) / "people.csv"
        lines = write_csv(path, args.mib)
        size_mib = round(path.stat().st_size / MIB, 1)
        engine = db.make_engine(url)
        seed_existing(engine, lines)
        with engine.begin() as conn:
            users.create_user(conn, "bench-marketer@example.com", "benchmark-password",
                              "marketer")
            list_id = int(lists.create_list(conn, "Checked")["id"])
        app = create_app(load({"DATABASE_URL": url, "SECRET_KEY": "bench"}), engine=engine)
        client = logged_in_client(app, "bench-marketer@example.com", "benchmark-password")
        before = _state(engine)
        runs = [check(client, list_id, path) for _ in range(2)]
        after = _state(engine)
        engine.dispose()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    results = {
        "file_mib": size_mib, "lines": lines,
        "check_seconds": [round(s, 1) for s, _ in runs], "report": runs[-1][1],
        "db_growth_mib": round((after["db_bytes"] - before["db_bytes"]) / MIB, 1),
        "db_before_mib": round(before["db_bytes"] / MIB, 1),
        "kept_uploads": after["kept"],
        "subscribers_inserted": after["inserted"] - before["inserted"],
        "subscribers_rows": (before["subscribers"], after["subscribers"]),
        "peak_rss_mib": round(peak_mib, 1)}
    print(f"CPU: {info['cpu_model']} ({info['cpus']} cores, load {info['load_1m']}), "
          f"PostgreSQL {info['postgres']}, Python {info['python']}")
    print(table(f"Check first, twice, one user and list ({lines:,} lines; report: "
                f"{results['report']})",
                ["file", "s per check (1st, 2nd)", "DB growth after 2 checks",
                 "kept uploads", "rows inserted into subscribers", "peak RSS"],
                [[f"{size_mib} MiB", " , ".join(f"{s:.1f}" for s in results["check_seconds"]),
                  f"{results['db_growth_mib']} MiB (from {results['db_before_mib']} MiB)",
                  results["kept_uploads"], results["subscribers_inserted"],
                  f"{results['peak_rss_mib']} MiB"]]))
    saved = save("import_check", {"machine": info, "results": results})
    print(f"\nsaved {saved}")


if __name__ == "__main__":
    main()
