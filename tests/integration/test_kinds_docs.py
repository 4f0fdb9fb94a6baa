"""The curl examples of docs/api.md's "Transactional kinds" section work as written: every
body is valid JSON and is accepted by the API, in the order the section gives them."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from tests.conftest import Api

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def calls() -> list[tuple[str, str, dict[str, object]]]:
    """(method, path, body) of each curl with a body in the section."""
    section = DOC.read_text(encoding="utf-8").split("## Transactional kinds", 1)[1]
    found = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for command in block.split("curl -s ")[1:]:
            data = re.search(r"-d '(.*?)'", command, re.S)
            if data is None:
                continue
            path = re.search(r"\$API(/[^\s\"]+)", command)
            assert path is not None, command
            found.append(("PUT" if "-X PUT" in command else "POST", path[1],
                          json.loads(data[1])))
    return found


def test_the_documented_calls_are_accepted(api: Api, engine: sa.Engine) -> None:
    done = calls()
    assert [(m, p) for m, p, _ in done] == [
        ("POST", "/verifications"), ("POST", "/messages"), ("PUT", "/kinds/onboarding"),
        ("POST", "/messages"), ("PUT", "/kinds/churn"), ("POST", "/messages")]
    for method, path, body in done:
        if "send_at" in body:  # the example's date, moved to 3 days from whenever this runs
            body["send_at"] = (datetime.now(UTC) + timedelta(days=3)).isoformat()
        r = api.client.open(f"/api/v1{path}", method=method, json=body, headers=api.headers)
        assert r.status_code in (200, 201, 202), (path, r.get_json())
    cancelled = api.delete("/messages?user_id=42&kind=onboarding").get_json()
    assert cancelled["cancelled"] == 1
    with engine.connect() as conn:
        events = dict(conn.execute(sa.text(
            "SELECT kind, payload -> 'event' ->> 'name' FROM delivery_jobs "
            "WHERE kind <> 'verification'")).all())
    assert events == {"onboarding": "signup", "churn": "subscription_cancelled"}
