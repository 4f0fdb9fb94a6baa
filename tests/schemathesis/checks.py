"""A check of our own for Schemathesis (loaded by tests/integration/test_schemathesis.py
through SCHEMATHESIS_HOOKS): the narrow form of the exceptions in schemathesis.toml.

Three operations refuse some schema-valid bodies for reasons no JSON Schema can state, so
their ``positive_data_acceptance`` accepts a 422. This check takes that allowance back for
everything but those reasons: a 422 to a schema-valid body passes only when every field
it names is one whose rule the document cannot say for that operation.
"""

from __future__ import annotations

from typing import Any

import schemathesis

UNSTATABLE: dict[str, tuple[frozenset[str], str]] = {
    "POST /campaigns": (frozenset({"subject", "text", "html", "from"}),
                        "templates compile in the sandbox; From is judged by email-validator"),
    "PUT /kinds/{name}": (frozenset({"subject", "text", "html", "class", "active"}),
                          "templates compile in the sandbox; the built-in kind stays active "
                          "and critical"),
    "POST /messages": (frozenset({"send_at"}),
                       "send_at is judged on the server's clock (not past, within a year)"),
}


def _fields(response: Any) -> set[str]:
    try:
        return set(response.json()["error"]["fields"])
    except (ValueError, KeyError, TypeError):
        return set()


@schemathesis.check
def refusals_only_for_unstatable_rules(ctx: Any, response: Any, case: Any) -> None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 422:
        return
    allowed, why = UNSTATABLE.get(case.operation.label, (frozenset(), ""))
    named = _fields(response)
    if not named or not named <= allowed:
        excused = f" (excused here: {', '.join(sorted(allowed))}: {why})" if allowed else ""
        raise AssertionError(f"a schema-valid request was refused with 422 for "
                             f"{', '.join(sorted(named - allowed)) or 'no named field'}"
                             f"{excused}: {response.text[:300]}")
