"""`urewrite stat --interval S` and `stat --dir DIR`: counts read while processes run.

With a command, stat runs it with a fresh region directory (as plain `stat` does)
and prints a table every S seconds. With `--dir DIR` it reads the regions that
processes started with UREWRITE_DIR=DIR write there, without touching them,
until Ctrl-C or `--duration`; the final report gives the hits the regions hold
(each process counts from its start). Interval lines give what happened in each
interval, like `perf stat -I`. The snapshots and their schedule are the reading
side's (reader/ticker.py); this module prints them.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import List, Optional, Tuple

from urewrite.reader.command_run import exit_status, interrupts_to
from urewrite.reader.directories import region_directory, remove_region_directory
from urewrite.reader.snapshots import ProbeChange, Snapshot, Watcher, changes
from urewrite.reader.sources import DirectorySource
from urewrite.reader.ticker import Ticker
from urewrite.sink import Sink
from urewrite.trampolines.region import ENV_VAR, Region
from urewrite.trampolines.region_reader import collect


class IntervalPrinter:
    """Prints each interval: a table of hits and hits/s per probe, or a JSON line."""

    def __init__(self, sink: Sink, as_json: bool, start: float):
        self.sink, self.as_json, self.start = sink, as_json, start
        self.header_done = False

    def __call__(self, before: Snapshot, after: Snapshot) -> None:
        rows = changes(before, after)
        elapsed = after.time - self.start
        if self.as_json:
            self.sink.write(json.dumps({
                "time_s": round(elapsed, 6), "seconds": round(after.time - before.time, 6),
                "probes": [{"object": r.key.object, "name": r.key.name, "kind": r.key.kind,
                            "address": r.key.address, "hits": r.hits,
                            "per_second": round(r.per_second, 3), "total": r.total}
                           for r in rows]}) + "\n")
            return
        self.sink.write("".join(line + "\n" for line in self.lines(elapsed, rows)))

    def lines(self, elapsed: float, rows: List[ProbeChange]) -> List[str]:
        wo = max([len(r.key.object) for r in rows] + [len("OBJECT")])
        wn = max([len(r.key.name) for r in rows] + [len("PROBE")])
        out = []
        if not self.header_done:
            out.append(f"#{'TIME(s)':>11}  {'OBJECT':<{wo}}  {'PROBE':<{wn}}  {'KIND':<7} "
                       f"{'HITS':>12} {'HITS/S':>14}")
            self.header_done = True
        for r in rows:
            out.append(f"{elapsed:12.3f}  {r.key.object:<{wo}}  {r.key.name:<{wn}}  "
                       f"{r.key.kind:<7} {r.hits:>12} {r.per_second:>14.1f}")
        if not rows:
            out.append(f"{elapsed:12.3f}  (no region yet)")
        return out


def stat_live(command: List[str], directory: Optional[str], interval: Optional[float],
              duration: Optional[float], as_json: bool, sink: Sink
              ) -> Tuple[Optional[int], List[Region], List[str]]:
    """Run `command` or watch `directory`, printing intervals to `sink`. Returns the
    exit status (None for a directory), the regions at the end, and a line per
    region file that could not be read."""
    if directory is not None:
        return (None,) + _watch_directory(directory, interval, duration, as_json, sink)
    return _watch_command(command, interval, as_json, sink)


def _watch_directory(directory: str, interval: Optional[float], duration: Optional[float],
                     as_json: bool, sink: Sink) -> Tuple[List[Region], List[str]]:
    problems: List[str] = []
    watcher = Watcher(DirectorySource(directory), problems.append)
    try:
        ticker = Ticker(watcher, interval, lambda b, a: printer(b, a))
        printer = IntervalPrinter(sink, as_json, ticker.start)
        deadline = None if duration is None else ticker.start + duration
        # Ctrl-C ends the watch between two ticks, never inside one (an interval printed
        # but not yet taken as the last would be counted again by the report)
        stop = []
        previous = signal.signal(signal.SIGINT, lambda *_: stop.append(True))
        try:
            ticker.run(lambda: bool(stop) or
                       (deadline is not None and time.monotonic() >= deadline))
        finally:
            signal.signal(signal.SIGINT, previous)
        return ticker.finish().as_regions(), problems
    finally:
        watcher.close()


def _watch_command(command: List[str], interval: Optional[float], as_json: bool,
                   sink: Sink) -> Tuple[int, List[Region], List[str]]:
    directory = region_directory()
    watcher = Watcher(DirectorySource(directory))
    try:
        ticker = Ticker(watcher, interval, lambda b, a: printer(b, a))
        printer = IntervalPrinter(sink, as_json, ticker.start)
        with interrupts_to(command, dict(os.environ, **{ENV_VAR: directory})) as process:
            ticker.run(lambda: process.poll() is not None)
            returncode = process.wait()
        ticker.finish()
        # the report reads the files as plain stat does: exact now that all are closed
        problems: List[str] = []
        return exit_status(returncode), collect(directory, problems), problems
    finally:
        watcher.close()
        remove_region_directory(directory)
