"""Which SIGKILL left which duplicate (bench/chaos.py's check of docs/design.md §16: a kill
causes at most one duplicate per worker thread)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence


def blame(kills: Sequence[tuple[Sequence[int], int]],
          copies: Mapping[int, Sequence[int]]) -> list[int]:
    """The duplicates each kill caused. ``kills``, in order: the jobs its victim held in
    `sending`, and how many messages the sink's record held once the victim was dead.
    ``copies``: each job's copies, as their places in the sink's record.

    Every copy but a job's last was accepted and never marked `sent`; the kill that left
    it so is the first one after it whose victim held the job. (The last kill that held a
    job is not always it: a job one kill's victim left unmarked is taken back, and may sit
    claimed, not yet sent, in the next victim's batch.) A copy that no kill holding its
    job came after was left by something else (the relay's lost 250): no kill's."""
    holders: dict[int, list[int]] = defaultdict(list)
    for index, (jobs, _records) in enumerate(kills):
        for job_id in jobs:
            holders[job_id].append(index)
    caused = [0] * len(kills)
    for job_id, held_by in holders.items():
        for place in copies.get(job_id, [])[:-1]:
            index = next((k for k in held_by if place < kills[k][1]), None)
            if index is not None:
                caused[index] += 1
    return caused
