"""The options of `stat` and `trace` that arm running processes (reader/arming.py)."""

from __future__ import annotations

import click


def live_options(f):
    """-p PID, --all [FILE], --duration S: arm running processes (reader/arming.py)."""
    f = click.option("--duration", type=click.FloatRange(min=0), metavar="S",
                     help="With -p or --all: disarm after S seconds [default: at Ctrl-C, or "
                          "when the processes exit]. With --dir: stop after S seconds (0: "
                          "read once now).")(f)
    return arm_options(f)


def arm_options(f):
    """-p PID, --all [FILE] (export has a --duration of its own)."""
    f = click.option("--all", "all_of", is_flag=False, flag_value="-", default=None,
                     metavar="[FILE]", help="Arm every running process that maps an object "
                                            "rewritten by urewrite (or FILE).")(f)
    return click.option("-p", "--pid", "pids", metavar="PID[,PID...]",
                        help="Arm these running processes instead of running COMMAND; "
                             "disarm them at the end.")(f)


def latency_option(f):
    """--latency: stat, top and export time calls only when asked (two clock reads a call)."""
    return click.option("--latency", is_flag=True,
                        help="Also time every call of the functions probed at entry and "
                             "return, into a latency histogram each (two clock reads a "
                             "call); without it they are only counted.")(f)


def check_latency(latency: bool, directory) -> None:
    if latency and directory is not None:
        raise click.UsageError("--latency goes with a command, -p or --all: processes "
                               "started with UREWRITE_DIR time their calls when started "
                               "with UREWRITE_LATENCY=1 too")


def live_or_command(pids, all_of, duration, command) -> bool:
    if pids is not None and all_of is not None:
        raise click.UsageError("-p and --all exclude each other")
    live = pids is not None or all_of is not None
    if live and command:
        raise click.UsageError("give COMMAND or -p/--all, not both")
    if not live and not command:
        raise click.UsageError("missing COMMAND (or -p PID, --all)")
    if duration is not None and not live:
        raise click.UsageError("--duration goes with -p or --all")
    return live
