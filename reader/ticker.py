"""A snapshot of a source's regions every interval, each interval handed on: what
`stat --interval` and `top` show (export takes one snapshot per scrape instead)."""

from __future__ import annotations

import time
from typing import Callable, Optional

from urewrite.reader.snapshots import Snapshot, Watcher, changes

POLL_SECONDS = 0.05  # how often the end (the command's exit, the deadline) is checked


class Ticker:
    """Takes a snapshot every `interval` seconds (or none, when interval is None)
    until `done()`, and hands each interval to `on_interval(before, after)`."""

    def __init__(self, watcher: Watcher, interval: Optional[float],
                 on_interval: Callable[[Snapshot, Snapshot], None],
                 from_zero: bool = False):
        """from_zero: every region of the source is new since it began (processes
        armed just now, whose regions may already count), so the first interval
        counts them from zero rather than from a first read."""
        self.watcher, self.interval, self.on_interval = watcher, interval, on_interval
        self.last = Snapshot(time.monotonic()) if from_zero else watcher.snapshot()
        self.start = self.last.time

    def run(self, done: Callable[[], bool], wake: Optional[Callable[[float], bool]] = None,
            limit: Optional[int] = None) -> int:
        """Until done() (or `limit` intervals); `wake(seconds)` may wait instead of
        sleeping and return True to stop. Returns the intervals handed on."""
        ticks = 0
        next_tick = self.start + self.interval if self.interval else None
        while not done() and (limit is None or ticks < limit):
            now = time.monotonic()
            if next_tick is not None and now >= next_tick:
                self.tick()
                ticks += 1
                # keep to the schedule, but never catch up with a burst of ticks
                next_tick = max(next_tick + self.interval, time.monotonic())
                continue
            pause = POLL_SECONDS if next_tick is None else min(POLL_SECONDS, next_tick - now)
            if wake is not None and wake(pause):
                break
            if wake is None:
                time.sleep(pause)
        return ticks

    def tick(self) -> None:
        after = self.watcher.snapshot()
        self.on_interval(self.last, after)
        self.last = after

    def finish(self) -> Snapshot:
        """A last snapshot; the part of an interval since the last tick is printed
        when it saw hits or lasted a tenth of an interval."""
        after = self.watcher.snapshot()
        if self.interval and (after.time - self.last.time >= self.interval / 10
                              or any(c.hits for c in changes(self.last, after))):
            self.on_interval(self.last, after)
        self.last = after
        return after
