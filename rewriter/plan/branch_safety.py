"""Branch safety: whether anything may branch into a window after its first byte (a taken
address, a branch target, a jump table's case, a C++ landing pad), and whether other code
branches into a function past its entry. A jump written over such a window would be
entered in its middle: the window is refused (or another one tried)."""

from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Set

import numpy as np

from urewrite.arch.base import Window
from urewrite.rewriter import taken_addresses
from urewrite.rewriter.functions import Function
from urewrite.rewriter.model import BinaryModel
from urewrite.rewriter.plan.results import Plan


class BranchSafety:
    """The branch-safety questions of one file's windows, asked of its model; what a
    window needs is checked once (the reasons an address is taken, the targets near
    the last function asked)."""

    def __init__(self, model: BinaryModel):
        self.model = model
        self.backend = model.backend
        self.functions = model.functions
        # (function, near_targets(), the same sorted)
        self._near_cache: tuple = (None, set(), [])
        self._taken_reasons: Dict[int, Optional[str]] = {}  # address -> why it is taken

    def branch_into(self, plan: Plan, taken: Dict[int, list],
                     inner_window: bool = False) -> Optional[str]:
        """Why something may branch into the plan's window after its first byte: a taken
        address (`taken`: taken_in_windows()), a branch target, a landing pad; or None.
        `inner_window`: the window is Windows.inner_window()'s as it was made, which keeps
        clear of the last two, looking at every function near the one holding it: only
        taken addresses are left to ask about, unless the window reaches past that
        function's end (borrowed padding), nearer to others."""
        lo, hi = plan.window.address + 1, plan.window.end
        if not taken.keys().isdisjoint(range(lo, hi)):  # (most windows: none, asked in C)
            for target in range(lo, hi):
                why = target in taken and self.taken_reason(taken, target)
                if why:
                    return f"{why} may lead to {target:#x}, inside the displaced bytes"
        holder = self.model.holding(plan.site)
        if inner_window and plan.window.end <= holder.end:
            return None
        near = self.model.near_functions(plan.window) \
            if self.model.targets_between(plan.window.address, plan.window.end) else []
        for fn in near + [None]:
            found = self.model.branch_targets(fn) if fn else self.parent_case_labels(holder)
            for target, source in found.items():
                if lo <= target < hi:
                    branch = "the jump table of the jump" if fn is None or \
                        source in self.model.jump_tables(fn) else "the branch"
                    return (f"{branch} at {source:#x} lands at {target:#x}, "
                            f"inside the displaced bytes")
        pad = self.landing_pad_in(plan.window.address, plan.window.end, plan.window.insns)
        if pad:
            return f"{pad}, inside the displaced bytes"
        return None

    def clear_of_branches(self, plans: List[Plan], taken: Dict[int, list]) -> list:
        """Per plan, whether branch_into(plan, taken) is sure to be None, found for all
        at once with arrays: after the window's first byte, no address of `taken`, no
        branch target of the file (once prepare() has seen them all: the near ones and
        the cases are among them), and no landing pad nor unreadable range where
        landing_pad_in() would look. False: ask branch_into() (one by one: slower)."""
        if self.model.all_targets is None or not plans:
            return [False] * len(plans)
        starts = np.fromiter((p.window.address for p in plans), np.int64, len(plans))
        ends = starts + np.fromiter((p.window.size for p in plans), np.int64, len(plans))

        def inside(values: np.ndarray) -> np.ndarray:  # some value v: start < v < end
            if not len(values):
                return np.zeros(len(starts), dtype=bool)
            k = values.searchsorted(starts, side="right")
            return (k < len(values)) & (values[np.minimum(k, len(values) - 1)] < ends)

        asked = inside(np.sort(np.fromiter(taken, np.int64, len(taken)))) | \
            inside(self.model.all_targets)
        # (landing_pad_in: a window of one instruction has no pad after its first byte)
        lone = np.fromiter((len(p.window.insns) == 1 and p.window.insns[0].end >= p.window.end
                            for p in plans), bool, len(plans))
        if not (asked | lone).all():
            pads = self.model.landing_pads()
            padded = inside(np.array(pads.pads, dtype=np.int64))
            for low, high, _ in pads.unreadable:  # (few; as LandingPads.unknown_inside)
                padded |= (low < ends) & (starts + 1 < high)
            asked |= padded & ~lone
        return (~asked).tolist()

    def taken_in_windows(self, plans: List[Plan]) -> Dict[int, list]:
        # window interiors, only where an instruction could start: nothing can be aimed
        # anywhere else. (Not their starts: a function's entry is named by every call to
        # it, and those matches took seconds to list. _merge asks of a start itself.)
        step = self.backend.insn_alignment
        first = np.fromiter((p.window.address + step for p in plans), np.int64, len(plans))
        end = np.fromiter((p.window.end for p in plans), np.int64, len(plans))
        counts = np.maximum((end - first + step - 1) // step, 0)  # (as many as range() has)
        before = np.repeat(np.cumsum(counts) - counts, counts)  # (each one's first index)
        return self.model.taken_index.find(np.repeat(first, counts) +
                                     step * (np.arange(int(counts.sum())) - before))

    def taken_inside(self, start: int, end: int) -> Optional[tuple]:
        """(address, what may take it) for the first taken address in (start, end), or
        None: the scans asked for these addresses alone."""
        taken = self.model.taken_index.find(np.arange(start + 1, end, dtype=np.int64))
        return None if not taken else next(((a, why) for a in range(start + 1, end)
                     for why in [self.taken_reason(taken, a)] if why), None)

    def taken_reason(self, taken: Dict[int, list], address: int) -> Optional[str]:
        """What may take `address` (a match in data, or one in code that its instruction
        confirms), or None. Checked only for addresses a window needs, once each."""
        if address not in taken:
            return None
        if address not in self._taken_reasons:
            self._taken_reasons[address] = next(
                (m.describe() for m in taken[address] if self.counts(m, address)), None)
        return self._taken_reasons[address]

    def counts(self, match: taken_addresses.Match, address: int) -> bool:
        """Whether a match may really take `address`: a match in code must be confirmed
        by its instruction; a plain constant in the data of a position-dependent file
        that names the middle of an instruction is taken for what it most likely is,
        data that looks like a code address ("ABC\0..." is 0x434241), when every
        function holding it decodes whole; relocations always count."""
        if match.source is not None:
            return self.model.really_refers(match, address)
        if match.kind != taken_addresses.CONSTANT:
            return True
        holders = self.model.holders(address)
        return not holders or not all(self.inside_an_instruction(fn, address)
                                      for fn in holders)

    def inside_an_instruction(self, fn: Function, address: int) -> bool:
        """Whether `address` lies after the first byte of an instruction of the
        function's linear sweep, the sweep decoding the whole function."""
        sweep = self.model.sweep(fn)
        if not len(sweep) or sweep.end != fn.end:
            return False
        k = sweep.index_holding(address)
        return k is not None and sweep.edges[k] < address

    def landing_pad_in(self, start: int, end: int, insns) -> Optional[str]:
        """What makes (start, end) unsafe for the unwinder: a C++ landing pad after its
        first byte (it resumes there, as a branch would land), or a function whose
        landing pads cannot be read. Landing pads are read when a window of more than
        one instruction first needs them."""
        if len(insns) == 1 and insns[0].end >= end:
            return None  # no instruction starts inside it
        pad = self.model.landing_pads().first_inside(start, end)
        if pad is not None:
            return f"a C++ landing pad is at {pad:#x}"
        unknown = self.model.landing_pads().unknown_inside(start, end)
        return f"a C++ landing pad may lie anywhere in {unknown[2]}" if unknown else None

    def near_targets(self, fn: Function) -> Set[int]:
        """Where the branches of the function and of its neighbours land (kept for the
        last function asked: its windows are planned one after another)."""
        if self._near_cache[0] != fn.address:
            targets = set(self.parent_case_labels(fn))
            for near in self.model.near_functions(Window(fn.address, fn.size, ())):
                targets.update(self.model.branch_targets(near))
            self._near_cache = (fn.address, targets, sorted(targets))
        return self._near_cache[1]

    def near_target_between(self, fn: Function, start: int, end: int) -> bool:
        """Whether one of near_targets(fn) lies in (start, end)."""
        self.near_targets(fn)
        ordered = self._near_cache[2]
        k = bisect.bisect_right(ordered, start)
        return k < len(ordered) and ordered[k] < end

    def parent_case_labels(self, fn: Function) -> Dict[int, int]:
        """Case labels that the jump tables of the function a named part (f.cold) was
        split off from put in it: that function may lie beyond rel8 reach."""
        if ".cold" not in fn.name:
            return {}
        if self.model.by_name is None:
            self.model.by_name = {f.name: f for f in self.functions}
        parent = self.model.by_name.get(fn.name.split(".cold")[0])
        if parent is None:
            return {}
        return {target: table.jump for table in self.model.jump_tables(parent).values()
                for target in table.targets if fn.address <= target < fn.end}

    def branch_from_outside(self, fn: Function, parts: List[Function], inside,
                             index: Optional[int] = None):
        """(target, source) of a branch from code outside the function's parts to an
        instruction inside them other than its entry (code shared by two functions,
        as glibc's string functions do), or None. `index`: where a function of one
        part is in self.functions."""
        # (prepare()'s marks, for a function of one part: whether the byte scans, and
        # whether the functions' branches, may enter it past its entry from outside; a
        # function that overlaps another has both. Where one says no, that look is
        # skipped: few functions are marked, by one or the other.)
        by_scans = by_branches = True
        if len(parts) == 1 and self.model.entered is not None:
            if index is None:
                index = self.model.index_of(fn)
            if index is not None:
                by_scans, by_branches = self.model.entered[index]
        if not by_scans and not by_branches:
            return None
        starts = [self.model.sweep(part).starts for part in parts]
        interior = np.concatenate(starts) if len(starts) > 1 else starts[0]
        interior = interior[interior != fn.address]  # (arrays: a big function has 1,000s)
        references = self.model.taken_index.branch_sources(interior) if by_scans else {}
        for target in sorted(references):
            for source in references[target]:
                if not inside(source) and self.model.really_names(source, target):
                    return target, source
        if not by_branches or not self.pairs_from_outside(parts, interior):
            return None  # (no function's branch lands there from outside: nor a near one's)
        within = None  # (the same as a set, made if a branch from outside lands inside)
        for part in parts:  # short branches, which the byte scan does not see
            for near in self.model.near_functions(Window(part.address, part.size, ())):
                if inside(near.address):
                    continue
                for target, source in self.model.branch_targets(near).items():
                    if not inside(source) and inside(target):
                        within = set(interior.tolist()) if within is None else within
                        if target in within:
                            return target, source
        return None

    def pairs_from_outside(self, parts: List[Function], interior: np.ndarray) -> bool:
        """Whether any direct branch or jump-table case of the file (prepare()'s, of every
        function) lands on one of `interior` from outside `parts`; True before prepare()
        has them. Where none does, no near function's does (asked with arrays at once,
        not a loop over their neighbours' branches)."""
        if self.model.branch_pairs is None:
            return True
        targets, sources = self.model.branch_pairs
        bounds = targets.searchsorted([(p.address, p.end) for p in parts]).tolist()
        landing = np.concatenate([targets[a:b] for a, b in bounds])
        source = np.concatenate([sources[a:b] for a, b in bounds])
        outside = np.ones(len(source), dtype=bool)
        for part in parts:
            outside &= (source < part.address) | (source >= part.end)
        # (the few from outside, if any, then looked up: most of a function's are its own)
        return bool(outside.any()) and bool(np.isin(landing[outside], interior).any())

    def direct_targets_in(self, start: int, end: int) -> bool:
        near = self.model.near_functions(Window(start, end - start, ()))
        return any(start <= t < end for fn in near
                   for t in self.model.branch_targets(fn))
