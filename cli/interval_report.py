"""`urewrite stat --interval S` and `stat --dir DIR`: counts read while processes run.

With a command, stat runs it with a fresh region directory (as plain `stat` does)
and prints a table every S seconds. With `--dir DIR` it reads the regions that
processes started with UREWRITE_DIR=DIR write there, without touching them,
until Ctrl-C or `--duration`; the final report gives the hits the regions hold
(each process counts from its start). Interval lines give what happened in each
interval, like `perf stat -I`. The watch is the reading side's (reader/watch.py);
this module prints it.
"""

from __future__ import annotations

import json
from typing import List, Optional, Tuple

from urewrite.reader.snapshots import ProbeChange, Snapshot, changes
from urewrite.reader.watch import watch_command, watch_directory
from urewrite.sink import Sink
from urewrite.trampolines.region import Region


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
              duration: Optional[float], as_json: bool, sink: Sink, latency: bool = False
              ) -> Tuple[Optional[int], List[Region], List[str], Optional[list]]:
    """Run `command` or watch `directory`, printing intervals to `sink`. Returns the
    exit status (None for a directory), the regions at the end, a line per region
    file that could not be read, and the maps of programs built into a command's
    probes (None for a directory: the report reads them there)."""
    def printer(start: float) -> IntervalPrinter:
        return IntervalPrinter(sink, as_json, start)
    if directory is not None:
        return (None,) + watch_directory(directory, interval, duration, printer) + (None,)
    return watch_command(command, interval, printer, latency)
