"""Runs a command with event tracing on (or arms running processes with a ring), and
streams its probes' events."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

from urewrite.reader import arming
from urewrite.reader.command_run import command_environment, exit_status, interrupts_to
from urewrite.reader.directories import region_directory, remove_region_directory
from urewrite.trampolines.region import ENV_VAR, FILE_SUFFIX, TRACE_ENV_VAR
from urewrite.trampolines.ring import Event, RingReader, open_ring

POLL_SECONDS = 0.01


@dataclass
class RingSummary:
    object: str
    pid: int
    events: int  # written by the process
    lost: int  # of those, not delivered
    full: bool  # some were lost for want of room (else: never finished)

    @classmethod
    def of(cls, reader: RingReader) -> "RingSummary":
        return cls(reader.info.object, reader.info.pid, reader.head(), reader.lost(),
                   reader.was_full())


def sweep_rings(directories: List[str], readers: Dict[str, RingReader],
                on_events: Callable[[List[Event]], None], final: bool) -> None:
    """Open the rings that appeared in `directories` (readers: path -> reader, kept
    across sweeps), and pass their new events, in time order, to `on_events`."""
    for directory in directories:
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if name.endswith(FILE_SUFFIX) and path not in readers:
                reader = open_ring(path)
                if reader is not None and reader.has_ring:
                    readers[path] = reader
                elif reader is not None:
                    reader.close()
    batch = [e for r in readers.values() for e in r.poll(final=final)]
    if batch:
        on_events(sorted(batch, key=lambda e: e.ts_ns))


def run_and_trace(command: List[str], ring_entries: int,
                  on_events: Callable[[List[Event]], None]) -> Tuple[int, List[RingSummary]]:
    """Run `command`; pass each batch of events, in time order, to `on_events` while
    it runs and once more after it exits. Returns its exit status and a summary per
    ring."""
    directory = region_directory()
    readers: Dict[str, RingReader] = {}

    def sweep(final: bool) -> None:
        sweep_rings([directory], readers, on_events, final)

    try:
        env = command_environment(**{ENV_VAR: directory, TRACE_ENV_VAR: str(ring_entries)})
        with interrupts_to(command, env) as process:
            while process.poll() is None:
                sweep(final=False)
                time.sleep(POLL_SECONDS)
        sweep(final=True)
        return exit_status(process.returncode), [RingSummary.of(r) for r in readers.values()]
    finally:
        for reader in readers.values():
            reader.close()
        remove_region_directory(directory)


def trace_armed(pids, all_of, duration, on_armed: Callable, on_problems: Callable):
    """A stand-in for run_and_trace that traces running processes (-p, --all):
    on_armed(processes) once they are armed, on_problems(lines) after the last sweep."""
    def run_and_trace(_command, ring_entries: int, on_events):
        readers: Dict[str, RingReader] = {}

        def sweep(processes, final: bool) -> None:
            sweep_rings([p.directory for p in processes], readers, on_events, final)

        session = None
        try:
            session = arming.run(pids, all_of, duration, ring_entries, on_armed, sweep)
            sweep(session.processes, True)
            on_problems(session.problems)
            return 0, [RingSummary.of(r) for r in readers.values()]
        finally:
            for reader in readers.values():
                reader.close()
            if session is not None:
                arming.remove(session.processes)
    return run_and_trace
