"""Retry schedules: per kind, with jitter, never forever (P5)."""

from __future__ import annotations

import random
from collections.abc import Sequence


def next_delay(schedule: Sequence[int], attempts_done: int, jitter: float = 0.1,
               rng: random.Random | None = None) -> float | None:
    """Seconds until the next attempt after ``attempts_done`` failed attempts, or None when
    the schedule is used up (the job then fails). ``schedule[0]`` follows the first attempt,
    so a schedule of five delays allows six attempts in all."""
    if attempts_done < 1 or attempts_done > len(schedule):
        return None
    base = float(schedule[attempts_done - 1])
    spread = (rng or random).uniform(-jitter, jitter) if jitter else 0.0
    return max(0.0, base * (1.0 + spread))
