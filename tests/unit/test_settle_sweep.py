"""The settler's pass over a cancelled campaign's span of ids (workers.delivery.lifecycle
.Sweep): windows handed out in id order, disjoint, covering the span exactly, whichever
stream asks; a window given back is taken again first."""

from __future__ import annotations

import itertools
import threading

from workers.delivery.lifecycle import Sweep


def test_windows_are_disjoint_in_order_and_cover_the_span() -> None:
    sweep = Sweep(broadcast_id=1, upto=1000, next=99)  # ids 100..1000
    windows = []
    while (window := sweep.take(250)) is not None:
        windows.append(window)
    assert windows == [(99, 349), (349, 599), (599, 849), (849, 1000)]
    assert sweep.take(250) is None


def test_streams_asking_at_once_share_the_span_without_overlap() -> None:
    sweep = Sweep(broadcast_id=1, upto=100_000, next=0)
    taken: list[tuple[int, int]] = []
    lock = threading.Lock()

    def stream() -> None:
        while (window := sweep.take(7)) is not None:
            with lock:
                taken.append(window)

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    taken.sort()
    assert taken[0][0] == 0 and taken[-1][1] == 100_000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(taken))


def test_a_window_given_back_is_taken_again_first() -> None:
    sweep = Sweep(broadcast_id=1, upto=100, next=0)
    first = sweep.take(10)
    second = sweep.take(10)
    assert first == (0, 10) and second == (10, 20)
    sweep.give_back(first)  # its transaction failed
    assert sweep.take(10) == (0, 10)
