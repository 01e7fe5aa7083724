"""rewriter/arrays.py: what it gives is numpy's own answer."""

import numpy as np
import pytest

from urewrite.rewriter.arrays import unique


@pytest.mark.parametrize("n", [0, 1, 2, 3, 1000, 100_000])
def test_unique_is_np_unique(n):
    rng = np.random.default_rng(n)
    values = rng.integers(-(1 << 40), 1 << 40, n, dtype=np.int64)
    values = np.concatenate([values, values[: n // 3]])  # repeats
    before = values.copy()
    got = unique(values)
    assert got.dtype == np.int64 and np.array_equal(got, np.unique(values))
    assert np.array_equal(values, before)  # (its input left alone)


def test_unique_of_words_with_the_top_bit_set():
    words = np.array([2**64 - 8, 16, 2**64 - 8, 0], dtype="<u8").view(np.int64)
    assert np.array_equal(unique(words), np.unique(words))
