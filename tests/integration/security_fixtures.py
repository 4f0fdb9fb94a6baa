"""What the security tests share: a seeded database with one of everything, and the
route walker that turns every rule in ``app.url_map`` into a callable URL.

Routes are discovered, never listed: a route another area adds tomorrow is walked too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import Flask
from werkzeug.routing import Rule
from werkzeug.routing.converters import AnyConverter, IntegerConverter

from webapp.domain import suppressions, users, verifications
from workers import queue
from workers.building import links
from workers.core.settings import Config

ROLES = ("admin", "marketer", "support")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
MISSING_ID = 987_654_321
CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')

# Path parameter names -> the seeded row they name (see :func:`seed`).
PARAM_KEYS = {"campaign_id": "campaign_id", "list_id": "list_id", "job_id": "job_id",
              "subscriber_id": "subscriber_id", "user_id": "user_id", "token_id": "token_id",
              "email": "suppressed_email", "user_ref": "user_ref", "token": "unsubscribe",
              "filename": "static_file"}


def seed(engine: sa.Engine, config: Config, *, name: str = "Seeded",
         email: str = "seeded@example.org") -> dict[str, Any]:
    """One list with a subscriber, a sent campaign (with jobs), a failed job with an
    attempt, a suppression, a verification job, a user with a token; returns their ids."""
    from tests.helpers import make_campaign

    campaign = make_campaign(engine, [email], name=name)
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        list_id = campaign["list_id"]
        subscriber_id = conn.execute(sa.text(
            "SELECT subscriber_id FROM memberships WHERE list_id = :l LIMIT 1"),
            {"l": list_id}).scalar_one()
        job_id = conn.execute(sa.text(
            "SELECT id FROM delivery_jobs WHERE campaign_id = :c LIMIT 1"),
            {"c": campaign["id"]}).scalar_one()
        failed_id = failed_job(conn, "failed@example.org", "550 5.7.1 blocked")
        suppressions.suppress(conn, "suppressed@example.org", "manual", actor="tests")
        job, _ = verifications.request(conn, config, verifications.VerificationRequest(
            "user-42", "verify@example.org", "https://app.example.com/verify?t=1"),
            actor="tests")
        user_id = users.create_user(conn, f"bystander-{name.lower()[:8]}@example.org",
                                    "bystander password", "marketer")["id"]
        users.create_token(conn, user_id, "bystander")
        token_id = conn.execute(sa.text("SELECT id FROM api_tokens WHERE user_id = :u"),
                                {"u": user_id}).scalar_one()
    return {
        "campaign_id": campaign["id"], "list_id": list_id, "subscriber_id": subscriber_id,
        "job_id": job_id, "failed_job_id": failed_id, "verification_job_id": job["id"],
        "user_id": user_id, "token_id": token_id, "suppressed_email": "suppressed@example.org",
        "user_ref": "user-42", "static_file": "css/app.css",
        "unsubscribe": links.make_token(config.secret_key, subscriber_id,
                                                    campaign["id"]),
    }


def failed_job(conn: sa.Connection, email: str, reply: str) -> int:
    """A verification job that failed with ``reply`` (one recorded attempt)."""
    job_id = int(conn.execute(sa.text("""
        INSERT INTO delivery_jobs (kind, priority, status, email, user_ref, attempts,
                                   last_error, last_error_class, finished_at)
        VALUES ('verification', :p, 'failed', :e, 'failed-user', 1, :r, 'rejected', now())
        RETURNING id"""), {"p": queue.PRIORITY["verification"], "e": email, "r": reply}
    ).scalar_one())
    conn.execute(sa.text("""
        INSERT INTO job_attempts (job_id, attempt, outcome, smtp_code, reply, duration_ms)
        VALUES (:j, 1, 'rejected', 550, :r, 12)"""), {"j": job_id, "r": reply})
    return job_id


@dataclass(frozen=True)
class Call:
    """One (rule, method) of the app, with a URL built from seeded or missing ids."""

    rule: Rule
    method: str
    url: str

    @property
    def endpoint(self) -> str:
        return str(self.rule.endpoint)

    @property
    def is_api(self) -> bool:
        from webapp.auth import METRICS_PATHS

        return self.url.startswith("/api/") or self.url in METRICS_PATHS

    def __str__(self) -> str:
        return f"{self.method} {self.url} ({self.endpoint})"


def _value(rule: Rule, name: str, ids: dict[str, Any], existing: bool) -> Any:
    converter = rule._converters[name]
    if isinstance(converter, AnyConverter):
        return sorted(converter.items)[0]
    if isinstance(converter, IntegerConverter):
        if existing and PARAM_KEYS.get(name) in ids:
            return ids[PARAM_KEYS[name]]
        return MISSING_ID
    if existing and PARAM_KEYS.get(name) in ids:
        return ids[PARAM_KEYS[name]]
    return "missing-value"


def calls(app: Flask, ids: dict[str, Any], *, existing_for_writes: bool = False
          ) -> Iterator[Call]:
    """Every (rule, method) in the app. GETs name seeded rows; state-changing methods
    name missing ones unless ``existing_for_writes`` (so walking changes nothing)."""
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: (r.rule, r.endpoint)):
        for method in sorted((rule.methods or set()) & set(METHODS)):
            existing = method == "GET" or existing_for_writes
            values = {name: _value(rule, name, ids, existing) for name in rule.arguments}
            built = rule.build(values, append_unknown=False)
            assert built is not None, f"cannot build {rule.rule} from {values}"
            yield Call(rule, method, built[1])


def csrf_token(client: Any) -> str:
    """A CSRF token bound to the client's session (from the login page's form)."""
    found = CSRF_FIELD.search(client.get("/login").get_data(as_text=True))
    assert found, "the login page has no csrf_token field"
    return found[1]


def login(client: Any, user: dict[str, Any]) -> str:
    """Log ``client`` in through the login form; returns the session's CSRF token."""
    token = csrf_token(client)
    answer = client.post("/login", data={"email": user["email"], "password": user["password"],
                                         "csrf_token": token})
    assert answer.status_code == 302, answer.get_data(as_text=True)[:500]
    return csrf_token(client)


def send(client: Any, call: Call, *, csrf: str | None = None,
         headers: dict[str, str] | None = None) -> Any:
    """Make ``call`` with an empty body (JSON object on the API), the CSRF token when
    given (form field and header, as forms and HTMX send it)."""
    headers = dict(headers or {})
    kwargs: dict[str, Any] = {}
    if csrf is not None:
        headers["X-CSRFToken"] = csrf
    if call.method != "GET":
        if call.is_api:
            kwargs["json"] = {}
        elif csrf is not None:
            kwargs["data"] = {"csrf_token": csrf}
    return client.open(call.url, method=call.method, headers=headers, **kwargs)


