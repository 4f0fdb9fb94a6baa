"""Lists and subscribers. One subscriber per address however it is cased (docs/design.md §20)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from email_validator import EmailNotValidError, validate_email
from sqlalchemy.engine import Connection

from webapp.domain import audit, text_limits
from webapp.domain.csv_export import SafeWriter
from webapp.domain.errors import Conflict, Invalid, NotFound
from workers.core.i18n import N_, Text

MAX_NAME = text_limits.LIST_NAME


# email-validator's answers that a person typing an address meets, in the page's language
#; a message that names characters keeps its tail ("…: ñ, ü"). Others stay as
# the library words them.
EMAIL_PROBLEMS = {
    "An email address must have an @-sign.": N_("An email address must have an @-sign."),
    "There must be something after the @-sign.": N_(
        "There must be something after the @-sign."),
    "There must be something before the @-sign.": N_(
        "There must be something before the @-sign."),
    "The part after the @-sign is not valid. It should have a period.": N_(
        "The part after the @-sign is not valid. It should have a period."),
    "An email address cannot have two periods in a row.": N_(
        "An email address cannot have two periods in a row."),
    "An email address cannot start with a period.": N_(
        "An email address cannot start with a period."),
    "An email address cannot have a period immediately before the @-sign.": N_(
        "An email address cannot have a period immediately before the @-sign."),
    "An email address cannot end with a period.": N_(
        "An email address cannot end with a period."),
    "An email address cannot have a period immediately after the @-sign.": N_(
        "An email address cannot have a period immediately after the @-sign."),
    "The part after the @-sign is not valid. It is not within a valid top-level domain.": N_(
        "The part after the @-sign is not valid. It is not within a valid top-level domain."),
    "There can't be anything after the email address.": N_(
        "There can't be anything after the email address."),
    "The part after the @-sign is a special-use or reserved name that cannot be used with "
    "email.": N_("The part after the @-sign is a special-use or reserved name that cannot "
                 "be used with email."),
    "The email address contains invalid characters before the @-sign: ": N_(
        "The email address contains invalid characters before the @-sign: %(chars)s"),
    "The part after the @-sign contains invalid characters: ": N_(
        "The part after the @-sign contains invalid characters: %(chars)s"),
}


def email_problem(message: str) -> str:
    """email-validator's message in the page's language where it is one people meet."""
    for english, said in EMAIL_PROBLEMS.items():
        if message == english:
            return said
        if english.endswith(": ") and message.startswith(english):
            return Text(said.msgid, chars=message[len(english):].rstrip("."))
    return message


# The common address, checked without walking email-validator's whole path (0.36 ms an
# address, most of a 500-message batch's Python): a plain ASCII dot-atom local
# part (RFC 5322 atext, which email-validator accepts as it is) and a domain whose answer is
# email-validator's own, cached per domain. Anything else (quoted or non-ASCII local parts,
# too long, odd shapes) takes email-validator's full path, so the accepted addresses, their
# normalized form and every refusal's wording are the same
# (tests/unit/test_email_check.py compares both on a corpus).
_PLAIN_LOCAL = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
_MAX_LOCAL, _MAX_ADDRESS = 64, 254


@functools.lru_cache(maxsize=4096)
def _domain(domain: str) -> str | None:
    """``domain`` as email-validator normalizes it, or None if it refuses it."""
    try:
        return str(validate_email(f"a@{domain}", check_deliverability=False).domain)
    except EmailNotValidError:
        return None


def _plain(address: str) -> str | None:
    """The normalized address if it is of the common shape and valid, else None (ask
    email-validator)."""
    local, at, domain = address.rpartition("@")
    if not at or len(local) > _MAX_LOCAL or len(address) > _MAX_ADDRESS \
            or not address.isascii() or _PLAIN_LOCAL.fullmatch(local) is None:
        return None
    normalized = _domain(domain)
    return None if normalized is None else f"{local}@{normalized}"


def check_email(raw: Any) -> str:
    """A syntactically valid address (as given, trimmed) or :class:`Invalid`."""
    if not isinstance(raw, str) or not raw.strip():
        raise Invalid(N_("email is required"), fields={"email": N_("required")})
    plain = _plain(raw.strip())
    if plain is not None:
        return plain
    try:
        result = validate_email(raw.strip(), check_deliverability=False)
    except EmailNotValidError as exc:
        why = email_problem(str(exc))
        raise Invalid(N_("invalid email address: %(why)s", why=why),
                      fields={"email": why}) from None
    return str(result.normalized)


def _check_list_name(name: str, description: str) -> tuple[str, str]:
    raw = name or ""
    name = raw.strip()
    if not name:
        raise Invalid(N_("a list needs a name"), fields={"name": N_("required")})
    if len(raw) > MAX_NAME:
        raise Invalid(N_("list name too long"),
                      fields={"name": N_("at most %(max)s characters", max=MAX_NAME)})
    text_limits.check("description", description, text_limits.LIST_DESCRIPTION)
    return name, (description or "").strip()


def _taken(conn: Connection, name: str, list_id: int | None) -> None:
    """Two lists with one name cannot be told apart in the composer, the import form or a
    subscriber's preferences: a name is used once, whatever its case. Two requests naming
    the same new list at once are serialized on the name (a transaction-scoped lock)."""
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtextextended("
                         "'senddock.list:' || lower(:n), 0))"), {"n": name})
    if conn.execute(sa.text("SELECT 1 FROM lists WHERE lower(name) = lower(:n) "
                            "AND id IS DISTINCT FROM :id"),
                    {"n": name, "id": list_id}).first() is not None:
        raise Conflict(N_("a list named “%(name)s” exists already", name=name),
                       fields={"name": N_("already used")})


def create_list(conn: Connection, name: str, description: str = "", *,
                actor: str = "system") -> dict[str, Any]:
    name, description = _check_list_name(name, description)
    _taken(conn, name, None)
    row = conn.execute(sa.text(
        "INSERT INTO lists (name, description) VALUES (:n, :d) RETURNING id, name, created_at"),
        {"n": name, "d": description}).mappings().one()
    audit.record(conn, actor, "list.create", f"list:{row['id']}", name=name)
    return dict(row)


# The list's size comes from lists.subscriber_count (kept exact by triggers on memberships),
# so no page view counts a million rows.
_LIST_FIELDS = "l.id, l.name, l.description, l.created_at, l.subscriber_count AS subscribers"


def get_list(conn: Connection, list_id: int, *, lock: bool = False) -> dict[str, Any]:
    row = conn.execute(sa.text(
        f"SELECT {_LIST_FIELDS} FROM lists l WHERE l.id = :id" + (" FOR UPDATE" if lock else "")),
        {"id": list_id}).mappings().first()
    if row is None:
        raise NotFound(N_("list %(id)s does not exist", id=str(list_id)))
    return dict(row)


def all_lists(conn: Connection) -> list[dict[str, Any]]:
    rows = conn.execute(sa.text(f"SELECT {_LIST_FIELDS} FROM lists l ORDER BY l.id"))
    return [dict(r) for r in rows.mappings()]


def rename_list(conn: Connection, list_id: int, name: str, description: str = "", *,
                actor: str = "system") -> dict[str, Any]:
    current = get_list(conn, list_id, lock=True)
    name, description = _check_list_name(name, description)
    _taken(conn, name, list_id)
    conn.execute(sa.text("UPDATE lists SET name = :n, description = :d WHERE id = :id"),
                 {"n": name, "d": description, "id": list_id})
    audit.record(conn, actor, "list.rename", f"list:{list_id}", old=current["name"], new=name)
    return get_list(conn, list_id)


def delete_list(conn: Connection, list_id: int, *, actor: str = "system") -> None:
    """Delete the list and its memberships (subscribers stay, with their history). A list
    that campaigns were composed for cannot be deleted: their records would lose it."""
    current = get_list(conn, list_id, lock=True)
    used = conn.execute(sa.text("SELECT name FROM campaigns WHERE list_id = :id ORDER BY id "
                                "LIMIT 4"), {"id": list_id}).scalars().all()
    if used:
        names = ", ".join(f"“{n}”" for n in used[:3]) + (" …" if len(used) > 3 else "")
        raise Conflict(N_("the list is used by campaigns (%(names)s); it cannot be deleted",
                          names=names))
    conn.execute(sa.text("DELETE FROM lists WHERE id = :id"), {"id": list_id})
    audit.record(conn, actor, "list.delete", f"list:{list_id}", name=current["name"],
                 subscribers=current["subscribers"])


@dataclass
class SubscriberInput:
    email: str
    name: str
    attributes: dict[str, Any]
    # Consent to tracking opens and clicks (None: as it is; a new subscriber allows it).
    tracking: bool | None = None


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
                raise Invalid(N_("each subscriber must be an object"))
            email = check_email(raw_email)
            name = item.get("name") or ""
            attributes = item.get("attributes") or {}
            if not isinstance(name, str):
                raise Invalid(N_("name must be text of at most %(max)s characters",
                                 max=text_limits.SUBSCRIBER_NAME), fields={"name": N_(
                                     "must be a string")})
            text_limits.check("name", name, text_limits.SUBSCRIBER_NAME)
            if not isinstance(attributes, dict):
                raise Invalid(N_("attributes must be an object"),
                              fields={"attributes": N_("must be an object")})
            text_limits.check_attributes(attributes)
            tracking = item.get("tracking")
            if tracking is not None and not isinstance(tracking, bool):
                raise Invalid(N_("tracking must be true or false"),
                              fields={"tracking": N_("must be true or false")})
        except Invalid as exc:
            error: dict[str, Any] = {"index": index, "email": raw_email
                                     if isinstance(raw_email, str) else None,
                                     "error": exc.message}
            if exc.fields:
                error["field"] = next(iter(exc.fields))
            errors.append(error)
            continue
        if email.lower() in seen:
            errors.append({"index": index, "email": email, "error": "duplicate address"})
            continue
        seen.add(email.lower())
        valid.append((index, SubscriberInput(email, name.strip(), attributes, tracking)))
    return valid, errors


# Upsert by lower(email) and add to the list, set-based: one statement for any batch size.
# Whoever left the list (list_unsubscribes) is not added back: only their own confirmed
# consent does that (webapp.domain.subscriptions.confirm).
_UPSERT = sa.text("""
WITH input AS (
    SELECT * FROM unnest(CAST(:emails AS text[]), CAST(:names AS text[]),
                         CAST(:attrs AS jsonb[]), CAST(:tracking AS boolean[]))
           AS i(email, name, attributes, tracking)
), up AS (
    INSERT INTO subscribers AS s (email, name, attributes, tracking)
    SELECT email, name, attributes, coalesce(tracking, true) FROM input
    ON CONFLICT (lower(email)) DO UPDATE
       SET name = CASE WHEN EXCLUDED.name <> '' THEN EXCLUDED.name ELSE s.name END,
           attributes = s.attributes || EXCLUDED.attributes
    RETURNING id, (xmax = 0) AS inserted
), m AS (
    INSERT INTO memberships (list_id, subscriber_id) SELECT :list_id, id FROM up
     WHERE NOT EXISTS (SELECT 1 FROM list_unsubscribes u
                        WHERE u.list_id = :list_id AND u.subscriber_id = up.id)
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
    added, updated = upsert_subscribers(conn, list_id, [s for _, s in valid])
    return {"added": added, "updated": updated, "errors": errors}


def upsert_subscribers(conn: Connection, list_id: int,
                       batch: list[SubscriberInput]) -> tuple[int, int]:
    """Insert or update ``batch`` (validated, one entry per address) and put them on the
    list, in one statement. Returns (added, updated)."""
    if not batch:
        return 0, 0
    row = conn.execute(_UPSERT, {
        "list_id": list_id, "emails": [s.email for s in batch],
        "names": [s.name for s in batch],
        "attrs": [json.dumps(s.attributes) for s in batch],
        "tracking": [s.tracking for s in batch]}).one()
    given = [s for s in batch if s.tracking is not None]
    if given:  # an existing subscriber's consent changes only when it is given
        conn.execute(sa.text("""
            UPDATE subscribers s SET tracking = i.tracking
              FROM unnest(CAST(:emails AS text[]), CAST(:tracking AS boolean[]))
                   AS i(email, tracking)
             WHERE lower(s.email) = lower(i.email) AND s.tracking <> i.tracking"""),
            {"emails": [s.email for s in given], "tracking": [s.tracking for s in given]})
    return int(row.added), int(row.updated)


def would_upsert(conn: Connection, batch: list[SubscriberInput]) -> tuple[int, int]:
    """What :func:`upsert_subscribers` would answer for ``batch`` (validated, one entry per
    address), read only: (added, updated), where an address already stored is an update and
    any other an addition. One indexed look-up (``lower(email)``) per batch; it writes
    nothing, so a dry run leaves no dead rows in ``subscribers`` or ``memberships``."""
    if not batch:
        return 0, 0
    existing = int(conn.execute(sa.text("""
        SELECT count(*) FROM subscribers
         WHERE lower(email) = ANY (CAST(:emails AS text[]))"""),
        {"emails": [s.email.lower() for s in batch]}).scalar_one())
    return len(batch) - existing, existing


# --- one subscriber ----------------------------------------------------------------------

SUBSCRIBER_STATUSES = ("active", "unsubscribed", "blocklisted")
PAGE_SIZE = 50


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def subscriber_page(conn: Connection, list_id: int, *, after: int | None = None,
                    before: int | None = None, query: str = "",
                    limit: int = PAGE_SIZE) -> dict[str, Any]:
    """One page of the list's subscribers in id order, by keyset (``after``/``before`` an
    id), never OFFSET: any page costs the same at a million subscribers. ``query`` matches
    any part of the address or name (trigram index). Returns rows and the cursors of the
    neighbouring pages (None where there is none)."""
    backwards = before is not None and after is None
    cursor = before if backwards else after
    # Only the conditions in use are in the statement: an `:x IS NULL OR …` would keep the
    # planner from turning the cursor into an index range (a deep page would scan).
    conditions = ["m.list_id = :list_id"]
    if cursor is not None:
        conditions.append(f"m.subscriber_id {'<' if backwards else '>'} :cursor")
    order = f"m.subscriber_id {'DESC' if backwards else 'ASC'}"
    if query.strip():
        conditions.append("lower(s.email || ' ' || s.name) LIKE :pattern")
        source = "memberships m"
    else:
        # Without a search, take the page from the membership key first, then look up its
        # 51 subscribers: a plan that merge-joins all subscribers up to the cursor (what a
        # generic plan may pick for a deep page) cannot happen.
        source = (f"(SELECT * FROM memberships m WHERE {' AND '.join(conditions)} "
                  f"ORDER BY {order} LIMIT :limit) m")
    rows = [dict(r) for r in conn.execute(sa.text(f"""
        SELECT s.id, s.email, s.name, s.status, s.attributes, m.created_at AS added_at
          FROM {source} JOIN subscribers s ON s.id = m.subscriber_id
         WHERE {' AND '.join(conditions)}
         ORDER BY {order} LIMIT :limit"""),
        {"list_id": list_id, "cursor": cursor, "limit": limit + 1,
         "pattern": f"%{_escape_like(query.strip().lower())}%"}).mappings()]
    more = len(rows) > limit
    rows = rows[:limit]
    if backwards:
        rows.reverse()
    first, last = (rows[0]["id"], rows[-1]["id"]) if rows else (None, None)
    has_next = more if not backwards else before is not None
    has_prev = (more if backwards else after is not None) and bool(rows)
    return {"rows": rows, "next_after": last if has_next and rows else None,
            "prev_before": first if has_prev else None}


def get_member(conn: Connection, list_id: int, subscriber_id: int) -> dict[str, Any]:
    row = conn.execute(sa.text("""
        SELECT s.id, s.email, s.name, s.status, s.attributes, s.created_at,
               m.created_at AS added_at
          FROM memberships m JOIN subscribers s ON s.id = m.subscriber_id
         WHERE m.list_id = :l AND m.subscriber_id = :s"""),
        {"l": list_id, "s": subscriber_id}).mappings().first()
    if row is None:
        raise NotFound(N_("subscriber %(subscriber)s is not on list %(list)s",
                          subscriber=str(subscriber_id), list=str(list_id)))
    return dict(row)


def parse_attributes(text: str) -> dict[str, str]:
    """``key: value`` lines (or ``key=value``) into attributes; blank lines ignored."""
    attributes: dict[str, str] = {}
    for number, line in enumerate((text or "").splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition(":") if ":" in line else line.partition("=")
        if not sep or not key.strip():
            raise Invalid(N_("attributes line %(line)s must look like “key: value”",
                             line=str(number)),
                          fields={"attributes": N_("line %(line)s: expected key: value",
                                                   line=str(number))})
        attributes[key.strip()] = value.strip()
    return attributes


def add_member(conn: Connection, list_id: int, email: str, name: str = "",
               attributes: dict[str, Any] | None = None, *,
               actor: str = "system") -> dict[str, Any]:
    """Add one subscriber (or update the existing one with that address) to the list."""
    result = add_subscribers(conn, list_id, [{"email": email, "name": name,
                                              "attributes": attributes or {}}])
    if result["errors"]:
        message = result["errors"][0]["error"]
        raise Invalid(message, fields={result["errors"][0].get("field", "email"): message})
    row = conn.execute(sa.text("SELECT id FROM subscribers WHERE lower(email) = lower(:e)"),
                       {"e": check_email(email)}).one()
    audit.record(conn, actor, "subscriber.add", f"list:{list_id}", subscriber=row.id,
                 created=bool(result["added"]))
    return get_member(conn, list_id, row.id)


def update_member(conn: Connection, list_id: int, subscriber_id: int, *, email: str,
                  name: str, attributes: dict[str, Any], status: str,
                  actor: str = "system") -> dict[str, Any]:
    """Change one subscriber's address, name, attributes or status. The address stays
    unique however it is cased."""
    get_member(conn, list_id, subscriber_id)
    address = check_email(email)
    if status not in SUBSCRIBER_STATUSES:
        raise Invalid(N_("status must be one of %(choices)s",
                         choices=", ".join(SUBSCRIBER_STATUSES)),
                      fields={"status": N_("unknown status")})
    text_limits.check("name", name, text_limits.SUBSCRIBER_NAME)
    text_limits.check_attributes(attributes)
    taken = conn.execute(sa.text("SELECT id FROM subscribers WHERE lower(email) = lower(:e) "
                                 "AND id <> :id"), {"e": address, "id": subscriber_id}).first()
    if taken:
        raise Conflict(N_("another subscriber already has the address %(email)s",
                          email=address), fields={"email": N_("already taken")})
    conn.execute(sa.text("""
        UPDATE subscribers SET email = :e, name = :n, attributes = CAST(:a AS jsonb),
               status = :st WHERE id = :id"""),
        {"e": address, "n": (name or "").strip(), "a": json.dumps(attributes), "st": status,
         "id": subscriber_id})
    audit.record(conn, actor, "subscriber.update", f"subscriber:{subscriber_id}",
                 list=list_id, status=status)
    return get_member(conn, list_id, subscriber_id)


def remove_member(conn: Connection, list_id: int, subscriber_id: int, *,
                  actor: str = "system") -> None:
    """Take the subscriber off this list (they stay on other lists and in past sends)."""
    member = get_member(conn, list_id, subscriber_id)
    conn.execute(sa.text("DELETE FROM memberships WHERE list_id = :l AND subscriber_id = :s"),
                 {"l": list_id, "s": subscriber_id})
    audit.record(conn, actor, "subscriber.remove", f"list:{list_id}",
                 subscriber=subscriber_id, email=member["email"])


# --- export ------------------------------------------------------------------------------

EXPORT_CHUNK = 5000
# A double opt-in's consent (webapp.domain.subscriptions): through what, asked when and from
# which IP, confirmed when and from which IP.
CONSENT_COLUMNS = ("consent_form", "consent_at", "consent_ip", "confirmed_at",
                   "confirmed_ip")


def _attribute_cell(value: Any) -> str | None:
    """An attribute as a CSV cell: text as it is, anything else as JSON (``true``,
    ``[1, 2]``, ``{"x": 1}``), never Python's spelling of it (``True``, ``{'x': 1}``)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def export_csv(conn: Connection, list_id: int) -> Iterator[str]:
    """The list as CSV text, yielded a chunk at a time (keyset over the membership key), so
    a million subscribers are never held in memory. Columns: email, name, status, added_at,
    the consent of a double opt-in (:data:`CONSENT_COLUMNS`, empty for addresses added
    otherwise), then every attribute key found on the list; the file imports back as it is
    (the extra columns as attributes, unless mapped to skip). Every cell,
    the header's attribute keys included, is neutralised against spreadsheet formulas."""
    get_list(conn, list_id)
    keys = sorted(conn.execute(sa.text("""
        SELECT DISTINCT jsonb_object_keys(s.attributes) FROM memberships m
          JOIN subscribers s ON s.id = m.subscriber_id WHERE m.list_id = :l"""),
        {"l": list_id}).scalars())
    writer = SafeWriter()
    writer.row(["email", "name", "status", "added_at", *CONSENT_COLUMNS, *keys])
    after = 0
    while True:
        rows = conn.execute(sa.text("""
            SELECT m.subscriber_id, s.email, s.name, s.status, m.created_at, s.attributes,
                   c.source, c.requested_at, c.remote_addr, c.confirmed_at, c.confirmed_addr
              FROM memberships m JOIN subscribers s ON s.id = m.subscriber_id
              LEFT JOIN LATERAL (
                  SELECT r.source, r.requested_at, r.remote_addr, r.confirmed_at,
                         r.confirmed_addr
                    FROM subscription_requests r
                   WHERE r.list_id = m.list_id AND lower(r.email) = lower(s.email)
                     AND r.confirmed_at IS NOT NULL
                     AND r.confirmed_addr IS DISTINCT FROM 'already on the list'
                   ORDER BY r.confirmed_at DESC LIMIT 1) c ON true
             WHERE m.list_id = :l AND m.subscriber_id > :after
             ORDER BY m.subscriber_id LIMIT :n"""),
            {"l": list_id, "after": after, "n": EXPORT_CHUNK}).all()
        for r in rows:
            writer.row([r.email, r.name, r.status, r.created_at.isoformat(),
                        r.source and f"{r.source} (list {list_id})",
                        r.requested_at and r.requested_at.isoformat(), r.remote_addr,
                        r.confirmed_at and r.confirmed_at.isoformat(), r.confirmed_addr,
                        *(_attribute_cell(r.attributes.get(k)) for k in keys)])
        yield writer.take()
        if len(rows) < EXPORT_CHUNK:
            return
        after = rows[-1].subscriber_id
