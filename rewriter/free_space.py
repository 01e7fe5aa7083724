"""Bytes a hop may land in: code bytes that never run and that nothing targets.

A short hop (docs/design.md, "Patch tactics") needs a landing within its reach
for the long jump to its trampoline. Landings come from:
- alignment padding between two functions: nop/int3 runs after a function whose
  last instruction never falls through, before the next function or symbol;
- the filler of a window that is patched anyway (bytes after its jump);
- an evicted neighbour: a window moved to a trampoline of its own only to free
  the bytes after its jump (the planner finds those).
`Occupancy` keeps windows and landings from overlapping.
"""

from __future__ import annotations

import bisect
from typing import Callable, List, Tuple

import numpy as np


class Occupancy:
    """Disjoint byte ranges in use: windows, landings. Those taken at once (of(): a big
    file's windows, 100,000s) are kept apart from those taken one by one after them:
    an insert among all of them would cost more than the search."""

    def __init__(self):
        self._many = _Ranges()  # taken at once
        self._added = _Ranges()  # taken one by one

    @classmethod
    def of(cls, starts, ends) -> "Occupancy":
        """Many [start, end) ranges taken at once."""
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        order = np.lexsort((ends, starts))
        starts, ends = starts[order], ends[order]
        overlap = np.flatnonzero(starts[1:] < ends[:-1])
        assert not len(overlap), (hex(int(starts[overlap[0] + 1])), hex(int(ends[overlap[0]])))
        used = cls()
        used._many.starts, used._many.ends = starts.tolist(), ends.tolist()
        return used

    def is_free(self, start: int, end: int) -> bool:
        return self._many.is_free(start, end) and self._added.is_free(start, end)

    def take(self, start: int, end: int) -> None:
        assert self.is_free(start, end), (hex(start), hex(end))
        self._added.take(start, end)


class _Ranges:
    """Disjoint [start, end) ranges, sorted."""

    def __init__(self):
        self.starts: List[int] = []
        self.ends: List[int] = []

    def is_free(self, start: int, end: int) -> bool:
        k = bisect.bisect_right(self.starts, start)
        if k and self.ends[k - 1] > start:
            return False
        return k == len(self.starts) or self.starts[k] >= end

    def take(self, start: int, end: int) -> None:
        k = bisect.bisect_right(self.starts, start)
        self.starts.insert(k, start)
        self.ends.insert(k, end)


def padding_gaps(elf, backend, functions, last_instruction: Callable,
                 symbol_starts: np.ndarray, reaches: List[Tuple[int, int]]
                 ) -> List[Tuple[int, int]]:
    """(start, end) of each run of padding between functions (sorted by address) that no
    code reaches by falling through: the function before it ends in an instruction that
    never continues (a return, a jump), and no symbol (`symbol_starts`, sorted) starts
    inside it. Only gaps that meet one of `reaches` ([lo, hi] each) are looked at:
    decoding the rest would be wasted."""
    reaches = sorted(reaches)
    lows = np.array([lo for lo, _ in reaches], dtype=np.int64)
    highs = np.maximum.accumulate(np.array([hi for _, hi in reaches] or [0], dtype=np.int64))
    addresses = np.fromiter((f.address for f in functions), np.int64, len(functions))
    ends = np.fromiter((f.end for f in functions), np.int64, len(functions))
    gaps = []
    for section in elf.executable_sections():
        first, last = np.searchsorted(addresses, (section.addr, section.end)).tolist()
        if first == last:
            continue
        # where code stops falling through, before each function's successor: the
        # furthest end so far (or the section's start), and the function that first
        # reached it (-1: none yet)
        end_of = ends[first:last]
        reach = np.maximum.accumulate(np.maximum(end_of, section.addr))
        before = np.concatenate(([section.addr], reach[:-1]))
        by = np.maximum.accumulate(np.where(end_of > before, np.arange(len(end_of)), -1))
        following = np.minimum(np.append(addresses[first + 1:last], section.end), section.end)
        # (a symbol inside only shortens a gap: one out of reach, or too short, stays so)
        k = np.searchsorted(lows, following)
        near = (k > 0) & (highs[np.maximum(k - 1, 0)] >= reach)
        for i in np.flatnonzero(near & (by >= 0) &
                                (following - reach >= backend.patch_size)).tolist():
            start, end = int(reach[i]), int(following[i])
            j = int(np.searchsorted(symbol_starts, start))
            if j < len(symbol_starts) and symbol_starts[j] < end:
                end = int(symbol_starts[j])  # a label (hand-written code) is no padding
            if end - start < backend.patch_size or not _meets(lows, highs, start, end):
                continue
            fn = functions[first + int(by[i])]
            insn = last_instruction(fn)
            if insn is None or insn.end != fn.end or not backend.ends_flow(insn):
                continue
            run = padding_ends(backend, elf.read(start, end - start))
            if run and run[-1] >= backend.patch_size:
                gaps.append((start, start + run[-1]))
    return gaps


def _meets(lows: np.ndarray, highs: np.ndarray, start: int, end: int) -> bool:
    """Whether [start, end) meets a reach: one starts before it ends and, of those, one
    ends at or after its start."""
    k = int(np.searchsorted(lows, end))
    return k > 0 and int(highs[k - 1]) >= start


def padding_ends(backend, code: bytes) -> List[int]:
    """Where the padding instructions (nop, int3) at the start of `code` end, counted
    from its start, up to the first that is no padding or does not decode."""
    ends = []
    for insn in backend.decode(code, 0):
        if not backend.is_padding(insn):
            break
        ends.append(insn.end)
    return ends
