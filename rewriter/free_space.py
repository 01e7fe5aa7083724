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
from typing import Callable, List, Set, Tuple


class Occupancy:
    """Disjoint byte ranges in use: windows, landings."""

    def __init__(self):
        self._starts: List[int] = []
        self._ends: List[int] = []

    @classmethod
    def of(cls, ranges) -> "Occupancy":
        """Many (start, end) ranges taken at once (a big file's windows: 100,000s)."""
        used = cls()
        for start, end in sorted(ranges):
            assert not used._ends or used._ends[-1] <= start, (hex(start), hex(end))
            used._starts.append(start)
            used._ends.append(end)
        return used

    def is_free(self, start: int, end: int) -> bool:
        k = bisect.bisect_right(self._starts, start)
        if k and self._ends[k - 1] > start:
            return False
        return k == len(self._starts) or self._starts[k] >= end

    def take(self, start: int, end: int) -> None:
        assert self.is_free(start, end), (hex(start), hex(end))
        k = bisect.bisect_right(self._starts, start)
        self._starts.insert(k, start)
        self._ends.insert(k, end)


def padding_gaps(elf, backend, functions, last_instruction: Callable, symbol_starts: Set[int],
                 wanted: Callable[[int, int], bool]) -> List[Tuple[int, int]]:
    """(start, end) of each run of padding between functions that no code reaches by
    falling through: the function before it ends in an instruction that never
    continues (a return, a jump), and no symbol starts inside it. Only gaps for which
    `wanted(start, end)` holds are looked at (decoding the rest would be wasted)."""
    gaps = []
    starts = sorted(symbol_starts)
    for section in elf.executable_sections():
        inside = [f for f in functions if section.addr <= f.address < section.end]
        reach = section.addr  # the furthest end of a function so far
        last = None  # the function that ends there
        for fn, following in zip(inside, inside[1:] + [None]):
            if fn.end > reach:
                reach, last = fn.end, fn
            start = reach
            end = min(following.address if following else section.end, section.end)
            k = bisect.bisect_left(starts, start)
            if k < len(starts) and starts[k] < end:
                end = starts[k]  # a label (hand-written code) is no padding
            if end - start < backend.patch_size or last is None or not wanted(start, end):
                continue
            insn = last_instruction(last)
            if insn is None or insn.end != last.end or not backend.ends_flow(insn):
                continue
            run = padding_ends(backend, elf.read(start, end - start))
            if run and run[-1] >= backend.patch_size:
                gaps.append((start, start + run[-1]))
    return gaps


def padding_ends(backend, code: bytes) -> List[int]:
    """Where the padding instructions (nop, int3) at the start of `code` end, counted
    from its start, up to the first that is no padding or does not decode."""
    ends = []
    for insn in backend.decode(code, 0):
        if not backend.is_padding(insn):
            break
        ends.append(insn.end)
    return ends
