"""Errors a user can cause. Views and the API turn them into clear answers (P9)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class DomainError(Exception):
    """Base: ``status`` is the HTTP status the API answers with; ``fields`` names the
    offending input fields."""

    status = 400

    def __init__(self, message: str, *, fields: Mapping[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.message = message  # a workers.core.i18n.Text when marked: pages show it translated
        self.fields = dict(fields or {})
        self.extra = extra


class NotFound(DomainError):
    status = 404


class Conflict(DomainError):
    status = 409


class Invalid(DomainError):
    status = 422


class TooLarge(DomainError):
    """A value within the request is over its size limit (the whole body: Flask's 413)."""

    status = 413


class TooMany(DomainError):
    """Cooldown or rate limit: ``retry_after`` seconds."""

    status = 429

    def __init__(self, message: str, *, retry_after: int, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.retry_after = retry_after


class Overloaded(DomainError):
    """The backlog limit is reached: new work is refused rather than growing forever."""

    status = 503

    def __init__(self, message: str, *, retry_after: int = 60, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.retry_after = retry_after
