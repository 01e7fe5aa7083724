"""Runs a command with its probes armed (a fresh region directory, directories.py) and
collects the regions it leaves behind."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

from urewrite.errors import UrewriteError
from urewrite.reader.directories import region_directory, remove_region_directory

if TYPE_CHECKING:
    from urewrite.trampolines.region import Region

# region.ENV_VAR and LATENCY_ENV_VAR, which the runtime reads (tests/test_stat.py
# checks): region.py loads dataclasses, 8 ms before `stat -- COMMAND` could start it
ENV_VAR = "UREWRITE_DIR"
LATENCY_ENV_VAR = "UREWRITE_LATENCY"


# Variables urewrite set for itself (quiet_numpy), left out of the commands it starts
_OURS = set()
_OPENBLAS = "OPENBLAS_NUM_THREADS"


def quiet_numpy() -> None:
    """numpy's OpenBLAS starts a thread per core that spins for a while once started:
    8% of this 2-core machine's samples under `urewrite run`, beside the traced
    command; urewrite does no linear algebra. One thread then, unless the user says
    otherwise; the commands urewrite starts get the environment as it was."""
    if _OPENBLAS not in os.environ:
        os.environ[_OPENBLAS] = "1"
        _OURS.add(_OPENBLAS)


def command_environment(**extra: str) -> dict:
    """The environment a command urewrite starts gets: the user's, and `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in _OURS}
    env.update(extra)
    return env


def armed_environment(directory: str, latency: bool = False) -> dict:
    """Our environment for a command whose probes write regions into `directory`; with
    `latency`, the calls of functions probed at entry and return are timed too (else
    as the environment says: unset, they only count)."""
    env = command_environment(**{ENV_VAR: directory})
    if latency:
        env[LATENCY_ENV_VAR] = "1"
    return env


def exit_status(returncode: int) -> int:
    """A shell-style exit status: 128+N for a command ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class Spawned:
    """A command started by posix_spawn, as much of subprocess.Popen as we use (pid,
    poll, wait, terminate, returncode): no fork of this process and no `subprocess`
    import before a command starts (6 ms of `stat -- COMMAND`'s start, #37). It gets
    the signal dispositions a shell would give it: SIGINT default (we ignore it while
    it runs), SIGPIPE and SIGXFSZ default (Python ignores both, and ignored signals
    stay ignored across exec)."""

    def __init__(self, command: List[str], env: dict):
        self.pid = os.posix_spawnp(command[0], command, env,
                                   setsigdef=(signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ))
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def terminate(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


@contextmanager
def interrupts_to(command: List[str], env: dict):
    """Start `command`; while it runs, Ctrl-C is its to handle (it is in our process
    group), and we wait for it rather than die first."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            process = Spawned(command, env)
        except OSError as e:  # (only starting it: what the caller's block raises is its own)
            raise UrewriteError(f"cannot run {command[0]}: {e.strerror}")
        yield process
    finally:
        signal.signal(signal.SIGINT, previous)


class _Started:
    """A command started with a fresh region directory, until it is waited for."""

    def __init__(self, command: List[str], latency: bool):
        self.command = list(command)
        self.latency = latency
        self.directory = region_directory()
        self._interrupts = interrupts_to(self.command,
                                         armed_environment(self.directory, latency))
        try:
            self.process = self._interrupts.__enter__()
        except BaseException:
            remove_region_directory(self.directory)
            raise

    def end(self) -> int:
        """Wait for the command; its exit status (the caller removes the directory)."""
        try:
            return self.process.wait()
        finally:
            self._interrupts.__exit__(None, None, None)


_started = None  # the command start_early started, until run_and_collect takes it over


def start_early(command: List[str], latency: bool = False) -> bool:
    """Start `command` now, as run_and_collect(command) will want it (entry.py: before
    the imports of what reads and reports). False, and nothing started, when it cannot
    be: run_and_collect then tries again and says why."""
    global _started
    try:
        _started = _Started(command, latency)
    except UrewriteError:
        return False
    return True


def end_early() -> None:
    """A command started early that nothing took over: wait for it and remove its
    directory."""
    global _started
    started, _started = _started, None
    if started is not None:
        try:
            started.end()
        finally:
            remove_region_directory(started.directory)


def run_and_collect(command: List[str], latency: bool = False,
                    on_table: Optional[Callable[[str, object], None]] = None
                    ) -> Tuple[int, List[Region], List[str], list]:
    """Run `command` with a fresh region directory (or take it over, started by
    start_early).

    `latency`: time the calls of functions probed at entry and return.
    `on_table(object, table)`: called while the command runs with each probe table
    read (region_reader.ProbeTable), for work a report can do before the counts; the
    regions then may have their hits but not yet their probes (region_reader's
    probes_later).
    Returns its exit status, the regions (those of one rewrite with their counts
    added up in the first, see `region_reader.collect`), a line for each region
    file that could not be read, and the maps of programs built into the probes
    (probe_programs.built_in_maps).

    Every rewritten object in every process of the command writes one region
    file there. Ctrl-C reaches the command (same process group); we wait for it.
    """
    global _started
    if _started is not None and (_started.command, _started.latency) == (list(command),
                                                                         latency):
        started, _started = _started, None
    else:
        started = _Started(command, latency)
    try:
        try:  # the reader's imports while the command runs, not before
            from urewrite.trampolines.region_reader import TableCache, collect
            tables = TableCache()
            _prepare_while_running(started, tables, on_table)
        finally:
            returncode = started.end()
        problems: List[str] = []
        regions = collect(started.directory, problems, tables, on_table is not None)
        return exit_status(returncode), regions, problems, built_in_maps_in(started.directory)
    finally:
        remove_region_directory(started.directory)


def _prepare_while_running(started: _Started, tables, on_table=None) -> None:
    """Until the command exits, parse the probe table of each rewrite whose region
    appears, and compare each further region's with it (tables.prepare): what is left
    after it is reading the counts. They are read only then: a region is final once no
    process can write it, which a reader cannot tell from here (its pid may be another
    namespace's; a process sharing the writer's memory outlives it)."""
    try:
        pidfd = os.pidfd_open(started.process.pid)
    except (AttributeError, OSError):  # (Python before 3.9, Linux before 5.3)
        return
    import select
    from urewrite.trampolines.program_file import OWN_MAPS_PREFIX
    from urewrite.trampolines.region import FILE_SUFFIX
    try:
        done, told = set(), 0
        interval, longest = 0.005, 0.1
        renamed = None  # once a program built into the probes runs (its `comm`)
        while not select.select([pidfd], [], [], interval)[0]:
            try:
                names = os.listdir(started.directory)
            except OSError:
                return
            for name in names:
                if name not in done and name.endswith(FILE_SUFFIX) and \
                        tables.prepare(os.path.join(started.directory, name)):
                    done.add(name)
            while on_table is not None and told < len(tables.parsed):
                on_table(*tables.parsed[told])
                told += 1
            if renamed is None and any(name.startswith(OWN_MAPS_PREFIX) for name in names):
                from urewrite.reader.thread_names import RENAMED_SECONDS, RenamedThreads
                renamed, longest = RenamedThreads(), RENAMED_SECONDS
            if renamed is not None:
                renamed.poll([started.directory])
            # (a loop of thousands of runs: a listing of thousands each time, 1 to 2 ms;
            # at most every 0.1 s, so that most regions are compared before the end)
            interval = min(2 * interval, longest)
    finally:
        os.close(pidfd)


def built_in_maps_in(*directories: str) -> list:
    """The built-in programs' maps, loading their readers only where there are some."""
    from urewrite.trampolines.program_file import OWN_MAPS_PREFIX
    found = []
    for directory in directories:
        try:
            if any(n.startswith(OWN_MAPS_PREFIX) for n in os.listdir(directory)):
                found.append(directory)
        except OSError:
            continue
    if not found:
        return []
    from urewrite.reader.probe_programs import built_in_maps
    return built_in_maps(*found)
