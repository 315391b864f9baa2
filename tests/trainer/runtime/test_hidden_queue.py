"""The hidden-state queue both pipeline modes use: bounded by exactly its capacity, taken in order."""

import threading
import time

import pytest

from trainer.runtime.hidden_queue import HiddenStateQueue, Stopped


class Item:
    def __init__(self, index: int):
        self.index = index


def produce(q: HiddenStateQueue, lane: int, lanes: int, end: int, delay: float) -> threading.Thread:
    def run():
        try:
            for g in range(lane, end, lanes):
                time.sleep(delay)
                q.put(Item(g))
        except Stopped:
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_depth_8_over_3_producers_holds_8_and_gives_the_data_order():
    q = HiddenStateQueue(8, start=0)
    threads = [produce(q, lane, 3, 60, delay) for lane, delay in ((0, 0.004), (1, 0.0), (2, 0.001))]
    deadline = time.monotonic() + 10
    while q.depth() < 8 and time.monotonic() < deadline:  # the drafter is late: the queue fills up
        time.sleep(0.01)
    time.sleep(0.1)
    assert q.capacity == 8 and q.depth() == 8  # not 6 (8 // 3 per producer), not more
    seen, most = [], 0
    for g in range(60):
        most = max(most, q.depth())
        seen.append(q.get(g).index)
    assert seen == list(range(60)) and most <= 8
    for t in threads:
        t.join(5)


def test_a_depth_below_the_number_of_producers_never_deadlocks():
    q = HiddenStateQueue(1, start=5)
    threads = [produce(q, lane, 3, 40, 0.0) for lane in range(3)]
    assert [q.get(g).index for g in range(5, 40)] == list(range(5, 40))
    for t in threads:
        t.join(5)


def test_a_strided_consumer_reserves_exactly_capacity_places():
    q = HiddenStateQueue(2, start=1, stride=2)  # a drafter replica taking 1, 3, 5, ...
    q.reserve(1)
    q.put(Item(1))
    q.reserve(3)
    blocked = threading.Event()

    def third():
        q.reserve(5)
        blocked.set()

    threading.Thread(target=third, daemon=True).start()
    assert not blocked.wait(0.3)  # 1 waits and 3 is reserved: 5 must wait for a place
    assert q.get(1).index == 1
    assert blocked.wait(5)
    with pytest.raises(RuntimeError, match="out of order"):
        q.get(5)


def test_a_failure_is_raised_at_the_batch_its_producer_owed():
    q = HiddenStateQueue(4, start=0)
    q.put(Item(0))
    q.put(Item(1))
    q.fail(2, ValueError("boom"), "target worker failed")
    assert q.get(0).index == 0 and q.get(1).index == 1
    with pytest.raises(RuntimeError, match="target worker failed: ValueError"):
        q.get(2)


def test_a_failure_waits_its_grace_for_a_stop():
    q = HiddenStateQueue(4, start=0)
    q.fail(0, OSError("peer gone"), "receiving hidden states failed", grace_s=5.0)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(Stopped):
        q.get(0, stop.is_set)
    assert time.monotonic() - t0 < 4


def test_close_stops_producers_and_the_drafter():
    q = HiddenStateQueue(1, start=0)
    q.put(Item(0))
    errors = []

    def blocked_put():
        try:
            q.put(Item(1))
        except Stopped:
            errors.append("put")

    t = threading.Thread(target=blocked_put, daemon=True)
    t.start()
    time.sleep(0.2)
    q.close()
    t.join(5)
    assert errors == ["put"] and q.depth() == 0
    with pytest.raises(Stopped):
        q.get(0)
