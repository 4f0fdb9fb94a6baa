"""The floor bench_api.py compares SendDock against: the smallest queue endpoint on the same
stack (Flask + waitress + psycopg, one INSERT per request into ``email_jobs``, autocommit,
one connection per waitress thread), as the second seed sketched it.

    python -m bench.minimal_queue --port 8099 --dsn postgresql://... --threads 8
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

import psycopg
from flask import Flask, jsonify, request
from waitress import serve

TABLE = """
CREATE TABLE IF NOT EXISTS email_jobs (
    id bigserial PRIMARY KEY, user_id text NOT NULL, email text NOT NULL,
    payload jsonb NOT NULL, status text NOT NULL DEFAULT 'pending',
    created_at timestamptz NOT NULL DEFAULT now())"""


def make_app(dsn: str) -> Flask:
    app = Flask(__name__)
    local = threading.local()

    def conn() -> psycopg.Connection[Any]:
        if getattr(local, "conn", None) is None:
            local.conn = psycopg.connect(dsn, autocommit=True)
        return local.conn  # type: ignore[no-any-return]

    @app.post("/jobs")
    def enqueue() -> Any:
        body = request.get_json()
        row = conn().execute(
            "INSERT INTO email_jobs (user_id, email, payload) VALUES (%s, %s, %s) RETURNING id",
            (str(body["user_id"]), body["email"], psycopg.types.json.Jsonb(body))).fetchone()
        assert row is not None
        return jsonify({"id": row[0], "status": "pending"}), 202

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    with psycopg.connect(args.dsn, autocommit=True) as c:
        c.execute(TABLE)
    serve(make_app(args.dsn), host="127.0.0.1", port=args.port, threads=args.threads,
          _quiet=True)


if __name__ == "__main__":
    main()
