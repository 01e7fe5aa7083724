"""Occupancy: byte ranges in use by windows and landings, taken one by one or at once."""

import random

import pytest

from urewrite.rewriter.free_space import Occupancy


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
    at_once = Occupancy.of(ranges)
    for _ in range(500):
        start = rng.randrange(400)
        end = start + rng.randrange(1, 12)
        assert at_once.is_free(start, end) == one_by_one.is_free(start, end), (start, end)


def test_overlapping_ranges_are_not_taken():
    with pytest.raises(AssertionError):
        Occupancy.of([(10, 20), (19, 25)])
