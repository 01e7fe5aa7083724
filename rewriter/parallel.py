"""Independent work on the other cores: in a forked child while the caller does its own
(`Forked`), or over a list of items in a pool of processes (`map_ordered`).

`list` plans a file's return probes in a child while it plans the entries: the
two share nothing but the file read before the fork, so the result is the one a
single process gets, in about the time of the longer half. The child sends its
result back pickled through a pipe; an error there is raised here. With one core
(or where fork is missing) the work runs in the caller, when asked for.

`list --summary` lists its files in a pool, one file per process at a time, in the
order given; a worker of the pool runs its own `Forked` work inline (the pool already
uses the cores).
"""

from __future__ import annotations

import itertools
import mmap
import multiprocessing
import os
import pickle
from typing import Callable, Generic, Iterable, Iterator, Optional, TypeVar

from urewrite.errors import UrewriteError

T = TypeVar("T")
_in_pool = False  # set in the workers of map_ordered's pool


def _enter_pool() -> None:
    global _in_pool
    _in_pool = True


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Forked(Generic[T]):
    """`work()` started in a child process at once (when there are cores to spare);
    `result()` waits for it."""

    def __init__(self, work: Callable[[], T]):
        self._work = work
        self._pid = None
        if cores() < 2 or _in_pool or not hasattr(os, "fork"):
            return
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: do the work, send it back, and leave at once
            os.close(read_end)
            try:
                payload = pickle.dumps((True, work()))
            except BaseException as e:  # (sent back, raised in the parent)
                payload = pickle.dumps((False, str(e) if isinstance(e, UrewriteError)
                                        else f"{type(e).__name__}: {e}"))
            with os.fdopen(write_end, "wb") as out:
                out.write(payload)
            os._exit(0)
        os.close(write_end)
        self._pid, self._read_end = pid, read_end

    def result(self) -> T:
        if self._pid is None:
            return self._work()
        with os.fdopen(self._read_end, "rb") as source:
            payload = source.read()
        _, status = os.waitpid(self._pid, 0)
        if not payload:
            raise UrewriteError(f"a worker process failed (wait status {status})")
        ok, value = pickle.loads(payload)
        if not ok:
            raise UrewriteError(value)
        return value


class Shares(Generic[T]):
    """Pieces of work, each handed once to whichever process asks first: this one or a
    child forked after (`Forked`), each taking the next piece as it finishes one. Two
    processes so share work whose cost is spread unevenly along a file, and end
    together. The number of the next piece is in an anonymous shared mapping, which
    forked children share, behind a lock (of the fork context: made and unlinked at
    once, with no resource tracker)."""

    def __init__(self, pieces: list, sizes: Optional[list] = None):
        self._pieces = pieces
        self._next = mmap.mmap(-1, 8)  # (zero: the first piece)
        self._lock = multiprocessing.get_context("fork").Lock()
        # items handed out once each piece is (`sizes`: items per piece; else one each)
        self._handed = list(itertools.accumulate(sizes)) if sizes is not None else \
            list(range(1, len(pieces) + 1))
        self._reported = 0  # (items told to this process's progress)

    @classmethod
    def of(cls, items: list, count: int) -> "Shares":
        """`items` in about `count` pieces of consecutive ones."""
        step = -(-len(items) // count) or 1
        pieces = [items[k:k + step] for k in range(0, len(items), step)]
        return cls(pieces, [len(p) for p in pieces])

    def take(self, leave: int = 0, progress: Optional[Callable[[int], None]] = None
             ) -> Iterator[T]:
        """The pieces this process gets, up to the last `leave` ones (left to the others:
        a child that must still send what it found stops that much earlier).
        `progress(n)`: told of n more items handed out, to any process, as this one
        takes each piece (the work of both, shown by the one that draws the bar)."""
        while True:
            with self._lock:
                k = int.from_bytes(self._next[:8], "little")
                if k >= len(self._pieces) - leave:
                    return
                self._next[:8] = (k + 1).to_bytes(8, "little")
            if progress is not None and k > 0:  # (the pieces before this one: handed out)
                self._tell(progress, self._handed[k - 1])
            yield self._pieces[k]

    def done(self, progress: Optional[Callable[[int], None]]) -> None:
        """Tell `progress` of the items not yet told: all are done."""
        if progress is not None and self._handed:
            self._tell(progress, self._handed[-1])

    def _tell(self, progress: Callable[[int], None], handed: int) -> None:
        if handed > self._reported:
            progress(handed - self._reported)
            self._reported = handed


def map_ordered(function: Callable, items: Iterable, workers: int = 0) -> Iterator:
    """function(item) for each item, in order, computed by `workers` forked processes
    (the cores by default); `function` must be a module's own function and its result
    picklable. One item, one core or no fork: in this process."""
    items = list(items)
    workers = min(workers or cores(), len(items))
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        yield from map(function, items)
        return
    with multiprocessing.get_context("fork").Pool(workers, initializer=_enter_pool) as pool:
        yield from pool.imap(function, items, chunksize=1)
