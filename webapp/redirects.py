"""The one check for where SendDock may send a browser back to (no open redirect, P10).

Every ``?next=``, ``?back=`` and hidden ``back`` field goes through :func:`local_path`
before it becomes a ``Location`` header or a link. Browsers are lenient in ways a naive
``startswith("/")`` misses: they drop tab, CR and LF anywhere in a URL
(``/\\t/evil.example`` becomes ``//evil.example``), read a backslash as a slash
(``/\\evil.example``), and treat ``//host`` as "same scheme, other host".
"""

from __future__ import annotations

from urllib.parse import urlsplit


def is_local_path(target: str | None) -> bool:
    """True only for a path on this site: it starts with one ``/`` followed by anything
    but ``/``, and holds no backslash, no control character (C0, DEL, C1) and no scheme
    or host however a browser might read it."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return False
    if any(ch == "\\" or ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in target):
        return False
    parts = urlsplit(target)
    return not parts.scheme and not parts.netloc


def local_path(target: str | None, default: str) -> str:
    """``target`` when :func:`is_local_path` accepts it, else ``default`` (a path the
    caller built with ``url_for``)."""
    return target if target is not None and is_local_path(target) else default
