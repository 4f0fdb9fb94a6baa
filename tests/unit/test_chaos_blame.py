"""How bench/chaos.py puts each duplicate down to a kill: the kill that left the copy
accepted and unmarked, not the last one that held the job (the promise it checks: a kill
causes at most one duplicate per worker thread, docs/design.md §16)."""

from __future__ import annotations

from bench.chaos import Kill, blame


def kill(jobs: list[int], records_at_kill: int) -> Kill:
    return Kill(at=0.0, slot=0, pid=1, victim_in_flight=len(jobs), all_in_flight=len(jobs),
                victim_jobs=jobs, records_at_kill=records_at_kill)


def test_a_job_taken_back_and_held_by_the_next_victim_stays_with_the_first_kill() -> None:
    # The first victim sent jobs 1 and 2 (copies 5 and 6 in the record) and died before
    # marking them; the restarted process claimed them again, and was itself killed with
    # them still claimed, before it had sent them (their second copies came after).
    first, second = kill([1, 2, 3], records_at_kill=10), kill([1, 2, 4], records_at_kill=22)
    blame([first, second], {1: [5, 30], 2: [6, 31], 3: [7], 4: [20, 25]})
    assert (first.duplicates, second.duplicates) == (2, 1)


def test_a_job_sent_three_times_is_one_duplicate_for_each_kill_that_left_it() -> None:
    first, second = kill([1], records_at_kill=10), kill([1], records_at_kill=20)
    blame([first, second], {1: [5, 15, 25]})
    assert (first.duplicates, second.duplicates) == (1, 1)


def test_a_copy_no_kill_held_after_it_is_put_down_to_none() -> None:
    # Sent twice, but both copies came after the only kill that held it (the relay's
    # lost 250, say): no kill left it unmarked.
    only = kill([1], records_at_kill=10)
    blame([only], {1: [12, 14], 2: [3, 4]})
    assert only.duplicates == 0
