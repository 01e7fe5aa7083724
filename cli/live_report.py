"""`stat -p`, `trace -p`, `top -p` and `export -p`: a live session (reader/arming.py)
with the usual reports, or a live view (reader/snapshots.py) of the armed processes."""

from __future__ import annotations

import json
import signal
import sys
from typing import Callable, List, Optional

import click

from urewrite.errors import UrewriteError
from urewrite.reader import arming
from urewrite.reader.snapshots import Watcher
from urewrite.reader.sources import ArmedSource

EXIT_ERROR = 1


def announce(processes: List[arming.LiveProcess]) -> None:
    """One line on stderr once every process is armed (scripts wait for it)."""
    what = ", ".join(f"{p.pid} ({', '.join(a.obj.name for a in p.objects)})" for p in processes)
    click.echo(f"urewrite: armed pid {what}; Ctrl-C to disarm", err=True)


def _warn(problems: List[str]) -> None:
    for problem in problems:
        click.echo(f"urewrite: warning: {problem}", err=True)


def view_armed(pids, all_of, duration,
               during: Callable[[Watcher, Callable[[], bool]], None],
               after: Optional[Callable[[Watcher], None]] = None, latency: bool = False) -> int:
    """Arms the processes, runs during(watcher, over) on their regions while they are
    armed (`over()`: --duration ended or every process exited; Ctrl-C ends it too),
    disarms them, then calls after(watcher) on what they hold. Returns the exit status.
    `latency`: they time the calls of functions probed at entry and return."""
    session, watcher, problems = None, None, []
    try:
        with arming.armed(pids, all_of, duration, latency=latency) as session:
            watcher = Watcher(ArmedSource(session.processes), problems.append)
            if not session.interrupted:
                announce(session.processes)
                during(watcher, session.over)
        if after is not None:
            after(watcher)
    except UrewriteError as e:
        click.echo(f"urewrite: {e}", err=True)
        return EXIT_ERROR
    finally:
        if watcher is not None:
            watcher.close()
        if session is not None:
            arming.remove(session.processes)
    _warn(session.problems + [f"skipped {p}" for p in problems])
    return 0


def stat_intervals(pids, all_of, duration, interval: float, as_json: bool, output,
                   report: Callable, latency: bool = False) -> int:
    """`stat -p --interval`: a table every S seconds while armed, then the report of
    the last snapshot, taken after disarming: the intervals add up to it."""
    from urewrite.interval_report import IntervalPrinter
    from urewrite.reader.ticker import Ticker
    from urewrite.sink import Sink

    sink = Sink(output, sys.stdout)
    ticker = None

    def during(watcher: Watcher, over: Callable[[], bool]) -> None:
        nonlocal ticker
        ticker = Ticker(watcher, interval, lambda b, a: printer(b, a), from_zero=True)
        printer = IntervalPrinter(sink, as_json, ticker.start)
        # Ctrl-C, SIGTERM and SIGHUP end the watch between two ticks, never inside one
        # (an interval printed but not yet taken as the last would be printed again)
        stop = []
        saved = {sig: signal.signal(sig, lambda *_: stop.append(True))
                 for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            ticker.run(lambda: bool(stop) or over())
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)

    def after(_watcher: Watcher) -> None:
        regions = ticker.finish().as_regions() if ticker else []
        text = report(0, regions, as_json)
        sink.write(json.dumps(json.loads(text)) + "\n" if as_json else text)
        if not regions:
            click.echo("urewrite: no probe was hit while armed", err=True)

    try:
        return view_armed(pids, all_of, duration, during, after, latency)
    finally:
        sink.close()


def stat_live(pids, all_of, duration, as_json: bool, output, report: Callable,
              latency: bool = False) -> int:
    """Arms, waits, disarms, then prints the hits the processes made while armed (and
    those of children they forked meanwhile). Returns the exit status."""
    session = None
    try:
        session = arming.run(pids, all_of, duration, 0, announce, lambda *_: None, latency)
        problems: List[str] = []
        regions = arming.regions_of(session.processes, problems)
        from urewrite.reader.command_run import built_in_maps_in
        programs = built_in_maps_in(*sorted({p.directory for p in session.processes}))
    except UrewriteError as e:
        click.echo(f"urewrite: {e}", err=True)
        return EXIT_ERROR
    finally:
        if session is not None:
            arming.remove(session.processes)
    _warn(session.problems + [f"skipped {p}" for p in problems])
    text = report(0, regions, as_json, programs)
    if output:
        with open(output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    if not regions:
        click.echo("urewrite: no probe was hit while armed", err=True)
    return 0


def trace_live(pids, all_of, duration):
    """A stand-in for tracing.run_and_trace that traces running processes."""
    from urewrite.reader.tracing import trace_armed
    return trace_armed(pids, all_of, duration, announce, _warn)
