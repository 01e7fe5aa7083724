"""Occupancy: byte ranges in use by windows and landings, taken one by one or at once;
the padding between functions that a hop may land in."""

import bisect
import os
import random

import numpy as np
import pytest

from urewrite.rewriter import elf_symbols
from urewrite.rewriter.free_space import Occupancy, padding_ends, padding_gaps
from urewrite.rewriter.pipeline import analyse

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def _disjoint(rng: random.Random, n: int) -> list:
    ranges, at = [], rng.randrange(100)
    for _ in range(n):
        at += rng.randrange(0, 6)  # (some ranges touch: end == next start)
        size = rng.randrange(1, 9)
        ranges.append((at, at + size))
        at += size
    rng.shuffle(ranges)
    return ranges


@pytest.mark.parametrize("seed", range(8))
def test_taken_at_once_is_taken_one_by_one(seed):
    rng = random.Random(seed)
    ranges = _disjoint(rng, rng.randrange(0, 60))
    one_by_one = Occupancy()
    for start, end in ranges:
        one_by_one.take(start, end)
    at_once = Occupancy.of([a for a, _ in ranges], [b for _, b in ranges])
    half = len(ranges) // 2  # (some taken at once, the rest one by one after them)
    both = Occupancy.of([a for a, _ in ranges[:half]], [b for _, b in ranges[:half]])
    for start, end in ranges[half:]:
        both.take(start, end)
    for _ in range(500):
        start = rng.randrange(400)
        end = start + rng.randrange(1, 12)
        assert at_once.is_free(start, end) == one_by_one.is_free(start, end) == \
            both.is_free(start, end), (start, end)
    for start, end in ranges:  # (taken already, by either part)
        with pytest.raises(AssertionError):
            both.take(start, end)


def test_overlapping_ranges_are_not_taken():
    with pytest.raises(AssertionError):
        Occupancy.of([19, 10], [25, 20])


def _gaps_walked(elf, backend, functions, last_instruction, symbol_starts, reaches):
    """padding_gaps() by a plain walk over every function of each section, asking each
    gap whether it meets a reach: what the vectorised one must find."""
    def meets(start, end):
        return any(lo < end and hi >= start for lo, hi in reaches)

    gaps = []
    for section in elf.executable_sections():
        inside = [f for f in functions if section.addr <= f.address < section.end]
        reach, last = section.addr, None
        for fn, following in zip(inside, inside[1:] + [None]):
            if fn.end > reach:
                reach, last = fn.end, fn
            start = reach
            end = min(following.address if following else section.end, section.end)
            k = bisect.bisect_left(symbol_starts, start)
            if k < len(symbol_starts) and symbol_starts[k] < end:
                end = symbol_starts[k]
            if end - start < backend.patch_size or last is None or not meets(start, end):
                continue
            insn = last_instruction(last)
            if insn is None or insn.end != last.end or not backend.ends_flow(insn):
                continue
            run = padding_ends(backend, elf.read(start, end - start))
            if run and run[-1] >= backend.patch_size:
                gaps.append((start, start + run[-1]))
    return gaps


@pytest.mark.skipif(not os.path.exists(LIBC), reason="needs Debian's x86_64 libc.so.6")
@pytest.mark.parametrize("count", [3, 40, 400, 4000])
def test_padding_gaps_are_those_a_walk_over_every_function_finds(count):
    """padding_gaps() looks closer only at the gaps a reach meets, found with arrays
    (node: 0.4 s -> 0.1 s in each process that plans hops): the gaps of libc within
    reach of `count` random hop windows are the ones a plain walk finds."""
    a = analyse(LIBC)
    planner, backend = a.planner, a.planner.backend
    values = elf_symbols.table(a.elf).values
    symbol_starts = np.unique(values[values != 0].astype(np.int64))
    rng = random.Random(count)
    sized = [f for f in a.functions if f.size]
    reaches = [backend.hop_reach(f.address + rng.randrange(f.size))
               for f in rng.choices(sized, k=count)]
    found = padding_gaps(a.elf, backend, a.functions, planner.model.last_instruction,
                         symbol_starts, reaches)
    walked = _gaps_walked(a.elf, backend, a.functions, planner.model.last_instruction,
                          symbol_starts.tolist(), reaches)
    assert sorted(found) == sorted(walked)
    assert len(found) >= min(count // 4, 500)
    # a label inside a gap ends it (libc has none there: some are made up)
    labelled = np.unique(np.concatenate([symbol_starts, [start + 6 for start, _ in walked]]))
    shortened = padding_gaps(a.elf, backend, a.functions, planner.model.last_instruction,
                             labelled, reaches)
    assert sorted(shortened) == sorted(_gaps_walked(
        a.elf, backend, a.functions, planner.model.last_instruction, labelled.tolist(), reaches))
    assert shortened != found or not walked
