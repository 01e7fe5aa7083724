"""The program's entry point (the `urewrite` script, `python -m urewrite`).

`urewrite stat [--json] [-o FILE] [--latency] -- COMMAND...` starts COMMAND first, then reads and
reports without loading the command line (click and the commands: 0.04 to 0.1 s of
CPU beside a loop of short runs of 0.4 s, #37). Any other form of the command line,
anything this does not recognise for certain, or a COMMAND that cannot be started,
goes the usual way (click).
"""

import os
import sys
from typing import List, NamedTuple, Optional


class StatCommand(NamedTuple):
    command: List[str]
    as_json: bool
    output: Optional[str]
    latency: bool = False


def stat_command(args: List[str]) -> Optional[StatCommand]:
    """`args` as stat's options would be, when they are `stat`, then only --json,
    --latency and -o/--output FILE (the last one counts, as in click), then `--` and
    COMMAND; else None. tests/test_stat.py holds it to what click parses."""
    if len(args) < 3 or args[0] != "stat":
        return None
    as_json, output, latency = False, None, False
    i = 1
    while i < len(args):
        arg = args[i]
        if arg == "--":
            command = args[i + 1:]
            return StatCommand(command, as_json, output, latency) if command else None
        if arg == "--json":
            as_json, i = True, i + 1
        elif arg == "--latency":
            latency, i = True, i + 1
        elif arg in ("-o", "--output") and i + 1 < len(args) \
                and not args[i + 1].startswith("-"):
            output, i = args[i + 1], i + 2
        elif arg.startswith("--output=") and len(arg) > len("--output="):
            output, i = arg[len("--output="):], i + 1
        else:
            return None
    return None


def run() -> None:
    from urewrite.reader import command_run
    command_run.quiet_numpy()
    stat = stat_command(sys.argv[1:])
    if stat:
        if command_run.start_early(stat.command, stat.latency):
            try:
                from urewrite.stat_report import run_command
                _exit_now(run_command(stat.command, stat.as_json, stat.output, stat.latency))
            except (EOFError, KeyboardInterrupt, BrokenPipeError) as e:
                _as_click_would(e)
            finally:
                command_run.end_early()  # (run_command took it over: nothing left to do)
    from urewrite.commands import run as run_commands
    run_commands()


def _exit_now(status: int) -> None:
    """Exits once the output is out, without the interpreter's teardown: freeing the
    objects of a report of 20,000 probes and a last collection took 9 ms after a loop
    of short runs (#37). Nothing is left to do at exit: the command was waited for and
    its region directory removed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _as_click_would(e: BaseException) -> None:
    """Ends as click's main() ends on these: Ctrl-C (once the command has exited) prints
    'Aborted!', a closed stdout ends quietly; status 1 either way."""
    import click
    from click.utils import PacifyFlushWrapper
    if isinstance(e, BrokenPipeError):
        sys.stdout = PacifyFlushWrapper(sys.stdout)
        sys.stderr = PacifyFlushWrapper(sys.stderr)
    else:
        click.echo(file=sys.stderr)
        click.echo("Aborted!", file=sys.stderr)
    sys.exit(1)
