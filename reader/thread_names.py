"""Threads that renamed themselves after a probe program learnt their name.

A program's `comm` is the thread's name as the runtime learnt it (prctl PR_GET_NAME) the
first time the thread needed it, kept beside its owner entry (docs/region.md): no system
call a hit. A thread that renames itself later (pthread_setname_np) would keep the old
name, where bpftrace reads the kernel's at every hit. So while a program that reads
`comm` runs (`urewrite run`; `stat -- COMMAND` where a program is built into the
probes), the tracer compares each learnt name with the kernel's
(/proc/PID/task/TID/comm) every RENAMED_SECONDS and clears the first byte of one that
differs: the thread learns its name again at its next read. A hit that read the name
as it was cleared sees a first byte of 0 and learns it then (the runtimes'
`program_comm` and `run_program`), so no hit gets half a name. Hits between a rename and
the next comparison still have the old name.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Iterable, Set

from urewrite.trampolines import region as R
from urewrite.trampolines.region_reader import read_header, region_paths

RENAMED_SECONDS = 0.1


class RenamedThreads:
    """forget_renamed every RENAMED_SECONDS at most, over the polls of a run; the
    regions of exited processes remembered between them."""

    def __init__(self):
        self.gone: Set[str] = set()
        self.due = time.monotonic()

    def poll(self, directories: Iterable[str]) -> None:
        if time.monotonic() >= self.due:
            forget_renamed(directories, self.gone)
            self.due = time.monotonic() + RENAMED_SECONDS


def forget_renamed(directories: Iterable[str], gone: Set[str]) -> int:
    """Clears the learnt name of each thread of these directories' regions that the
    kernel now names otherwise; how many were cleared. A region that cannot be
    written (another user's) or read is left alone; one whose process has exited is
    added to `gone` and not looked at again (a run over a build leaves thousands)."""
    cleared = 0
    for directory in directories:
        try:
            paths = region_paths(directory)
        except OSError:
            continue
        for path in paths:
            if path in gone:
                continue
            try:
                cleared += _forget_in(path, gone)
            except (OSError, R.RegionError):
                continue
    return cleared


def _forget_in(path: str, gone: Set[str]) -> int:
    fd = os.open(path, os.O_RDWR)
    try:
        header = read_header(fd, path, os.fstat(fd).st_size)
        if header.pid and not os.path.exists(f"/proc/{header.pid}"):
            gone.add(path)
            return 0
        owners = os.pread(fd, header.slots * R.OWNER_ENTRY_SIZE, header.owners_off)
        names_at = header.owners_off + header.slots * R.OWNER_ENTRY_SIZE
        names = os.pread(fd, header.slots * R.COMM_SIZE, names_at)
        cleared = 0
        for k in range(min(len(owners) // R.OWNER_ENTRY_SIZE, len(names) // R.COMM_SIZE)):
            thread, = struct.unpack_from("<Q", owners, k * R.OWNER_ENTRY_SIZE)
            tid, = struct.unpack_from("<I", owners, k * R.OWNER_ENTRY_SIZE + R.OWNER_TID)
            learnt = names[k * R.COMM_SIZE:(k + 1) * R.COMM_SIZE].split(b"\0", 1)[0]
            if not (thread and tid and learnt):
                continue
            try:
                with open(f"/proc/{header.pid}/task/{tid}/comm", "rb") as f:
                    now = f.read().rstrip(b"\n")
            except OSError:  # (gone, or not ours to see: the next thread learns its own)
                continue
            if now != learnt:
                os.pwrite(fd, b"\0", names_at + k * R.COMM_SIZE)
                cleared += 1
        return cleared
    finally:
        os.close(fd)
