"""The commands: `urewrite IN -p ... -o OUT`, `urewrite list`, `urewrite stat`.

Exit status: 0 success; 1 bad input or a probe that cannot be placed; 2 bad
usage. `stat` passes through the exit status of the command it ran (128+N when
a signal N ended it; 127 when it cannot be started).
"""

from __future__ import annotations

import json
import os
import sys

import click

from urewrite import __version__, console
from urewrite.console import EXIT_ERROR, end_now, fail
from urewrite.errors import UrewriteError
from urewrite.listing import list_command, parse_tactics, progress_bar
from urewrite.live_options import check_latency, latency_option, live_options, live_or_command
from urewrite.long_options import LongOptionsCommand



class _DefaultToRewrite(click.Group):
    """`urewrite IN ...` means `urewrite rewrite IN ...`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["rewrite"] + list(args)
        return super().parse_args(ctx, args)


def run() -> None:
    """The program (console script, `python -m urewrite`): main(), whose commands may
    end the process at once (console.end_now)."""
    console.own_process()
    main(prog_name="urewrite")


def _print_share_dir(kind: str):
    """An eager option that prints the folder of the build-system files shipped in the package."""
    def callback(ctx, _param, value):
        if not value or ctx.resilient_parsing:
            return
        click.echo(os.path.join(os.path.dirname(os.path.abspath(__file__)), "share", kind))
        ctx.exit()
    return callback


@click.group(cls=_DefaultToRewrite, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="urewrite")
@click.option("--cmake-dir", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_share_dir("cmake"),
              help="Print the folder of urewrite's CMake package (urewriteConfig.cmake) and exit.")
@click.option("--bazel-dir", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_share_dir("bazel"),
              help="Print the folder of urewrite's Bazel rules (a local_repository) and exit.")
def main():
    """Pre-instrument ELF programs and libraries (x86_64, arm64) with trap-free probes.

    \b
      urewrite list app                       what can be probed, and how
      urewrite app -p handle_request -r parse -p usdt:app:query -o app.probed
      urewrite stat -- ./app.probed ARGS      run it, print hits per probe (and latencies)
      urewrite trace -- ./app.probed ARGS     run it, print every hit with its arguments
    Exit status: 0 success, 1 bad input or a probe that cannot be placed, 2 bad usage;
    stat and trace pass on the command's own.
    """


@main.command(cls=LongOptionsCommand)
@click.argument("input_file", metavar="IN", type=click.Path())  # a directory: one line, exit 1
@click.option("-p", "--probe", "probes", multiple=True, metavar="SPEC",
              help="Function name, glob ('parse_*') or address (0x401136) to probe at entry, "
                   "or a USDT probe: usdt:PROVIDER:NAME (globs allowed). Repeatable.")
@click.option("-o", "--output", metavar="OUT", help="Output file [default: IN.probed].")
@click.option("-r", "--return", "returns", multiple=True, metavar="FUNC",
              help="Function name or glob to probe at every return (and tail call); return "
                   "events carry the return value. Repeatable.")
@click.option("--args", "arg_count", type=click.IntRange(0, 6), default=0, metavar="N",
              help="Record the first N integer arguments of function-entry probes in events "
                   "(urewrite trace); a Go function's in Go's convention (list shows it). "
                   "USDT probes record their own arguments.")
@click.option("--keep-going", is_flag=True,
              help="Skip sites that cannot be patched safely even when named exactly.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
@click.option("--tactics", callback=lambda _c, _p, v: parse_tactics(v), default=None,
              metavar="LIST", help="Patch tactics to try, in order, from jump,hop,evict,pun "
                                   "[default: all].")
@click.option("--exclude", "excludes", multiple=True, metavar="GLOB",
              help="Leave out functions with a name (or USDT probes, usdt:P:N) matching GLOB, "
                   "whatever selected them. Repeatable.")
@click.option("-e", "program_text", metavar="PROGRAM",
              help="Probe what a probe program (bpftrace's language) names in IN: its "
                   "uprobe, uretprobe and usdt probes whose path is IN, OUT, their basename "
                   "or '*'; and build the program in: it runs whenever the probes "
                   "are armed (stat, UREWRITE_DIR), and stat shows its maps.")
@click.option("-f", "program_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="The same, with the program read from FILE.")
@click.option("--call", "call", metavar="FILE.c:FUNCTION",
              help="Build a C callback into every probe: FUNCTION(struct urewrite_context *) "
                   "of FILE.c (compiled here) or of an object file, run whenever the probes "
                   "are armed (trampolines/urewrite.h); stat shows its maps.")
@click.option("--call-area", type=click.IntRange(0, 1 << 20), default=64, show_default=True,
              metavar="BYTES", help="Bytes of each probe's own area for the callback "
                                    "(ctx->area), a multiple of 8.")
def rewrite(input_file, probes, returns, output, arg_count, keep_going, as_json, quiet, tactics,
            excludes, program_text, program_file, call, call_area):
    """Write a copy of IN with probes at the given sites.

    A site that cannot be patched safely is refused with the reason: an error
    when named exactly (unless --keep-going), a warning when matched by a glob.
    """
    from urewrite.api.rewriting import NothingToProbe, rewrite as run_rewrite
    from urewrite.rewriter.pipeline import no_cycle_collection

    if output == "":
        raise click.BadParameter("must name a file", param_hint="-o")
    output = output if output is not None else input_file + ".probed"
    if program_text is not None and program_file is not None:
        raise click.UsageError("give the program with -e or with -f, not both")
    if program_file is not None:
        try:
            with open(program_file, encoding="utf-8") as f:
                program_text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            fail(f"cannot read the program {program_file}: "
                 f"{getattr(e, 'strerror', None) or e}")
    with no_cycle_collection():  # (the file's analysis lives until the report is written)
        kept = []  # (the analysis, which end_now() does not free)
        try:
            result = run_rewrite(input_file, output, probes, returns, arg_count, keep_going,
                                 tactics, excludes, program_text, call=call,
                                 call_area=call_area,
                                 progress=None if quiet else progress_bar,
                                 on_note=None if quiet else _say_note, keep=kept)
        except NothingToProbe:
            raise click.UsageError("give at least one probe with -p or -r")
        except UrewriteError as e:
            fail(str(e))
        _report_rewrite(result, output, as_json, quiet)
        end_now((kept, result))


def _say_note(text: str) -> None:
    click.echo(f"urewrite: note: {text}", err=True)


def _report_rewrite(result, output: str, as_json: bool, quiet: bool) -> None:
    """The rewrite's report (an api.RewriteResult)."""
    if as_json:
        click.echo(json.dumps({
            "output": result.output,
            "probes": [{"name": p.name, "kind": p.kind, "address": p.address,
                        "displaced": p.displaced, "tactic": p.tactic} for p in result.probes],
            "tactics": result.tactics,
            # (a return probe lists one entry per exit it patched, at the exit's address)
            "refused": [{"name": r.name, "address": r.address, "reason": r.reason}
                        for r in result.refusals],
        }, indent=2))
        return
    if not quiet:
        for warning in result.warnings:
            click.echo(f"urewrite: warning: {warning}", err=True)
        for r in result.refusals:  # (a function's entry and return may both be refused)
            what = f"the return of {r.name}" if r.kind == "return" else r.name
            click.echo(f"urewrite: warning: not probing {what}: {r.reason}", err=True)
        refused = f", {len(result.refusals)} refused" if result.refusals else ""
        # (adjacent sites may share a window)
        click.echo(f"urewrite: wrote {output}: {result.probe_count} probes at "
                   f"{len(result.probes)} sites{refused}", err=True)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE, not stdout.")
@click.option("--interval", type=click.FloatRange(min=0.01), metavar="S",
              help="Also print hits and hits/s per probe every S seconds.")
@click.option("--dir", "directory", metavar="DIR", type=click.Path(file_okay=False),
              help="Read the regions of running processes started with UREWRITE_DIR=DIR "
                   "(instead of a command), until Ctrl-C or --duration.")
@latency_option
@live_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def stat(as_json, output, interval, directory, latency, pids, all_of, duration, command):
    """Run COMMAND, then print the hits of every probe in it; or arm running
    processes (-p, --all) and print their hits when they are disarmed; or read
    the regions of running processes (--dir).

    \b
      urewrite stat -- ./app.probed ARGS
      urewrite stat --latency -- ./app.probed ARGS      and a histogram per function
      urewrite stat --interval 1 -- ./app.probed ARGS
      urewrite stat -p 1234 --duration 10 [--interval 1]
      urewrite stat --dir /dev/shm/app --interval 1 --duration 10
    The command's own output is left alone; the exit status is passed through.
    """
    from urewrite import stat_report
    from urewrite.sink import Sink

    check_latency(latency, directory)
    if pids is not None or all_of is not None:
        if directory is not None:
            raise click.UsageError("-p and --all go without --dir")
        live_or_command(pids, all_of, duration, command)
        from urewrite.live_report import stat_intervals, stat_live as stat_armed
        sys.exit(stat_armed(pids, all_of, duration, as_json, output,
                            stat_report.report_saying_missed, latency)
                 if interval is None else
                 stat_intervals(pids, all_of, duration, interval, as_json, output,
                                stat_report.report_saying_missed, latency))
    if bool(command) == (directory is not None):
        raise click.UsageError("give a command (after --) or --dir DIR, not both"
                               if command else "give a command (after --), -p PID or --dir DIR")
    if duration is not None and directory is None:
        raise click.UsageError("--duration goes with --dir, -p or --all")
    if interval is None and directory is None:
        sys.exit(stat_report.run_command(list(command), as_json, output, latency))
    from urewrite.interval_report import stat_live
    sink = Sink(output, sys.stdout)
    try:
        exit_code, regions, problems, programs = stat_live(list(command), directory, interval,
                                                           duration, as_json, sink, latency)
    except UrewriteError as e:
        click.echo(f"urewrite: {e}", err=True)
        sys.exit(127 if command else EXIT_ERROR)
    sys.exit(stat_report.finish(exit_code, regions, problems, as_json, sink,
                                every_line=interval is not None, directory=directory,
                                programs=programs))


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event (JSON lines).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "perfetto"]), default=None,
              help="text [default], json (as --json), or perfetto: Chrome trace-event JSON "
                   "for ui.perfetto.dev and chrome://tracing (a slice per call of functions "
                   "probed at entry and return).")
@click.option("-o", "--output", metavar="FILE", help="Write the events to FILE, not stdout.")
@click.option("--ring", "ring_entries", type=click.IntRange(16, 1 << 22), default=1 << 16,
              metavar="N", show_default=True,
              help="Events each process can hold before the reader catches up.")
@live_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def trace(as_json, fmt, output, ring_entries, pids, all_of, duration, command):
    """Run COMMAND and print every probe hit as it happens: time, process, thread,
    probe and arguments.

    \b
      urewrite trace -- ./app.probed ARGS
      urewrite trace --json -o events.jsonl -- ./app.probed ARGS
      urewrite trace --format perfetto -o trace.json -- ./app.probed ARGS
      urewrite trace -p 1234 --duration 5
    Events a full ring could not hold are counted and reported at the end. The
    command's own output is left alone; its exit status is passed through.
    """
    from urewrite.reader.tracing import run_and_trace

    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json and --format {fmt} disagree")
    as_json = as_json or fmt == "json"
    live = live_or_command(pids, all_of, duration, command)
    if live:
        from urewrite.live_report import trace_live
    traced = trace_live(pids, all_of, duration) if live else run_and_trace
    out = open(output, "w") if output else sys.stdout
    start = []
    perfetto = None
    if fmt == "perfetto":
        from urewrite.reader.perfetto import PerfettoWriter
        perfetto = PerfettoWriter(out)

    def write(events) -> None:
        if perfetto:
            return perfetto.write(events)
        for e in events:
            if as_json:
                out.write(json.dumps({"ts_ns": e.ts_ns, "pid": e.pid, "tid": e.tid,
                                      "object": e.object, "probe": e.probe, "kind": e.kind,
                                      "args": e.args}) + "\n")
            else:
                start[:] = start or [e.ts_ns]
                args = " ".join(str(a) for a in e.args)
                out.write(f"{(e.ts_ns - start[0]) / 1e9:15.9f} {e.pid:>7} {e.tid:>7}  "
                          f"{e.object}:{e.probe}  {args}".rstrip() + "\n")
        out.flush()

    if not as_json and not perfetto:  # (seconds with nanosecond digits)
        out.write(f"{'TIME(s)':>15} {'PID':>7} {'TID':>7}  PROBE  ARGS\n")
    try:
        exit_code, rings = traced(list(command), ring_entries, write)
    except UrewriteError as e:
        click.echo(f"urewrite: {e}", err=True)
        sys.exit(EXIT_ERROR if live else 127)
    finally:
        if perfetto:
            perfetto.close()
        if output:
            out.close()
    for ring in rings:
        if ring.lost:
            click.echo(loss_message(ring), err=True)
    if not rings:
        click.echo("urewrite: no probe region was written: is the command rewritten by "
                   "urewrite (and not set-user-ID)?", err=True)
    sys.exit(exit_code)


def loss_message(ring) -> str:
    """The warning for a ring (tracing.RingSummary) that lost events."""
    why = ("the ring was full; try a larger --ring" if ring.full else
           "their threads stopped while writing them (killed, or the process exited)")
    return f"urewrite: {ring.object} (pid {ring.pid}): {ring.lost} of {ring.events} " \
           f"events lost: {why}"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on stdout.")
@click.option("--threads", "threads", default="1", metavar="LIST", show_default=True,
              help="Thread counts for scaling rows, e.g. 1,2,4: every row again with that "
                   "many threads hitting the same probe.")
@click.option("--no-kernel", is_flag=True,
              help="Skip the rows that need root and tracefs (kernel uprobes, bpftrace).")
@click.option("--iterations", type=click.IntRange(1), default=100_000_000, metavar="N",
              show_default=True, help="Calls per run (kernel and BPF rows: N/1000, at least "
                                      "10000).")
@click.option("--repeat", type=click.IntRange(1), default=5, metavar="R", show_default=True,
              help="Runs per row; the median is shown with the spread.")
@click.option("--redis", is_flag=True,
              help="Also benchmark redis-server under redis-benchmark on 127.0.0.1.")
@click.option("--redis-requests", type=click.IntRange(1), default=100_000, metavar="N",
              show_default=True, help="Requests per redis-benchmark test.")
@click.option("--rewrite-scaling", is_flag=True,
              help="Also time rewrites of a generated program with more and more probes.")
@click.option("--functions", type=click.IntRange(1), default=10_000, metavar="N",
              show_default=True,
              help="Functions in the generated program of --rewrite-scaling and --collection.")
@click.option("--no-trigger", is_flag=True,
              help="Skip the trigger bench (with --redis, --rewrite-scaling, --big, "
                   "--collection, --programs or --postgres).")
@click.option("--plot", metavar="FILE", help="Draw M hits/s per row into FILE (PNG; needs "
                                             "matplotlib).")
@click.option("--big", "big_files", multiple=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False),
              help="Also time list, one probe and every function on FILE, with peak "
                   "memory (a big program or library: node, libLLVM). Repeatable.")
@click.option("--collection", is_flag=True,
              help="Also time reading a process's counts (--functions functions probed "
                   "at entry and return) and stat over a loop of short runs.")
@click.option("--python", metavar="FILE", type=click.Path(exists=True, dir_okay=False),
              help="With --collection: also loops of 'FILE -S -c pass' with every function "
                   "probed (a python3.11), plain, armed and under stat.")
@click.option("--programs", is_flag=True,
              help="Also time probe programs (urewrite run) against the same programs "
                   "under bpftrace (--iterations calls each).")
@click.option("--postgres", is_flag=True,
              help="Also run pgbench against Debian's PostgreSQL 15: the original, the "
                   "rewrite with every USDT probe counting (stat) and keyed by probe "
                   "(run), and bpftrace's usdt probes on the original, each beside an "
                   "unprobed copy run at the same time (root only).")
@click.option("--postgres-seconds", type=click.IntRange(1), default=10, metavar="S",
              show_default=True, help="Seconds of each pgbench run of --postgres.")
def bench(as_json, threads, no_kernel, iterations, repeat, redis, redis_requests,
          rewrite_scaling, functions, no_trigger, plot, big_files, collection, python,
          programs, postgres, postgres_seconds):
    """Measure what a probe costs here: urewrite against kernel uprobes.

    \b
      urewrite bench                   build a trigger program, measure, print a table
      urewrite bench --threads 1,2     scaling rows
      urewrite bench --no-kernel       skip the rows that need root and tracefs
    Kernel uprobe events made by the bench are removed on exit, on error and on
    Ctrl-C; no other event is touched.
    """
    from urewrite import bench as bench_module

    try:
        thread_counts = bench_module.parse_threads(threads)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--threads")
    if python and not collection:
        raise click.UsageError("--python goes with --collection")
    if no_trigger and plot:
        raise click.UsageError("--plot draws the trigger bench: drop --no-trigger")
    try:
        result = bench_module.run(iterations, repeat, thread_counts, not no_kernel, redis,
                                  redis_requests, rewrite_scaling, functions, not no_trigger,
                                  big_files, collection, python, programs, postgres,
                                  postgres_seconds)
        if plot:
            bench_module.plot(result, plot)
    except UrewriteError as e:
        fail(str(e))
    except KeyboardInterrupt:
        click.echo("urewrite: bench interrupted", err=True)
        sys.exit(130)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(bench_module.format_report(result), nl=False)


def _add_live_commands() -> None:
    from urewrite.live_commands import export, top
    from urewrite.program_run import run as run_program
    main.add_command(list_command)
    main.add_command(top)
    main.add_command(export)
    main.add_command(run_program)


_add_live_commands()

if __name__ == "__main__":
    main()
