"""How bench/chaos.py puts each duplicate down to a kill (harness/duplicates.py): the kill
that left the copy accepted and unmarked, not the last one that held the job (the promise
it checks: a kill causes at most one duplicate per worker thread, docs/design.md §16)."""

from __future__ import annotations

from harness.duplicates import blame


def test_a_job_taken_back_and_held_by_the_next_victim_stays_with_the_first_kill() -> None:
    # The first victim sent jobs 1 and 2 (copies 5 and 6 in the record) and died before
    # marking them; the restarted process claimed them again, and was itself killed with
    # them still claimed, before it had sent them (their second copies came after).
    kills = [([1, 2, 3], 10), ([1, 2, 4], 22)]
    assert blame(kills, {1: [5, 30], 2: [6, 31], 3: [7], 4: [20, 25]}) == [2, 1]


def test_a_job_sent_three_times_is_one_duplicate_for_each_kill_that_left_it() -> None:
    assert blame([([1], 10), ([1], 20)], {1: [5, 15, 25]}) == [1, 1]


def test_a_copy_no_kill_held_after_it_is_put_down_to_none() -> None:
    # Sent twice, but both copies came after the only kill that held it (the relay's
    # lost 250, say): no kill left it unmarked. Job 2 was never held by a victim.
    assert blame([([1], 10)], {1: [12, 14], 2: [3, 4]}) == [0]
