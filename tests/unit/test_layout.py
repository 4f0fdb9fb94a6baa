"""The layout shows the architecture (STYLE.md): the engine stands alone, and the job
vocabulary lives in one module that the schema and the SQL read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from workers.core import states

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_engine_never_imports_the_web_app() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in _imports(path)
                                            if m == "webapp" or m.startswith("webapp."))
        for path in (ROOT / "workers").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_engine_is_in_its_rooms() -> None:
    """workers/ holds its rooms as sub-packages (docs/design.md §11): a new engine module
    goes into one of them, not beside them."""
    top = {p.name for p in (ROOT / "workers").iterdir() if p.name != "__pycache__"}
    assert top == {"__init__.py", "core", "queue", "delivery", "after_acceptance", "building"}
    for room in top - {"__init__.py"}:
        assert (ROOT / "workers" / room / "__init__.py").is_file(), room


def test_tests_and_bench_do_not_import_each_other() -> None:
    """What both need lives in harness/ (real components, seed data) or the app."""
    def offenders(folders: tuple[str, ...], banned: str) -> dict[str, list[str]]:
        found = {}
        for folder in folders:
            for path in (ROOT / folder).rglob("*.py"):
                hits = sorted(m for m in _imports(path)
                              if m == banned or m.startswith(banned + "."))
                if hits:
                    found[str(path.relative_to(ROOT))] = hits
        return found

    assert offenders(("tests",), "bench") == {}
    assert offenders(("bench", "harness", "webapp", "workers"), "tests") == {}


def test_the_engine_does_not_import_test_tools() -> None:
    for path in (ROOT / "workers").rglob("*.py"):
        assert "aiosmtpd" not in " ".join(_imports(path)), path


def test_no_sql_spells_out_a_list_of_job_states() -> None:
    """State lists in SQL come from workers.core.states (sql_list), so adding a state is a
    one-place change. A literal ('pending', 'retry') in a statement is a second copy."""
    job_only = set(states.STATES) - {"sending", "sent", "cancelled"}  # campaigns share these
    pattern = re.compile(r"status\s+IN\s+\([^)]*'(?:" + "|".join(sorted(job_only)) + r")'")
    hits = []
    for folder in ("workers", "webapp"):
        for path in (ROOT / folder).rglob("*.py"):
            for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert hits == []


def test_vocabulary_is_consistent() -> None:
    assert set(states.TERMINAL) | set(states.ACTIVE) == set(states.STATES)
    assert not set(states.TERMINAL) & set(states.ACTIVE)
    assert set(states.CLAIMABLE) <= set(states.ACTIVE)
    assert set(states.PROBLEM) <= set(states.TERMINAL)
    assert set(states.TRANSITIONS) == set(states.STATES)
    for old, targets in states.TRANSITIONS.items():
        assert targets <= set(states.STATES), old
    assert set(states.PRIORITY) == set(states.KINDS)
    assert states.can_move("pending", "sending")
    assert not states.can_move("sent", "pending")
    assert states.sql_list(("a", "b")) == "('a', 'b')"


def test_cli_loads_the_demo_and_the_sink_lazily() -> None:
    import subprocess
    import sys

    code = ("import sys, webapp.cli; "
            "print(any(m.startswith(('aiosmtpd', 'webapp.sink', 'webapp.demo')) "
            "for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


# The jobs table is written by one package: nothing outside workers/queue/ inserts, moves
# or deletes a job (docs/design.md §11).
QUEUE = "workers/queue/"
#: No module of the package is longer than this: one concern each, short enough to read at once.
MAX_LINES = 400


def _writes(verb: str) -> dict[str, int]:
    pattern = re.compile(rf"\b{verb}\s+delivery_jobs\b", re.IGNORECASE)
    found: dict[str, int] = {}
    for folder in ("workers", "webapp", "harness"):
        for path in (ROOT / folder).rglob("*.py"):
            hits = len(pattern.findall(path.read_text(encoding="utf-8")))
            if hits:
                found[path.relative_to(ROOT).as_posix()] = hits
    return found


def _outside_the_queue(found: dict[str, int]) -> set[str]:
    return {path for path in found if not path.startswith(QUEUE)}


def test_jobs_are_created_only_by_the_queue() -> None:
    """Every job enters through workers/queue/ (enqueue_messages, enqueue_audience)."""
    created = _writes("INSERT INTO")
    assert _outside_the_queue(created) == set()
    assert set(created) == {QUEUE + "enqueue_messages.py", QUEUE + "enqueue_audience.py"}


def test_jobs_are_moved_and_deleted_only_by_the_queue() -> None:
    moved = _writes("UPDATE") | _writes("DELETE FROM")
    assert moved, "the check reads the tree"
    assert _outside_the_queue(moved) == set()


def test_the_queue_modules_are_short() -> None:
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
             for path in (ROOT / QUEUE).rglob("*.py")}
    assert len(sizes) > 5, sizes
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}


def test_the_old_queue_modules_are_gone() -> None:
    """Callers write ``from workers import queue``; the old single modules do not return."""
    assert not (ROOT / "workers/delivery/queue.py").exists()
    assert not (ROOT / "workers/delivery/enqueue.py").exists()


def test_the_pool_only_schedules() -> None:
    """The worker pool schedules threads, claims and batches; the reply policy, the
    relays, one attempt and an outcome's way to the database live in their own modules
    (workers/delivery/reply_policy.py, relay_board.py, attempt.py, handover.py)."""
    tree = ast.parse((ROOT / "workers" / "delivery" / "pool.py").read_text(encoding="utf-8"))
    [pool] = [node for node in tree.body if isinstance(node, ast.ClassDef)
              and node.name == "Pool"]
    assert pool.end_lineno is not None
    assert pool.end_lineno - pool.lineno + 1 < 300
