"""The proxy's busy log (``_busy.BusyLog``) on a clock the test moves: spans merged, written, cut at the stop."""

from __future__ import annotations

from pathlib import Path

import msgspec

from ddslurm.config import BusySpan
from ddslurm.runtime._busy import BusyLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _spans(path: Path) -> list[tuple[float, float]]:
    return [(s.start, s.end) for s in (msgspec.json.decode(x, type=BusySpan) for x in path.read_text().splitlines())]


def test_spans_are_merged_written_at_most_once_a_second_and_cut_at_the_stop(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "busy-m.jsonl"
    busy = BusyLog(path, clock=clock, flush_every=1.0)
    busy.enter()  # 100.0
    clock.now = 100.2
    busy.enter()
    clock.now = 100.4
    busy.leave()
    assert busy.in_flight == 1
    clock.now = 100.5
    busy.leave()  # [100.0, 100.5]; not written yet (under a second since the start)
    assert not path.exists()
    busy.enter()  # 100.5: touches the last span, merged
    clock.now = 100.7
    busy.leave()
    clock.now = 102.0
    busy.enter()
    clock.now = 102.5
    busy.leave()  # a second has passed: written
    assert _spans(path) == [(100.0, 100.7), (102.0, 102.5)]
    clock.now = 103.0
    busy.enter()
    clock.now = 104.0
    busy.close()  # a request still in flight: its span ends at the stop
    assert _spans(path) == [(100.0, 100.7), (102.0, 102.5), (103.0, 104.0)]


def test_without_a_path_nothing_is_written(tmp_path: Path) -> None:
    busy = BusyLog(None, clock=Clock())
    busy.enter()
    busy.leave()
    busy.close()
    assert list(tmp_path.iterdir()) == []
