"""How the jobs table is updated: HOT (heap-only) updates versus updates that add index
entries, read from PostgreSQL's own counters (pg_stat_user_tables) after one drain.

A HOT update is possible only when no indexed column changes. Claiming and finishing a job
change ``status``, which the claim, in-flight and per-broadcast indexes are built on, so
those updates cannot be HOT whatever the fillfactor; this script measures it rather than
assuming it (docs/scale-out.md quotes the figures).

    python -m bench.bench_hot --recipients 20000
"""

from __future__ import annotations

import argparse
import time

import sqlalchemy as sa

from bench.bench_drain import drain, prepare
from bench.common import free_port, fresh_database, machine, sink_process, table

_STATS = sa.text("""
SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_dead_tup,
       pg_relation_size('delivery_jobs') AS heap_bytes,
       (SELECT reloptions FROM pg_class WHERE oid = 'delivery_jobs'::regclass) AS options
  FROM pg_stat_user_tables WHERE relname = 'delivery_jobs'
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipients", type=int, default=20_000)
    parser.add_argument("--sink", choices=["postfix", "senddock"], default="senddock")
    args = parser.parse_args()
    port = free_port()
    with fresh_database() as url, sink_process(args.sink, port):
        engine, _, broadcast_id, _ = prepare(url, args.recipients)
        drain(engine, url, broadcast_id, args.recipients, port, workers=5)
        time.sleep(2)  # backends flush their table counters at most once a second
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            row = conn.execute(_STATS).mappings().one()
        engine.dispose()
    hot_share = row["n_tup_hot_upd"] / row["n_tup_upd"] if row["n_tup_upd"] else 0.0
    print(machine())
    print(table("delivery_jobs updates during one drain",
                ["recipients", "inserted", "updated", "HOT updates", "HOT share",
                 "dead tuples", "heap MB", "reloptions"],
                [[args.recipients, row["n_tup_ins"], row["n_tup_upd"], row["n_tup_hot_upd"],
                  f"{hot_share:.1%}", row["n_dead_tup"], f"{row['heap_bytes'] / 2**20:.1f}",
                  ",".join(row["options"] or [])]]))


if __name__ == "__main__":
    main()
