"""Users, roles, passwords (argon2) and API tokens (stored hashed)."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import sqlalchemy as sa
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy.engine import Connection

from webapp.domain import audit
from webapp.domain.errors import Conflict, Invalid, NotFound
from webapp.domain.lists import check_email
from webapp.models import ROLES

_hasher = PasswordHasher()
TOKEN_PREFIX = "sd_"
MIN_PASSWORD = 10


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def check_role(role: str) -> str:
    if role not in ROLES:
        raise Invalid(f"role must be one of {', '.join(ROLES)}", fields={"role": "unknown role"})
    return role


def create_user(conn: Connection, email: str, password: str, role: str, *,
                actor: str = "system") -> dict[str, Any]:
    email = check_email(email)
    check_role(role)
    if len(password) < MIN_PASSWORD:
        raise Invalid(f"password must be at least {MIN_PASSWORD} characters",
                      fields={"password": "too short"})
    exists = conn.execute(sa.text("SELECT 1 FROM users WHERE lower(email) = lower(:e)"),
                          {"e": email}).first()
    if exists:
        raise Conflict(f"a user with email {email} already exists", fields={"email": "taken"})
    row = conn.execute(sa.text("""
        INSERT INTO users (email, password_hash, role) VALUES (:e, :h, :r)
        RETURNING id, email, role, active, created_at"""),
        {"e": email, "h": hash_password(password), "r": role}).mappings().one()
    audit.record(conn, actor, "user.create", f"user:{row['id']}", email=email, role=role)
    return dict(row)


def get_user(conn: Connection, user_id: int) -> dict[str, Any]:
    row = conn.execute(sa.text("SELECT * FROM users WHERE id = :id"), {"id": user_id}
                       ).mappings().first()
    if row is None:
        raise NotFound(f"user {user_id} does not exist")
    return dict(row)


def find_user(conn: Connection, email: str) -> dict[str, Any] | None:
    row = conn.execute(sa.text("SELECT * FROM users WHERE lower(email) = lower(:e)"),
                       {"e": email}).mappings().first()
    return dict(row) if row else None


def _token_hash(token: str) -> str:
    # Tokens are 256-bit random values: a fast hash is enough (nothing to brute-force).
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(conn: Connection, user_id: int, name: str = "", *,
                 actor: str = "system") -> str:
    """A new API token for the user; returned once, only its hash is stored."""
    user = get_user(conn, user_id)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    conn.execute(sa.text("""
        INSERT INTO api_tokens (user_id, name, prefix, token_hash)
        VALUES (:u, :n, :p, :h)"""),
        {"u": user_id, "n": name, "p": token[:10], "h": _token_hash(token)})
    audit.record(conn, actor, "token.create", f"user:{user_id}", email=user["email"],
                 name=name)
    return token


def user_for_token(conn: Connection, token: str) -> dict[str, Any] | None:
    """The active user a live token belongs to (and note its use), or None."""
    row = conn.execute(sa.text("""
        UPDATE api_tokens t SET last_used_at = now()
          FROM users u
         WHERE t.token_hash = :h AND t.revoked_at IS NULL AND u.id = t.user_id AND u.active
        RETURNING u.id, u.email, u.role, t.id AS token_id"""),
        {"h": _token_hash(token)}).mappings().first()
    return dict(row) if row else None


def revoke_token(conn: Connection, token_id: int, *, actor: str = "system") -> None:
    n = conn.execute(sa.text("UPDATE api_tokens SET revoked_at = now() WHERE id = :id "
                             "AND revoked_at IS NULL"), {"id": token_id}).rowcount
    if not n:
        raise NotFound(f"token {token_id} does not exist or is already revoked")
    audit.record(conn, actor, "token.revoke", f"token:{token_id}")


LOGIN_WINDOW_MINUTES = 15
MAX_FAILED_PER_ACCOUNT = 5
MAX_FAILED_PER_ADDRESS = 20


class LoginRefused(Exception):
    """Wrong credentials, or too many failures: the message is safe to show."""


def authenticate(conn: Connection, email: str, password: str,
                 remote_addr: str) -> dict[str, Any]:
    """The user for these credentials, or :class:`LoginRefused`. Failed attempts are
    limited per account and per client address over a sliding window."""
    counts = conn.execute(sa.text("""
        SELECT count(*) FILTER (WHERE lower(email) = lower(:e)) AS per_account,
               count(*) FILTER (WHERE remote_addr = :a) AS per_address
          FROM login_attempts
         WHERE NOT succeeded AND at > now() - make_interval(mins => :w)
           AND (lower(email) = lower(:e) OR remote_addr = :a)"""),
        {"e": email, "a": remote_addr, "w": LOGIN_WINDOW_MINUTES}).one()
    if counts.per_account >= MAX_FAILED_PER_ACCOUNT or counts.per_address >= \
            MAX_FAILED_PER_ADDRESS:
        raise LoginRefused(f"Too many failed attempts. Try again in {LOGIN_WINDOW_MINUTES} "
                           "minutes.")
    user = find_user(conn, email)
    ok = user is not None and user["active"] and verify_password(user["password_hash"],
                                                                 password)
    if user is None:
        verify_password(_DUMMY_HASH, password)  # same time whether or not the user exists
    conn.execute(sa.text("INSERT INTO login_attempts (email, remote_addr, succeeded) "
                         "VALUES (:e, :a, :s)"), {"e": email[:320], "a": remote_addr, "s": ok})
    if not ok or user is None:
        raise LoginRefused("Wrong email or password.")
    conn.execute(sa.text("UPDATE users SET last_login_at = now() WHERE id = :id"),
                 {"id": user["id"]})
    return user


_DUMMY_HASH = hash_password("not a real password, only for timing")


def set_password(conn: Connection, user_id: int, password: str, *,
                 actor: str = "system") -> None:
    """Change the password and end every existing session of the user."""
    if len(password) < MIN_PASSWORD:
        raise Invalid(f"password must be at least {MIN_PASSWORD} characters",
                      fields={"password": "too short"})
    n = conn.execute(sa.text("UPDATE users SET password_hash = :h, "
                             "session_version = session_version + 1 WHERE id = :id"),
                     {"h": hash_password(password), "id": user_id}).rowcount
    if not n:
        raise NotFound(f"user {user_id} does not exist")
    audit.record(conn, actor, "user.password", f"user:{user_id}")
