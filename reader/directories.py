"""Directories for region files: made fresh for a command or an armed process, recognised
again (a tracer that died armed left one), and removed with what the processes left."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

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
    directory = os.path.join(holder, os.urandom(16).hex())  # (secrets.token_hex)
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
