"""Signed, unguessable links the engine puts into messages (SPEC 3, P10).

The engine builds them when it composes a message; the web app reads them back when a
recipient follows one. Both sides share only the secret key.
"""

from __future__ import annotations

from itsdangerous import BadSignature, URLSafeSerializer

_UNSUBSCRIBE_SALT = "senddock-unsubscribe-v1"


def make_token(secret_key: str, subscriber_id: int, campaign_id: int | None) -> str:
    """A token naming the subscriber and campaign, signed with the secret key (HMAC)."""
    return URLSafeSerializer(secret_key, salt=_UNSUBSCRIBE_SALT).dumps(
        [subscriber_id, campaign_id])


def read_token(secret_key: str, token: str) -> tuple[int, int | None] | None:
    """(subscriber_id, campaign_id) for a genuine token; None for a forged or broken one."""
    try:
        value = URLSafeSerializer(secret_key, salt=_UNSUBSCRIBE_SALT).loads(token)
    except BadSignature:
        return None
    if (not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], int)
            or not (value[1] is None or isinstance(value[1], int))):
        return None
    return value[0], value[1]


def unsubscribe_url(base_url: str, secret_key: str, subscriber_id: int,
                    campaign_id: int | None) -> str:
    return f"{base_url}/u/{make_token(secret_key, subscriber_id, campaign_id)}"
