"""Signed, unguessable links the engine puts into messages (docs/design.md §20, P10).

The engine builds them when it composes a message; the web app reads them back when a
recipient follows one. Both sides share only the secret key.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac

from itsdangerous import BadSignature, URLSafeSerializer

_UNSUBSCRIBE_SALT = "senddock-unsubscribe-v1"


def make_token(secret_key: str, subscriber_id: int, campaign_id: int | None) -> str:
    """A token naming the subscriber and campaign, signed with the secret key (HMAC)."""
    return _serializer(secret_key).dumps([subscriber_id, campaign_id])


@functools.lru_cache(maxsize=8)
def _serializer(secret_key: str) -> URLSafeSerializer:
    """One serializer per secret key (thread-safe: it keeps no state between calls)."""
    return URLSafeSerializer(secret_key, salt=_UNSUBSCRIBE_SALT)


def read_token(secret_key: str, token: str) -> tuple[int, int | None] | None:
    """(subscriber_id, campaign_id) for a genuine token; None for a forged or broken one."""
    try:
        value = _serializer(secret_key).loads(token)
    except BadSignature:
        return None
    if (not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], int)
            or not (value[1] is None or isinstance(value[1], int))):
        return None
    return value[0], value[1]


def unsubscribe_url(base_url: str, secret_key: str, subscriber_id: int,
                    campaign_id: int | None) -> str:
    return f"{base_url}/u/{make_token(secret_key, subscriber_id, campaign_id)}"


# --- VERP bounce addresses (docs/design.md §16 headers, docs/design.md §18) -----------------------
# The envelope sender of each message names its job, signed, so a bounce delivered to it (a
# DSN, or an ARF report quoting Original-Mail-From) finds the job without trusting anything
# else in the report: bounces+<token>@domain. The token is short (the local part of an
# address must stay under 64 octets) and case-insensitive (some MTAs lower-case addresses):
# base32 of the job id and a truncated HMAC.

_VERP_SALT = b"senddock-verp-v1"
_VERP_MAC_BYTES = 10


def _verp_mac(secret_key: str, job_id: int) -> bytes:
    return hmac.new(secret_key.encode() + _VERP_SALT, str(job_id).encode(),
                    hashlib.sha256).digest()[:_VERP_MAC_BYTES]


def make_bounce_token(secret_key: str, job_id: int) -> str:
    """A token naming ``job_id`` that only the holder of the secret key can make."""
    mac = base64.b32encode(_verp_mac(secret_key, job_id)).decode().rstrip("=").lower()
    return f"{job_id:x}.{mac}"


def read_bounce_token(secret_key: str, token: str) -> int | None:
    """The job id of a genuine token (any letter case); None for a forged or broken one."""
    head, _, mac = token.lower().partition(".")
    try:
        job_id = int(head, 16)
    except ValueError:
        return None
    expected = base64.b32encode(_verp_mac(secret_key, job_id)).decode().rstrip("=").lower()
    # Bytes, not str: the token is anyone's text, and compare_digest refuses non-ASCII str.
    return job_id if hmac.compare_digest(expected.encode(),
                                         mac.encode("utf-8", "surrogatepass")) else None


def bounce_address(bounce_address: str, secret_key: str, job_id: int) -> str:
    """``bounces@example.com`` → ``bounces+<token>@example.com`` for ``job_id``."""
    local, domain = bounce_address.rsplit("@", 1)
    return f"{local}+{make_bounce_token(secret_key, job_id)}@{domain}"


def job_from_bounce_address(secret_key: str, address: str,
                            bounce_address: str | None = None) -> int | None:
    """The job a VERP address names, if it is one of ours (and, when ``bounce_address`` is
    given, on its local part and domain); None otherwise."""
    address = address.strip().strip("<>")
    if "@" not in address or "+" not in address.split("@", 1)[0]:
        return None
    local, domain = address.rsplit("@", 1)
    base, _, token = local.partition("+")
    if bounce_address is not None:
        want_local, want_domain = bounce_address.lower().rsplit("@", 1)
        if (base.lower(), domain.lower()) != (want_local, want_domain):
            return None
    return read_bounce_token(secret_key, token)
