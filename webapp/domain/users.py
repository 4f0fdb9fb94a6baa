"""Users, roles, passwords (argon2) and API tokens (stored hashed)."""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

import sqlalchemy as sa
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy.engine import Connection

from webapp import access
from webapp.domain import audit
from webapp.domain.errors import Conflict, Invalid, NotFound
from webapp.domain.lists import check_email
from webapp.models import ROLES
from workers.core import pg
from workers.core.i18n import N_

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
        raise Invalid(N_("role must be one of %(choices)s", choices=", ".join(ROLES)),
                      fields={"role": N_("unknown role")})
    return role


def create_user(conn: Connection, email: str, password: str, role: str, *,
                actor: str = "system") -> dict[str, Any]:
    email = check_email(email)
    check_role(role)
    if len(password) < MIN_PASSWORD:
        raise Invalid(N_("password must be at least %(min)s characters", min=MIN_PASSWORD),
                      fields={"password": N_("too short")})
    exists = conn.execute(sa.text("SELECT 1 FROM users WHERE lower(email) = lower(:e)"),
                          {"e": email}).first()
    if exists:
        raise Conflict(N_("a user with email %(email)s already exists", email=email),
                       fields={"email": N_("taken")})
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
        raise NotFound(N_("user %(id)s does not exist", id=str(user_id)))
    return dict(row)


def find_user(conn: Connection, email: str) -> dict[str, Any] | None:
    row = conn.execute(sa.text("SELECT * FROM users WHERE lower(email) = lower(:e)"),
                       {"e": email}).mappings().first()
    return dict(row) if row else None


def _token_hash(token: str) -> str:
    # Tokens are 256-bit random values: a fast hash is enough (nothing to brute-force).
    return hashlib.sha256(token.encode()).hexdigest()


def check_scopes(role: str, scopes: Any) -> list[str]:
    """``scopes`` in their canonical order, refused when empty, unknown or wider than what
    ``role`` may hold (a token is never wider than its owner's role)."""
    chosen = set(scopes)
    if not chosen:
        raise Invalid(N_("choose at least one scope for the token"),
                      fields={"scopes": N_("required")})
    unknown = chosen - set(access.SCOPES)
    if unknown:
        raise Invalid(N_("unknown scope %(scope)s (choose among %(choices)s)",
                         scope=", ".join(sorted(unknown)), choices=", ".join(access.SCOPES)),
                      fields={"scopes": N_("unknown")})
    wider = chosen - access.scopes_for_role(role)
    if wider:
        raise Invalid(N_("a %(role)s may not hold the scope %(scope)s: a token is never "
                         "wider than its owner's role", role=role,
                         scope=", ".join(sorted(wider))),
                      fields={"scopes": N_("wider than the role")})
    return [s for s in access.SCOPES if s in chosen]


def create_token(conn: Connection, user_id: int, name: str = "", *,
                 actor: str = "system", expires_in_days: int | None = None,
                 scopes: Any = None) -> str:
    """A new API token for the user; returned once, only its hash is stored. With
    ``expires_in_days`` it answers 401 from then on. ``scopes`` (default: every scope the
    owner's role may hold) limit what it may call, see :mod:`webapp.access`."""
    user = get_user(conn, user_id)
    if expires_in_days is not None and not 1 <= expires_in_days <= 3650:
        raise Invalid(N_("a token expires after 1 to 3650 days (or never)"),
                      fields={"expires": N_("out of range")})
    held = check_scopes(user["role"], access.scopes_for_role(user["role"])
                        if scopes is None else scopes)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    conn.execute(sa.text("""
        INSERT INTO api_tokens (user_id, name, prefix, token_hash, expires_at, scopes)
        VALUES (:u, :n, :p, :h, CASE WHEN CAST(:days AS int) IS NULL THEN NULL
                                     ELSE now() + make_interval(days => :days) END,
                CAST(:s AS text[]))"""),
        {"u": user_id, "n": name, "p": token[:10], "h": _token_hash(token),
         "days": expires_in_days, "s": held})
    audit.record(conn, actor, "token.create", f"user:{user_id}", email=user["email"],
                 name=name, expires_in_days=expires_in_days, scopes=held)
    return token


# The token's user, and its use noted at most once a minute (or when the address moves):
# sixteen clients sharing one token would otherwise queue on its row's lock with every
# request (docs/performance.md).
# Run on the driver (every API request pays for it): workers.core.pg.driver_rows.
_USER_FOR_TOKEN = ("""
WITH t AS (
    SELECT t.id AS token_id, t.last_used_at, t.last_used_addr, t.scopes, t.expires_at,
           u.id, u.email, u.role
      FROM api_tokens t JOIN users u ON u.id = t.user_id
     WHERE t.token_hash = %(h)s AND t.revoked_at IS NULL AND u.active
       AND (t.expires_at IS NULL OR t.expires_at > now())
), used AS (
    UPDATE api_tokens SET last_used_at = now(), last_used_addr = %(a)s
     WHERE id IN (SELECT token_id FROM t WHERE last_used_at IS NULL
                                         OR last_used_at < now() - interval '1 minute'
                                         OR last_used_addr IS DISTINCT FROM %(a)s)
)
SELECT id, email, role, token_id, scopes, extract(epoch FROM expires_at - now()) AS expires_in
  FROM t""")

# How long a process answers a token it found live from memory (docs/design.md
# §23): a burst from one client then costs one check a second, not one per request.
# A token revoked, a user disabled or a role changed is refused by every process within
# this time, by the process that made the change at once (:func:`forget_tokens`); a
# token's own expiry is kept to the instant.
TOKEN_MEMORY_SECONDS = 1.0
_MEMORY_LIMIT = 1024  # remembered (token, address) pairs before the expired are swept
_remembered: dict[tuple[str, str | None], tuple[float, dict[str, Any]]] = {}


def user_for_token(conn: Connection, token: str,
                   remote_addr: str | None = None) -> dict[str, Any] | None:
    """The active user a live token belongs to, with the token's ``scopes`` (and note its
    use from ``remote_addr``), or None. A token found live is answered from memory for
    :data:`TOKEN_MEMORY_SECONDS` (never past its expiry); a refused one is checked anew
    every time."""
    key = (_token_hash(token), remote_addr)
    now = time.monotonic()
    hit = _remembered.get(key)
    if hit is not None and hit[0] > now:
        return dict(hit[1])
    rows = pg.driver_rows(conn, _USER_FOR_TOKEN, {"h": key[0], "a": remote_addr})
    if not rows:
        _remembered.pop(key, None)
        return None
    user = rows[0]
    expires_in = user.pop("expires_in")
    until = now + TOKEN_MEMORY_SECONDS
    if expires_in is not None:
        until = min(until, now + float(expires_in))
    if len(_remembered) >= _MEMORY_LIMIT:
        for stale in [k for k, (end, _) in list(_remembered.items()) if end <= now]:
            _remembered.pop(stale, None)
    if len(_remembered) < _MEMORY_LIMIT:
        _remembered[key] = (until, user)
    return dict(user)


def forget_tokens(conn: Connection | None = None) -> None:
    """Check every token against the database again: called by whatever in this process
    revokes a token, disables a user or changes a role, with its connection (then again
    when its transaction commits: a request in between would remember the old answer)."""
    _remembered.clear()
    if conn is not None:
        sa.event.listen(conn, "commit", lambda _conn: _remembered.clear(), once=True)


def revoke_token(conn: Connection, token_id: int, *, actor: str = "system") -> None:
    forget_tokens(conn)
    n = conn.execute(sa.text("UPDATE api_tokens SET revoked_at = now() WHERE id = :id "
                             "AND revoked_at IS NULL"), {"id": token_id}).rowcount
    if not n:
        raise NotFound(N_("token %(id)s does not exist or is already revoked",
                          id=str(token_id)))
    audit.record(conn, actor, "token.revoke", f"token:{token_id}")


LOGIN_WINDOW_MINUTES = 15
MAX_FAILED_PER_ACCOUNT = 5
MAX_FAILED_PER_ADDRESS = 20


class LoginRefused(Exception):
    """Wrong credentials, or too many failures: the message is safe to show."""


# Advisory lock namespaces (pg_advisory_xact_lock(int, int)): one failed-attempt counter
# per account and one per client address, each read and bumped by one request at a time.
_ACCOUNT_LOCK, _ADDRESS_LOCK = 0x5D10, 0x5D11


def reserve_attempt(conn: Connection, email: str, remote_addr: str) -> int:
    """Count a password check against the limits *before* it is made: under a lock per
    account and per address, refuse when either is at its limit, else record the attempt
    as failed and return its id (:func:`attempt_succeeded` turns it around). So N
    simultaneous wrong passwords are N failures, and at most the limit of them is checked.
    A refused attempt is recorded too (it is a failure to get in); the caller commits
    ``conn`` even when this raises :class:`LoginRefused`, and keeps the transaction short:
    the locks are held until it ends."""
    # Always the account's lock before the address's: no two requests wait on each other.
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:ns, hashtext(lower(:e)))"),
                 {"ns": _ACCOUNT_LOCK, "e": email[:320]})
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:ns, hashtext(:a))"),
                 {"ns": _ADDRESS_LOCK, "a": remote_addr})
    counts = conn.execute(sa.text("""
        SELECT count(*) FILTER (WHERE lower(email) = lower(:e)) AS per_account,
               count(*) FILTER (WHERE remote_addr = :a) AS per_address
          FROM login_attempts
         WHERE NOT succeeded AND at > now() - make_interval(mins => :w)
           AND (lower(email) = lower(:e) OR remote_addr = :a)"""),
        {"e": email[:320], "a": remote_addr, "w": LOGIN_WINDOW_MINUTES}).one()
    attempt_id = int(conn.execute(sa.text(
        "INSERT INTO login_attempts (email, remote_addr, succeeded) VALUES (:e, :a, false) "
        "RETURNING id"), {"e": email[:320], "a": remote_addr}).scalar_one())
    if counts.per_account >= MAX_FAILED_PER_ACCOUNT or counts.per_address >= \
            MAX_FAILED_PER_ADDRESS:
        audit.record(conn, "anonymous", "user.login_failed", email.lower()[:320],
                     remote_addr=remote_addr, reason="too many failed attempts")
        raise LoginRefused(N_("Too many failed attempts. Try again in %(minutes)s minutes.",
                              minutes=LOGIN_WINDOW_MINUTES))
    return attempt_id


def attempt_succeeded(conn: Connection, attempt_id: int) -> None:
    """The reserved attempt was the right password: it no longer counts as a failure."""
    conn.execute(sa.text("UPDATE login_attempts SET succeeded = true WHERE id = :id"),
                 {"id": attempt_id})


def authenticate(conn: Connection, attempt_id: int, email: str, password: str,
                 remote_addr: str) -> dict[str, Any]:
    """The user for these credentials, or :class:`LoginRefused`. ``attempt_id`` is this
    attempt as :func:`reserve_attempt` counted it (in a transaction committed before)."""
    user = find_user(conn, email)
    # The hash is checked before `active`, so a disabled account answers in the same time.
    ok = user is not None and verify_password(user["password_hash"], password) and \
        bool(user["active"])
    if user is None:
        verify_password(_DUMMY_HASH, password)  # same time whether or not the user exists
    if not ok or user is None:
        # Logged with the address typed (an unknown one too: a guessing attempt is news).
        audit.record(conn, "anonymous", "user.login_failed", email.lower()[:320],
                     remote_addr=remote_addr, reason="wrong email or password"
                     if user is None or user["active"] else "account disabled")
        raise LoginRefused(N_("Wrong email or password."))
    attempt_succeeded(conn, attempt_id)
    conn.execute(sa.text("UPDATE users SET last_login_at = now() WHERE id = :id"),
                 {"id": user["id"]})
    audit.record(conn, user["email"], "user.login", f"user:{user['id']}",
                 remote_addr=remote_addr)
    return user


_DUMMY_HASH = hash_password("not a real password, only for timing")


def set_password(conn: Connection, user_id: int, password: str, *,
                 actor: str = "system") -> None:
    """Change the password and end every existing session of the user."""
    if len(password) < MIN_PASSWORD:
        raise Invalid(N_("password must be at least %(min)s characters", min=MIN_PASSWORD),
                      fields={"password": N_("too short")})
    n = conn.execute(sa.text("UPDATE users SET password_hash = :h, "
                             "session_version = session_version + 1 WHERE id = :id"),
                     {"h": hash_password(password), "id": user_id}).rowcount
    if not n:
        raise NotFound(N_("user %(id)s does not exist", id=str(user_id)))
    end_sessions(conn, user_id)
    audit.record(conn, actor, "user.password", f"user:{user_id}")


# --- sessions (server-side: a cookie is only as good as its row) ------------------------

SESSION_DAYS = 31  # a session ends this long after its login at the latest


def _session_key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


USER_AGENT_MAX = 300
HANDLE = 16  # hex characters of a session's key that name it on the pages


def start_session(conn: Connection, user_id: int, *, second_factor: bool = False,
                  user_agent: str = "", address: str = "") -> str:
    """A new session for the user; returns the random token the cookie carries (only its
    SHA-256 is stored). ``second_factor``: the login passed it (now). The browser's
    User-Agent and address are kept for "Your sessions"."""
    token = secrets.token_urlsafe(32)
    conn.execute(sa.text("""
        INSERT INTO web_sessions (id, user_id, second_factor_at, user_agent, address)
        VALUES (:id, :u, CASE WHEN :f THEN now() END, :ua, :addr)"""),
                 {"id": _session_key(token), "u": user_id, "f": second_factor,
                  "ua": user_agent[:USER_AGENT_MAX], "addr": address[:100]})
    return token


def session_handle(token: str) -> str:
    """The name a session goes by on the pages (never the token, nor its whole key)."""
    return _session_key(token)[:HANDLE]


def browser_of(user_agent: str) -> str:
    """A person's reading of a User-Agent: the browser and the system ("Firefox on
    Linux"); the raw text cut short when neither is known."""
    ua = user_agent
    browser = next((name for token, name in (
        ("Edg/", "Edge"), ("OPR/", "Opera"), ("Firefox/", "Firefox"),
        ("Chromium/", "Chromium"), ("Chrome/", "Chrome"), ("Safari/", "Safari"),
        ("curl/", "curl"), ("python-requests", "Python requests")) if token in ua), "")
    system = next((name for token, name in (
        ("Android", "Android"), ("iPhone", "iOS"), ("iPad", "iPadOS"), ("Windows", "Windows"),
        ("Mac OS X", "macOS"), ("CrOS", "ChromeOS"), ("Linux", "Linux")) if token in ua), "")
    if browser and system:
        return f"{browser} · {system}"
    return browser or system or ua[:60]


def list_sessions(conn: Connection, user_id: int,
                  current_token: str | None = None) -> list[dict[str, Any]]:
    """The user's live sessions, most recently seen first: the browser, the address, when
    it started and was last seen, a handle to end it, and which one is ``current``."""
    current = _session_key(current_token) if current_token else ""
    rows = conn.execute(sa.text("""
        SELECT s.id, s.user_agent, s.address, s.created_at, s.last_seen_at
          FROM web_sessions s JOIN users u ON u.id = s.user_id
         WHERE s.user_id = :u AND u.active
           AND s.created_at > now() - make_interval(days => :days)
         ORDER BY s.id = :current DESC, s.last_seen_at DESC, s.created_at DESC"""),
        {"u": user_id, "days": SESSION_DAYS, "current": current}).mappings()
    return [{"handle": str(r["id"])[:HANDLE], "browser": browser_of(r["user_agent"]),
             "user_agent": r["user_agent"], "address": r["address"],
             "created_at": r["created_at"], "last_seen_at": r["last_seen_at"],
             "current": r["id"] == current} for r in rows]


def end_session_by_handle(conn: Connection, user_id: int, handle: str, actor: str) -> bool:
    """End the user's session named by ``handle`` (from :func:`list_sessions`)."""
    if len(handle) != HANDLE or not all(c in "0123456789abcdef" for c in handle):
        return False
    ended = conn.execute(sa.text(
        "DELETE FROM web_sessions WHERE user_id = :u AND left(id, :n) = :h"),
        {"u": user_id, "n": HANDLE, "h": handle}).rowcount
    if ended:
        audit.record(conn, actor, "session.end", f"user:{user_id}", session=handle)
    return bool(ended)


def end_other_sessions(conn: Connection, user_id: int, current_token: str | None,
                       actor: str) -> int:
    """End every session of the user but the one ``current_token`` names (None: all of
    them); returns how many ended."""
    ended = conn.execute(sa.text(
        "DELETE FROM web_sessions WHERE user_id = :u AND id <> :current"),
        {"u": user_id, "current": _session_key(current_token) if current_token else ""}
    ).rowcount
    if ended:
        audit.record(conn, actor, "session.end_others" if current_token else "session.end_all",
                     f"user:{user_id}", sessions=ended)
    return int(ended)


def second_factor_passed(conn: Connection, token: str) -> None:
    """The session just passed the second factor again (step-up)."""
    conn.execute(sa.text("UPDATE web_sessions SET second_factor_at = now() WHERE id = :id"),
                 {"id": _session_key(token)})


def session_user(conn: Connection, user_id: int, version: int,
                 token: str) -> dict[str, Any] | None:
    """The active user a session cookie names, when its session row still exists, is
    theirs, is younger than SESSION_DAYS and the user's session version still matches;
    else None (the cookie is worthless)."""
    row = conn.execute(sa.text("""
        SELECT u.id, u.email, u.role, u.session_version, u.locale,
               u.totp_enabled_at IS NOT NULL AS has_second_factor, s.second_factor_at,
               EXISTS (SELECT 1 FROM second_factor_roles r WHERE r.role = u.role)
                   AS second_factor_required
          FROM web_sessions s JOIN users u ON u.id = s.user_id
         WHERE s.id = :id AND u.id = :u AND u.active AND u.session_version = :v
           AND s.created_at > now() - make_interval(days => :days)"""),
        {"id": _session_key(token), "u": user_id, "v": version, "days": SESSION_DAYS}
    ).mappings().first()
    return dict(row) if row else None


def seen(conn: Connection, token: str, address: str) -> None:
    """The session was used now from ``address``: kept at most once a minute (one cheap
    statement that usually changes nothing)."""
    conn.execute(sa.text("""
        UPDATE web_sessions SET last_seen_at = now(), address = :a
         WHERE id = :id AND last_seen_at < now() - interval '1 minute'"""),
        {"id": _session_key(token), "a": address[:100]})


def end_session(conn: Connection, token: str) -> None:
    """End one session (logout): every copy of its cookie stops working."""
    conn.execute(sa.text("DELETE FROM web_sessions WHERE id = :id"),
                 {"id": _session_key(token)})


def end_sessions(conn: Connection, user_id: int) -> int:
    """End every session of the user (password change, disable); returns how many."""
    return conn.execute(sa.text("DELETE FROM web_sessions WHERE user_id = :u"),
                        {"u": user_id}).rowcount


# --- administration (the Users & tokens page) -------------------------------------------

def list_users(conn: Connection) -> list[dict[str, Any]]:
    """Every user with the number of live tokens, admins first."""
    rows = conn.execute(sa.text("""
        SELECT u.id, u.email, u.role, u.active, u.created_at, u.last_login_at,
               u.totp_enabled_at,
               (SELECT count(*) FROM api_tokens t
                 WHERE t.user_id = u.id AND t.revoked_at IS NULL) AS live_tokens
          FROM users u ORDER BY u.active DESC, u.role, lower(u.email)"""))
    return [dict(r) for r in rows.mappings()]


def list_tokens(conn: Connection, *, include_revoked: bool = True) -> list[dict[str, Any]]:
    """Tokens (never their secret: only the first characters) with owner and last use."""
    rows = conn.execute(sa.text("""
        SELECT t.id, t.name, t.prefix, t.created_at, t.last_used_at, t.revoked_at,
               t.last_used_addr, t.scopes, t.expires_at, t.expires_at <= now() AS expired,
               u.id AS user_id, u.email, u.role, u.active AS user_active
          FROM api_tokens t JOIN users u ON u.id = t.user_id
         WHERE CAST(:all AS boolean) OR t.revoked_at IS NULL
         ORDER BY t.revoked_at IS NOT NULL, t.created_at DESC, t.id DESC"""),
        {"all": include_revoked})
    return [dict(r) for r in rows.mappings()]


def _keep_an_admin(conn: Connection, user_id: int) -> None:
    """Refuse a change that would leave no active admin (nobody could manage users)."""
    others = conn.execute(sa.text(
        "SELECT count(*) FROM users WHERE role = 'admin' AND active AND id <> :id"),
        {"id": user_id}).scalar()
    if not others:
        raise Conflict(N_("this is the last active admin; make another user admin first"),
                       fields={"user": N_("last admin")})


def _locked_user(conn: Connection, user_id: int) -> dict[str, Any]:
    row = conn.execute(sa.text("SELECT * FROM users WHERE id = :id FOR UPDATE"),
                       {"id": user_id}).mappings().first()
    if row is None:
        raise NotFound(N_("user %(id)s does not exist", id=str(user_id)))
    # Serialize admin-count checks: two admins demoting each other at once cannot both win.
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(8, 1)"))
    return dict(row)


def update_role(conn: Connection, user_id: int, role: str, *, actor: str) -> dict[str, Any]:
    """Give the user ``role`` (effective on their next request: sessions and tokens read
    the role from the database)."""
    check_role(role)
    user = _locked_user(conn, user_id)
    if user["role"] == role:
        return user
    if user["role"] == "admin" and user["active"]:
        _keep_an_admin(conn, user_id)
    forget_tokens(conn)
    conn.execute(sa.text("UPDATE users SET role = :r WHERE id = :id"),
                 {"r": role, "id": user_id})
    audit.record(conn, actor, "user.role", f"user:{user_id}", email=user["email"],
                 before=user["role"], after=role)
    return {**user, "role": role}


def set_active(conn: Connection, user_id: int, active: bool, *, actor: str) -> dict[str, Any]:
    """Enable or disable a user. Disabling bumps ``session_version``, so every session of
    theirs ends at its next request, and their tokens stop working (tokens need an active
    user)."""
    user = _locked_user(conn, user_id)
    if user["active"] == active:
        return user
    if not active and user["role"] == "admin":
        _keep_an_admin(conn, user_id)
    forget_tokens(conn)
    conn.execute(sa.text("""
        UPDATE users SET active = :a,
               session_version = session_version + CASE WHEN :a THEN 0 ELSE 1 END
         WHERE id = :id"""), {"a": active, "id": user_id})
    if not active:
        end_sessions(conn, user_id)
    audit.record(conn, actor, "user.enable" if active else "user.disable", f"user:{user_id}",
                 email=user["email"])
    return {**user, "active": active}


def set_locale(conn: Connection, user_id: int, locale: str | None, *, allowed: Any,
               actor: str) -> None:
    """The UI language the user reads (None: whatever their browser asks for)."""
    if locale is not None and locale not in allowed:
        raise Invalid(N_("language must be one of %(choices)s", choices=", ".join(allowed)),
                      fields={"locale": N_("unknown")})
    conn.execute(sa.text("UPDATE users SET locale = :l WHERE id = :id"),
                 {"l": locale, "id": user_id})
    audit.record(conn, actor, "user.language", f"user:{user_id}", locale=locale or "browser")
