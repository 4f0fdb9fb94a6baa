"""The state vocabulary is spelled once (part 3): code compares job and campaign
states, indexes counters by them and writes them into SQL through the constants of
``workers.core.states``, never as quoted words. A quoted ``'sent'`` is a second copy that
a renamed or added state leaves behind.

The check reads the code with :mod:`ast` and looks only where a state is meant, so the
same words in messages, tab names, webhook event names or outcome classes pass:

* a comparison with a state word whose other side names a status or state
  (``job["status"] == "sent"``, ``status in ("pending", "retry")``);
* a counter read by a state word (``counts["sent"]``, ``by_state.get("retry", 0)``);
* a ``status=``/``state=`` argument holding one (``enqueue(..., status="held")``);
* SQL text with the word quoted after ``=``, ``<>``, ``IN (``, ``,``, ``THEN`` or ``ELSE``
  (``WHERE status = 'sent'``): write ``f"status = '{SENT}'"`` or ``sql_list(...)``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from workers.core import states

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("workers", "webapp", "bench")
#: The vocabulary's own module (migrations are outside FOLDERS: they are frozen history).
HOME = {"workers/core/states.py"}
#: Files excused from the rule: none (keep it that way; a state word belongs to states.py).
ALLOWED: set[str] = set()

WORDS = frozenset(states.STATES) | frozenset(states.Campaign.STATES)
_ALT = "|".join(sorted(WORDS))
SQL_WORD = re.compile(r"(?:=|<>|!=|\bIN\s*\(|,|\bTHEN|\bELSE)\s*'(?:" + _ALT + r")'")
ABOUT_STATE = re.compile(r"status|state", re.IGNORECASE)
COUNTERS = re.compile(r"status|states|by_state|count", re.IGNORECASE)
STATE_ARGS = {"status", "state", "new_status", "old_status"}


def _words(node: ast.AST) -> bool:
    """Whether the expression is a state word or a literal collection/choice of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in WORDS
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_words(e) for e in node.elts)
    if isinstance(node, ast.IfExp):
        return _words(node.body) or _words(node.orelse)
    return False


def _hits(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    # Docstrings and other bare strings are prose: they may quote SQL.
    prose = {id(n.value) for n in ast.walk(tree)
             if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if id(node) in prose:
            continue
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_words(s) for s in sides) and any(
                    not _words(s) and ABOUT_STATE.search(ast.unparse(s)) for s in sides):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Subscript):
            if _words(node.slice) and COUNTERS.search(ast.unparse(node.value)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get" and node.args \
                    and _words(node.args[0]) and COUNTERS.search(ast.unparse(func.value)):
                found.append((node.lineno, ast.unparse(node)))
            for kw in node.keywords:
                if kw.arg in STATE_ARGS and _words(kw.value):
                    found.append((kw.value.lineno, f"{kw.arg}={ast.unparse(kw.value)}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in SQL_WORD.finditer(node.value):
                found.append((node.lineno, match.group(0)))
    return sorted(set(found))


def quoted_state_words(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place ``source`` spells a state word where a constant belongs."""
    return _hits(ast.parse(source))


def test_the_check_finds_what_it_looks_for() -> None:
    """The detector itself: each way of spelling a state is found, the look-alikes are not."""
    flagged = [
        'job["status"] == "sent"',
        'if status in ("pending", "retry"): pass',
        'campaign_status(engine, c) != "sent"',
        'counts["sent"] + by_state.get("retry", 0)',
        'enqueue(conn, status="pending" if ok else "held")',
        'sql = "UPDATE delivery_jobs SET status = \'bounced\' WHERE id = :id"',
        'sql = "SELECT 1 WHERE status IN (\'draft\', \'paused\')"',
    ]
    for source in flagged:
        assert quoted_state_words(source), source
    passed = [
        'tab == "failed"',
        'if outcome == "sent": pass',
        'effect = "bounced"',
        'message = "the campaign is not \'sent\' yet"',
        '"""Moves a job: ``UPDATE delivery_jobs SET status = \'sent\'``."""',
        'series[minute]["sent"] += 1',
        'relay["state"].get("paused")',
        'sql = f"UPDATE delivery_jobs SET status = \'{SENT}\' WHERE status IN {x}"',
        'job["status"] == SENT',
        'counts[states.PENDING]',
    ]
    for source in passed:
        assert quoted_state_words(source) == [], source


def test_no_quoted_state_words_in_the_code() -> None:
    hits = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in HOME or rel in ALLOWED:
                continue
            for line, what in quoted_state_words(path.read_text(encoding="utf-8")):
                hits.append(f"{rel}:{line}: {what}")
    assert hits == [], "use the constants of workers.core.states:\n" + "\n".join(hits)
