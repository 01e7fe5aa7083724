"""Kernel uprobes, the rows urewrite is compared with: tracefs writes, finding
(and mounting) tracefs, uprobe events that clean up after themselves, file offsets
for them, and bpftrace counting programs."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence

from urewrite.bench.common import RUN_TIMEOUT, BenchError, clean_env, log

TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
# how long cleanup keeps trying to remove an instance or event the kernel calls busy: on a
# machine where other uprobes are being taken down (each waits for an RCU grace period),
# 5 s was not always enough. While another process keeps adding and removing uprobes, the
# instance stays busy as long as that goes on (seen past 30 s): cleanup then warns with
# the command that removes it
CLEANUP_SECONDS = 30


# -- kernel uprobes through tracefs --------------------------------------------------------

def tracefs_write(path: str, line: str) -> None:
    """Append to a tracefs file. Not open(path, "a"): Python seeks to the end, which
    tracefs refuses; and never O_TRUNC, which would clear every uprobe event."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def find_tracefs(mount: bool = True) -> str:
    """The tracefs folder with uprobe_events, mounting tracefs when it is not; or a
    BenchError with the reason it cannot be used."""
    if os.geteuid() != 0:
        raise BenchError("needs root")
    for d in TRACEFS_DIRS:
        if os.path.exists(os.path.join(d, "uprobe_events")):
            break
    else:
        d = TRACEFS_DIRS[0]
        if not (mount and os.path.isdir(d)):
            raise BenchError(f"tracefs is not mounted and {d} does not exist")
        proc = subprocess.run(["mount", "-t", "tracefs", "nodev", d], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise BenchError(f"tracefs is not mounted and mounting it on {d} failed: "
                             f"{proc.stderr.strip()}")
        log(f"mounted tracefs on {d}")
        if not os.path.exists(os.path.join(d, "uprobe_events")):
            raise BenchError("this kernel has no uprobe events (CONFIG_UPROBE_EVENTS)")
    events = os.path.join(d, "uprobe_events")
    try:
        os.close(os.open(events, os.O_WRONLY | os.O_APPEND))
    except OSError as e:
        raise BenchError(f"{events} cannot be opened for writing: {e.strerror}")
    return d


class KernelEvents:
    """Uprobe events made through tracefs, in a group of their own (urwbench_<pid>).

    Every event made is recorded and removed in __exit__, which runs on success,
    on error and on Ctrl-C (SIGINT and SIGTERM are held off while it cleans up).
    Only `-:group/name` lines for recorded events are ever written: no other event
    is touched. Enabled events record into a tracing instance of the same name
    (removed too), so the global trace buffer is left alone.
    """

    def __init__(self, tracefs: str, group: Optional[str] = None):
        self.tracefs = tracefs
        self.group = group or f"urwbench_{os.getpid()}"
        self.created: List[str] = []
        self.enabled: set = set()
        self.paths: Dict[str, str] = {}
        self.instance: Optional[str] = None

    @property
    def events_file(self) -> str:
        return os.path.join(self.tracefs, "uprobe_events")

    def __enter__(self) -> "KernelEvents":
        instance = os.path.join(self.tracefs, "instances", self.group)
        try:
            os.mkdir(instance)
            self.instance = instance
        except OSError:
            self.instance = None  # events then record into the top-level buffer
        return self

    def add(self, name: str, path: str, offset: int, ret: bool = False) -> str:
        """A uprobe (or uretprobe) at a file offset of `path`; returns its name."""
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name in self.created:
            raise ValueError(f"bad or duplicate event name {name!r}")
        path = os.path.realpath(path)
        self.created.append(name)  # first: an interrupt after the write still removes it
        self.paths[name] = path
        try:
            tracefs_write(self.events_file,
                          f"{'r' if ret else 'p'}:{self.group}/{name} {path}:{offset:#x}\n")
        except OSError as e:
            self.created.remove(name)
            raise BenchError(f"cannot add uprobe event {self.group}/{name} at {path}:"
                             f"{offset:#x}: {e.strerror}")
        return name

    def _enable_file(self, name: str) -> str:
        root = self.instance or self.tracefs
        return os.path.join(root, "events", self.group, name, "enable")

    def enable(self, name: str) -> None:
        tracefs_write(self._enable_file(name), "1")
        self.enabled.add(name)

    def disable(self, name: str) -> None:
        tracefs_write(self._enable_file(name), "0")
        self.enabled.discard(name)

    def hits(self, name: str) -> int:
        """The event's hits so far, from uprobe_profile."""
        path = self.paths[name]
        with open(os.path.join(self.tracefs, "uprobe_profile")) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[-2] == name and parts[0] == path:
                    return int(parts[-1])
        raise BenchError(f"uprobe_profile has no line for {self.group}/{name}")

    def leftovers(self) -> List[str]:
        """Lines of uprobe_events that belong to this group (none after __exit__)."""
        with open(self.events_file) as f:
            return [line.strip() for line in f if f":{self.group}/" in line]

    def __exit__(self, *exc) -> None:
        held = {signal.SIGINT, signal.SIGTERM}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            self.cleanup()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def cleanup(self) -> None:
        for name in list(self.enabled):
            with contextlib.suppress(OSError):
                self.disable(name)
        deadline = time.monotonic() + CLEANUP_SECONDS
        if self.instance:
            # (busy while a reader still has a file of it open)
            problem = until_done(lambda: os.rmdir(self.instance), deadline)
            if problem:
                log(f"warning: could not remove the tracing instance {self.instance} "
                    f"({problem}): remove it with: rmdir {self.instance}")
            self.instance = None
        failed = []
        for name in self.created:
            # (busy while a process that used it is still exiting)
            problem = until_done(
                lambda: tracefs_write(self.events_file, f"-:{self.group}/{name}\n"), deadline)
            if problem:
                failed.append(f"{self.group}/{name} ({problem})")
        self.created = []
        if failed:
            log(f"warning: could not remove uprobe events {', '.join(failed)}: remove them "
                f"with: echo '-:GROUP/NAME' >> {self.events_file}")


def until_done(remove, deadline: float) -> Optional[str]:
    """Call remove() until it succeeds, or finds nothing to remove, or the deadline
    passes (then: why not, from its last try; one try at least)."""
    while True:
        try:
            remove()
            return None
        except FileNotFoundError:
            return None
        except OSError as e:
            if time.monotonic() >= deadline:
                return e.strerror or str(e)
            time.sleep(0.1)


# -- where a uprobe goes -------------------------------------------------------------------

def function_offsets(path: str, names: Sequence[str]) -> Dict[str, int]:
    """File offsets of the named functions (symbol table or dynamic symbols)."""
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.rewriter.functions import discover
    elf = ElfFile.open(path)
    by_name = {n: fn.address for fn in discover(elf) for n in fn.names}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise BenchError(f"{path}: no function named {', '.join(missing)}")
    return {n: elf.offset_of(by_name[n]) for n in names}


# -- bpftrace ------------------------------------------------------------------------------

def bpftrace_unavailable() -> Optional[str]:
    if shutil.which("bpftrace") is None:
        return "bpftrace not installed"
    if os.geteuid() != 0:
        return "needs root"
    return None


def bpftrace_probe(binary: str, trigger: str, kind: str) -> str:
    if trigger == "usdt":
        return f"usdt:{binary}:trigger:usdt"
    return f"{'uretprobe' if kind == 'return' else 'uprobe'}:{binary}:trigger_{trigger}"


def run_bpftrace(probe: str, command: Sequence[str]) -> tuple:
    """Run `command` under a bpftrace program counting `probe`: (its stdout, the count).

    bpftrace starts the command itself once its probe is attached (-c). It runs in
    a session of its own, which is killed, bpftrace and command both, however this
    returns."""
    if any(" " in c for c in command):
        raise BenchError(f"bpftrace -c cannot run a path with spaces: {command[0]}")
    proc = subprocess.Popen(["bpftrace", "-e", f"{probe} {{ @c = count(); }}",
                             "-c", " ".join(command)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    errors = [line for line in err.splitlines()
              if line.strip() and "RLIMIT_MEMLOCK" not in line]
    if proc.returncode != 0:
        raise BenchError(f"bpftrace failed (exit {proc.returncode}): "
                         f"{errors[0] if errors else 'no message'}")
    count = re.search(r"^@c: (\d+)$", out, re.M)
    program = [line for line in out.splitlines()
               if line.strip() and not line.startswith(("@", "Attaching"))]
    return "\n".join(program), int(count.group(1)) if count else 0
