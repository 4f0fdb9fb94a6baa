"""The finish statement's plan (workers/queue/, ``_FINISH``): the finisher
prepares it once per session, so after five runs PostgreSQL may keep a generic plan,
which guesses 100 outcomes from jsonb_to_recordset whatever the document holds. On a
small table (a new install, a few thousand jobs) that guess made a hash join over a
sequential scan of delivery_jobs the cheaper plan: every outcome of a transactional burst
read the whole table. The ids given as an array keep it on the primary key."""

from __future__ import annotations

import sqlalchemy as sa

from tests.helpers import make_campaign
from workers import queue


def test_the_generic_plan_finds_the_outcomes_by_primary_key(engine: sa.Engine) -> None:
    campaign = make_campaign(engine, [f"plan{i}@example.org" for i in range(3000)])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
    with engine.begin() as conn:
        jobs = queue.claim_batch(conn, "w-plan", 2, "example.com")
        conn.execute(sa.text("ANALYZE delivery_jobs"))
    outcome = queue.Outcome(job_id=jobs[0].id, claim_token=jobs[0].claim_token, status="sent",
                            counted=True, reply_class="sent", code=250, reply="250 ok",
                            stage="data_end")
    document = queue.finish_document([outcome]).replace("'", "''")
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    with autocommit.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        driver.execute("SET plan_cache_mode = force_generic_plan")
        driver.execute(f"PREPARE finish_plan AS {queue.FINISH_PIPELINED}")
        plan = "\n".join(row[0] for row in driver.execute(
            f"EXPLAIN (ANALYZE, COSTS OFF) EXECUTE finish_plan ('{document}'::jsonb, 'w-plan')"))
        assert "Seq Scan on delivery_jobs" not in plan, plan
        assert "delivery_jobs_pkey" in plan, plan
    with engine.connect() as conn:  # and it did finish the job
        assert conn.execute(sa.text("SELECT status FROM delivery_jobs WHERE id = :id"),
                            {"id": jobs[0].id}).scalar_one() == "sent"
