"""Seed data in bulk for the benches and the tests that need many recipients: set-based
inserts, so 100,000 subscribers take seconds, not minutes."""

from __future__ import annotations

import sqlalchemy as sa


def seed_list(engine: sa.Engine, n: int, name: str = "bench") -> int:
    """A list of ``n`` subscribers, set-based."""
    with engine.begin() as conn:
        list_id = conn.execute(sa.text("INSERT INTO lists (name) VALUES (:n) RETURNING id"),
                               {"n": name}).scalar_one()
        conn.execute(sa.text("""
            INSERT INTO subscribers (email, name)
            SELECT 'user' || g || '-' || :tag || '@example.com', 'User ' || g
              FROM generate_series(1, :n) g"""), {"n": n, "tag": list_id})
        conn.execute(sa.text("""
            INSERT INTO memberships (list_id, subscriber_id)
            SELECT :l, id FROM subscribers WHERE email LIKE '%-' || :tag || '@example.com'"""),
            {"l": list_id, "tag": str(list_id)})
    return int(list_id)


#: The benchmarks' campaign (its list aside).
CAMPAIGN = {
    "name": "Bench", "subject": "Hello {{ name }}",
    "text": "Hi {{ name }},\n\nThis is a benchmark message.\n"
            + "Lorem ipsum dolor sit amet. " * 40 + "\nUnsubscribe: {{ unsubscribe_url }}",
    "html": "<p>Hi {{ name }}</p>" + "<p>Lorem ipsum dolor sit amet.</p>" * 40
            + '<p><a href="{{ unsubscribe_url }}">Unsubscribe</a></p>'}


def make_campaign(engine: sa.Engine, list_id: int) -> int:
    from webapp.domain import campaigns

    with engine.begin() as conn:
        c = campaigns.create(conn, {**CAMPAIGN, "list_id": list_id},
                             default_from="bench@example.com")
    return int(c["id"])
