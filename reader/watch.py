"""Counts while processes run, handed on every interval: a command run with a fresh
region directory (as plain `stat` runs it), or a directory that processes started with
UREWRITE_DIR=DIR write into, watched until Ctrl-C or a duration (`stat --interval`,
`stat --dir`)."""

from __future__ import annotations

import signal
import time
from typing import Callable, List, Optional, Tuple

from urewrite.reader.command_run import (armed_environment, built_in_maps_in, exit_status,
                                         interrupts_to)
from urewrite.reader.directories import region_directory, remove_region_directory
from urewrite.reader.snapshots import Snapshot, Watcher
from urewrite.reader.sources import DirectorySource
from urewrite.reader.ticker import Ticker
from urewrite.trampolines.region import Region
from urewrite.trampolines.region_reader import collect

# on_interval_from(start): what to call with each interval (before, after), given the
# time.monotonic() at which the watch began
OnIntervalFrom = Callable[[float], Callable[[Snapshot, Snapshot], None]]


def watch_directory(directory: str, interval: Optional[float], duration: Optional[float],
                    on_interval_from: OnIntervalFrom) -> Tuple[List[Region], List[str]]:
    """Until Ctrl-C or `duration`: the regions at the end, and a line per region file
    that could not be read."""
    problems: List[str] = []
    watcher = Watcher(DirectorySource(directory), problems.append)
    try:
        ticker = Ticker(watcher, interval, lambda b, a: on_interval(b, a))
        on_interval = on_interval_from(ticker.start)
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


def watch_command(command: List[str], interval: Optional[float],
                  on_interval_from: OnIntervalFrom, latency: bool = False
                  ) -> Tuple[int, List[Region], List[str], list]:
    """Until the command exits: its exit status, the regions it left, a line per region
    file that could not be read, and the maps of programs built into the probes
    (probe_programs.built_in_maps). `latency`: time the calls of functions probed at
    entry and return."""
    directory = region_directory()
    watcher = Watcher(DirectorySource(directory))
    try:
        ticker = Ticker(watcher, interval, lambda b, a: on_interval(b, a))
        on_interval = on_interval_from(ticker.start)
        with interrupts_to(command, armed_environment(directory, latency)) as process:
            ticker.run(lambda: process.poll() is not None)
            returncode = process.wait()
        ticker.finish()
        # the report reads the files as plain stat does: exact now that all are closed
        problems: List[str] = []
        return exit_status(returncode), collect(directory, problems), problems, \
            built_in_maps_in(directory)
    finally:
        watcher.close()
        remove_region_directory(directory)
