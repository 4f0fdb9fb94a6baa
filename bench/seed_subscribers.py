"""Seed N subscribers into a list, set-based (generate_series): a million in well under a
minute, for benchmarks and for trying the UI at scale.

    python -m bench.seed_subscribers --url postgresql://... --subscribers 1000000 [--list NAME]
"""

from __future__ import annotations

import argparse
import time

import sqlalchemy as sa

# Names and attributes vary so search and templates have something to work with; every
# 1000th subscriber is unsubscribed, so audience counts have something to leave out.
_SUBSCRIBERS = sa.text("""
INSERT INTO subscribers (email, name, attributes, status)
SELECT 'user' || g || '-' || :tag || '@example' || (g % 97) || '.com',
       (ARRAY['Ada', 'Grace', 'Alan', 'Edsger', 'Barbara', 'Ken'])[1 + g % 6] || ' '
           || (ARRAY['Lovelace', 'Hopper', 'Turing', 'Dijkstra', 'Liskov', 'Thompson'])[1 + g % 5]
           || ' ' || g,
       jsonb_build_object('plan', (ARRAY['free', 'pro', 'team'])[1 + g % 3], 'n', g),
       CASE WHEN g % 1000 = 0 THEN 'unsubscribed' ELSE 'active' END
  FROM generate_series(1, :n) g
""")

_MEMBERSHIPS = sa.text("""
INSERT INTO memberships (list_id, subscriber_id)
SELECT :list_id, id FROM subscribers WHERE email LIKE '%-' || :tag || '@%'
""")


def seed_subscribers(engine: sa.Engine, n: int, name: str = "Benchmark list") -> int:
    """Create a list with ``n`` new subscribers (two statements); returns the list id."""
    with engine.begin() as conn:
        list_id = int(conn.execute(sa.text(
            "INSERT INTO lists (name, description) VALUES (:n, 'seeded') RETURNING id"),
            {"n": name}).scalar_one())
        tag = f"l{list_id}"
        conn.execute(_SUBSCRIBERS, {"n": n, "tag": tag})
        conn.execute(_MEMBERSHIPS, {"list_id": list_id, "tag": tag})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE subscribers"))
        conn.execute(sa.text("VACUUM ANALYZE memberships"))
    return list_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="PostgreSQL URL of a migrated database")
    parser.add_argument("--subscribers", type=int, default=1_000_000)
    parser.add_argument("--list", default="Benchmark list")
    args = parser.parse_args()
    from webapp import db

    engine = db.make_engine(args.url)
    t0 = time.perf_counter()
    list_id = seed_subscribers(engine, args.subscribers, args.list)
    print(f"list {list_id}: {args.subscribers:,} subscribers in "
          f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
