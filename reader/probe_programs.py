"""Where a probe program runs (`urewrite run`), and what it gathered: a command run with
the program's files in its region directory, the program loaded into a directory for the
processes that start there meanwhile (--dir), or into running processes (-p, --all).

While it runs, every POLL_SECONDS, the events of the printf() ring of each directory go to
`on_events` (in time order, a directory at a time) and `each_poll(maps files)` is called;
either may be None. The end reads the maps files: (maps, (updates dropped, reads that
faulted)). The caller writes the program's files (`write_files(directory)`: the path of
its maps file) and prints.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, Optional, Tuple

from urewrite.programs import maps
from urewrite.reader import arming
from urewrite.reader.command_run import command_environment, exit_status, interrupts_to
from urewrite.reader.directories import region_directory, remove_region_directory
from urewrite.reader.tracing import POLL_SECONDS, sweep_rings
from urewrite.trampolines import program_file
from urewrite.trampolines.region import ENV_VAR, TRACE_ENV_VAR
from urewrite.trampolines.ring import Event, RingReader

OnEvents = Optional[Callable[[List[Event]], None]]
EachPoll = Optional[Callable[[List[str]], None]]


def read_maps(path: str, shapes) -> tuple:
    """What the processes of a run put in the maps file at `path` and in their own
    beside it (trampolines/program_file.py, maps.RUN.UID.PID), added up: (the maps, updates
    dropped, memory reads that faulted). A user's file that is not the run's maps is
    left out: its processes ran no program."""
    with open(path, "rb") as f:
        area = f.read()
    found, dropped = maps.read(area, shapes)
    contents, faults = [found], maps.faults(area)
    for own in _own_maps(path, maps.run_of(area)):
        try:
            with open(own, "rb") as f:
                theirs = f.read()
            gathered, lost = maps.read(theirs, shapes)
        except (OSError, ValueError):
            continue
        if maps.run_of(theirs) == maps.run_of(area):
            contents.append(gathered)
            dropped += lost
            faults += maps.faults(theirs)
    return (maps.merge(contents) if len(contents) > 1 else found), dropped, faults


def reset_map(path: str, shapes, index: int, forget: bool) -> None:
    """clear(@m) (`forget`) or zero(@m) in the maps file at `path` and the processes' own
    beside it (maps.reset); a file that is not the run's maps is left alone."""
    import mmap
    with open(path, "rb") as f:
        run = maps.run_of(f.read(16))
    for name in [path] + _own_maps(path, run):
        try:
            with open(name, "r+b") as f:
                area = mmap.mmap(f.fileno(), 0)
            try:
                if maps.run_of(area) == run:
                    maps.reset(area, shapes, index, forget)
            finally:
                area.close()
        except (OSError, ValueError):
            continue


def _own_maps(path: str, run: int) -> List[str]:
    """The processes' own maps files of run `run` beside the maps file at `path`."""
    directory = os.path.dirname(path)
    prefix = program_file.own_maps_name(run, 0)[:-1]
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    return [os.path.join(directory, name) for name in names
            if name.startswith(prefix) and _own_suffix(name[len(prefix):])]


def _own_suffix(text: str) -> bool:
    """UID.PID: a process's own maps file's name past maps.RUN."""
    parts = text.split(".")
    return len(parts) == 2 and all(p.isdigit() for p in parts)


def built_in_maps(*directories: str) -> List[tuple]:
    """The maps of the programs built into the probes (pipeline.rewrite's `built_in`)
    that processes left in `directories`: the files the maps' head describes, each run's
    added up: [(its maps, updates dropped, reads that faulted)]. A file that is not a
    maps area is left out (any user may create files in a shared directory)."""
    return _maps_by_run(directories, loaded=False)


def loaded_maps(*directories: str) -> List[tuple]:
    """The same, of the programs `urewrite run` loaded into `directories` (TAG.maps, the
    tracer's, and its processes' own): what `top` and `export` show while it runs."""
    return _maps_by_run(directories, loaded=True)


def _maps_by_run(directories, loaded: bool) -> List[tuple]:
    by_run: Dict[int, list] = {}
    tracers = set()  # runs whose maps a tracer made (TAG.maps): loaded, not built in
    seen = set()  # (device, inode): TAG.maps is one file under each tag
    for directory in directories:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            own = name.startswith(program_file.OWN_MAPS_PREFIX)
            parts = name[len(program_file.OWN_MAPS_PREFIX):].split(".") if own else []
            if own and (not parts[0].isdigit() or not _own_suffix(".".join(parts[1:]))):
                continue
            if not own and not name.endswith(program_file.MAPS_SUFFIX):
                continue
            try:
                with open(os.path.join(directory, name), "rb") as f:
                    identity = os.fstat(f.fileno())
                    if (identity.st_dev, identity.st_ino) in seen:
                        continue
                    seen.add((identity.st_dev, identity.st_ino))
                    area = f.read()
                shapes = maps.shapes_of(area)
                found, dropped = maps.read(area, shapes)
            except (OSError, ValueError):
                continue
            run = maps.run_of(area)
            if own and run != int(parts[0]):
                continue
            if not own:
                tracers.add(run)
            by_run.setdefault(run, []).append((found, dropped, maps.faults(area)))
    return [(maps.merge([m for m, _, _ in parts]), sum(d for _, d, _ in parts),
             sum(f for _, _, f in parts)) for run, parts in sorted(by_run.items())
            if (run in tracers) == loaded]


def current_maps(paths: List[str], shapes) -> list:
    """The maps the files (and the processes' own beside them) hold now, added up; a file not
    readable (yet) is left out."""
    contents = []
    for path in paths:
        try:
            contents.append(read_maps(path, shapes)[0])
        except (OSError, ValueError):
            continue
    return maps.merge(contents)


def _close(readers: Dict[str, RingReader]) -> None:
    for reader in readers.values():
        reader.close()


def run_command(command: List[str], write_files: Callable[[str], str], ring_entries: int,
                on_events: OnEvents, each_poll: EachPoll, shapes,
                stopped: Callable[[], bool] = lambda: False) -> Tuple[int, list, tuple]:
    """Runs the command with the program in its probes (and a printf() ring of
    `ring_entries` events in each process when not 0): (exit status, maps, lost).
    When `stopped()` says so (the program's exit()), the command gets SIGTERM, as
    bpftrace's -c command does."""
    directory = region_directory()
    try:
        maps_path = write_files(directory)
        env = command_environment(**{ENV_VAR: directory})
        if ring_entries:  # printf()s come back as events of the processes' rings
            env[TRACE_ENV_VAR] = str(ring_entries)
        readers: Dict[str, RingReader] = {}
        try:
            with interrupts_to(list(command), env) as process:
                while (on_events or each_poll) and process.poll() is None:
                    if on_events:
                        sweep_rings([directory], readers, on_events, final=False)
                    if stopped():
                        process.terminate()
                        break
                    if each_poll:
                        each_poll([maps_path])
                    time.sleep(POLL_SECONDS)
                returncode = process.wait()
            if on_events:
                sweep_rings([directory], readers, on_events, final=True)
        finally:
            _close(readers)
        found, dropped, faults = read_maps(maps_path, shapes)
    finally:
        remove_region_directory(directory)
    return exit_status(returncode), found, (dropped, faults)


def run_in_directory(directory: str, maps_path: str, tags: List[str],
                     duration: Optional[float], on_events: OnEvents, each_poll: EachPoll,
                     shapes, stopped: Callable[[], bool] = lambda: False
                     ) -> Tuple[int, list, tuple]:
    """The program (its files written in `directory`) stays loaded there until Ctrl-C
    or `duration`: every process that sets up its probes there meanwhile
    (UREWRITE_DIR) runs it; then it is unloaded (the files of `tags` removed):
    (0, the maps, lost). Processes still running keep it mapped, but what they add
    after that is not read. `stopped()` ends it too (the program's exit())."""
    readers: Dict[str, RingReader] = {}
    end = time.monotonic() + duration if duration is not None else None
    try:
        try:
            while (end is None or time.monotonic() < end) and not stopped():
                if on_events:
                    sweep_rings([directory], readers, on_events, final=False)
                if each_poll:
                    each_poll([maps_path])
                time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            pass
        if on_events:
            sweep_rings([directory], readers, on_events, final=True)
        found, dropped, faults = read_maps(maps_path, shapes)
    finally:
        _close(readers)
        with open(maps_path, "rb") as f:  # (the processes' own maps too: the directory stays)
            for own in _own_maps(maps_path, maps.run_of(f.read(16))):
                os.unlink(own)
        for tag in tags:  # (unloaded: processes that start now run none)
            for suffix in (program_file.PROGRAM_SUFFIX, program_file.MAPS_SUFFIX):
                try:
                    os.unlink(os.path.join(directory, tag + suffix))
                except FileNotFoundError:
                    pass
    return 0, found, (dropped, faults)


def run_armed(pids, all_of, duration, ring_entries: int, write_files: Callable[[str], str],
              on_armed: Callable[[List[arming.LiveProcess]], None], on_events: OnEvents,
              each_poll: EachPoll, shapes, stopped: Callable[[], bool] = lambda: False
              ) -> Tuple[List[str], list, tuple]:
    """Loads the program into running processes (write_files puts it in each one's
    directory before it is armed) until the session ends, or `stopped()` (the
    program's exit(): the processes run on, unloaded): (the session's problems, the
    maps of all of them added up, lost)."""
    maps_files: Dict[str, str] = {}  # directory -> its maps file

    def prepare(directory: str) -> None:
        maps_files[directory] = write_files(directory)
    session, readers = None, {}
    try:
        with arming.armed(pids, all_of, duration, ring_entries, prepare) as session:
            if not session.interrupted:
                on_armed(session.processes)
            while not session.over() and not stopped():
                for p in session.processes:
                    if on_events:
                        sweep_rings([p.directory], readers, on_events, final=False)
                if each_poll:
                    each_poll([maps_files[p.directory] for p in session.processes])
                time.sleep(POLL_SECONDS)
        contents, dropped, faults = [], 0, 0
        for p in session.processes:
            if on_events:
                sweep_rings([p.directory], readers, on_events, final=True)
            found, lost, faulted = read_maps(maps_files[p.directory], shapes)
            contents.append(found)
            dropped += lost
            faults += faulted
    finally:
        _close(readers)
        if session is not None:
            arming.remove(session.processes)
    return session.problems, maps.merge(contents), (dropped, faults)
