"""Transactional kinds as the engine sees them (docs/design.md §21): the class → priority
vocabulary, what a kind's template sees, and a per-process catalog of compiled kinds.

A kind is a row of ``kinds`` (name, class, templates, retry schedule, resend cooldown,
dedupe window). Its class fixes the priority its jobs get at enqueue, and the claim serves
priorities in order, so classes are served critical → lifecycle → campaigns (P7).

Guarantees kept here:

- every job's priority comes from :data:`CLASS_PRIORITY` (one place; a batch's items
  ``BULK_STEP`` behind their class's, still ahead of the next class), so the claim's
  ``ORDER BY priority`` is the class order;
- :func:`message_context` is the only place that decides what a kind's template sees, used
  by the worker that sends and by the preview, so what an admin previews is what is sent;
- :class:`KindCatalog` never renders a job with a kind older than the version the job was
  enqueued with (jobs carry ``kind_version``), and otherwise refreshes within ``max_age``.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from workers.building.message import CampaignTemplate, compile_campaign
from workers.core.states import (
    BOUNCED,
    CANCELLED,
    CLASS_PRIORITY,
    FAILED,
    KIND_NAME,
    SENT,
    SKIPPED,
)

CLASSES = ("critical", "lifecycle")
BUILTIN = "verification"
# Engine kinds that are not transactional kinds (campaign mail, test sends, sequence steps).
RESERVED = ("broadcast", "test", "sequence")
# A sequence step's mail retries on the built-in kind's schedule (lifecycle mail).
SEQUENCE = "sequence"
NAME_PATTERN = KIND_NAME
# Seconds from "due" (enqueue, or send_at when scheduled) to sent: the histogram's upper
# bounds. The migration's trigger buckets by these same bounds (tested).
TIME_TO_SENT_BOUNDS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
                       3600.0, 21600.0, 86400.0)
# What a job's terminal status or a retry is counted as in senddock_messages_total.
OUTCOMES = (SENT, FAILED, BOUNCED, SKIPPED, CANCELLED)


def class_of(kind: str, priority: int) -> str:
    """The class label of a job: campaign mail, test sends, or its kind's class."""
    if kind == "broadcast":
        return "campaign"
    if kind == "test":
        return "test"
    if kind == SEQUENCE:
        return "lifecycle"
    return "critical" if priority < CLASS_PRIORITY["lifecycle"] else "lifecycle"


@dataclass(frozen=True)
class KindSpec:
    """One row of ``kinds``. ``retry_schedule``/``resend_cooldown`` None means "the
    setting's default" (only the built-in ``verification`` uses that)."""

    name: str
    kind_class: str
    subject: str
    text_body: str | None
    html_body: str | None
    retry_schedule: tuple[int, ...] | None
    resend_cooldown: int | None
    dedupe_window: int
    active: bool
    version: int
    description: str = ""
    builtin: bool = False

    @property
    def priority(self) -> int:
        return CLASS_PRIORITY[self.kind_class]


_KIND_COLUMNS = """
name, class AS kind_class, subject, text_body, html_body, retry_schedule, resend_cooldown,
dedupe_window, active, version, description, builtin
"""


def _spec(row: Any) -> KindSpec:
    values = dict(row)
    schedule = values.pop("retry_schedule")
    return KindSpec(retry_schedule=None if schedule is None else tuple(schedule), **values)


def load_kind(conn: Connection, name: str) -> KindSpec | None:
    """The kind called ``name`` (active or not), or None."""
    row = conn.execute(sa.text(f"SELECT {_KIND_COLUMNS} FROM kinds WHERE name = :name"),
                       {"name": name}).mappings().first()
    return _spec(row) if row else None


def all_kinds(conn: Connection) -> list[KindSpec]:
    """Every kind, the built-in first, then by name."""
    rows = conn.execute(sa.text(f"SELECT {_KIND_COLUMNS} FROM kinds "
                                "ORDER BY builtin DESC, name")).mappings()
    return [_spec(r) for r in rows]


def job_kinds(conn: Connection) -> list[str]:
    """Every kind a job can have: the engine's own and the admins' (for filters)."""
    names = list(conn.execute(sa.text("SELECT name FROM kinds ORDER BY builtin DESC, name"))
                 .scalars())
    return [*names, *(k for k in ("broadcast", "test") if k not in names)]


def is_kind_name(value: str) -> bool:
    """Whether ``value`` is spelled like a kind (it may still name none)."""
    return re.fullmatch(KIND_NAME, value) is not None


def message_context(*, email: str, user_ref: str | None, kind: str,
                    payload: dict[str, Any]) -> dict[str, Any]:
    """What a kind's templates see for one job: ``data``, ``event``, ``email``,
    ``user_id``, ``kind`` (and ``verify_url`` for verification mail, whose payload has
    carried it since before kinds existed)."""
    data = payload.get("data")
    if not isinstance(data, dict):
        data = {k: v for k, v in payload.items() if k == "verify_url"}
    event = payload.get("event") if isinstance(payload.get("event"), dict) else {}
    return {"email": email, "user_id": user_ref, "kind": kind, "data": data, "event": event,
            "verify_url": data.get("verify_url", payload.get("verify_url", "")),
            "subscriber": {"email": email}}


def compile_kind(spec: KindSpec) -> CampaignTemplate:
    """The kind's three templates compiled in the sandbox (raises TemplateError)."""
    return compile_campaign(spec.subject, spec.text_body, spec.html_body)


@dataclass(frozen=True)
class PreparedKind:
    spec: KindSpec
    template: CampaignTemplate
    loaded_at: float


class UnknownKind(Exception):
    """A job names a kind that is not (or no longer) in ``kinds``."""


class KindCatalog:
    """Compiled kinds for one process, shared by worker threads."""

    def __init__(self, engine: Engine, max_age: float = 5.0) -> None:
        self.engine = engine
        self.max_age = max_age
        self._lock = threading.Lock()
        self._kinds: dict[str, PreparedKind] = {}

    def get(self, name: str, version: int | None = None) -> PreparedKind:
        """The kind, reloaded when the job needs a newer version than the cached one or the
        cache is older than ``max_age``. Raises :class:`UnknownKind`."""
        cached = self._kinds.get(name)
        fresh = cached is not None and (
            cached.spec.version >= version if version is not None
            else time.monotonic() - cached.loaded_at < self.max_age)
        if cached is not None and fresh:
            return cached
        with self.engine.connect() as conn:
            spec = load_kind(conn, name)
        if spec is None:
            raise UnknownKind(name)
        prepared = PreparedKind(spec, compile_kind(spec), time.monotonic())
        with self._lock:
            self._kinds[name] = prepared
        return prepared

    def retry_schedule(self, name: str, defaults: Mapping[str, Sequence[int]]) -> tuple[int, ...]:
        """The kind's retry delays: campaign and test mail from the settings (``defaults``),
        a kind from its row, falling back to the settings' verification schedule."""
        if name == SEQUENCE:
            return tuple(defaults.get(name, defaults.get(BUILTIN, ())))
        if name in RESERVED:
            return tuple(defaults.get(name, ()))
        try:
            schedule = self.get(name).spec.retry_schedule
        except UnknownKind:
            schedule = None
        if schedule is not None:
            return schedule
        return tuple(defaults.get(name, defaults.get(BUILTIN, ())))
