"""No UI text is left untranslated in Spanish (docs/design.md §25).

1. Every template's literal text — text between tags, and the text attributes
   (placeholder, title, aria-label, alt, data-confirm, data-copied) — is inside ``_()``;
   so are prose string literals in template expressions.
2. Every message the templates and the Python code mark for translation is in the Spanish
   catalog, with a translation.
3. The committed ``messages.mo`` says exactly what ``messages.po`` says (a fresh clone and
   the wheel need no compile step).
"""

from __future__ import annotations

import ast
import io
import re
from pathlib import Path

from babel.messages.extract import extract_from_dir
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from jinja2 import Environment

ROOT = Path(__file__).resolve().parent.parent.parent
TEMPLATES = ROOT / "templates"
CATALOG = ROOT / "translations" / "es" / "LC_MESSAGES"
# Not UI: the engine's mail templates are the team's own content.
SKIP = {"mail"}
TEXT_ATTRIBUTES = ("placeholder", "title", "aria-label", "alt", "data-confirm", "data-copied")
LETTER = re.compile(r"[A-Za-z]")
ENV = Environment(extensions=["jinja2.ext.i18n"])
GETTEXT = {"_", "gettext", "ngettext", "pgettext"}


def _templates() -> list[Path]:
    return sorted(p for p in TEMPLATES.rglob("*.html")
                  if p.relative_to(TEMPLATES).parts[0] not in SKIP)


def _segments(source: str) -> list[tuple[bool, str]]:
    """The source as (is_literal_text, text) pieces: Jinja constructs ({{ }}, {% %}, {# #},
    quoted strings inside them skipped) and the literal text between them."""
    out: list[tuple[bool, str]] = []
    pos, n = 0, len(source)
    closers = {"{{": "}}", "{%": "%}", "{#": "#}"}
    while pos < n:
        starts = [i for i in (source.find(o, pos) for o in closers) if i >= 0]
        if not starts:
            out.append((True, source[pos:]))
            break
        start = min(starts)
        if start > pos:
            out.append((True, source[pos:start]))
        close = closers[source[start:start + 2]]
        j, quote = start + 2, ""
        while j < n:
            c = source[j]
            if quote:
                if c == "\\":
                    j += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"" and close != "#}":
                quote = c
            elif source.startswith(close, j):
                j += 2
                break
            j += 1
        out.append((False, source[start:j]))
        pos = j
    return out


def _literal_text(source: str) -> list[str]:
    """Text a reader would see that is not inside a gettext call."""
    found: list[str] = []
    in_tag = False
    for literal, text in _segments(source):
        if not literal:
            continue
        i = 0
        while i < len(text):
            if in_tag:
                j = text.find(">", i)
                chunk = text[i:] if j < 0 else text[i:j + 1]
                for name, value in re.findall(
                        r'\b(' + "|".join(TEXT_ATTRIBUTES) + r')="([^"{}]*)"', chunk):
                    if LETTER.search(value):
                        found.append(f'{name}="{value}"')
                in_tag, i = (True, len(text)) if j < 0 else (False, j + 1)
            else:
                j = text.find("<", i)
                chunk = text[i:] if j < 0 else text[i:j]
                if LETTER.search(re.sub(r"&#?\w+;", "", chunk)):  # entities are not words
                    found.append(chunk.strip())
                if j < 0:
                    break
                if text.startswith("<!--", j):
                    i = text.find("-->", j) + 3
                    continue
                in_tag, i = True, j
    return found


def _prose_literals(source: str) -> list[str]:
    """String literals in expressions that read as prose (a space and a letter, not a
    format or a selector) and are not the argument of a gettext call."""
    found = []
    tokens = [t for t in ENV.lexer.tokeniter(source, "t") if t[1] != "whitespace"]
    for k, (_line, token, value) in enumerate(tokens):
        if token != "string":
            continue
        text = value[1:-1]
        if " " not in text.strip() or not LETTER.search(text) or "%" in text \
                or text.startswith(("#", ".", "/")) or "{{" in text or "{%" in text:
            continue
        before = [t[2] for t in tokens[max(0, k - 2):k]]
        if len(before) == 2 and before[1] == "(" and before[0] in GETTEXT | {"startswith"}:
            continue  # translated, or compared with data (not shown)
        found.append(text)
    return found


def test_no_template_text_is_left_unwrapped() -> None:
    problems = []
    for path in _templates():
        source = path.read_text()
        for text in _literal_text(source) + _prose_literals(source):
            problems.append(f"{path.relative_to(ROOT)}: {text[:80]!r}")
    assert not problems, "wrap these in _():\n" + "\n".join(problems)


def _catalog() -> dict[str, str]:
    with (CATALOG / "messages.po").open("rb") as f:
        catalog = read_po(f, locale="es")
    found: dict[str, str] = {}
    for m in catalog:
        if not m.id or "fuzzy" in m.flags:
            continue
        ids = m.id if isinstance(m.id, tuple) else (m.id,)
        strings = m.string if isinstance(m.string, tuple) else (m.string,)
        for i, one in enumerate(ids):  # a plural: every form must be translated
            found[str(one)] = "" if not all(strings) else str(strings[min(i, len(strings) - 1)])
    return found


# What babel.cfg extracts: the web app, the templates, and the engine's and the domain
# code's messages marked with workers.core.i18n.N_ (translated when a page shows them).
METHOD_MAP = [("webapp/**.py", "python"), ("workers/**.py", "python"),
              ("templates/**.html", "jinja2")]
KEYWORDS = {"_": None, "gettext": None, "lazy_gettext": None, "_l": None,
            "ngettext": (1, 2), "N_": None, "lazy_pgettext": ((1, "c"), 2)}


def _extracted() -> list[tuple[str, int, str]]:
    """(file, line, message) of every message marked for translation."""
    options = {"templates/**.html": {"extensions": "jinja2.ext.i18n"}}
    found = []
    for file, line, message, _comments, _context in extract_from_dir(
            str(ROOT), METHOD_MAP, options_map=options, keywords=KEYWORDS):
        for part in message if isinstance(message, tuple) else (message,):
            if part:
                found.append((file, line, part))
    return found


def _marked() -> set[str]:
    """Every message the templates and the Python code mark for translation."""
    return {message for _file, _line, message in _extracted()}


def test_the_engines_and_domain_messages_are_marked() -> None:
    """The extraction sees N_ in workers/ and webapp/domain/ (else their messages would
    stay English on Spanish pages without this file noticing)."""
    files = {file for file, _line, _message in _extracted()}
    assert {"workers/building/message.py", "workers/building/dkim.py", "webapp/domain/campaigns.py",
            "webapp/domain/domain_checks.py", "webapp/domain/imports.py"} <= files
    assert "campaign is %(status)s; only drafts can be edited" in _marked()


def test_babel_cfg_extracts_what_this_test_checks() -> None:
    config = (ROOT / "babel.cfg").read_text()
    assert "[python: workers/**.py]" in config and "-k N_" in config


PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def test_every_translation_keeps_the_placeholders() -> None:
    """A translation that drops or invents a %(name)s would show the wrong text or fail
    (KeyError) on the page that formats it."""
    with (CATALOG / "messages.po").open("rb") as f:
        catalog = read_po(f, locale="es")
    wrong = []
    for m in catalog:
        if not m.id or not m.string:
            continue
        ids = m.id if isinstance(m.id, tuple) else (m.id,)
        strings = m.string if isinstance(m.string, tuple) else (m.string,)
        wanted = set().union(*(PLACEHOLDER.findall(str(i)) for i in ids))
        for one in strings:
            if one and set(PLACEHOLDER.findall(str(one))) - wanted:
                wrong.append(f"{ids[0]!r} -> {one!r}")
            if one and len(ids) == 1 and set(PLACEHOLDER.findall(str(one))) != wanted:
                wrong.append(f"{ids[0]!r} -> {one!r}")
    assert not wrong, "placeholders differ:\n" + "\n".join(wrong)


def test_every_marked_message_has_its_spanish_translation() -> None:
    catalog = _catalog()
    missing = sorted(m for m in _marked() if not catalog.get(m))
    assert not missing, f"{len(missing)} messages without Spanish: " + "\n".join(missing[:40])


def test_the_compiled_catalog_is_the_catalog() -> None:
    with (CATALOG / "messages.po").open("rb") as f:
        catalog = read_po(f, locale="es")
    compiled = io.BytesIO()
    write_mo(compiled, catalog)
    assert (CATALOG / "messages.mo").read_bytes() == compiled.getvalue(), \
        "translations/es/LC_MESSAGES/messages.mo is stale: run pybabel compile -d translations"


# The modules whose messages reach pages (the API's answers are English by design).
# verifications.py and intake.py: their raw strings are the API's request validation
# (user_id, verify_url, Idempotency-Key), which no page's form sends; feedback_intake.py
# answers the providers.
API_ONLY = {"webapp/blueprints/api", "webapp/domain/messages.py", "webapp/json_input.py",
            "webapp/openapi.py", "webapp/cli.py", "webapp/security.py",
            "webapp/domain/verifications.py", "webapp/domain/feedback_intake.py",
            "webapp/domain/intake.py"}
DOMAIN_ERRORS = {"Invalid", "Conflict", "DomainError", "NotFound", "Overloaded"}


def _literal(node: ast.AST) -> bool:
    """English written in the code: a string literal, an f-string, or a sum of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    if isinstance(node, ast.JoinedStr):
        return True
    return isinstance(node, ast.BinOp) and (_literal(node.left) or _literal(node.right))


def test_no_server_message_reaches_a_page_unmarked() -> None:
    """"schedule in the past" and others were plain English strings raised or
    flashed by the web app, so they stayed English on Spanish pages. Every flash() and every
    domain error raised where pages can show it is marked (_(), N_(), ngettext...), so the
    catalog check above sees it."""
    found = []
    for path in sorted((ROOT / "webapp").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if any(rel == a or rel.startswith(a + "/") for a in API_ONLY):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if (name == "flash" or name in DOMAIN_ERRORS) and _literal(node.args[0]):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node.args[0])[:70]}")
    assert not found, "mark these for translation:\n" + "\n".join(found)
