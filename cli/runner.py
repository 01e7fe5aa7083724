"""Runs a command with its probes armed and collects the regions it leaves behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from contextlib import contextmanager
from typing import List, Tuple

from urewrite.errors import UrewriteError
from urewrite.trampolines.region import ENV_VAR, Region, read_regions


def exit_status(returncode: int) -> int:
    """A shell-style exit status: 128+N for a command ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@contextmanager
def interrupts_to(command: List[str], env: dict):
    """Start `command`; while it runs, Ctrl-C is its to handle (it is in our process
    group), and we wait for it rather than die first."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            yield subprocess.Popen(command, env=env, preexec_fn=lambda: signal.signal(
                signal.SIGINT, signal.SIG_DFL))
        except OSError as e:
            raise UrewriteError(f"cannot run {command[0]}: {e.strerror}")
    finally:
        signal.signal(signal.SIGINT, previous)


def region_directory() -> str:
    """A fresh directory for region files: in /dev/shm where it is a writable tmpfs.

    Regions are shared file mappings written on every hit. On a disk file system the
    kernel writes dirty pages back and write-protects them again, so hits would
    fault every few seconds; tmpfs pages never go to disk.
    """
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
    return tempfile.mkdtemp(prefix="urewrite-", dir=base)


def run_and_collect(command: List[str]) -> Tuple[int, List[Region], List[str]]:
    """Run `command` with a fresh region directory.

    Returns its exit status, the regions, and a line for each region file that
    could not be read.

    Every rewritten object in every process of the command writes one region
    file there. Ctrl-C reaches the command (same process group); we wait for it.
    """
    directory = region_directory()
    try:
        with interrupts_to(command, dict(os.environ, **{ENV_VAR: directory})) as process:
            returncode = process.wait()
        problems: List[str] = []
        regions = read_regions(directory, problems)
        return exit_status(returncode), regions, problems
    finally:
        shutil.rmtree(directory, ignore_errors=True)
