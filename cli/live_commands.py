"""The click commands `urewrite top` and `urewrite export`; `commands.py` adds them
to the group. The screen is top.py's; the reading is the reading side's (reader/:
sources.py, ticker.py, prometheus.py, arming.py)."""

from __future__ import annotations

import sys
import time
from typing import Tuple

import click

from urewrite.console import fail
from urewrite.errors import UrewriteError
from urewrite.live_options import arm_options, check_latency, latency_option


def _source_options(f):
    """Where the regions come from: --dir DIR, or processes armed while they run."""
    f = arm_options(f)
    return click.option("--dir", "directory", metavar="DIR", type=click.Path(file_okay=False),
                        help="Read the regions of processes started with UREWRITE_DIR=DIR.")(f)


def _armed(pids, all_of) -> bool:
    if pids is not None and all_of is not None:
        raise click.UsageError("-p and --all exclude each other")
    return pids is not None or all_of is not None


def parse_listen(text: str) -> Tuple[str, int]:
    """'127.0.0.1:9464', ':9464' (every IPv4 address), '[::1]:9464' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r}: expected ADDR:PORT, such as 127.0.0.1:9464")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


def _deadline(duration):
    """done() for --duration S (never done without one)."""
    end = None if duration is None else time.monotonic() + duration
    return lambda: end is not None and time.monotonic() >= end



@click.command(context_settings={"ignore_unknown_options": True})
@_source_options
@click.option("--interval", "-d", type=click.FloatRange(min=0.05), default=1.0, metavar="S",
              show_default=True, help="Seconds between refreshes.")
@click.option("-n", "--iterations", "refreshes", type=click.IntRange(min=1), metavar="N",
              help="Stop after N refreshes.")
@click.option("--once", is_flag=True, help="One refresh (-n 1).")
@click.option("--plain", is_flag=True,
              help="Print each refresh as a plain table (the default when stdout is not a "
                   "terminal).")
@click.option("--duration", type=click.FloatRange(min=0), metavar="S",
              help="With --dir, -p or --all: stop after S seconds (-p, --all: then disarm).")
@latency_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def top(directory, pids, all_of, interval, refreshes, once, plain, duration, latency, command):
    """Probes sorted by hits/s, refreshed in place: hits/s, total, and (--latency) p50/p99
    latency for functions probed at entry and return.

    \b
      urewrite top -p 1234                    arm a running process; disarm on exit
      urewrite top --dir /dev/shm/app         processes started with UREWRITE_DIR=/dev/shm/app
      urewrite top -- ./app.probed ARGS       run the command, watch it until it exits
      urewrite top --dir DIR --once | cat     one plain table after one interval
    q or Ctrl-C quits (-p, --all: and disarms; so does the processes' exit). With a
    command, its exit status is passed through.
    """
    from urewrite.reader.command_run import armed_environment, exit_status, interrupts_to
    from urewrite.reader.directories import region_directory, remove_region_directory
    from urewrite.reader.snapshots import Watcher
    from urewrite.reader.sources import DirectorySource
    from urewrite.reader.ticker import Ticker
    from urewrite.top import run_top

    check_latency(latency, directory)
    armed = _armed(pids, all_of)
    if bool(command) + (directory is not None) + armed != 1:
        raise click.UsageError("give one of: a command (after --), --dir DIR, -p PID, --all")
    if duration is not None and command:
        raise click.UsageError("--duration goes with --dir, -p or --all")
    refreshes = 1 if once else refreshes
    plain = plain or not sys.stdout.isatty()
    if armed:
        from urewrite.live_report import view_armed

        def during(watcher, over):
            ticker = Ticker(watcher, interval, None, from_zero=True)
            run_top(ticker, watcher.source.label, interval, over, refreshes, sys.stdout, plain)
        sys.exit(view_armed(pids, all_of, duration, during, latency=latency))
    problems = []
    if directory is not None:
        try:
            watcher = Watcher(DirectorySource(directory), problems.append)
            ticker = Ticker(watcher, interval, None)
            try:
                run_top(ticker, directory, interval, _deadline(duration), refreshes,
                        sys.stdout, plain)
            except KeyboardInterrupt:
                pass
        except UrewriteError as e:
            fail(str(e))
        for problem in problems:
            click.echo(f"urewrite: warning: skipped {problem}", err=True)
        return
    run_dir = region_directory()
    try:
        ticker = Ticker(Watcher(DirectorySource(run_dir)), interval, None)
        with interrupts_to(list(command), armed_environment(run_dir, latency)) as process:
            run_top(ticker, command[0], interval, lambda: process.poll() is not None,
                    refreshes, sys.stdout, plain)
            returncode = process.wait()
    except UrewriteError as e:
        click.echo(f"urewrite: {e}", err=True)
        sys.exit(127)
    finally:
        remove_region_directory(run_dir)
    sys.exit(exit_status(returncode))


@click.command()
@_source_options
@click.option("--listen", metavar="ADDR:PORT", required=True,
              help="Where to serve /metrics: 127.0.0.1:9464, :9464 (every address), "
                   "[::1]:9464; port 0 picks a free one.")
@click.option("--duration", type=click.FloatRange(min=0), metavar="S",
              help="Stop after S seconds [default: until Ctrl-C; -p, --all: or until the "
                   "processes exit, then disarm].")
@latency_option
def export(directory, pids, all_of, listen, duration, latency):
    """Serve the probes' counts as Prometheus metrics, read at every scrape.

    \b
      urewrite export -p 1234 --listen 127.0.0.1:9464     arm a running process
      urewrite export --dir /dev/shm/app --listen 127.0.0.1:9464
    A counter per probe (urewrite_probe_hits_total), a histogram per function probed
    at entry and return (urewrite_probe_latency_seconds; -p, --all: with --latency),
    the event ring's counters.
    """
    from urewrite.reader.prometheus import serve
    from urewrite.reader.sources import DirectorySource

    check_latency(latency, directory)
    armed = _armed(pids, all_of)
    if (directory is not None) == armed:
        raise click.UsageError("give --dir DIR (the UREWRITE_DIR of the processes to "
                               "export), -p PID or --all" if not armed else
                               "give --dir DIR or -p/--all, not both")
    try:
        host, port = parse_listen(listen)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--listen")

    def serving(source, over) -> None:
        with serve(source, host, port,
                   lambda m: click.echo(f"urewrite: warning: skipped {m}", err=True)) as url:
            click.echo(f"urewrite: serving {url} (regions of {source.label})", err=True)
            try:
                while not over():
                    time.sleep(0.1)
            except KeyboardInterrupt:
                pass
    if armed:
        from urewrite.live_report import view_armed
        sys.exit(view_armed(pids, all_of, duration, lambda w, over: serving(w.source, over),
                            latency=latency))
    try:
        serving(DirectorySource(directory), _deadline(duration))
    except UrewriteError as e:
        fail(str(e))
