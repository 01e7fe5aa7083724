"""The whole-file precompute: the sweeps, branch targets and jump tables of many functions
worked out at once, on two cores; and, for the whole file, where every branch lands and
which functions something enters past their entry. What it finds goes into the binary
model, as each function's own analysis would have put it there."""

from __future__ import annotations

from typing import Callable, List, Optional, Set

import numpy as np

from urewrite.arch.base import OTHER, Sweep
from urewrite.rewriter import parallel, taken_addresses
from urewrite.rewriter.arrays import unique
from urewrite.rewriter.functions import Function
from urewrite.rewriter.model import BinaryModel
from urewrite.rewriter.plan.results import Prepared


class WholeFile:
    """The whole-file precompute over one file's model."""

    def __init__(self, model: BinaryModel):
        self.model = model
        self.backend = model.backend
        self.functions = model.functions

    def prepare(self, functions: List[Function],
                meanwhile: Optional[Callable[[], None]] = None,
                progress: Optional[Callable[[int], None]] = None) -> None:
        """Sweep many functions and work out their branch targets and jump tables at
        once, in this process and a forked child (parallel.py), each taking pieces of
        them as it goes: the caches are what each function's own analysis would fill,
        whoever did it, so plans do not change. `meanwhile()`: other work for this
        process first, the child taking more pieces meanwhile. `progress(n)`: told
        of functions done, by both."""
        whole = functions is self.functions  # (then the whole-file filters below)
        # (pieces of about 1/2048 of them, taken by each process as it goes: cost is not
        # spread evenly along a file, and fixed halves of it, even every other
        # function, left one process waiting for the other)
        pieces = parallel.Shares.of(functions, 2048)

        def analyse(leave: int = 0, progress=None) -> List[Function]:  # (the functions it took)
            took = []
            for piece in pieces.take(leave, progress):
                for fn in piece:
                    self.model.jump_tables(fn)  # (the direct targets: asked later, where needed)
                took += piece
            return took

        def found() -> Prepared:  # (what the child sends)
            # (the last 64 pieces left to this process, about what the child's packing
            # and sending take)
            part = analyse(leave=64)
            return Prepared([fn.address for fn in part],
                    {fn.address: self.model.direct[fn.address] for fn in part
                     if fn.address in self.model.direct},
                    {fn.address: self.model.tables[fn.address] for fn in part},
                    {fn.address: self.model.unknown_jumps[fn.address] for fn in part},
                    {fn.address: self.model.computed[fn.address] for fn in part
                     if fn.address in self.model.computed},
                    Sweep.pack([self.model.sweeps[fn.address] for fn in part
                                if not swept_ahead]))

        self.model.taken_index.wait()  # (scans made ahead, on a thread: done before the fork)
        swept_ahead = self.model.swept_all(functions)  # (then the child has them all too)
        if swept_ahead and self.model.batch is not None:  # (most: no indirect jump, no table)
            self.model.no_indirect_jumps = self.held_without(
                np.frombuffer(self.model.batch[0].kinds, np.uint8) == OTHER)
        second = parallel.Forked(found)
        if meanwhile is not None:
            meanwhile()
        analyse(progress=progress)
        theirs = second.result()
        pieces.done(progress)
        sweeps = dict(zip(theirs.functions, Sweep.unpack(theirs.sweeps)))
        for ours, received in zip((self.model.direct, self.model.tables, self.model.unknown_jumps,
                                   self.model.computed, self.model.sweeps),
                                  (theirs.direct, theirs.tables, theirs.unknown_jumps,
                                   theirs.computed, sweeps)):
            for address, value in received.items():
                ours.setdefault(address, value)
        if whole:  # where every branch lands, and which functions are entered past the entry
            targets, sources = self.branches(functions)
            self.model.all_targets = unique(targets)
            order = np.argsort(targets, kind="stable")
            self.model.branch_pairs = (targets[order], sources[order])
            overlapping = self.overlapping()
            self.model.entered = list(zip((overlapping | self.entered_from_outside()).tolist(),
                                     (overlapping | self.entered_by(targets, sources)).tolist()))
            self.model.no_fragment_targets = self.clear_of_fragments()

    def clear_of_fragments(self) -> Set[int]:
        """The addresses of functions none of whose branch targets (direct ones, and
        their jump tables' cases) is a fragment's start, of those the batch's sweeps
        hold: BinaryModel.parts() need not ask their branch_targets() (a
        dict each, made in Python)."""
        if self.model.batch is None:
            return set()
        fragments = self.model.fragments()
        clear = self.held_without(np.isin(np.frombuffer(self.model.batch[0].targets, np.int64),
                                           np.fromiter(fragments, np.int64)))
        for address, tables in self.model.tables.items():
            if any(t in fragments for table in tables.values() for t in table.targets):
                clear.discard(address)
        return clear

    def held_without(self, rows: np.ndarray) -> Set[int]:
        """The addresses of the functions whose sweeps the batch holds (BinaryModel.sweep_all) with
        none of `rows` (a mask over all the batch's rows), read at once: an address swept
        twice counts only if both are held and without."""
        batch, swept = self.model.batch
        held = (batch.spans[:, 1] >= 0).tolist()  # (not those swept another way)
        owner = np.repeat(np.arange(len(swept)), batch.spans[:, 3])  # (of each row)
        having = set(np.unique(owner[rows]).tolist())
        found, others = set(), set()
        for k, fn in enumerate(swept):
            (found if held[k] and k not in having else others).add(fn.address)
        return found - others

    def branches(self, functions: List[Function]) -> tuple:
        """(targets, sources): where each direct branch or call of the functions lands
        and where it is, and the same for each case of their jump tables (from its jump):
        every function's branch_targets(), as two arrays. The direct branches of the
        functions swept at once (BinaryModel.sweep_all) are read from that batch's arrays in one go,
        not function by function."""
        targets, sources = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        in_batch: Set[int] = set()
        if self.model.batch is not None:
            batch, swept = self.model.batch
            asked = {fn.address for fn in functions}
            if all(fn.address in asked for fn in swept):
                held = (batch.spans[:, 1] >= 0).tolist()  # (not those swept another way)
                in_batch = {fn.address for fn, h in zip(swept, held) if h}
                rows = np.frombuffer(batch.rows, np.int64) + \
                    np.repeat(batch.spans[:, 0], batch.spans[:, 3])  # (rows of the edges)
                found = np.frombuffer(batch.targets, np.int64)
                direct = found >= 0
                targets.append(found[direct])
                sources.append(np.frombuffer(batch.edges, np.int64)[rows[direct]])
        for fn in functions:
            if fn.address not in in_batch:
                sweep = self.model.sweep(fn)
                direct = sweep.targets >= 0
                targets.append(sweep.targets[direct])
                sources.append(sweep.edges[sweep.rows[direct]])
            for table in self.model.jump_tables(fn).values():
                targets.append(np.fromiter(table.targets, dtype=np.int64))
                sources.append(np.full(len(table.targets), table.jump, dtype=np.int64))
        return np.concatenate(targets), np.concatenate(sources)

    def overlapping(self) -> np.ndarray:
        """Per function: whether it overlaps another (its insides are not its alone)."""
        starts = np.array(self.model.starts, dtype=np.int64)
        overlapping = np.zeros(len(self.functions), dtype=bool)
        if len(starts) > 1:  # overlapping neighbours: the end of one passes the next's start
            ends = np.array([f.end for f in self.functions], dtype=np.int64)
            before = np.array(self.model.ends_so_far, dtype=np.int64)
            overlapping[1:] |= starts[1:] < before[:-1]
            overlapping[:-1] |= starts[1:] < ends[:-1]
        return overlapping

    def entered_from_outside(self) -> np.ndarray:
        """Per function: whether anything may branch into it from outside, past its
        entry, that no function's branches say (branches()): a branch or address
        computation the byte scans found (TakenIndex.branch_sources())."""
        targets, sources = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for table in self.model.taken_index.code_tables():
            if table.kind == taken_addresses.BRANCH:
                targets.append(table.values)
                sources.append(table.sources)
        return self.entered_by(np.concatenate(targets), np.concatenate(sources))

    def entered_by(self, targets: np.ndarray, sources: np.ndarray) -> np.ndarray:
        """Per function: whether a branch from `sources` to `targets` enters it past
        its entry from outside its range."""
        starts = np.array(self.model.starts, dtype=np.int64)
        ends = np.array([f.end for f in self.functions], dtype=np.int64)
        entered = np.zeros(len(self.functions), dtype=bool)
        k = np.searchsorted(starts, targets, side="right") - 1
        inside = k >= 0
        k, targets, sources = k[inside], targets[inside], sources[inside]
        into = (targets < ends[k]) & (targets != starts[k]) & \
            ((sources < starts[k]) | (sources >= ends[k]))
        entered[k[into]] = True
        return entered
