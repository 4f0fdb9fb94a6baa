"""Lists and subscribers. One subscriber per address however it is cased (SPEC 3)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from email_validator import EmailNotValidError, validate_email
from sqlalchemy.engine import Connection

from webapp.domain.errors import Invalid, NotFound

MAX_NAME = 200


def check_email(raw: Any) -> str:
    """A syntactically valid address (as given, trimmed) or :class:`Invalid`."""
    if not isinstance(raw, str) or not raw.strip():
        raise Invalid("email is required", fields={"email": "required"})
    try:
        result = validate_email(raw.strip(), check_deliverability=False)
    except EmailNotValidError as exc:
        raise Invalid(f"invalid email address: {exc}", fields={"email": str(exc)}) from None
    return str(result.normalized)


def create_list(conn: Connection, name: str, description: str = "") -> dict[str, Any]:
    name = (name or "").strip()
    if not name:
        raise Invalid("a list needs a name", fields={"name": "required"})
    if len(name) > MAX_NAME:
        raise Invalid("list name too long", fields={"name": f"at most {MAX_NAME} characters"})
    row = conn.execute(sa.text(
        "INSERT INTO lists (name, description) VALUES (:n, :d) RETURNING id, name, created_at"),
        {"n": name, "d": description}).mappings().one()
    return dict(row)


def get_list(conn: Connection, list_id: int) -> dict[str, Any]:
    row = conn.execute(sa.text("""
        SELECT l.id, l.name, l.description, l.created_at,
               (SELECT count(*) FROM memberships m WHERE m.list_id = l.id) AS subscribers
          FROM lists l WHERE l.id = :id"""), {"id": list_id}).mappings().first()
    if row is None:
        raise NotFound(f"list {list_id} does not exist")
    return dict(row)


def all_lists(conn: Connection) -> list[dict[str, Any]]:
    rows = conn.execute(sa.text("""
        SELECT l.id, l.name, l.description, l.created_at,
               (SELECT count(*) FROM memberships m WHERE m.list_id = l.id) AS subscribers
          FROM lists l ORDER BY l.id"""))
    return [dict(r) for r in rows.mappings()]


@dataclass
class SubscriberInput:
    email: str
    name: str
    attributes: dict[str, Any]


def validate_subscribers(items: Iterable[Any]) -> tuple[list[tuple[int, SubscriberInput]],
                                                         list[dict[str, Any]]]:
    """Split raw items into valid (index, input) pairs and per-item errors; a repeated
    address (however cased) is an error after its first occurrence."""
    valid: list[tuple[int, SubscriberInput]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        raw_email = item.get("email") if isinstance(item, dict) else None
        try:
            if not isinstance(item, dict):
                raise Invalid("each subscriber must be an object")
            email = check_email(raw_email)
            name = item.get("name") or ""
            attributes = item.get("attributes") or {}
            if not isinstance(name, str) or len(name) > MAX_NAME:
                raise Invalid(f"name must be text of at most {MAX_NAME} characters")
            if not isinstance(attributes, dict):
                raise Invalid("attributes must be an object")
        except Invalid as exc:
            errors.append({"index": index, "email": raw_email if isinstance(raw_email, str)
                           else None, "error": exc.message})
            continue
        if email.lower() in seen:
            errors.append({"index": index, "email": email, "error": "duplicate address"})
            continue
        seen.add(email.lower())
        valid.append((index, SubscriberInput(email, name.strip(), attributes)))
    return valid, errors


# Upsert by lower(email) and add to the list, set-based: one statement for any batch size.
_UPSERT = sa.text("""
WITH input AS (
    SELECT * FROM unnest(CAST(:emails AS text[]), CAST(:names AS text[]),
                         CAST(:attrs AS jsonb[])) AS i(email, name, attributes)
), up AS (
    INSERT INTO subscribers AS s (email, name, attributes)
    SELECT email, name, attributes FROM input
    ON CONFLICT (lower(email)) DO UPDATE
       SET name = CASE WHEN EXCLUDED.name <> '' THEN EXCLUDED.name ELSE s.name END,
           attributes = s.attributes || EXCLUDED.attributes
    RETURNING id, (xmax = 0) AS inserted
), m AS (
    INSERT INTO memberships (list_id, subscriber_id) SELECT :list_id, id FROM up
    ON CONFLICT DO NOTHING
)
SELECT count(*) FILTER (WHERE inserted) AS added, count(*) FILTER (WHERE NOT inserted) AS updated
  FROM up
""")


def add_subscribers(conn: Connection, list_id: int, items: list[Any]) -> dict[str, Any]:
    """Add or update subscribers and put them on the list. Invalid items are reported
    with their index; the rest are saved (P9)."""
    get_list(conn, list_id)
    valid, errors = validate_subscribers(items)
    added = updated = 0
    if valid:
        row = conn.execute(_UPSERT, {
            "list_id": list_id,
            "emails": [s.email for _, s in valid], "names": [s.name for _, s in valid],
            "attrs": [json.dumps(s.attributes) for _, s in valid]}).one()
        added, updated = int(row.added), int(row.updated)
    return {"added": added, "updated": updated, "errors": errors}
