"""What the composer tells a marketer before anything is sent (P9):

- every template error of every field at once (subject, text and HTML each compiled on
  their own, so an error in the HTML does not hide one in the text);
- every variable the templates read that no recipient will have: a top-level name the
  template context does not define, or an ``attributes.x`` key that none of the list's
  subscribers carries, with the keys the list does have and the closest one.

Missing variables render as nothing (the sandbox is lenient, so one odd subscriber never
fails a send); that is why they are reported here, at save and on the review page.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from jinja2 import TemplateSyntaxError, meta, nodes
from sqlalchemy.engine import Connection

from webapp.domain.errors import Invalid
from workers.building.message import TemplateError, compile_campaign, template_env
from workers.core.i18n import N_, Text

FIELDS = ("subject", "html", "text")
FIELD_NAMES = {"subject": N_("subject"), "html": N_("html"), "text": N_("text")}
# What recipient_context (workers/building/compose.py) gives every template, plus Jinja's own.
KNOWN_NAMES = frozenset({"subscriber", "email", "name", "attributes", "unsubscribe_url",
                         "campaign", "range", "dict", "cycler", "joiner", "namespace",
                         "loop", "self", "varargs", "kwargs", "caller",
                         "archive_url"})  # the web version: "" unless it is on
KEY_SAMPLE = 50_000  # subscribers read for the list's attribute keys (bounded at any size)


@dataclass(frozen=True)
class Problem:
    """One error or warning about one field, with its line when known."""

    field: str
    line: int | None
    message: str

    @property
    def text(self) -> Text:
        """"html on line 3: …", translatable (the UI shows it in the page's language)."""
        field = FIELD_NAMES.get(self.field, self.field)
        if self.line:
            return N_("%(field)s on line %(line)s: %(message)s", field=field, line=self.line,
                      message=self.message)
        return N_("%(field)s: %(message)s", field=field, message=self.message)

    def __str__(self) -> str:
        return str.__str__(self.text)


def _sources(values: dict[str, Any]) -> dict[str, str]:
    return {f: v for f in FIELDS if isinstance(v := values.get(f), str) and v.strip()}


def template_errors(values: dict[str, Any]) -> list[Problem]:
    """Every field's template error (each field compiled alone), in field order."""
    problems = []
    for field, source in _sources(values).items():
        try:
            compile_campaign(source if field == "subject" else "x",
                             source if field == "text" else None,
                             source if field == "html" else None)
        except TemplateError as exc:
            problems.append(Problem(exc.field, exc.line, exc.message))
    return problems


def check_templates(values: dict[str, Any]) -> None:
    """Raise :class:`Invalid` naming every bad field at once (``fields`` maps each to its
    "line N: message"; ``problems`` lists them all)."""
    problems = template_errors(values)
    if not problems:
        return
    raise Invalid(Text.joined("; ", (N_("template error in %(problem)s", problem=p.text)
                                     for p in problems)),
                  fields={p.field: (N_("line %(line)s: %(message)s", line=p.line,
                                       message=p.message) if p.line else p.message)
                          for p in problems},
                  problems=problems)


def _attribute_reads(tree: nodes.Template) -> list[tuple[str, int]]:
    """(key, line) of every ``attributes.key`` / ``attributes['key']`` /
    ``subscriber.attributes.key`` spelled out in the template."""
    reads = []
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        assert isinstance(node, nodes.Getattr | nodes.Getitem)
        base = node.node
        is_attributes = (isinstance(base, nodes.Name) and base.name == "attributes") or (
            isinstance(base, nodes.Getattr) and base.attr == "attributes"
            and isinstance(base.node, nodes.Name) and base.node.name == "subscriber")
        if not is_attributes:
            continue
        if isinstance(node, nodes.Getattr):
            reads.append((node.attr, node.lineno))
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            reads.append((node.arg.value, node.lineno))
    return reads


def _name_lines(tree: nodes.Template) -> dict[str, int]:
    lines: dict[str, int] = {}
    for node in tree.find_all(nodes.Name):
        if node.ctx == "load":
            lines.setdefault(node.name, node.lineno)
    return lines


def _closest(word: str, choices: list[str]) -> Text:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return N_(" Did you mean “%(word)s”?", word=close[0]) if close else Text.verbatim("")


def undefined_variables(values: dict[str, Any], attribute_keys: list[str]) -> list[Problem]:
    """Variables the templates read that will render as nothing for every recipient."""
    keys = sorted(attribute_keys)
    have: str = (", ".join(keys) if keys else N_("none")) if len(keys) <= 30 else \
        ", ".join(keys[:30]) + ", …"
    problems = []
    for field, source in _sources(values).items():
        try:
            tree = template_env(field == "html").parse(source)
        except TemplateSyntaxError:
            continue  # reported as a template error
        lines = _name_lines(tree)
        for name in sorted(meta.find_undeclared_variables(tree) - KNOWN_NAMES):
            problems.append(Problem(field, lines.get(name), N_(
                "“%(name)s” is not a variable a recipient has, so it renders as nothing. "
                "Use name, email, attributes.<column> or unsubscribe_url.%(hint)s", name=name,
                hint=_closest(name, sorted(KNOWN_NAMES - {"range", "dict", "cycler", "joiner",
                                                           "namespace", "loop", "self",
                                                           "varargs", "kwargs", "caller"})))))
        for key, line in _attribute_reads(tree):
            if key not in attribute_keys:
                problems.append(Problem(field, line, N_(
                    "no subscriber on the list has the attribute “%(key)s”, so "
                    "attributes.%(key)s renders as nothing. The list's attributes: "
                    "%(have)s.%(hint)s", key=key, have=have, hint=_closest(key, keys))))
    return problems


def list_attribute_keys(conn: Connection, list_id: int) -> list[str]:
    """The attribute keys the list's subscribers carry (over the first
    :data:`KEY_SAMPLE` members, so the cost is bounded at a million)."""
    rows = conn.execute(sa.text("""
        SELECT DISTINCT jsonb_object_keys(s.attributes) AS key
          FROM (SELECT subscriber_id FROM memberships WHERE list_id = :list_id
                 LIMIT :sample) m
          JOIN subscribers s ON s.id = m.subscriber_id
         ORDER BY 1"""), {"list_id": list_id, "sample": KEY_SAMPLE})
    return [r.key for r in rows]


def warnings_for(conn: Connection, values: dict[str, Any], list_id: int) -> list[Problem]:
    """The undefined-variable warnings for ``values`` sent to ``list_id``."""
    return undefined_variables(values, list_attribute_keys(conn, list_id))


def campaign_values(campaign: dict[str, Any]) -> dict[str, Any]:
    """A stored campaign in the composer's field names."""
    return {"subject": campaign["subject"], "html": campaign["html_body"],
            "text": campaign["text_body"]}
