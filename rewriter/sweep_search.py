"""The planner's searches over every function's sweep, in compiled code.

Windows.inner_window tries windows around a site (exits, USDT sites, addresses) and
skips those a nearby branch or a C++ landing pad lands inside; Windows.window takes the
instructions at an entry; ReturnExits.exit_points goes over a function's rows for those that
may leave it. On a big file these are most of `list`'s time (100,000s of
windows), and they need only arrays. Where the backend's native module has one
(Backend.sweep_search_engine: x86_64's, in Rust) and every function was swept at
once (a SweepBatch), the planner asks it first: it reads the sweep's arrays in place
and answers only where it finds what the Python code would (for a window, the first
free of near branch targets and landing pads; what the planner must read to check
that its instructions move, which it still does, Windows.displaced). Everything else stays
with the Python code, which also gives the reasons: windows whose padding refuses
them all, functions whose branch targets it does not hold (.cold parts, whose
parent's jump tables land in them; functions swept another way), sites with no
window, functions of several parts. tests/test_sweep_search.py holds the two to the
same answers.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from urewrite.arch.base import BRANCH, JUMP, OTHER, RETURN, SweepBatch
from urewrite.arch.jump_tables import JumpTable
from urewrite.rewriter.except_table import LandingPads
from urewrite.rewriter.functions import Function

_INT64_MAX = (1 << 63) - 1


def build(engine: type, functions: List[Function], batch: SweepBatch,
          swept: List[Function], tables: Dict[int, Dict[int, JumpTable]],
          pads: LandingPads, reach: int, look_back: int):
    """The engine over the batch's sweeps of `swept` for the planner's `functions`
    (address order), whose jump tables (function address -> jump -> table) are known."""
    in_batch = {fn.address: k for k, fn in enumerate(swept)}  # (the planner's: by address)
    # (a function not in the batch, or whose jump tables are not known yet, is one the
    # engine does not search in or near)
    spans = np.array([batch.spans[in_batch[fn.address]]
                      if fn.address in in_batch and fn.address in tables else (0, -1, 0, 0, 0, 0)
                      for fn in functions], dtype=np.int64).reshape(-1, 6)
    cases: list = []
    case_starts = [0]
    for fn in functions:
        for table in tables.get(fn.address, {}).values():
            cases.extend(table.targets)
        case_starts.append(len(cases))
    unreadable = [(min(start, _INT64_MAX), min(end, _INT64_MAX))
                  for start, end, _ in pads.unreadable]
    return engine(
        batch.edges, batch.rows, batch.kinds, batch.targets, batch.marked, spans.tobytes(),
        _int64s(fn.address for fn in functions), _int64s(fn.end for fn in functions),
        bytes(".cold" not in fn.name for fn in functions),  # (see the module's docstring)
        _int64s(cases), _int64s(case_starts), _int64s(pads.pads),
        _int64s(v for pair in unreadable for v in pair), reach, look_back,
        (JUMP, BRANCH, RETURN, OTHER))


def _int64s(values) -> bytes:
    return np.fromiter(values, dtype=np.int64).tobytes()
