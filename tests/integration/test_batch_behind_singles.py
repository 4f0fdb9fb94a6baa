"""A batch import never delays a single message of its class (P7): the items of
``POST /messages/batch`` are queued one step behind the single requests of their kind's
class (:data:`workers.core.states.BULK_STEP`), still ahead of every lower class, so a
signup's verification posted while 20,000 imported ones drain goes out next. The pool's
pacing of the API looks at the single requests only: imported mail waiting is expected."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.integration.test_delivery_pacing import _job
from tests.integration.test_kinds_api import ONBOARDING, message, put_kind
from workers import queue
from workers.building.kinds import class_of
from workers.core.states import BULK_STEP, CLASS_PRIORITY, SENT
from workers.delivery import pool as pool_module
from workers.delivery.pool import Pool


def _verification(user: str) -> dict[str, Any]:
    return {"kind": "verification", "user_id": user, "email": f"{user}@example.org",
            "data": {"verify_url": f"https://app.example/v/{user}"}}


def _priorities(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {r.user_ref: r.priority for r in conn.execute(sa.text(
            "SELECT user_ref, priority FROM delivery_jobs"))}


def test_a_single_message_is_claimed_before_a_batch_queued_earlier(
        api: Api, engine: sa.Engine) -> None:
    assert put_kind(api, "onboarding", ONBOARDING).status_code == 201
    batch = api.post("/messages/batch", {"messages": [
        _verification(f"import-{i}") for i in range(30)]})
    assert batch.status_code == 207 and batch.get_json()["accepted"] == 30
    lifecycle = api.post("/messages", message(user_id="lifecycle-1"))
    single = api.post("/messages", _verification("signup"))
    assert lifecycle.status_code == single.status_code == 202
    priorities = _priorities(engine)
    critical = CLASS_PRIORITY["critical"]
    assert priorities["signup"] == critical
    assert {priorities[f"import-{i}"] for i in range(30)} == {critical + BULK_STEP}
    assert priorities["lifecycle-1"] == CLASS_PRIORITY["lifecycle"]
    # Imported mail is still critical mail: ahead of lifecycle mail, labelled critical.
    assert critical + BULK_STEP < CLASS_PRIORITY["lifecycle"]
    assert class_of("verification", critical + BULK_STEP) == "critical"
    with engine.begin() as conn:
        first = queue.claim_batch(conn, "w-bulk", 1, "example.com")
        second = queue.claim_batch(conn, "w-bulk", 30, "example.com")
    assert [j.id for j in first] == [single.get_json()["id"]]
    assert [j.user_ref for j in second] == [f"import-{i}" for i in range(30)]


def test_a_batch_item_of_a_lifecycle_kind_stays_behind_its_singles_only(
        api: Api, engine: sa.Engine) -> None:
    assert put_kind(api, "onboarding", ONBOARDING).status_code == 201
    assert api.post("/messages/batch", {"messages": [
        message(user_id="bulk-onboarding")]}).status_code == 207
    lifecycle = CLASS_PRIORITY["lifecycle"]
    assert _priorities(engine)["bulk-onboarding"] == lifecycle + BULK_STEP
    assert lifecycle + BULK_STEP < CLASS_PRIORITY["campaign"]
    assert class_of("onboarding", lifecycle + BULK_STEP) == "lifecycle"


def test_imported_mail_waiting_does_not_make_the_pool_behind(
        engine: sa.Engine, config_for: Any) -> None:
    pool = Pool(engine, config_for())
    late = pool_module.BEHIND_LAG + 30
    bulk = CLASS_PRIORITY["critical"] + BULK_STEP
    # A full claim of imported mail that waited long: the single requests are not behind
    # (they would have been claimed first).
    pool._note_lag([_job("verification", late, priority=bulk)] * 10, asked=10)
    assert not pool.behind()
    pool._note_lag([_job("verification", late)], asked=10)
    assert pool.behind()
    pool._note_lag([_job("verification", late, priority=bulk)] * 10, asked=10)
    assert not pool.behind()


def test_imported_mail_is_counted_in_its_class(api: Api, engine: sa.Engine) -> None:
    """/metrics' class label of an imported verification is critical, like its kind's."""
    assert api.post("/messages/batch", {"messages": [
        _verification("counted-import")]}).status_code == 207
    with engine.begin() as conn:
        [job] = queue.claim_batch(conn, "w-bulk", 1, "example.com")
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        assert queue.finish_one(conn, "w-bulk", queue.Outcome(
            job.id, job.claim_token, SENT, counted=True, reply_class=SENT, code=250,
            reply="250 ok", stage="data_end"))
    with engine.connect() as conn:
        counted = {(r.kind, r.klass, r.outcome): int(r.n) for r in conn.execute(sa.text(
            "SELECT kind, class AS klass, outcome, sum(n) AS n FROM job_outcome_counts"
            " GROUP BY 1, 2, 3"))}
        timed = {(r.kind, r.klass) for r in conn.execute(sa.text(
            "SELECT DISTINCT kind, class AS klass FROM time_to_sent_counts"))}
    assert counted == {("verification", "critical", SENT): 1}
    assert timed == {("verification", "critical")}


def _claim_order(engine: sa.Engine, n: int) -> list[str]:
    with engine.begin() as conn:
        return [j.user_ref for j in queue.claim_batch(conn, "w-bulk", n, "example.com")]


def test_an_imported_message_asked_for_again_by_its_user_goes_first(
        api: Api, engine: sa.Engine) -> None:
    """The user is waiting for it now: asked again by a single request (the same address:
    the live job answers), it leaves the import's queue."""
    assert api.post("/messages/batch", {"messages": [
        _verification(f"import-{i}") for i in range(5)]}).status_code == 207
    again = api.post("/messages", _verification("import-3"))
    assert again.status_code == 202 and again.get_json()["existing_because"] == "live"
    assert _priorities(engine)["import-3"] == CLASS_PRIORITY["critical"]
    assert _claim_order(engine, 5) == ["import-3", "import-0", "import-1", "import-2",
                                       "import-4"]


def test_an_imported_message_asked_again_in_another_batch_stays_imported(
        api: Api, engine: sa.Engine) -> None:
    for _ in range(2):
        assert api.post("/messages/batch", {"messages": [
            _verification("import-0")]}).status_code == 207
    assert _priorities(engine)["import-0"] == CLASS_PRIORITY["critical"] + BULK_STEP


@pytest.mark.parametrize("path, body", [
    ("/messages/resend", {"kind": "verification", "user_id": "import-2"}),
    ("/verifications/resend", {"user_id": "import-2"}),
])
def test_a_resend_of_an_imported_message_goes_first(
        api: Api, engine: sa.Engine, path: str, body: dict[str, Any]) -> None:
    assert api.post("/messages/batch", {"messages": [
        _verification(f"import-{i}") for i in range(4)]}).status_code == 207
    with engine.begin() as conn:  # imported before the resend cooldown
        conn.execute(sa.text("UPDATE delivery_jobs SET created_at = now() - interval '1 h',"
                             " available_at = now() - interval '1 h'"))
    resent = api.post(path, body)
    assert resent.status_code == 202, resent.get_json()
    assert resent.get_json()["reused"] is True
    assert _claim_order(engine, 4) == ["import-2", "import-0", "import-1", "import-3"]
