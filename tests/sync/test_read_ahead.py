"""A task reads its next batch while it writes the current one: order, errors, bounded memory, clean stop."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from aeroqueue.sync.task import read_ahead


def test_items_come_in_order_and_all_of_them():
    assert list(read_ahead(iter(range(1000)))) == list(range(1000))
    assert list(read_ahead(iter([]))) == []


def test_an_error_in_the_source_reaches_the_consumer_after_the_items_before_it():
    def source() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("scan failed")

    got = []
    with pytest.raises(ValueError, match="scan failed"):
        for item in read_ahead(source()):
            got.append(item)
    assert got == [1, 2]


def test_the_reader_stays_at_most_depth_items_ahead_and_stops_when_the_consumer_does():
    produced: list[int] = []
    closed = threading.Event()

    def source() -> Iterator[int]:
        try:
            for i in range(100):
                produced.append(i)
                yield i
        finally:
            closed.set()

    stream = read_ahead(source(), depth=1)
    assert next(stream) == 0
    # The reader may have read item 1 (queued) and item 2 (waiting to be queued): no further.
    threading.Event().wait(0.3)
    assert len(produced) <= 3
    stream.close()  # the consumer gives up (a failed write)
    assert closed.is_set(), "the source is closed when the consumer stops"
    assert len(produced) <= 3
    assert not [t for t in threading.enumerate() if t.name == "sync-scan"], "no reader thread left behind"
