"""Arms the probes of running processes, reads them, and disarms them (stat/trace -p).

The process is never stopped, signalled or ptrace-attached. Each rewritten object
it maps has state memory (docs/design.md, "Live arming"); its `.urewrite.live`
section (trampolines/live_note.py) says where. Through /proc/PID/mem we write a
region directory (and, for trace, a ring size) there, then turn the state word
from 1 (disarmed) to 0 (not set up): the next hit sets up a region in that
directory, on the runtime's own lazy set-up path. To disarm we store 1 again.
A region is never unmapped (a thread may be writing it): one mapping per arm
cycle stays in the process.

An open /proc/PID/mem stays bound to the address space it was opened on: after
an exec or an exit, reads and writes through it fail and never reach the new
image. One tracer per process: an abstract socket named after the process is the
lock, freed by the kernel however the tracer ends.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional

from urewrite.errors import UrewriteError
from urewrite.reader.directories import made_here, region_directory, remove_region_directory
from urewrite.trampolines import live_note
from urewrite.trampolines.region import FILE_SUFFIX, read_region
from urewrite.trampolines.region_reader import collect_paths, region_paths

DISARMED, NOT_SET_UP = 1, 0
POLL_SECONDS = 0.01
SET_UP_WAIT = 5.0  # seconds a set-up in progress may take before we give up waiting
DIR_PREFIX = "urewrite-live-"


class LiveError(UrewriteError):
    pass


class Gone(Exception):
    """The process exited or exec'd: its old address space is no longer there."""


PERMISSION = ("permission denied: arming a running process needs the right to ptrace it "
              "(root or CAP_SYS_PTRACE, or the same user where Yama's ptrace_scope allows)")


class ProcessMemory:
    """/proc/PID/mem, opened once: every access reaches the address space it was opened on."""

    def __init__(self, pid: int):
        try:
            self.fd = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:
            raise LiveError(f"pid {pid}: {PERMISSION}")
        except FileNotFoundError:
            raise LiveError(f"pid {pid}: no such process")

    def read(self, address: int, size: int) -> bytes:
        try:
            data = os.pread(self.fd, size, address)
        except OSError as e:
            raise Gone() from e
        if len(data) != size:
            raise Gone()
        return data

    def write(self, address: int, data: bytes) -> None:
        try:
            done = os.pwrite(self.fd, data, address)
        except OSError as e:
            raise Gone() from e
        if done != len(data):
            raise Gone()

    def u64(self, address: int) -> int:
        return struct.unpack("<Q", self.read(address, 8))[0]

    def put_u64(self, address: int, value: int) -> None:
        self.write(address, struct.pack("<Q", value))

    def cstring(self, address: int, limit: int) -> bytes:
        return self.read(address, limit).split(b"\0", 1)[0]

    def close(self) -> None:
        os.close(self.fd)


_notes: Dict[tuple, Optional[live_note.LiveNote]] = {}


def _note_of(pid: int, path: str, inode: int) -> Optional[live_note.LiveNote]:
    """The descriptor of a mapped file, read through the process's own view of the file
    system; None for a file urewrite did not rewrite (or rewrote without one)."""
    key = (path, inode)
    if key not in _notes:
        note = None
        for candidate in (f"/proc/{pid}/root{path}", path):
            try:
                if os.stat(candidate).st_ino != inode:
                    continue  # replaced on disk since it was mapped
                note = live_note.read(candidate)
                break
            except OSError:
                continue
        _notes[key] = note
    return _notes[key]


@dataclass
class MappedObject:
    path: str
    note: live_note.LiveNote
    bias: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def at(self, field_name: str) -> int:
        return self.note.state + self.bias + self.note.offsets[field_name]


def read_maps(pid: int) -> List[tuple]:
    """(start, file offset, inode, path) of each file mapping of the process."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except PermissionError:
        raise LiveError(f"pid {pid}: {PERMISSION}")
    except (FileNotFoundError, ProcessLookupError):
        raise LiveError(f"pid {pid}: no such process")
    maps = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and parts[4] != "0":
            maps.append((int(parts[0].split("-")[0], 16), int(parts[2], 16), int(parts[4]),
                         parts[5]))
    return maps


def mapped_objects(pid: int, memory: Optional[ProcessMemory] = None,
                   only: Optional[tuple] = None) -> List[MappedObject]:
    """The rewritten objects the process has loaded (`only`: the inode and base name of
    one file). With `memory`, each is checked in place: the runtime's first word holds
    its own link-time address, so a file merely mapped as data is not taken for one."""
    objects, seen = [], set()
    for start, offset, inode, path in read_maps(pid):
        if offset != 0 or (path, inode) in seen:
            continue
        if only is not None and only != (inode, os.path.basename(path)):
            continue
        note = _note_of(pid, path, inode)
        if note is None:
            continue
        obj = MappedObject(path, note, start - note.file_delta)
        if memory is not None:
            try:
                if memory.u64(note.link_table + obj.bias) != note.link_table:
                    continue
            except Gone:
                continue
        seen.add((path, inode))
        objects.append(obj)
    return objects


def start_time(pid: int) -> str:
    """The process's start time in clock ticks: with the pid, names one process for good."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        raise LiveError(f"pid {pid}: no such process")


class TracerLock:
    """One tracer per process: an abstract unix socket named after it, bound while we
    hold it (the kernel frees the name however we end)."""

    def __init__(self, pid: int, started: str):
        self.name = f"\0urewrite-live/{pid}/{started}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.bind(self.name)
            self.sock.listen(16)
        except OSError as e:
            self.sock.close()
            if e.errno != errno.EADDRINUSE:
                raise LiveError(f"pid {pid}: cannot take the tracer lock: {e.strerror}")
            holder = self._holder()
            by = f" (urewrite pid {holder})" if holder else ""
            raise LiveError(f"pid {pid} is armed by another urewrite tracer{by}: one tracer "
                            f"per process; stop that one first")

    def _holder(self) -> Optional[int]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(1)
                probe.connect(self.name)
                cred = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                        struct.calcsize("3i"))
                return struct.unpack("3i", cred)[0]
        except OSError:
            return None

    def close(self) -> None:
        self.sock.close()


@dataclass
class ArmedObject:
    obj: MappedObject
    saved: Dict[str, bytes]  # the bytes our writes replaced, restored at disarm
    stale_increments: int = 0  # semaphore increments of a tracer that died armed


@dataclass
class LiveProcess:
    """One process we armed, with the directory its regions go to."""

    pid: int
    directory: str
    memory: ProcessMemory
    lock: Optional[TracerLock]
    objects: List[ArmedObject] = field(default_factory=list)
    gone: bool = False

    def alive(self) -> bool:
        if self.gone:
            return False
        try:
            self.memory.read(self.objects[0].obj.at("region"), 8)
            return True
        except Gone:
            self.gone = True
            return False


def _region_directory(pid: int) -> str:
    """A fresh directory for one process's regions, that the process can write (when we
    are root, whatever user it is or becomes, as for `stat` of a command: see
    directories.region_directory), in a holder named after it."""
    return region_directory(f"{DIR_PREFIX}{pid}-")


def _check_armable(pid: int, memory: ProcessMemory, obj: MappedObject) -> Optional[str]:
    """None when the object is ready to be armed; the directory of a tracer that died
    while it was armed (we hold the lock, so no live tracer armed it): we take it over.
    Raises when it is armed by its environment."""
    state = memory.u64(obj.at("region"))
    if state == NOT_SET_UP and not memory.u64(obj.at("started")):
        raise LiveError(f"pid {pid}: {obj.name} has not started its runtime yet; try again")
    if state > DISARMED:
        where = memory.cstring(obj.at("dir"), obj.note.offsets["dir_max"] + 1).decode(
            errors="replace")
        if made_here(where, f"{DIR_PREFIX}{pid}-"):
            return where
        raise LiveError(f"pid {pid}: {obj.name} is armed already: it writes its region to "
                        f"{where} (UREWRITE_DIR when it started); read it there")
    return None


def arm(pid: int, ring_entries: int = 0, only: Optional[tuple] = None,
        prepare: Optional[Callable[[str], None]] = None, latency: bool = False
        ) -> LiveProcess:
    """Arms every rewritten object the process maps (`only`: those of one file).
    `prepare(directory)` puts what the set-up reads there first (a probe program);
    `latency`: time the calls of functions probed at entry and return (an object
    rewritten before this could be asked times them always)."""
    maps_first = mapped_objects(pid, only=only)  # a clear error before asking for more
    if not maps_first:
        what = "maps no object rewritten by urewrite" if only is None else \
            "does not map that file"
        raise LiveError(f"pid {pid} {what}")
    lock = TracerLock(pid, start_time(pid))
    memory = None
    try:
        memory = ProcessMemory(pid)
        objects = mapped_objects(pid, memory, only)
        if not objects:
            raise LiveError(f"pid {pid} maps no object rewritten by urewrite")
        stale = [_check_armable(pid, memory, obj) for obj in objects]
        directory = _region_directory(pid)
        process = LiveProcess(pid, directory, memory, lock)
        path = directory.encode() + b"\0"
        try:
            if prepare is not None:
                prepare(directory)
            for obj, dead_tracer in zip(objects, stale):
                if len(path) > obj.note.offsets["dir_max"]:
                    raise LiveError(f"{directory}: too long a directory")
                saved = {"dir": memory.read(obj.at("dir"), len(path)),
                         "dir_too_long": memory.read(obj.at("dir_too_long"), 1),
                         "ring_entries": memory.read(obj.at("ring_entries"), 8)}
                timed = "latency" in obj.note.offsets
                if timed:
                    saved["latency"] = memory.read(obj.at("latency"), 1)
                if dead_tracer:  # nothing of the program's to keep; its set-up's
                    saved["dir"] = b"\0" * len(path)  # semaphore increment to undo too
                    saved["ring_entries"] = bytes(8)
                    if timed:
                        saved["latency"] = b"\0"
                    remove_region_directory(dead_tracer)
                process.objects.append(ArmedObject(obj, saved, int(bool(dead_tracer))))
                # what the set-up reads first, then the state word that makes it run
                memory.write(obj.at("dir"), path)
                memory.write(obj.at("dir_too_long"), b"\0")
                memory.put_u64(obj.at("ring_entries"), ring_entries)
                if timed:
                    memory.write(obj.at("latency"), b"\1" if latency else b"\0")
                memory.put_u64(obj.at("region"), NOT_SET_UP)
        except BaseException:
            for armed in process.objects:  # undo what was armed before the failure
                try:
                    _disarm_one(process, armed)
                except Gone:
                    break
            remove_region_directory(directory)
            raise
        return process
    except Gone:
        lock.close()
        memory.close()
        raise LiveError(f"pid {pid}: the process exited")
    except BaseException:
        lock.close()
        if memory is not None:
            memory.close()
        raise


def _quiesce(memory: ProcessMemory, obj: MappedObject) -> bool:
    """Stores 1 in the state word until no set-up is in progress and it stays 1 (a
    thread that began setting up before our store publishes its region after it),
    twice in a row, 5 ms apart. False when a set-up did not finish in time."""
    deadline = time.monotonic() + SET_UP_WAIT
    settled = 0
    while True:
        memory.put_u64(obj.at("region"), DISARMED)
        if memory.u64(obj.at("setup_lock")) == 0 and memory.u64(obj.at("region")) == DISARMED:
            settled += 1
            if settled == 2:  # once more after a pause: a set-up claimed as we looked
                return True
            time.sleep(0.005)
            continue
        settled = 0
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)


def _set_up_here(directory: str, pid: int, tag: str) -> bool:
    """Whether the process set up a region of this object in our directory (its USDT
    semaphores were then enabled once more)."""
    for name in os.listdir(directory):
        if name.startswith(f"{tag}.{pid}") and name.endswith(FILE_SUFFIX):
            try:
                if read_region(os.path.join(directory, name)).pid == pid:
                    return True
            except Exception:  # noqa: BLE001 (a region never filled in)
                continue
    return False


def _semaphores_down(memory: ProcessMemory, obj: MappedObject, times: int) -> None:
    """Undo the set-up's increments of the probed USDT semaphores (as tracers that
    enable them through /proc/PID/mem do: not atomic against another such tracer)."""
    table = obj.note.semaphores + obj.bias
    count = memory.u64(table)
    for k in range(min(count, 4096)):
        at = memory.u64(table + 8 + 8 * k) + obj.bias
        value = struct.unpack("<H", memory.read(at, 2))[0]
        memory.write(at, struct.pack("<H", max(0, value - times)))


def _disarm_one(process: LiveProcess, armed: ArmedObject) -> List[str]:
    memory, obj = process.memory, armed.obj
    problems = []
    if not _quiesce(memory, obj):
        problems.append(f"pid {process.pid}: {obj.name}: a set-up did not finish within "
                        f"{SET_UP_WAIT:.0f} s; it may stay armed")
    for name, data in armed.saved.items():
        memory.write(obj.at(name), data)
    times = int(_set_up_here(process.directory, process.pid, obj.note.tag)) + \
        armed.stale_increments
    if times:
        _semaphores_down(memory, obj, times)
    return problems


def disarm(process: LiveProcess) -> List[str]:
    """Disarms the process, and any child it forked while armed that set up a region in
    its directory. Returns lines of problems."""
    problems = []
    for armed in process.objects:
        try:
            problems += _disarm_one(process, armed)
        except Gone:
            process.gone = True
            break
    for child in _forked_children(process):
        problems += child
    process.memory.close()
    if process.lock:
        process.lock.close()
    return problems


def _forked_children(process: LiveProcess):
    """Children forked while armed inherit the directory (the state page is cleared in a
    child, the rest is not) and set up a region there at their first hit: disarm them,
    restoring what the parent had."""
    pids = set()
    for name in os.listdir(process.directory):
        if not name.endswith(FILE_SUFFIX):  # (regions only: TAG.PID[-N].ure)
            continue
        try:
            pids.add(int(name[:-len(FILE_SUFFIX)].rsplit(".", 1)[1].split("-")[0]))
        except (ValueError, IndexError):
            continue
    for pid in sorted(pids - {process.pid}):
        try:
            memory = ProcessMemory(pid)
        except (LiveError, OSError):  # (gone since)
            continue
        child = LiveProcess(pid, process.directory, memory, None)
        try:
            tags = {a.obj.note.tag: a for a in process.objects}
            for obj in mapped_objects(pid, memory):
                armed = tags.get(obj.note.tag)
                # (only a process writing to our directory: a file's name is no proof,
                # any user's process may create files there)
                if armed is not None and memory.cstring(
                        obj.at("dir"), obj.note.offsets["dir_max"] + 1) == \
                        process.directory.encode():
                    yield _disarm_one(child, ArmedObject(obj, armed.saved, 0))
        except (Gone, LiveError):
            pass
        finally:
            memory.close()


def parse_pids(text: str) -> List[int]:
    try:
        pids = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise LiveError(f"-p {text}: expected PID[,PID...]")
    if not pids or any(p <= 0 for p in pids):
        raise LiveError(f"-p {text}: expected PID[,PID...]")
    return pids


def processes_mapping(path: Optional[str]) -> List[int]:
    """Every process (that we may inspect) mapping a rewritten object, or the file."""
    only = None
    if path is not None:
        try:
            st = os.stat(path)
            note = live_note.read(path)
        except OSError as e:
            raise LiveError(f"{path}: {e.strerror}")
        if note is None:
            raise LiveError(f"{path}: not rewritten by urewrite (or by a version without "
                            f"live arming)")
        only = (st.st_ino, os.path.basename(path))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if mapped_objects(int(entry), only=only):
                found.append(int(entry))
        except (LiveError, OSError):
            continue
    return found


@dataclass
class Session:
    """The processes armed, a line per problem, and when to stop (see `over`)."""
    processes: List[LiveProcess]
    problems: List[str]
    deadline: Optional[float] = None  # time.monotonic() at which --duration ends
    interrupted: bool = False  # Ctrl-C (or SIGTERM, SIGHUP) came while arming

    def over(self) -> bool:
        """The duration ended, Ctrl-C came while arming, or every process has exited."""
        return self.interrupted or \
            (self.deadline is not None and time.monotonic() >= self.deadline) or \
            not any(p.alive() for p in self.processes)


def _stop_signals():
    """SIGTERM and SIGHUP end the session as Ctrl-C does (we disarm first)."""
    def raise_interrupt(*_):
        raise KeyboardInterrupt
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_interrupt)


def _targets(pids_text: Optional[str], all_of: Optional[str]) -> tuple:
    """(pids, the (inode, base name) of the one file to arm or None) of -p or --all."""
    if all_of is None:
        return parse_pids(pids_text or ""), None
    file = None if all_of in ("", "-") else all_of
    pids = processes_mapping(file)
    if not pids:
        raise LiveError("no running process maps " + (
            file if file else "an object rewritten by urewrite"))
    return pids, None if file is None else (os.stat(file).st_ino, os.path.basename(file))


@contextmanager
def armed(pids_text: Optional[str], all_of: Optional[str], duration: Optional[float],
          ring_entries: int = 0, prepare: Optional[Callable[[str], None]] = None,
          latency: bool = False) -> Iterator[Session]:
    """Arms the processes for the block, then disarms them, however it ends. Ctrl-C
    in the block ends it as `session.over()` does; the regions stay for the caller to
    read (arming.remove deletes them) unless the block failed. A process we cannot arm
    is an error (after disarming the others) for -p; --all skips processes we may not
    inspect. Every reader of armed processes (stat, trace, top, export) runs here."""
    pids, only = _targets(pids_text, all_of)
    session = Session([], [])
    _stop_signals()
    finished = False
    try:
        try:
            for pid in pids:
                try:
                    session.processes.append(arm(pid, ring_entries, only, prepare, latency))
                except LiveError as e:
                    if all_of is None:
                        raise
                    session.problems.append(str(e))  # --all: arm the others
            if not session.processes:
                problems = session.problems
                raise LiveError(problems[0] if len(problems) == 1 else
                                f"no process could be armed ({len(problems)} refused)")
        except KeyboardInterrupt:
            session.interrupted = True
        if duration is not None:
            session.deadline = time.monotonic() + duration
        try:
            yield session
        except KeyboardInterrupt:
            pass
        finished = True
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # never half disarmed
        try:
            for process in session.processes:
                session.problems += disarm(process)
            time.sleep(POLL_SECONDS)  # hits already past the check land in the region
        finally:
            signal.signal(signal.SIGINT, previous)
            if not finished:
                remove(session.processes)


def run(pids_text: Optional[str], all_of: Optional[str], duration: Optional[float],
        ring_entries: int, on_armed: Callable[[List[LiveProcess]], None],
        on_poll: Callable[[List[LiveProcess], bool], None], latency: bool = False
        ) -> Session:
    """Arms the processes, calls on_poll every POLL_SECONDS until the session is over
    (or Ctrl-C), and disarms them."""
    with armed(pids_text, all_of, duration, ring_entries, latency=latency) as session:
        if not session.interrupted:
            on_armed(session.processes)
        while True:
            on_poll(session.processes, False)
            if session.over():
                break
            time.sleep(POLL_SECONDS)
    return session


def regions_of(processes: List[LiveProcess], problems: List[str]):
    return collect_paths([path for p in processes for path in region_paths(p.directory)],
                         problems)


def remove(processes: List[LiveProcess]) -> None:
    for p in processes:
        remove_region_directory(p.directory)
