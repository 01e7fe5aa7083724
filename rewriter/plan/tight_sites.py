"""The tactics for tight sites, those the plain jump refused (docs/design.md, "Patch
tactics"), tried in order: a hop (a short jump to a landing in padding), an eviction (a
landing that a neighbour window, moved to a trampoline of its own, frees), a punned jump
(ending in the bytes after the window; with successor eviction where those bytes lead
nowhere free). What each writes: plan/tactics.py."""

from __future__ import annotations

import bisect
import weakref
from dataclasses import replace
from typing import Dict, List, Optional, Union

import numpy as np

from urewrite.arch.base import Window
from urewrite.rewriter import elf_symbols, free_space
from urewrite.rewriter.arrays import unique
from urewrite.rewriter.free_space import Occupancy
from urewrite.rewriter.functions import Function
from urewrite.rewriter.plan.results import Hop, Outcome, Plan, Pun, Refusal, Refused
from urewrite.rewriter.selectors import Site


class TightSites:
    """Hops, evictions and punned jumps for one planner's refused sites. Windows are the
    planner's (a weak reference: the planner owns this)."""

    MAX_EVICTION_CANDIDATES = 8  # neighbour windows looked at per hop

    def __init__(self, planner):
        self.planner = weakref.proxy(planner)
        self.model = planner.model
        self.safety = planner.safety
        self.elf = planner.elf
        self.backend = planner.backend
        self.functions = planner.functions
        self._gap_ends: tuple = (None, [])  # (padding gaps, their ends): landing_in_padding
        self._symbol_starts: Optional[np.ndarray] = None  # where symbols start, sorted, when needed
        self._text_relocations: Optional[bool] = None  # the file's, when first needed

    def place(self, outcomes: List[Outcome]) -> List[Outcome]:
        """Each site the plain jump refused, tried again by the tactics for tight sites
        in order, each over all the sites those before it left (so that the places each
        takes are the same whichever ran before): a hop to a landing in padding, a hop
        to a landing an evicted neighbour frees, a punned jump. Hops patch a window of
        whole instructions of the hop's size with a short jump to a landing of the
        jump's size within its reach. Landings and evicted windows follow the rules of
        windows: whole instructions, nothing targets their bytes, no overlap with
        another window."""
        refusals = [o for o in outcomes if isinstance(o, Refusal)]
        if not refusals:
            return outcomes
        # (no landing or evicted window in copied code either)
        tight = _TightSites(self._used_by(outcomes), self.hop_windows(refusals))
        for name, tactic in (("hop", self.hop_to_padding), ("evict", self.hop_over_eviction),
                             ("pun", self.pun_each)):
            tactic(tight, name in self.planner.tactics)
        result = [o for o in outcomes if isinstance(o, Plan)] + tight.outcomes()
        result.sort(key=lambda o: o.window.address if isinstance(o, Plan) else o.site.address)
        return result

    def hop_over_calls(self, outcomes: List[Outcome]) -> List[Outcome]:
        """Plain jumps whose window ends in a displaced call, hopped where a hop's shorter
        window leaves the call in place and a landing in padding is free: a displaced call
        is emulated (its callee returns into the original code), and that return is
        mispredicted at every hit, disarmed too (6.5 ns a call here, docs/benchmarks.md);
        a hop costs one more jump. After the tight sites (place()), which need landings
        more: a jump kept is a jump that works."""
        candidates = [o for o in outcomes if isinstance(o, Plan) and o.tactic == "jump"
                      and len(o.points) == 1 and self.backend.is_call(o.window.insns[-1])]
        shorter = {}
        for plan in candidates:
            try:
                hop = self.planner.group_window(list(plan.sites), self.backend.hop_size)
            except Refused:
                continue
            call = plan.window.insns[-1]
            if plan.window.address <= hop.window.address and hop.window.end <= call.address \
                    and {p.address for p in hop.points} == {p.address for p in plan.points}:
                shorter[plan.window.address] = hop
        if not shorter:
            return outcomes
        used = self._used_by(outcomes)
        gaps = self.padding_gaps(list(shorter.values()))
        wanted = {a for start, end in gaps for a in range(start, end)}
        wanted |= {a for h in shorter.values() for a in range(h.window.address + 1, h.window.end)}
        taken = self.model.taken_index.find(wanted)
        result = []
        for outcome in outcomes:
            hop = shorter.get(outcome.window.address) if isinstance(outcome, Plan) else None
            landing = None
            if hop is not None and self.safety.branch_into(hop, taken) is None:
                landing = self.landing_in_padding(hop.window, gaps, used, taken)
            if landing is None:
                result.append(outcome)
                continue
            used.take(landing, landing + self.backend.patch_size)
            result.append(replace(hop, hop=Hop(landing)))
        return result

    def _used_by(self, outcomes: List[Outcome]) -> Occupancy:
        """The bytes the plans' windows, landings, moved neighbours and stubs take, and
        copied code (before place(), the plain jumps' windows and copied code)."""
        size = self.backend.patch_size
        ranges = [(c.start, c.end) for c in self.model.copied]
        for plan in outcomes:
            if not isinstance(plan, Plan):
                continue
            patching = plan.patching
            ranges.append((plan.window.address, plan.window.end))
            if patching.moved is not None:  # (an evicted neighbour holds its landing)
                ranges.append((patching.moved.address, patching.moved.end))
            if plan.hop is not None:
                ranges.append((plan.hop.landing, plan.hop.landing + size))
            ranges += [(a, a + size) for a in patching.stub_addresses()]
        merged: List[list] = []
        for start, end in sorted(ranges):
            if merged and start < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return Occupancy.of([a for a, _ in merged], [b for _, b in merged])

    def hop_windows(self, refusals: List[Refusal]) -> list:
        """(refusals, the window of a hop for them or why there is none) for each group
        of refusals at one address; windows that overlap merged (merge_overlaps)."""
        tried = []
        for group in self.planner.by_address(refusals, lambda refusal: refusal.site):
            try:
                tried.append((group, self.planner.group_window([r.site for r in group],
                                                        self.backend.hop_size)))
            except Refused as why:
                tried.append((group, str(why)))
        return tried

    def hop_to_padding(self, tight: "_TightSites", enabled: bool) -> None:
        """Hops to the nearest free landing in padding. Asks first of every hop window
        what either hop needs (nothing branches into it, no other window over it): the
        reason is kept where it fails, tried or not."""
        plans = [p for _, p in tight.tried if isinstance(p, Plan)]
        gaps = self.padding_gaps(plans)
        # window interiors, and every byte a landing may take
        wanted = {a for p in plans for a in range(p.window.address + 1, p.window.end)}
        wanted |= {a for start, end in gaps for a in range(start, end)}
        taken = self.model.taken_index.find(wanted)
        tight.tried = self.merge_overlaps(tight.tried, taken)
        for _, plan in tight.tried:
            if isinstance(plan, str):
                continue
            reason = self.safety.branch_into(plan, taken)
            if reason is None and not tight.used.is_free(plan.window.address, plan.window.end):
                reason = "its window overlaps another window"
            if reason:
                tight.reasons[plan.window.address] = reason
                continue
            landing = self.landing_in_padding(plan.window, gaps, tight.used, taken) \
                if enabled else None
            if landing is not None:
                tight.used.take(plan.window.address, plan.window.end)
                tight.used.take(landing, landing + self.backend.patch_size)
                tight.hopped[plan.window.address] = replace(plan, hop=Hop(landing))

    def hop_over_eviction(self, tight: "_TightSites", enabled: bool) -> None:
        """Hops to a landing that a neighbour window frees, moved to a trampoline of
        its own, for the hop windows left."""
        waiting = [p for _, p in tight.tried if isinstance(p, Plan)
                   and p.window.address not in tight.hopped
                   and p.window.address not in tight.reasons]
        candidates = {p.window.address: self.eviction_candidates(p.window, tight.used)
                      if enabled else [] for p in waiting}
        wanted = {a for found in candidates.values() for w in found
                  for a in range(w.address + 1, w.end)}
        taken = self.model.taken_index.find(wanted) if wanted else {}
        for plan in waiting:
            if not tight.used.is_free(plan.window.address, plan.window.end):
                tight.reasons[plan.window.address] = "its window overlaps another window"
                continue
            evicted = self.evict(candidates[plan.window.address], plan.window, tight.used,
                                 taken)
            if evicted is None:
                tight.reasons[plan.window.address] = (
                    f"no {self.backend.patch_size} free bytes within its reach, in padding "
                    f"or after a neighbour window that could move")
                continue
            landing = evicted.address + self.backend.patch_size
            tight.used.take(plan.window.address, plan.window.end)
            tight.used.take(evicted.address, evicted.end)
            tight.hopped[plan.window.address] = replace(plan, hop=Hop(landing, evicted))

    def pun_each(self, tight: "_TightSites", enabled: bool) -> None:
        """Punned jumps for the groups no hop took, in order."""
        if not (enabled and self.backend.puns):
            return
        for k, (group, plan) in enumerate(tight.tried):
            if not (isinstance(plan, Plan) and plan.window.address in tight.hopped):
                tight.punned[k] = self.pun([r.site for r in group], tight.used)

    def pun(self, sites: List[Site], used: Occupancy) -> Union[Plan, str, None]:
        """A punned jump for sites no other tactic could patch: a window of just their
        instruction, shorter than the jump, whose last bytes are the bytes after it, so
        that these must stay as they are (no window or landing over them), and the
        stub where those bytes make it go must be free, above the new code and state,
        and within the stub's reach of the trampoline. The plan, or why not."""
        try:
            plan = self.planner.group_window(sites, 1)
        except Refused as why:
            return str(why)
        window, size = plan.window, self.backend.patch_size
        if window.size >= size:
            return None  # the plain jump was refused for a reason no pun lifts
        if self._text_relocations is None:
            self._text_relocations = self.elf.text_relocations
        if self._text_relocations:
            return "the file has text relocations: the bytes after it may change"
        following = self.elf.offset_of(window.end, size)
        if following is None or not used.is_free(window.address, window.end + size - 1):
            return "the bytes after it are not kept as they are"
        reason = self.safety.branch_into(plan, self.safety.taken_in_windows([plan]))
        if reason:
            return reason
        floor = self.planner.stub_floor
        found = self.backend.pun(window, self.elf.data[following:following + size],
                                 self.planner.stubs)
        if found is None:
            moved = self.successor(window, used)
            if isinstance(moved, Window):
                return self.pun_over_successor(plan, moved, used) or (
                    f"the bytes after it make the jump go below the new code ({floor:#x}), "
                    f"and no stubs were free for it and the instructions after it (within "
                    f"the cap on pages of stubs)")
            return (f"the bytes after it make the jump go below the new code ({floor:#x}), "
                    f"onto another stub, or to a new page of stubs past the cap; and {moved}")
        patch, stub, jump_size = found
        used.take(window.address, window.address + jump_size)
        self.planner.stubs.take(stub)
        return replace(plan, pun=Pun(patch, stub))

    def pun_over_successor(self, plan: Plan, moved: Window, used: Occupancy) -> Optional[Plan]:
        """The punned jump of `plan`'s window ending in the jump that moves `moved` (the
        instructions after it) away, both displacements chosen so that both go to free
        stubs; None if no pair is free."""
        found = self.backend.pun_over_successor(plan.window, self.planner.stubs)
        if found is None:
            return None
        patch, site_stub, successor_jump, stub = found
        used.take(plan.window.address, moved.end)
        self.planner.stubs.take(site_stub)
        self.planner.stubs.take(stub)
        return replace(plan, pun=Pun(patch, site_stub, moved, successor_jump, stub))

    def successor(self, window: Window, used: Occupancy) -> Union[Window, str]:
        """The whole instructions right after `window` that a jump could replace, moved to a
        trampoline of their own (as an evicted neighbour is): one function's, at least a
        jump long, each relocatable, none a landing pad (endbr64), nothing aimed after the
        first one's first byte; or why there are none."""
        at, size = window.end, self.backend.patch_size
        k = bisect.bisect_right(self.model.starts, at) - 1
        fn = self.functions[k] if k >= 0 else None
        if fn is None or not fn.address <= at < fn.end:
            return "no function's code follows it, to move away"
        insns, first = self.rows_from(fn, at, at + size)
        if first is None:
            return "no instruction starts right after it, to move away"
        last = first
        while last < len(insns) and insns[last].end - at < size:
            last += 1
        if last == len(insns):
            return "the instructions after it end before a jump would"
        chosen = insns[first:last + 1]
        end = chosen[-1].end
        if last > first and self.planner.windows.unknown_cases([fn]):
            return "the instructions after it lie where any one may be a case of a table"
        if not used.is_free(at, end) or any(self.backend.landing_pad_size(i) for i in chosen):
            return "the instructions after it cannot move"
        if self.safety.near_target_between(fn, at, end):
            return "a branch lands inside the instructions after it"
        if self.safety.taken_inside(at, end) or self.safety.landing_pad_in(at, end, chosen):
            return "a branch may land inside the instructions after it"
        try:
            return Window(at, end - at, self.planner.windows.displaced(chosen))
        except Refused as why:
            return f"the instructions after it {why}"

    def rows_from(self, fn: Function, start: int, end: int) -> tuple:
        """(instructions, k): the function's instructions from the first starting at or
        after `start` to the one that holds `end` (or its last), each decoded where the
        planner may read it (rows()); k the index of the one starting at `start`, or
        None. Where those it decodes do not match the sweep, all the function's, decoded
        (as instructions(): they then decide)."""
        sweep = self.model.sweep(fn)
        first = int(sweep.edges.searchsorted(start))
        last = min(int(sweep.edges.searchsorted(end)) + 1, len(sweep))
        try:
            insns = self.model.rows(fn, first, last) if first < last else []
        except Refused:
            insns = self.model.instructions(fn)
            return insns, next((k for k, i in enumerate(insns) if i.address == start), None)
        return insns, 0 if insns and insns[0].address == start else None

    def merge_overlaps(self, tried: list, taken: Dict[int, list]) -> list:
        """Hop windows that overlap (the entry and the exit of a tiny function) become
        one, as plain windows do; else the later one is refused."""
        merged = []
        for group, plan in tried:
            if isinstance(plan, Plan):
                before = next((k for k in range(len(merged) - 1, -1, -1)
                               if isinstance(merged[k][1], Plan)), None)
                if before is not None and plan.window.address < merged[before][1].window.end:
                    union = self.planner.merge(merged[before][1], plan, taken)
                    if union is None:
                        plan = "its window overlaps the window of the site before it"
                    else:
                        merged[before] = (merged[before][0] + group, union)
                        continue
            merged.append((group, plan))
        return merged

    def padding_gaps(self, plans: List[Plan]) -> List[tuple]:
        """The padding runs within reach of some hop window (only those are decoded)."""
        if not plans:
            return []
        if self._symbol_starts is None:
            values = elf_symbols.table(self.elf).values
            self._symbol_starts = unique(values[values != 0].astype(np.int64))
        return sorted(free_space.padding_gaps(
            self.elf, self.backend, self.functions, self.model.last_instruction,
            self._symbol_starts, [self.backend.hop_reach(p.window.address) for p in plans]))

    def landing_in_padding(self, window: Window, gaps, used: Occupancy,
                            taken: Dict[int, list]) -> Optional[int]:
        """The nearest free landing in padding within a hop's reach of `window`."""
        lo, hi = self.backend.hop_reach(window.address)
        size = self.backend.patch_size
        spots = []
        if self._gap_ends[0] is not gaps:  # (gaps are sorted and disjoint: so are their ends)
            self._gap_ends = (gaps, [end for _, end in gaps])
        k = bisect.bisect_left(self._gap_ends[1], lo + size)  # the first gap reaching lo
        while k < len(gaps) and gaps[k][0] <= hi:
            start, end = gaps[k]
            for at in range(max(start, lo), min(end - size, hi) + 1):
                spots.append((abs(at - window.address), at))
            k += 1
        for _, at in sorted(spots):
            clear = at + size <= window.address or at >= window.end  # of the hop's own window
            if clear and used.is_free(at, at + size) and \
                    not any(self.safety.taken_reason(taken, a) for a in range(at, at + size)) and \
                    not self.safety.direct_targets_in(at, at + size):
                return at
        return None

    def eviction_candidates(self, window: Window, used: Occupancy) -> List[Window]:
        """Neighbour windows whose bytes after a jump would hold a landing in a hop's
        reach of `window`: whole instructions of one function, at least two jumps long,
        that can run from a trampoline, with no known branch target inside and no
        landing pad (endbr64) among them. Functions with an indirect jump other than a
        recovered jump table are left alone: its targets are unknown."""
        lo, hi = self.backend.hop_reach(window.address)
        size = self.backend.patch_size
        found = []
        for fn in self.model.near_functions(window):
            if self.model.has_indirect_jump(fn):
                continue
            insns, _ = self.rows_from(fn, lo - size, hi + size)
            for k, first in enumerate(insns):
                if not lo <= first.address + size <= hi:
                    continue
                last = k
                while last < len(insns) and insns[last].end - first.address < 2 * size:
                    last += 1
                if last == len(insns):
                    break
                chosen = insns[k:last + 1]
                end = chosen[-1].end
                if not used.is_free(first.address, end) or \
                        any(self.backend.landing_pad_size(i) for i in chosen):
                    continue
                if self.safety.near_target_between(fn, first.address, end) or \
                        self.safety.landing_pad_in(first.address, end, chosen):
                    continue
                try:
                    displaced = self.planner.windows.displaced(chosen)
                except Refused:
                    continue
                found.append(Window(first.address, end - first.address, displaced))
                if len(found) >= self.MAX_EVICTION_CANDIDATES:
                    return found
        return found

    def evict(self, candidates: List[Window], window: Window, used: Occupancy,
               taken: Dict[int, list]) -> Optional[Window]:
        """The first candidate still free, clear of the hop's own window, that nothing
        targets inside."""
        for w in candidates:
            if used.is_free(w.address, w.end) and (w.end <= window.address or
                                                   w.address >= window.end) and \
                    not any(self.safety.taken_reason(taken, a)
                            for a in range(w.address + 1, w.end)):
                return w
        return None


class _TightSites:
    """What the tactics for tight sites share as they run (TightSites.place)."""

    def __init__(self, used: Occupancy, tried: list):
        self.used = used  # bytes windows, landings and evicted windows take
        self.tried = tried  # (refusals, hop window plan or why there is none)
        self.hopped: Dict[int, Plan] = {}  # hop window -> its plan with a hop
        self.reasons: Dict[int, str] = {}  # hop window -> why no hop
        self.punned: Dict[int, Union[Plan, str, None]] = {}  # index in tried -> pun()

    def outcomes(self) -> List[Outcome]:
        """A plan for each group a tactic took; a refusal with each tactic's reason for
        the others (one reason where all are the same)."""
        result = []
        for k, (group, plan) in enumerate(self.tried):
            if isinstance(plan, Plan) and plan.window.address in self.hopped:
                result.append(self.hopped[plan.window.address])
                continue
            why = plan if isinstance(plan, str) else self.reasons[plan.window.address]
            punned = self.punned.get(k)
            if isinstance(punned, Plan):
                result.append(punned)
                continue
            for r in group:
                tried_so = [("jump", r.reason), ("hop", why)] + ([("pun", punned)] if punned else [])
                result.append(Refusal(r.site, r.reason if {w for _, w in tried_so} == {r.reason}
                                      else "; ".join(f"{t}: {w}" for t, w in tried_so)))
        return result
