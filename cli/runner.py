"""Runs a command with its probes armed and collects the regions it leaves behind."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from contextlib import contextmanager
from typing import List, Tuple

from urewrite.errors import UrewriteError
from urewrite.trampolines.region import ENV_VAR, Region


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
            process = subprocess.Popen(command, env=env, preexec_fn=lambda: signal.signal(
                signal.SIGINT, signal.SIG_DFL))
        except OSError as e:  # (only starting it: what the caller's block raises is its own)
            raise UrewriteError(f"cannot run {command[0]}: {e.strerror}")
        yield process
    finally:
        signal.signal(signal.SIGINT, previous)


SHM = "/dev/shm"
HOLDER_PREFIX = "urewrite-"


def region_base() -> str:
    return SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK | os.X_OK) else \
        tempfile.gettempdir()


def region_directory(prefix: str = HOLDER_PREFIX) -> str:
    """A fresh directory for region files: in /dev/shm where it is a writable tmpfs.

    Regions are shared file mappings written on every hit. On a disk file system the
    kernel writes dirty pages back and write-protects them again, so hits would
    fault every few seconds; tmpfs pages never go to disk.

    It is a randomly named directory inside a fresh holder (remove both with
    `remove_region_directory`). Run by root, the command's processes may become
    other users (setpriv, runuser, servers that drop privileges): the directory then
    lets every user create files but not list, rename or delete other users' (mode
    1733, like /tmp without the listing), and the holder lets others pass through but
    not list it (0711), so only processes given its path (UREWRITE_DIR) find it. Each
    region is created 0600 by its process, as its user: no other user can read it.
    The reader (trampolines/region_reader.py) trusts nothing in it.
    """
    holder = tempfile.mkdtemp(prefix=prefix, dir=region_base())  # 0700, ours
    directory = os.path.join(holder, secrets.token_hex(16))
    os.mkdir(directory, 0o700)
    if os.geteuid() == 0:
        os.chmod(directory, 0o1733)
        os.chmod(holder, 0o711)
    return directory


def made_here(directory: str, prefix: str = HOLDER_PREFIX) -> bool:
    """Whether `directory` is one `region_directory(prefix)` made: in a holder of that
    name in our base, a real directory (not a symlink someone planted) and ours."""
    holder = os.path.dirname(os.path.normpath(directory))
    if os.path.dirname(holder) != region_base() or \
            not os.path.basename(holder).startswith(prefix):
        return False
    try:
        st = os.lstat(holder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def remove_region_directory(directory: str) -> None:
    """Remove a directory made by `region_directory`, its holder and whatever the
    processes left in it (without following any symlink they left)."""
    if made_here(directory):
        shutil.rmtree(os.path.dirname(os.path.normpath(directory)), ignore_errors=True)
    else:
        shutil.rmtree(directory, ignore_errors=True)


def run_and_collect(command: List[str]) -> Tuple[int, List[Region], List[str]]:
    """Run `command` with a fresh region directory.

    Returns its exit status, the regions (those of one rewrite with their counts
    added up in the first, see `region_reader.collect`), and a line for each region
    file that could not be read.

    Every rewritten object in every process of the command writes one region
    file there. Ctrl-C reaches the command (same process group); we wait for it.
    """
    directory = region_directory()
    try:
        with interrupts_to(command, dict(os.environ, **{ENV_VAR: directory})) as process:
            try:  # the reader's imports (numpy) while the command runs, not before
                from urewrite.trampolines.region_reader import collect
            finally:
                returncode = process.wait()
        problems: List[str] = []
        regions = collect(directory, problems)
        return exit_status(returncode), regions, problems
    finally:
        remove_region_directory(directory)
