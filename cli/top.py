"""`urewrite top`: probes sorted by hits/s, refreshed in place.

On a terminal the table fills the screen (the terminal's alternate screen, as
`top` and `less` use) and is redrawn every interval; `q` or Ctrl-C quits.
Elsewhere (a pipe, a file) each refresh is printed as a plain table, with no
escape sequences. Latency columns come from the log2 histograms of functions
probed at entry and return, over the last interval: the quantile is below the
value shown.
"""

from __future__ import annotations

import os
import select
import shutil
import sys
import termios
import time
import tty
from contextlib import contextmanager
from typing import Callable, List, Optional, TextIO

from urewrite.reader.snapshots import ProbeChange, Snapshot, changes, percentile_ns


def format_ns(ns: Optional[int]) -> str:
    """'<4.19ms' for a bucket bound of 4194304 ns; '-' without samples."""
    if ns is None:
        return "-"
    for unit, scale in (("s", 10 ** 9), ("ms", 10 ** 6), ("us", 10 ** 3)):
        if ns >= scale:
            return f"<{ns / scale:.3g}{unit}"
    return f"<{ns}ns"


def sorted_rows(rows: List[ProbeChange]) -> List[ProbeChange]:
    return sorted(rows, key=lambda r: (-r.per_second, -r.total, r.key.object, r.key.name))


def table(rows: List[ProbeChange], rates: bool = True) -> List[str]:
    """The table's lines, sorted by rate (then total). Without `rates` (before the first
    interval) the rate and latency columns read '-'."""
    rows = sorted_rows(rows)
    wn = max([len(r.key.name) for r in rows] + [len("PROBE")])
    wo = max([len(r.key.object) for r in rows] + [len("OBJECT")])
    lines = [f"{'PROBE':<{wn}}  {'OBJECT':<{wo}}  {'KIND':<7} {'HITS/S':>12} {'TOTAL':>14} "
             f"{'P50':>9} {'P99':>9}"]
    for r in rows:
        rate = f"{r.per_second:.1f}" if rates else "-"
        hist = r.histogram if rates else None
        lines.append(f"{r.key.name:<{wn}}  {r.key.object:<{wo}}  {r.key.kind:<7} {rate:>12} "
                     f"{r.total:>14} {format_ns(percentile_ns(hist, 0.5)):>9} "
                     f"{format_ns(percentile_ns(hist, 0.99)):>9}")
    return lines


def built_in_maps(directory: Optional[str]) -> List[str]:
    """The lines of the maps of programs built into the probes, and of programs
    `urewrite run` loaded, kept in `directory` (docs/programs.md), as `urewrite run`
    prints them: their values so far."""
    if directory is None:
        return []
    from urewrite.reader.command_run import built_in_maps_in
    from urewrite.reader.probe_programs import loaded_maps
    from urewrite.programs.output import text
    lines = []
    for heading, found in (("the program built into the probes:", built_in_maps_in(directory)),
                           ("the program urewrite run loaded:", loaded_maps(directory))):
        for maps, _, _ in found:
            lines += ["", heading, ""] + text(maps).rstrip("\n").split("\n")
    return lines


def title(label: str, snap: Snapshot, interval: float) -> str:
    processes = len({r.pid for r in snap.regions.values()})
    untimed = " - calls untimed: no latency (--latency)" if snap.untimed() else ""
    return (f"urewrite top - {label} - {processes} process{'es' if processes != 1 else ''}, "
            f"{len(snap.totals())} probes - every {interval:g} s - "
            f"{time.strftime('%H:%M:%S')}{untimed}")


class PlainScreen:
    """Each refresh as a plain table, a blank line between refreshes."""

    def __init__(self, out: TextIO):
        self.out, self.frames = out, 0

    def show(self, lines: List[str]) -> None:
        self.out.write(("\n" if self.frames else "") + "\n".join(lines) + "\n")
        self.out.flush()
        self.frames += 1

    def wait(self, seconds: float) -> bool:
        time.sleep(seconds)
        return False


class FullScreen(PlainScreen):
    """The terminal's alternate screen, redrawn in place; `q` stops."""

    def show(self, lines: List[str]) -> None:
        size = shutil.get_terminal_size()
        lines = [line[:size.columns] for line in lines[:max(size.lines - 1, 1)]]
        self.out.write("\x1b[H" + "".join(line + "\x1b[K\n" for line in lines) + "\x1b[J")
        self.out.flush()

    def wait(self, seconds: float) -> bool:
        if self.keys is None:
            time.sleep(seconds)
            return False
        ready, _, _ = select.select([self.keys], [], [], max(seconds, 0))
        return bool(ready) and os.read(self.keys.fileno(), 1) in (b"q", b"Q")

    @contextmanager
    def active(self, keys: Optional[TextIO]):
        self.keys = keys if keys is not None and keys.isatty() else None
        saved = termios.tcgetattr(self.keys) if self.keys else None
        self.out.write("\x1b[?1049h\x1b[?25l")  # alternate screen, cursor hidden
        try:
            if self.keys:
                tty.setcbreak(self.keys)  # read `q` without Enter
            yield self
        finally:
            if saved is not None:
                termios.tcsetattr(self.keys, termios.TCSADRAIN, saved)
            self.out.write("\x1b[?25h\x1b[?1049l")
            self.out.flush()


def run_top(ticker, label: str, interval: float, done: Callable[[], bool],
            refreshes: Optional[int], out: TextIO, plain: bool) -> None:
    """Refresh until done(), `refreshes` tables, `q` or Ctrl-C. When done() ends it
    (the command exited), the last part of an interval is shown too, as a plain
    table after the full screen is gone."""
    frames: List[List[str]] = []

    directory = getattr(ticker.watcher.source, "directory", None)

    def show(before: Snapshot, after: Snapshot) -> None:
        frames.append([title(label, after, interval), ""] + table(changes(before, after))
                      + built_in_maps(directory))
        screen.show(frames[-1])

    ticker.on_interval = show
    screen = PlainScreen(out) if plain else FullScreen(out)
    if plain:
        ticks = ticker.run(done, screen.wait, refreshes)
    else:
        with screen.active(sys.stdin):
            screen.show([title(label, ticker.last, interval), ""]
                        + table(changes(ticker.last, ticker.last), rates=False))
            ticks = ticker.run(done, screen.wait, refreshes)
    if done() and (refreshes is None or ticks < refreshes):
        if not plain:
            screen = PlainScreen(out)
        ticker.finish()
