"""`urewrite run`: runs a command whose rewritten files run a probe program in their
probes, then prints the program's maps as bpftrace does (docs/programs.md)."""

from __future__ import annotations

import os
import struct
import sys
import time

import click

from urewrite.console import fail
from urewrite.errors import UrewriteError
from urewrite.live_options import live_options, live_or_command

PRINTF_RING = 1 << 16  # events a process's ring holds for printf()s


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.option("-e", "program_text", metavar="PROGRAM", help="The program (bpftrace's language).")
@click.option("-f", "program_path", metavar="FILE", type=click.Path(dir_okay=False),
              help="Read the program from FILE.")
@click.option("--json", "as_json", is_flag=True, help="Print the maps as bpftrace's -f json.")
@click.option("-o", "--output", metavar="FILE", help="Write the maps to FILE, not stdout.")
@click.option("--map-size", type=click.IntRange(1, 1 << 24), default=4096, show_default=True,
              metavar="N", help="Entries a map with keys holds (a power of two at or above "
                                "N); updates past it are dropped and counted.")
@click.option("--interval", type=click.FloatRange(min=0.01), metavar="S",
              help="Also print the maps every S seconds while the program runs.")
@click.option("--dir", "directory", metavar="DIR", type=click.Path(file_okay=False),
              help="Load the program into DIR, for the processes that start with "
                   "UREWRITE_DIR=DIR (instead of a command), until Ctrl-C or --duration.")
@click.option("--call", "call", metavar="FILE.c:FUNCTION",
              help="Instead of a program, a C callback run at every probe of the files "
                   "(trampolines/urewrite.h): of the command's program, or of --in.")
@click.option("--call-area", type=click.IntRange(0, 1 << 20), default=64, show_default=True,
              metavar="BYTES", help="Bytes of each probe's own area for the callback.")
@click.option("--in", "in_files", multiple=True, metavar="FILE", type=click.Path(dir_okay=False),
              help="A rewritten file whose probes run the callback (default: the command's "
                   "program). Repeatable.")
@live_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(program_text, program_path, as_json, output, map_size, interval, directory, call,
        call_area, in_files, pids, all_of, duration, command):
    """Run COMMAND with a probe program in the probes of its rewritten files, then print
    the program's maps.

    \b
      urewrite run -e 'uprobe:./app.probed:parse { @[arg1] = count(); }' -- ./app.probed ARGS
      urewrite run -f prog.bt -- ./app.probed ARGS
      urewrite run -f prog.bt -p 1234 --duration 10
      urewrite run -f prog.bt --dir /dev/shm/app --duration 60
      urewrite run --call hook.c:on_hit -- ./app.probed ARGS
    The probes a program names must be in the files (urewrite IN -e PROGRAM -o OUT
    rewrites a file with them). The command's own output is left alone; the exit status
    is passed through. With -p or --all, the program is loaded into running processes
    until Ctrl-C, --duration S or their exit, then unloaded, and the maps printed. With
    --dir, processes started with UREWRITE_DIR=DIR while it runs run the program.
    """
    from urewrite.programs import evaluate, output as printer

    if (program_text is None) + (program_path is None) + (call is None) != 2:
        raise click.UsageError("give the program with -e PROGRAM or -f FILE, or a callback "
                               "with --call FILE.c:FUNCTION")
    if in_files and call is None:
        raise click.UsageError("--in goes with --call (a program names its files)")
    if directory is not None:
        if command or pids is not None or all_of is not None:
            raise click.UsageError("--dir goes without a command, -p or --all")
        armed = False
    else:
        armed = live_or_command(pids, all_of, duration, command)
    if call is not None:
        checked = None
        lowered, targets = _callback(call, call_area, map_size, in_files, command)
    else:
        checked, targets, lowered = _program(program_text, program_path, command, map_size)
    blocks = checked.program.blocks if checked else []
    state = evaluate.State(checked) if checked else None
    for block in blocks:  # BEGIN, in the tracer
        if any(p.kind == "BEGIN" for p in block.probes):
            evaluate.run_block(state, block, _tracer_hit(block))
    if state is not None:
        _print(state.printed)
    ticker = _Ticker(interval, lowered, as_json)
    if directory is not None:
        returncode, found, lost = _run_in_directory(directory, duration, targets, lowered,
                                                    ticker)
    elif armed:
        returncode, found, lost = _run_armed(pids, all_of, duration, targets, lowered, ticker)
    else:
        returncode, found, lost = _run_command(command, targets, lowered, ticker)
    if state is not None:
        state.printed.clear()
        state.maps.update({m.name: m for m in found})
        for block in blocks:  # END, over what the probes gathered
            if any(p.kind == "END" for p in block.probes):
                evaluate.run_block(state, block, _tracer_hit(block))
        _print(state.printed)
    shown = list(state.maps.values()) if state is not None else found
    report = "\n".join(printer.json_lines(shown)) + "\n" if as_json else \
        ("\n\n" + printer.text(shown) if shown else "")
    if output:
        with open(output, "w") as f:
            f.write(report)
    else:
        sys.stdout.write(report)
    dropped, faults = lost
    if dropped:
        click.echo(f"urewrite: {dropped} map updates were dropped: a map with keys holds "
                   f"{max(m.capacity for m in lowered.maps)} entries (--map-size N)", err=True)
    if faults:
        click.echo(f"urewrite: {faults} memory reads found nothing to read (str() or a "
                   f"pointer read of a bad address): they gave \"\" or 0", err=True)
    sys.exit(returncode)


class _Ticker:
    """--interval S: the maps so far, every S seconds, as the end prints them."""

    def __init__(self, interval, lowered, as_json: bool):
        self.interval, self.lowered, self.as_json = interval, lowered, as_json
        self.next = time.monotonic() + interval if interval else None

    def due(self) -> bool:
        return self.next is not None and time.monotonic() >= self.next

    def each_poll(self):
        """What the runs call every poll (None without --interval): the maps, when due."""
        if self.next is None:
            return None

        def poll(maps_files) -> None:
            if self.due():
                self.show(maps_files)
        return poll

    def show(self, maps_files) -> None:
        """Print the maps the files hold now (several: added up)."""
        from urewrite.programs import output as printer
        from urewrite.reader.probe_programs import current_maps
        shown = current_maps(maps_files, self.lowered.maps)
        _print(["\n".join(printer.json_lines(shown)) + "\n" if self.as_json else
                printer.text(shown) + "\n"])
        self.next += self.interval


def _each_poll(ticker, lowered):
    """What the runs call every poll: the ticker's, and where the program reads `comm`,
    the names of threads that renamed themselves forgotten (reader/thread_names.py)."""
    shows = ticker.each_poll()
    from urewrite.trampolines.program_file import USES_COMM
    if not lowered.uses & USES_COMM:
        return shows
    from urewrite.reader.thread_names import RenamedThreads
    renamed = RenamedThreads()

    def poll(maps_files) -> None:
        renamed.poll({os.path.dirname(path) for path in maps_files})
        if shows:
            shows(maps_files)
    return poll


def _run_command(command, targets, lowered, ticker):
    """Runs the command with the program in its probes: (exit status, maps, dropped)."""
    from urewrite.reader.probe_programs import run_command

    ring, printed = _events(lowered)
    returncode, found, lost = run_command(
        command, lambda directory: _noted(printed, _write_program(directory, targets, lowered)),
        ring, printed, _each_poll(ticker, lowered), lowered.maps, _stopped(printed))
    return (0 if _stopped(printed)() else returncode), found, lost  # (exit(): bpftrace's 0)


def _run_in_directory(directory, duration, targets, lowered, ticker):
    """Loads the program into a region directory until Ctrl-C or `duration` (the
    processes that set up their probes there meanwhile run it), then unloads it:
    (0, the maps, dropped)."""
    from urewrite.reader.probe_programs import run_in_directory

    if not os.path.isdir(directory):
        fail(f"no directory {directory}")
    printed = _events(lowered)[1]
    maps_path = _noted(printed, _write_program(directory, targets, lowered))
    click.echo(f"urewrite: the program is loaded in {directory}; Ctrl-C ends", err=True)
    if _events(lowered)[0]:
        from urewrite.trampolines.region import TRACE_ENV_VAR
        click.echo(f"urewrite: printf() shows events of processes started with "
                   f"{TRACE_ENV_VAR}=N too (a ring of N events)", err=True)
    return run_in_directory(directory, maps_path, [t.tag for t in targets.values()], duration,
                            printed, _each_poll(ticker, lowered), lowered.maps,
                            _stopped(printed))


def _write_program(directory, targets, lowered) -> str:
    """The program's files in `directory` (attach.write_files): its maps file; a bad
    program or directory ends the command with one line."""
    from urewrite.programs import attach
    try:
        return attach.write_files(directory, targets, lowered, _code_of(lowered), _backend_of)
    except UrewriteError as e:
        fail(str(e))
    except FileExistsError as e:  # (another run's program, in a directory of --dir)
        fail(f"a program is loaded in {directory} already ({os.path.basename(e.filename)})")
    except OSError as e:
        fail(f"cannot write the program's files in {directory}: {e.strerror}")


def _run_armed(pids, all_of, duration, targets, lowered, ticker):
    """Loads the program into running processes until the session ends:
    (0, the maps of all of them, dropped)."""
    from urewrite.live_report import announce
    from urewrite.programs import attach
    from urewrite.reader.probe_programs import run_armed

    ring, printed = _events(lowered)

    def write_files(directory):
        try:
            return _noted(printed, attach.write_files(directory, targets, lowered,
                                                      _code_of(lowered), _backend_of))
        except OSError as e:
            raise UrewriteError(f"cannot write the program's files in {directory}: {e.strerror}")
    try:
        problems, found, lost = run_armed(pids, all_of, duration, ring, write_files,
                                          announce, printed, _each_poll(ticker, lowered),
                                          lowered.maps,
                                          _stopped(printed))
    except UrewriteError as e:
        fail(str(e))
    for problem in problems:
        click.echo(f"urewrite: warning: {problem}", err=True)
    return 0, found, lost


def _program(text, path, command, map_size):
    """The program (-e, or read from -f) checked, attached to its files and lowered:
    (checked, targets, lowered); one line where it cannot be."""
    from urewrite.programs import attach, checks, parser
    try:
        if path is not None:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError) as e:
                raise UrewriteError(f"cannot read the program {path}: "
                                    f"{getattr(e, 'strerror', None) or e}")
        checked = checks.check(parser.parse(text))
        targets = {}
        attach.attach(targets, checked.program.blocks, list(command))
        return checked, targets, attach.lower(checked, targets, map_size)
    except UrewriteError as e:
        fail(str(e))


def _callback(spec, area, map_size, in_files, command):
    """The callback built for its files (--in, else the command's program), attached to
    every probe of theirs: (the callback, the targets); one line where it cannot be."""
    from urewrite.programs import attach, callback
    import shutil
    paths = list(in_files)
    if not paths:
        program = shutil.which(command[0]) if command else None
        if program is None:
            raise click.UsageError("--call needs the rewritten files: --in FILE (or a "
                                   "command whose program is one)")
        paths = [program]
    try:
        targets = {}
        for path in paths:
            try:
                targets.setdefault(os.path.realpath(path), attach.target(path))
            except UrewriteError as e:
                if in_files or "not rewritten" not in str(e):
                    raise
                raise UrewriteError(f"--call: {path} is not rewritten by urewrite: name the "
                                    f"rewritten files with --in FILE")
        machines = {t.machine for t in targets.values()}
        if len(machines) > 1:
            raise UrewriteError("--call: the files are of different machines: one run each")
        from urewrite.api.rewriting import backend_of
        built = callback.build(spec, backend_of(machines.pop(), "callbacks"), area, map_size)
        callback.attach(built, targets)
    except UrewriteError as e:
        fail(str(e))
    return built, targets


def _events(lowered):
    """(the ring each process gets, what prints its events): a program's printf()s, or a
    callback's emitted words (none: no ring, and nothing for the tracer to poll, where
    its code cannot reach the context's event routine)."""
    if not _is_callback(lowered):
        return (PRINTF_RING if lowered.printfs else 0), _printed(lowered)
    from urewrite.programs.callback import event_line
    from urewrite.trampolines.program_file import PRINTF_PROBE, USES_EVENT
    if not lowered.uses & USES_EVENT:
        return 0, None

    def show(events):
        _print([event_line(e.args) + "\n" for e in events if e.number == PRINTF_PROBE])
    return PRINTF_RING, show


def _is_callback(lowered) -> bool:
    from urewrite.programs.callback import Callback
    return isinstance(lowered, Callback)


def _code_of(lowered):
    """write_files's `assemble`: a program's code, or a callback's."""
    if not _is_callback(lowered):
        return _program_code
    from urewrite.programs.callback import assemble
    return lambda _machine, built, offsets: assemble(built, offsets)


class _Printed:
    """Does what the events the processes' rings hold say, in time order: prints the
    printf()s, prints, clears or zeroes a map (print(), clear(), zero(): in the maps
    files in `paths`, as they are when the event is read, as bpftrace's user space
    does them), until an exit(): `exited` then, and the events after it are left."""

    def __init__(self, printfs, shapes):
        self.printfs, self.shapes, self.exited = printfs, shapes, False
        self.paths = []  # the run's maps files (one per process directory when armed)

    def __call__(self, events):
        from urewrite.programs.evaluate import printf_text
        from urewrite.programs.lower import EXIT, map_action
        from urewrite.trampolines.program_file import PRINTF_PROBE
        lines = []
        for event in events:
            index = event.number - PRINTF_PROBE
            if self.exited or not 0 <= index < len(self.printfs):
                continue
            text, kinds = self.printfs[index]
            action = map_action(text)
            if text == EXIT:
                self.exited = True
            elif action:
                lines += self.act(*action)
            else:
                lines.append(printf_text(text, printf_values(kinds, event.args)))
        _print(lines)

    def act(self, action: str, index: int, top: int = 0, div: int = 1) -> list:
        from urewrite.programs import output as printer
        from urewrite.reader.probe_programs import current_maps, reset_map
        if action == "print":
            name = self.shapes[index].name
            return [printer.text([m], top, div) for m in current_maps(self.paths, self.shapes)
                    if m.name == name]
        for path in self.paths:
            reset_map(path, self.shapes, index, forget=action == "clear")
        return []

    def wrote(self, path: str) -> str:
        """Notes a maps file the program's files were written with; its path."""
        self.paths.append(path)
        return path


def _printed(lowered):
    """A _Printed for the program's printf()s, exit()s and map actions (None when it has
    none)."""
    return _Printed(lowered.printfs, lowered.maps) if lowered.printfs else None


def _noted(printed, maps_path: str) -> str:
    """The maps file of the program's files just written, noted for its map actions."""
    return printed.wrote(maps_path) if isinstance(printed, _Printed) else maps_path


def _stopped(printed):
    """Whether the program has called exit() (run_*'s `stopped`)."""
    return lambda: isinstance(printed, _Printed) and printed.exited


def printf_values(kinds, words):
    """printf()'s values from an event's words: a string is 8 of them, a float's or a
    double's bits one."""
    from urewrite.programs import floats
    values, at = [], 0
    for kind in kinds:
        if kind == "s":
            raw = struct.pack("<8Q", *[w & (2**64 - 1) for w in (words[at:at + 8] + [0] * 8)[:8]])
            values.append(raw.split(b"\0", 1)[0].decode("utf-8", "replace"))
            at += 8
        else:
            word = words[at] if at < len(words) else 0
            values.append(floats.shown(floats.from_bits(word, floats.F32 if kind == "f32" else
                                                        floats.F64))
                          if kind in ("f32", "f64") else word)
            at += 1
    return values


def _backend_of(machine):
    from urewrite.api.rewriting import backend_of  # (loaded when a program is written)
    return backend_of(machine)


def _program_code(machine, lowered, offsets):
    from urewrite.api.rewriting import program_code  # (loaded when a program is written)
    return program_code(machine, lowered, offsets)


def _tracer_hit(block):
    from urewrite.programs.evaluate import Hit
    return Hit(block.probes[0], pid=os.getpid(), comm="urewrite", nsecs=_monotonic_ns())


def _monotonic_ns() -> int:
    import time
    return time.monotonic_ns()


def _print(lines) -> None:
    if lines:
        try:
            sys.stdout.write("".join(lines))
            sys.stdout.flush()
        except BrokenPipeError:  # (a reader such as head went away: go on, quietly)
            sys.stdout = open(os.devnull, "w")


