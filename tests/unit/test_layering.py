"""The engine's rooms are layered one way (docs/design.md §11): core ← queue ← building ←
delivery ← after_acceptance. A module imports only from its own room and the rooms before it — at
module level and inside functions alike — so a reader of core needs nothing above it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ORDER = ("core", "queue", "building", "delivery", "after_acceptance")

# Known upward imports, each with why it is still there: none. (The worker pool hosts the
# after-acceptance jobs on its scheduler because workers.after_acceptance.pool.worker_pool
# hands them in.) A new entry needs a reason here.
ALLOWED: set[tuple[str, str]] = set()


def upward_imports(root: Path = ROOT) -> list[tuple[str, int, str]]:
    found = []
    for path in sorted((root / "workers").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if len(parts) < 3 or parts[1] not in ORDER:
            continue
        level = ORDER.index(parts[1])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                bits = module.split(".")
                if bits[0] == "workers" and len(bits) > 1 and bits[1] in ORDER \
                        and ORDER.index(bits[1]) > level:
                    found.append((rel, node.lineno, module))
    return found


def test_no_room_imports_a_later_one() -> None:
    wrong = [f"{path}:{line}: imports {module}" for path, line, module in upward_imports()
             if not any(path == p and module.startswith(m) for p, m in ALLOWED)]
    assert not wrong, "an upward import (docs/design.md §11):\n" + "\n".join(wrong)


def test_the_allowances_are_still_needed() -> None:
    # An allowance nobody uses any more goes, so the list only shrinks.
    used = {(path, m) for path, _, module in upward_imports()
            for p, m in ALLOWED if path == p and module.startswith(m)}
    assert used == ALLOWED


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "workers" / "core").mkdir(parents=True)
    (tmp_path / "workers" / "core" / "x.py").write_text(
        "def f():\n    from workers.delivery import queue\n    return queue\n")
    assert upward_imports(tmp_path) == [("workers/core/x.py", 2, "workers.delivery")]


def test_the_engine_defines_its_tables() -> None:
    """The queue's tables are defined in the engine, on the metadata the web app's tables
    share (so Alembic sees one schema); the web app re-exports them."""
    from webapp import models
    from workers.core import tables

    defined = {node.targets[0].id for node in ast.parse(
        (ROOT / "workers" / "core" / "tables.py").read_text(encoding="utf-8")).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "Table"}
    assert {"delivery_jobs", "job_attempts", "suppressions", "workers", "relay_state",
            "domain_throttles", "rate_limiter", "sender_refusals"} <= defined
    assert models.metadata is tables.metadata
    for name in defined:
        assert getattr(models, name) is getattr(tables, name)
        assert tables.metadata.tables[name] is getattr(tables, name)
