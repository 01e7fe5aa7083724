"""Where live views find regions.

A *source* names region files: a directory that processes started with
UREWRITE_DIR write into (`DirectorySource`), or the directories of processes
armed while they run (`ArmedSource`, for -p and --all). `stat --interval`, `top`
and `export` only ever see a `Watcher` (snapshots.py) over a source.
"""

from __future__ import annotations

import os
from typing import List

from urewrite.errors import UrewriteError
from urewrite.trampolines import region as R


class DirectorySource:
    """The region files in one directory (UREWRITE_DIR of the processes that write them)."""

    def __init__(self, directory: str):
        if not os.path.isdir(directory):
            raise UrewriteError(f"{directory}: no such directory")
        self.directory = directory
        self.label = directory

    def paths(self) -> List[str]:
        return region_files(self.directory)


def region_files(directory: str) -> List[str]:
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise UrewriteError(f"{directory}: {e.strerror}")
    return [os.path.join(directory, n) for n in sorted(names) if n.endswith(R.FILE_SUFFIX)]


class ArmedSource:
    """The region files of processes armed while they run (arming.py, `arming.armed`):
    each has a directory of its own, which its forked children write into too."""

    def __init__(self, processes):
        self.processes = processes
        self.label = "pid " + ",".join(str(p.pid) for p in processes)

    def paths(self) -> List[str]:
        return [path for p in self.processes for path in region_files(p.directory)]
