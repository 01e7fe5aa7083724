"""A per-user cache of assembled runtimes: Keystone's bytes for one source text.

Importing Keystone and assembling a runtime cost about 12 ms of a one-probe
rewrite's 0.2 s; the same rewrite run again (a build that re-runs its steps, a
benchmark) reads the bytes back instead. The key covers everything the bytes
depend on: the source text after substitution (fields, file tag), the base
address, the architecture and mode, and Keystone's own library file (so an
upgrade misses). An entry is written to a temporary file and renamed into
place, so concurrent writers each publish a whole entry; a reader checks its
digest, so a truncated or corrupt entry is a miss and gets rewritten.

UREWRITE_CACHE_DIR chooses the folder; set to the empty string, it turns the
cache off. Without it: $XDG_CACHE_HOME/urewrite, else ~/.cache/urewrite.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
import time
from typing import Callable, Optional

CACHE_ENV_VAR = "UREWRITE_CACHE_DIR"
FORMAT = b"urewrite-runtime-1\n"
DIGEST_SIZE = 32
KEEP = 64  # entries kept: each rewrite with new inputs adds one (~10 KiB)
STALE_TEMP_NS = 3600 * 10**9  # a temporary file this old lost its writer


def assembled(text: str, base: int, arch: str, mode: str,
              assemble: Callable[[], bytes]) -> bytes:
    """The bytes `assemble()` gives for this source, from the cache when it has them."""
    folder = cache_dir()
    if folder is None:
        return assemble()
    key = hashlib.sha256(b"\0".join([FORMAT, _keystone_identity(), arch.encode(), mode.encode(),
                                     b"%x" % base, text.encode()])).hexdigest()
    path = os.path.join(folder, key + ".bin")
    code = _read(path)
    if code is None:
        code = assemble()
        _write(folder, path, code)
    else:
        _touch(path)  # pruning keeps the entries used last
    return code


def cache_dir() -> Optional[str]:
    folder = os.environ.get(CACHE_ENV_VAR)
    if folder is None:
        root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(root, "urewrite")
    return os.path.join(folder, "runtime") if folder else None


def _keystone_identity() -> bytes:
    """Names the installed Keystone without importing it (its import is what we save)."""
    spec = importlib.util.find_spec("keystone")
    if spec is None or not spec.origin:
        return b"keystone?"
    folder = os.path.dirname(spec.origin)
    for name in ("libkeystone.so", os.path.basename(spec.origin)):
        try:
            st = os.stat(os.path.join(folder, name))
        except OSError:
            continue
        return f"{folder}:{name}:{st.st_size}:{st.st_mtime_ns}".encode()
    return b"keystone?"


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            entry = f.read()
    except OSError:
        return None
    head = len(FORMAT) + DIGEST_SIZE
    if not entry.startswith(FORMAT) or len(entry) < head:
        return None
    code = entry[head:]
    if hashlib.sha256(code).digest() != entry[len(FORMAT):head]:
        return None
    return code


def _write(folder: str, path: str, code: bytes) -> None:
    """Publishes the entry whole, or not at all: a cache must never fail a rewrite."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(FORMAT + hashlib.sha256(code).digest() + code)
            os.replace(temp, path)
        except BaseException:
            os.unlink(temp)
            raise
        _prune(folder)
    except OSError:
        pass


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _prune(folder: str) -> None:
    """Keeps the KEEP entries used last, and drops temporary files a killed writer left.

    Another process may be pruning too: whatever it removed first is skipped."""
    entries, stale = [], []
    abandoned = time.time_ns() - STALE_TEMP_NS
    with os.scandir(folder) as it:
        for e in it:
            try:
                mtime = e.stat().st_mtime_ns
            except OSError:
                continue
            if e.name.endswith(".bin"):
                entries.append((mtime, e.path))
            elif e.name.startswith(".tmp-") and mtime < abandoned:
                stale.append((mtime, e.path))
    for _, path in sorted(entries)[:-KEEP] + stale:
        try:
            os.unlink(path)
        except OSError:
            pass
