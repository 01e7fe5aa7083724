"""Counts through the API: the regions a directory holds, a command run with its
probes armed (`stat -- COMMAND`), running processes armed for a while (`stat -p`).
The reading side's own functions (reader/), with typed results."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterable, Iterator, List, Optional, Sequence, Union

from urewrite.api.results import ArmedProcesses, Bucket, CommandRun, Counts, ProbeCount
from urewrite.errors import UrewriteError


def counts_of(regions, problems: List[str], programs=()) -> Counts:
    """What `stat --json` reports of these regions (and built-in programs' maps)."""
    from urewrite.reader.counts import histogram_buckets, probe_totals

    totals, histograms = probe_totals(regions)
    probes = [ProbeCount(obj, name, kind, address, hits,
                         [Bucket(**b) for b in histogram_buckets(histograms[k])]
                         if k in histograms else None)
              for k, hits in totals.items() for obj, name, kind, address in (k,)]
    shown = []
    if programs:
        import json
        from urewrite.programs.output import json_lines
        shown = [{"maps": [json.loads(line) for line in json_lines(maps)],
                  "dropped": dropped, "faults": faults} for maps, dropped, faults in programs]
    return Counts(len({r.pid for r in regions}), probes,
                  sum(r.returns_missed for r in regions),
                  sum(r.latency_missed for r in regions), list(problems), shown)


def read_regions(directory: str) -> Counts:
    """The counts of the regions in `directory` (processes started with
    UREWRITE_DIR=DIRECTORY write them there), as `stat --json` reports them."""
    import os
    from urewrite.reader.command_run import built_in_maps_in
    from urewrite.trampolines.region_reader import collect

    if not os.path.isdir(directory):
        raise UrewriteError(f"{directory}: not a directory")
    problems: List[str] = []
    regions = collect(directory, problems)
    return counts_of(regions, problems, built_in_maps_in(directory))


def run(command: Sequence[str], *, latency: bool = False) -> CommandRun:
    """Run `command` with a fresh region directory (its probes armed), wait for it, and
    read what it counted: `stat -- COMMAND` (`latency`: `stat --latency`, calls timed).
    Ctrl-C goes to the command; its output is its own. Raises UrewriteError when it
    cannot be started."""
    from urewrite.reader.command_run import run_and_collect

    if not command:
        raise UrewriteError("give a command to run")
    exit_code, regions, problems, programs = run_and_collect([str(c) for c in command],
                                                             latency)
    return CommandRun(exit_code, counts_of(regions, problems, programs))


@contextmanager
def arm(pids: Union[None, int, Iterable[int]] = None, *, file: Optional[str] = None,
        latency: bool = False) -> Iterator[ArmedProcesses]:
    """Arm running processes for the block (`stat -p PID,...`; pids None: every process
    mapping `file`, or any rewritten object, as `--all`; `latency`: calls timed, as
    `--latency`), then disarm them and read what they counted meanwhile into the
    result's `counts`. Main thread only (it handles
    SIGTERM and SIGHUP as Ctrl-C while armed); Ctrl-C in the block disarms, reads the
    counts, and is raised again."""
    from urewrite.reader import arming

    if pids is None:
        pids_text, all_of = None, file or ""
    else:
        listed = [pids] if isinstance(pids, int) else list(pids)
        bad = [p for p in listed if not isinstance(p, int) or p <= 0]
        if bad or not listed:
            raise UrewriteError(f"not a process id: {bad[0]!r}" if bad else "no process given")
        pids_text, all_of = ",".join(map(str, listed)), None
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    session, interrupted = None, False
    try:
        with arming.armed(pids_text, all_of, None, latency=latency) as session:
            result = ArmedProcesses([p.pid for p in session.processes])
            try:
                yield result
            except KeyboardInterrupt:
                interrupted = True
        problems: List[str] = []
        regions = arming.regions_of(session.processes, problems)
        result.problems = session.problems + [f"skipped {p}" for p in problems]
        result.counts = counts_of(regions, problems)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if session is not None:
            arming.remove(session.processes)
    if interrupted:
        raise KeyboardInterrupt
