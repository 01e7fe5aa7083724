"""Small numpy helpers the scans and the planner share."""

from __future__ import annotations

import numpy as np


def unique(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted: np.unique's result, by a sort (numpy 2's np.unique
    hashes, which is slower on addresses: docs/benchmarks.md section 11)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
