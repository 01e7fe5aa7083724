"""Decides, per site, which bytes a patch displaces, or why the site is refused.

A site is patched by overwriting a window of whole instructions (at least the
backend's patch size) with a jump. That is safe only when:
- every displaced instruction can run from the trampoline (the backend says);
- no branch lands inside the window after its first byte (such a branch
  would land in the middle of the jump). Direct branches of the function and of
  its neighbours are decoded exactly; far branches and addresses taken anywhere
  in the file are found by conservative scans (taken_addresses.py); C++ landing
  pads, where the unwinder resumes a frame, count as branch targets
  (except_table.py);
- a window that runs past the function's end covers only alignment padding that
  no symbol and no branch claims;
- no patched byte lies in code that the program copies elsewhere at run time
  (copied_code.py): a jump copied away would lead nowhere.
"""

from __future__ import annotations

import bisect
import functools
import os
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Set

import numpy as np

from urewrite.arch.base import Backend, Insn, Window
from urewrite.errors import UrewriteError
from urewrite.rewriter import (free_space, go_runtime, layout, parallel, redirection,
                               taken_addresses)
from urewrite.rewriter.elf_file import ElfFile
from urewrite.rewriter.functions import Function
from urewrite.rewriter.model import MAX_LOOK_BACK, BinaryModel
from urewrite.rewriter.plan.branch_safety import BranchSafety
from urewrite.rewriter.plan.return_exits import ReturnExits
from urewrite.rewriter.plan.results import (UNKNOWN, Outcome, Plan, Precomputed, ProbePoint,
                                            Refusal, Refused, Verdict, WindowFound)
from urewrite.rewriter.plan.tactics import TACTICS
from urewrite.rewriter.plan.tight_sites import TightSites
from urewrite.rewriter.plan.whole_file import WholeFile
from urewrite.rewriter.selectors import Site
from urewrite.rewriter.stub_space import StubSpace
from urewrite.trampolines.region import KIND_RETURN





# Set: return probes redirect the return address wherever that is allowed, even
# where every exit could be patched (tests reach the fallback with it on arm64,
# where nearly every exit can be patched).
REDIRECT_ALL = "UREWRITE_REDIRECT_RETURNS"


class Planner:
    """Plans sites of one file. Decodes each function once, however many sites it has."""

    def __init__(self, elf: ElfFile, backend: Backend, functions: List[Function],
                 tactics: tuple = TACTICS,
                 taken_index: Optional[taken_addresses.TakenIndex] = None):
        self.elf = elf
        self.backend = backend
        self.tactics = tactics  # which of TACTICS to try
        self.functions = functions
        self.model = BinaryModel(elf, backend, functions, taken_index)
        self.safety = BranchSafety(self.model)
        self.whole_file = WholeFile(self.model)
        self.exits = ReturnExits(self.model, self.safety)
        self._decoded_alone: Dict[bytes, object] = {}  # (_decoded_alone_as)
        self._gaps: Dict[int, int] = {}  # section -> _gap_after()
        self._windows_known: Dict[tuple, object] = {}  # _window_key() -> window (or why not)
        # _window_key() -> _retried_window() as precompute found it (None: no window)
        self._retried_known: Dict[tuple, Optional[WindowFound]] = {}
        self._offset_tables: Dict[int, Optional[int]] = {}  # function -> _case_base()
        # function (its return probe's exits: -address - 1) -> _unknown_targets()
        self._unknown_known: Dict[int, Optional[str]] = {}
        self._verbatim: Dict[bytes, list] = {}  # code -> its instructions, or [] (_moves_verbatim)
        self._padding_runs: Dict[bytes, list] = {}  # code -> _padding_run()
        self._shadow_stack = elf.shadow_stack
        self._redirect_file_problem: Optional[str] = None  # computed when first needed
        self._redirect_problems: Dict[int, Optional[str]] = {}  # function -> its own problem
        self._injected: Optional[Set[int]] = None  # _keep_injected_flags(), when first needed
        self.redirected_because: Dict[int, str] = {}  # function -> why its exits are not patched
        # punned jumps' stubs go at or above this (layout.stub_floor); set by plan()
        self.stub_floor: Optional[int] = None
        self.stubs: Optional[StubSpace] = None  # the punned jumps' stubs; set by plan()
        self.tight_sites = TightSites(self)  # (hop, evict, pun: for sites the jump refused)

    def prepare(self, functions: List[Function],
                meanwhile: Optional[Callable[[], None]] = None,
                progress: Optional[Callable[[int], None]] = None) -> None:
        """The whole-file precompute of these functions (WholeFile.prepare)."""
        self.whole_file.prepare(functions, meanwhile, progress)

    # -- planning ----------------------------------------------------------------
    def plan(self, sites: List[Site], progress: Optional[Callable[[int], None]] = None
             ) -> List[Outcome]:
        """A plan per address (with every site there), or a refusal per site.

        A return probe becomes one site per exit of its function, planned as a
        whole: when some exit cannot be patched, it becomes one site at the entry
        that redirects the return address instead, when that is allowed
        (redirection.py); else it is refused with both reasons. `progress(n)` is
        told as sites are done.
        """
        if self.stub_floor is None:
            self.stub_floor = layout.stub_floor(self.elf, len(sites))
        in_copy, sites = self._refuse_copied(sites)
        if progress and in_copy:
            progress(len(in_copy))
        returns = {s.probe_key: s for s in sites if s.kind == KIND_RETURN}
        expanded, unpatched = [], {}  # return probe key -> why its exits cannot be patched
        redirect_all = REDIRECT_ALL in os.environ
        for site in sites:
            if site.kind != KIND_RETURN:
                expanded.append(site)
                continue
            if progress:
                progress(1)  # (its exits are planned with the others, quickly)
            if redirect_all and not self._redirect_problem(site.function):
                unpatched[site.probe_key] = f"{REDIRECT_ALL} is set"  # tests of the fallback
                continue
            try:
                expanded.extend(self.exits.exit_sites(site))
            except Refused as why:
                unpatched[site.probe_key] = str(why)
        kept, failed = self._whole_returns(self._plan_sites(expanded, progress))
        unpatched.update(failed)
        # the fallback: redirect the return address at the entry (docs/design.md)
        redirects, refused = [], []
        for key, reason in unpatched.items():
            problem = self._redirect_problem(returns[key].function)
            if problem:
                refused.append(Refusal(returns[key], f"{reason}; and its return address "
                                                     f"cannot be redirected: {problem}"))
            else:
                redirects.append(replace(returns[key], address=returns[key].function.address,
                                         redirect=True))
                self.redirected_because[returns[key].function.address] = reason
        if redirects:
            expanded = [s for s in expanded if s.probe_key not in unpatched] + redirects
            # (the first round's plans are made again: not kept beside the second's, 24 MB
            # of libLLVM's peak)
            kept = failed = None
            kept, failed = self._whole_returns(self._plan_sites(expanded))
            refused += [Refusal(returns[key], f"{unpatched.get(key, '')}; and its return "
                                              f"address cannot be redirected: {reason}"
                                if key in unpatched else reason)
                        for key, reason in failed.items()]
        return self._keep_injected_flags(kept + refused + in_copy)

    def _keep_injected_flags(self, outcomes: List[Outcome]) -> List[Outcome]:
        """The outcomes, where a function that a runtime enters by a call it injects at
        any instruction (go_runtime.injected_entries) keeps the flags at its entry and
        exits, and has no return redirected (its return goes back to that instruction,
        every flag live)."""
        if self._injected is None:
            self._injected = go_runtime.injected_entries(self.elf)
        if not self._injected:
            return outcomes
        out = []
        for o in outcomes:
            if isinstance(o, Plan) and any(s.function.address in self._injected
                                           for s in o.sites):
                redirected = [s for s in o.sites if s.redirect]
                out += [Refusal(s, "Go's runtime injects calls to it at any instruction: its "
                                   "return address cannot be redirected") for s in redirected]
                o = o.without({s.probe_key for s in redirected})
                if o is None:
                    continue
                o = replace(o, points=tuple(replace(p, flags_live=True) for p in o.points))
            out.append(o)
        return out

    def _refuse_copied(self, sites: List[Site]) -> tuple:
        """(refusals of the sites in copied code, the other sites). A return probe is
        refused when any of its function is: its exits or its entry would be patched."""
        refused, rest = [], []
        for site in sites:
            copy = self.model.copied_at(site.function.address, site.function.end) \
                if site.kind == KIND_RETURN else self.model.copied_at(site.address)
            if copy:
                refused.append(Refusal(site, copy.reason()))
            else:
                rest.append(site)
        return refused, rest

    @staticmethod
    def _whole_returns(outcomes: List[Outcome]) -> tuple:
        """A return probe missing one exit (or its redirecting entry) would miss returns:
        drop it whole. Returns (outcomes kept, {probe key: reason} of dropped ones)."""
        failed = {}
        for o in outcomes:
            if isinstance(o, Refusal) and o.site.kind == KIND_RETURN:
                where = "its entry" if o.site.redirect else f"its exit at {o.site.address:#x}"
                failed.setdefault(o.site.probe_key, f"{where}: {o.reason}")
        kept = []
        for o in outcomes:
            if isinstance(o, Refusal):
                if o.site.kind != KIND_RETURN:
                    kept.append(o)
                continue
            remaining = o.without(failed) if failed else o
            if remaining:
                kept.append(remaining)
        return kept, failed

    def _redirect_problem(self, fn: Function) -> Optional[str]:
        if self._redirect_file_problem is None:
            self._redirect_file_problem = redirection.file_problem(self.elf, self.backend) or ""
        if self._redirect_file_problem:
            return self._redirect_file_problem
        if fn.address not in self._redirect_problems:  # (or precompute found it)
            self._redirect_problems[fn.address] = redirection.function_problem(
                self.elf, self.backend, fn, self.model.entry_frames())
        return self._redirect_problems[fn.address]

    def precompute(self, sites: List[Site],
                   progress: Optional[Callable[[int], None]] = None) -> None:
        """For plans that are only reported (`list`): a window for each of these sites
        (for a return probe, its exits first, then a window for each) and whether
        anything may branch into it, worked out ahead, in this process and a forked
        child (parallel.py), each taking pieces of them as it goes: plan() takes
        them as it would have found them itself, so the plans are the same, in about
        half the time. `progress(n)`: told of sites done, by both."""
        self.model.taken_index.every_value()  # (the scans, made once before the fork)
        self.model.compiled_search()  # (and the compiled search, where there is one)

        # (pieces of about 1/2048 of the sites, taken by each process as it goes; see
        # prepare)
        pieces = parallel.Shares.of(sites, 2048)

        def work(leave: int = 0, progress=None) -> Precomputed:
            exits, windows, plans = {}, {}, []
            at_risk = {}  # return probes with an exit whose window may fail: address -> function
            for piece in pieces.take(leave, progress):
                targets = []
                for site in piece:
                    if site.kind != KIND_RETURN:
                        targets.append(site)
                        continue
                    try:
                        points, conditional = exits[site.function.address] = \
                            self.exits.exit_points(site)
                    except Refused as why:
                        exits[site.function.address] = str(why)
                        at_risk[site.function.address] = site.function
                        continue
                    self.exits.conditional |= conditional  # (a window asks)
                    targets.extend(site.at_exit(*point) for point in points)
                for target, found in zip(targets, self._windows(targets)):
                    if isinstance(found, Plan):
                        plans.append((self._window_key(target), target, found))
                        continue
                    windows[self._window_key(target)] = found
                    if target.kind == KIND_RETURN:
                        at_risk[target.function.address] = target.function
            taken = self.safety.taken_in_windows([plan for _, _, plan in plans])
            retried = {}  # key -> _retried_window(), where something may branch in
            clear = self.safety.clear_of_branches([plan for _, _, plan in plans], taken)
            for (key, target, plan), known_clear in zip(plans, clear):
                verdict = None if known_clear else \
                    self.safety.branch_into(plan, taken, inner_window=not target.at_entry)
                windows[key] = self._kept(plan, verdict)
                if verdict and not target.at_entry:  # (what _plan_sites will try next)
                    again, why = self._retried_window([target])
                    retried[key] = again and self._kept(again, why)
                if verdict and target.kind == KIND_RETURN:
                    at_risk[target.function.address] = target.function
            # where a return probe's exits may not all be patched, plan() asks whether its
            # return address may be redirected instead: a walk over the whole function
            # (libLLVM: 5,000 functions, 0.1 s in the native module where it was
            # built, else 12 s of Capstone's detail), answered here on both cores
            problems = {address: self._redirect_problem(fn) for address, fn in at_risk.items()}
            return Precomputed(exits, windows, problems, retried)

        # (the child leaves the last 64 pieces to this process: it also sends what it
        # found, and this process reads it, 0.5 s on node)
        second = parallel.Forked(lambda: work(leave=64))
        for found in (work(progress=progress), second.result()):
            self.exits.known.update(found.exits)
            self._windows_known.update(found.windows)
            # (read only if the file allows it)
            self._redirect_problems.update(found.redirect_problems)
            self._retried_known.update(found.retried)
        pieces.done(progress)

    def _window_key(self, site: Site) -> tuple:
        """What a site's window depends on (precompute)."""
        return (site.address, site.function.address, site.at_entry, site.stays_within,
                self._counts_when_taken(site))

    def _known_window(self, site: Site) -> Optional[tuple]:
        """(the plan of the window precompute found for a site, the Verdict on what may
        branch into it); None if it found none."""
        known = self._windows_known.get(self._window_key(site))
        if known is None:
            return None
        if isinstance(known, str):
            raise Refused(known)
        plan, reason = self._made_again(known, site)
        return plan, Verdict(True, reason)

    @staticmethod
    def _kept(plan: Plan, reason: Optional[str]) -> WindowFound:
        """A plan of one site, and what may branch into it (None or why), as precompute
        keeps them: all but the site (sent between processes; _made_again() gives them
        back)."""
        return WindowFound(plan.window, plan.points[0].address, plan.points[0].flags_live,
                           reason)

    def _made_again(self, kept: WindowFound, site: Site) -> tuple:
        """(the plan _kept() keeps, for `site`; what may branch into it: None or why)."""
        # (an entry's point follows its landing pad: the window's start)
        window, point, flags_live, reason = kept
        return Plan(window, (ProbePoint(point, (site,), flags_live,
                                        self._counts_when_taken(site),
                                        site.stays_within),)), reason

    def _counts_when_taken(self, site: Site) -> bool:
        """Whether the site is a conditional exit, counted on its taken edge only."""
        return site.kind == KIND_RETURN and site.address in self.exits.conditional

    def _by_address(self, items, site_of=lambda site: site) -> list:
        """Sites (or items holding one) grouped by the point they share, in address
        order (a conditional exit counts on its taken edge only, an indirect jump's
        when it leaves: they share no point)."""
        groups: Dict[tuple, list] = {}
        for item in items:
            site = site_of(item)
            key = (site.address, self._counts_when_taken(site), site.stays_within)
            groups.setdefault(key, []).append(item)
        return [groups[key] for key in sorted(groups)]

    def _group_window(self, group: List[Site], size: Optional[int] = None,
                      avoid_taken: bool = False) -> Plan:
        """One window for the sites at one point, all counted there."""
        return self._group_plan(group, size, avoid_taken)[0]

    @staticmethod
    def _primary(group: List[Site]) -> Site:
        # a site inside a function follows the stricter rules (flags live)
        return group[0] if len(group) == 1 else \
            next((s for s in group if not s.at_entry), group[0])

    def _group_plan(self, group: List[Site], size: Optional[int] = None,
                    avoid_taken: bool = False, found=None) -> tuple:
        """(_group_window(), what may branch into it when precompute found out: None or
        why, or UNKNOWN: a Verdict). `found`: that for the primary site already, or why it has
        no window (_plan_sites: _found_windows())."""
        primary = self._primary(group)
        if found is None:
            known = self._known_window(primary) if size is None and not avoid_taken else None
            found = known or (self._window(primary, size, avoid_taken), UNKNOWN)
        elif isinstance(found, str):
            raise Refused(found)
        plan, verdict = found
        copy = self.model.copied_at(plan.window.address, plan.window.end)
        if copy:
            raise Refused(copy.reason())
        if len(group) == 1:
            return plan, verdict
        point = plan.points[0]
        return replace(plan, points=(replace(point, sites=tuple(
            [primary] + [s for s in group if s is not primary])),)), verdict

    def _plan_sites(self, sites: List[Site], progress=None) -> List[Outcome]:
        # (planned afresh: a second round re-plans every site)
        # (a partial, not a lambda: one would hold the planner in a reference cycle,
        # and the collector would visit a big file's millions of objects to free it)
        self.stubs = StubSpace(self.stub_floor, self.backend.patch_size,
                                functools.partial(layout.stub_page_cap, self.elf),
                                self.backend.stub_places_engine)
        tentative, verdicts = [], {}  # (verdicts: id(plan) -> its Verdict, where known)
        groups = self._by_address(sites)
        found = []  # (_group_plan()'s `found`, for each group: a few thousand at a time)
        for k, group in enumerate(groups):
            if k % 4096 == 0 and "jump" in self.tactics:  # (progress goes on meanwhile)
                found = self._found_windows(groups[k:k + 4096])
            if progress and group[0].kind != KIND_RETURN:
                progress(len(group))
            try:
                if "jump" not in self.tactics:
                    raise Refused("not among the tactics to try")
                plan, verdict = self._group_plan(group, found=found[k % 4096])
                tentative.append(plan)
                if verdict.known:
                    verdicts[id(plan)] = verdict
            except Refused as why:
                tentative.extend(Refusal(s, str(why)) for s in group)
        asked = [o for o in tentative if isinstance(o, Plan) and id(o) not in verdicts]
        taken = self.safety.taken_in_windows(asked)
        # (most windows, known clear all at once: only the others are asked one by one)
        verdicts.update((id(plan), Verdict(True)) for plan, clear in
                        zip(asked, self.safety.clear_of_branches(asked, taken)) if clear)
        outcomes = []
        previous, previous_at = None, 0  # the last plan kept, and where it is in outcomes
        tentative.sort(key=lambda o: o.window.address if isinstance(o, Plan) else o.site.address)
        for outcome in tentative:
            if isinstance(outcome, Plan):
                verdict = verdicts.get(id(outcome), UNKNOWN)
                reason = verdict.reason if verdict.known else \
                    self.safety.branch_into(outcome, taken)
                if reason and not outcome.site.at_entry:
                    retried = self._window_clear_of_taken(outcome, previous)
                    if retried:
                        outcome, reason = retried, None
                if reason is None and previous and outcome.window.address < previous.window.end:
                    merged = self._merge(previous, outcome, taken)
                    if merged:
                        outcomes[previous_at] = previous = merged
                        continue
                    reason = "its window overlaps the window of the site before it"
                if reason:
                    outcomes.extend(Refusal(s, reason) for s in outcome.sites)
                    continue
                previous, previous_at = outcome, len(outcomes)
            outcomes.append(outcome)
        if self.backend.hop_size and {"hop", "evict", "pun"} & set(self.tactics):
            outcomes = self.tight_sites.hop_tight_sites(outcomes)
        return outcomes

    def _found_windows(self, groups: List[List[Site]]) -> list:
        """For each group, its primary site's window as precompute found it, else found
        now, those of all the groups at once (_windows()): (plan, what may branch into
        it: a Verdict), or why it has none."""
        found: list = []
        for group in groups:
            try:
                found.append(self._known_window(self._primary(group)))
            except Refused as why:
                found.append(str(why))
        missing = [k for k, known in enumerate(found) if known is None]
        for k, window in zip(missing, self._windows([self._primary(groups[k])
                                                     for k in missing])):
            found[k] = window if isinstance(window, str) else (window, UNKNOWN)
        return found

    def _window_clear_of_taken(self, plan: Plan, previous: Optional[Plan]) -> Optional[Plan]:
        """Another window for an inner site whose first window has a taken address (or
        a branch target) inside: one that starts earlier and keeps clear of them, and of
        the window before it. None if there is none."""
        sites = list(plan.sites)
        key = self._window_key(sites[0])
        if len(sites) == 1 and key in self._retried_known:  # (precompute's, for this site)
            kept = self._retried_known[key]
            retried, verdict = self._made_again(kept, sites[0]) if kept else (None, None)
        else:
            retried, verdict = self._retried_window(sites)
        if retried is None or retried.window == plan.window or \
                previous and retried.window.address < previous.window.end:
            return None
        return None if verdict else retried

    def _retried_window(self, sites: List[Site]) -> tuple:
        """(the group's window clear of taken addresses, what may still branch into it:
        None or why), or (None, None) if there is none."""
        try:
            retried = self._group_window(sites, avoid_taken=True)
        except Refused:
            return None, None
        return retried, self.safety.branch_into(retried, self.safety.taken_in_windows([retried]))

    def _merge(self, a: Plan, b: Plan, taken: Dict[int, list]) -> Optional[Plan]:
        """One window for two overlapping ones (an entry and a return probe of a short
        function), when the union is whole instructions and nothing branches into it."""
        if b.window.end <= a.window.end:
            insns = a.window.insns
        elif a.window.end == a.window.insns[-1].end:
            insns = a.window.insns + tuple(i for i in b.window.insns if i.address >= a.window.end)
        else:
            return None  # a borrowed padding that b's instructions would follow
        window = Window(a.window.address, max(a.window.end, b.window.end) - a.window.address,
                        insns)
        targets = self.safety.near_targets(self.model.holding(a.site))
        if any(window.address < t < window.end for t in targets):
            return None
        if self.safety.landing_pad_in(window.address, window.end, insns):
            return None
        if b.window.address != a.window.address and self.safety.taken_reason(
                self.model.taken_index.find([b.window.address]), b.window.address):
            return None  # b's first byte is no longer a window start (merges are rare)
        points = {}
        for point in a.points + b.points:
            if point.address in points:
                old = points[point.address]
                if (old.taken, old.stays_within) != (point.taken, point.stays_within):
                    return None
                point = replace(old, sites=old.sites + point.sites,
                                flags_live=old.flags_live or point.flags_live)
            points[point.address] = point
        return Plan(window, tuple(points[k] for k in sorted(points)))

    def _window(self, site: Site, size: Optional[int] = None, avoid_taken: bool = False) -> Plan:
        """The window a jump of `size` bytes (the backend's jump by default) needs.
        `avoid_taken`: an inner site's window also keeps clear of taken addresses."""
        size = size or self.backend.patch_size
        if not site.at_entry:
            return self._inner_window(site, size, avoid_taken)
        fn = site.function
        if not fn.size:
            raise Refused("its size is unknown (no symbol size and no .eh_frame entry)")
        found = self._searched_entry(site, size)
        if found is not None:
            return found
        insns = self.model.head(fn, size)
        if not insns:
            raise Refused("its first instruction cannot be decoded")
        start = site.address + self.backend.landing_pad_size(insns[0])
        chosen = []
        for insn in insns:
            if insn.address < start:
                continue
            if not chosen and insn.address != start:
                raise Refused("its instructions cannot be decoded")
            chosen.append(insn)
            if insn.end - start >= size:
                break
        if not chosen:
            raise Refused("its instructions cannot be decoded")
        covered = chosen[-1].end
        if covered - start < size:
            if covered < fn.end:
                raise Refused(f"its instructions cannot be decoded past {covered:#x}")
            covered = self._borrow_padding(fn, start, covered, size)
        window = Window(start, covered - start, self._displaced(chosen))
        return Plan(window, (ProbePoint(start, (site,), self.backend.flags_live_at_entry()),))

    def _searched_entry(self, site: Site, size: int) -> Optional[Plan]:
        """_window()'s plan at a function's entry where the compiled search finds it
        (as _searched_window()); None where it is left to the Python planner."""
        search = self.model.compiled_search()
        fn = site.function
        k = self.model.index_of(fn)
        if search is None or k is None:
            return None
        pad = self._entry_pad(fn)
        if pad is None:
            return None
        found = search.entry(site.address, k, size, self._padding_end, pad)
        if found is None:
            return None
        first, last, end, read = found
        try:
            displaced = self._displaced(self._read_window(fn, first, last, read))
        except Refused:  # (the Python planner refuses in its own words)
            return None
        start = site.address + pad
        return Plan(Window(start, end - start, displaced),
                    (ProbePoint(start, (site,), self.backend.flags_live_at_entry()),))

    def _displaced(self, insns) -> tuple:
        """`insns` (from the quick sweep), once every one is known to run from a
        trampoline; else the reason it cannot. Plans keep these light instructions
        (a detailed one holds its decoder's whole record, and a big file has 100,000s
        of windows): the code that moves them decodes them in detail (detailed())."""
        start, end = insns[0].address, insns[-1].end
        last = len(insns) - 1
        # (what the quick decode tells of those relocation_problem() asks in detail)
        problems = [self.backend.quick_relocation_problem(insn, k == last, self._shadow_stack)
                    for k, insn in enumerate(insns) if self.backend.needs_detail(insn)]
        if None in problems:
            problem = self._in_detail(insns)[1]
            if problem:
                raise Refused(problem)
            return tuple(insns)
        # (the decoder that moves them must see the very instructions the sweep saw:
        # where two decoders disagree, as on the length of a ud1, nothing is moved)
        if self.model.instruction_ends(self.elf.read(start, end - start)) != \
                [i.end - start for i in insns]:
            raise Refused(f"its instructions at {start:#x} decode differently in detail")
        problem = next((p for p, in problems if p), None)
        if problem:
            raise Refused(f"cannot relocate {problem}")
        return tuple(insns)

    def _read_window(self, fn: Function, first: int, last: int, read: tuple) -> list:
        """Rows `first` to `last` of the function's sweep, found by the compiled search,
        read as rows() reads them and what the Python planner reads with them (`read`,
        what SweepSearch.rows_read gives: its first row, the edges, the marked, the
        direct targets); Refused where rows() would refuse them."""
        if fn.address in self.model.decoded:  # (decoded whole: rows() gives those instructions)
            return self.model.rows(fn, first, last + 1)
        lo, edges, marked, direct = read
        insns = self.model.insns(edges, marked, dict(direct) if direct else {})
        return insns[first - lo:last - lo + 1]

    def _in_detail(self, insns) -> tuple:
        """(`insns` decoded in detail, why they cannot run from a trampoline or None)."""
        start, end = insns[0].address, insns[-1].end
        detailed = self.backend.decode(self.elf.read(start, end - start), start, detail=True)
        if [(i.address, i.size) for i in detailed] != [(i.address, i.size) for i in insns]:
            return detailed, f"its instructions at {start:#x} decode differently in detail"
        for k, insn in enumerate(detailed):
            problem = self.backend.relocation_problem(insn, k == len(detailed) - 1,
                                                      self._shadow_stack)
            if problem:
                return detailed, f"cannot relocate {problem}"
        return detailed, None

    def detailed(self, plan: Plan) -> Plan:
        """The plan with the instructions of its windows (its own, and the neighbour
        it moves away) decoded in detail, for the code that moves them. (Done when
        the trampolines are made, on every core: node, every function: 6.7 s.)"""
        window = self._detailed_window(plan.window)
        hop, pun = plan.hop, plan.pun
        if hop is not None and hop.evicted is not None:
            hop = replace(hop, evicted=self._detailed_window(hop.evicted))
        if pun is not None and pun.successor is not None:
            pun = replace(pun, successor=self._detailed_window(pun.successor))
        return Plan(window, plan.points, hop, pun)  # (replace() checks every field: slower)

    def _detailed_window(self, window: Window) -> Window:
        if not window.insns:
            return window
        start, end = window.insns[0].address, window.insns[-1].end
        code = self.elf.read(start, end - start)
        verbatim = self._moves_verbatim(code, window.insns)
        if verbatim:  # copied as they are: their bytes (and names, which say a return)
            return Window(window.address, window.size, tuple(
                Insn(start + at, end - at, mnemonic, op_str, code[at:end])
                for at, end, mnemonic, op_str in verbatim))
        detailed, problem = self._in_detail(window.insns)
        if problem:  # (planning checked each window as _displaced() does: never met)
            raise UrewriteError(f"internal error: the window at {window.address:#x} was "
                                f"planned, yet {problem}")
        return Window(window.address, window.size, tuple(detailed))

    def _moves_verbatim(self, code: bytes, insns) -> Optional[list]:
        """Where `insns`, the instructions of `code`, lie in it and what they are named
        ((start, end, mnemonic, op_str) each), if every one runs from any address as it
        is (Backend.moves_verbatim) as the quick decoder finds them there; else None.
        Kept per byte string, as BinaryModel.instruction_ends."""
        found = self._verbatim.get(code)
        if found is None:
            quick = self.backend.decode(code, 0)
            found = self._verbatim[code] = [
                (i.address, i.end, i.mnemonic, i.op_str) for i in quick] \
                if all(map(self.backend.moves_verbatim, quick)) else []
        if not found or [end for _, end, _, _ in found] != \
                [i.end - insns[0].address for i in insns]:
            return None
        return found

    MAX_LOOK_BACK = MAX_LOOK_BACK  # bytes a window may start before an inner site

    def _inner_window(self, site: Site, size: int, avoid_taken: bool = False) -> Plan:
        """A window around a site inside a function (USDT, address, exit).

        Tried in order: starting at the site, then one more instruction before it
        each time. Windows with a known branch target inside, or an instruction
        that cannot move, are skipped; the first that fits wins. With `avoid_taken`,
        so are windows with a taken address inside (the scans are asked only then:
        the first window rarely has one, and _plan_sites checks every window).
        """
        found = self._searched_window(site, size) if not avoid_taken else None
        if found is not None:
            return found
        fn = self.model.holding(site)
        if not fn.size:
            raise Refused("it lies in no function of known size")
        sweep = self.model.sweep(fn)
        # the instructions any window may hold: from MAX_LOOK_BACK before the site to
        # the first that starts a jump's size after it (or the function's end)
        at, first_row, end_row = sweep.edges.searchsorted(
            (site.address, site.address - self.MAX_LOOK_BACK, site.address + size)).tolist()
        if at >= len(sweep) or sweep.edges[at] != site.address:
            raise Refused(f"{site.address:#x} is not the start of an instruction")
        end_row = min(end_row + 1, len(sweep))
        insns, index = self.model.rows(fn, at, end_row), 0
        reason = "too few instructions follow it for a jump"
        alone = self._unknown_targets(site, fn)
        for back in range(at - first_row + 1):
            if back == 1:  # (the instructions before the site: decoded once needed)
                insns, index = self.model.rows(fn, first_row, at) + insns, at - first_row
            first = index - back
            start = insns[first].address
            if site.address - start > self.MAX_LOOK_BACK or alone and first < index:
                break
            last = index  # the window always holds the site's own instruction
            while last < len(insns) and insns[last].end - start < size:
                last += 1
            if alone and index < last < len(insns):
                reason = (f"{alone}: a window may hold its own instruction only, and that is "
                          f"{insns[index].size} bytes long, too short for a {size}-byte jump")
                break
            if last < len(insns):
                end = insns[last].end
            else:  # the function ends first: borrow the padding after it, if any
                last = len(insns) - 1
                try:
                    end = self._borrow_padding(fn, start, insns[last].end, size)
                except Refused as why:
                    reason = str(why)
                    continue
            # (this and the landing pads below: what BranchSafety.branch_into(inner_window=True)
            # leaves out; BranchSafety.near_targets() holds the targets it would look at)
            inside = [t for t in self.safety.near_targets(fn) if start < t < end] \
                if self.model.targets_between(start, end) and \
                self.safety.near_target_between(fn, start, end) else []
            if inside:
                reason = f"a branch lands at {inside[0]:#x}, inside every window around it"
                continue
            if avoid_taken:
                why = self.safety.taken_inside(start, end)
                if why:
                    reason = f"{why[1]} may lead to {why[0]:#x}, inside every window around it"
                    continue
            pad = self.safety.landing_pad_in(start, end, insns[first:last + 1])
            if pad:
                reason = f"{pad}, inside every window around it"
                continue
            try:
                displaced = self._displaced(insns[first:last + 1])
            except Refused as why:
                reason = str(why)
                continue
            window = Window(start, end - start, displaced)
            # at a return or tail call the flags carry nothing (SysV ABI), as at an entry;
            # a conditional tail call is counted on its taken edge, into the callee; an
            # indirect jump may stay in the function, flags and all
            flags_live = site.kind != KIND_RETURN or bool(site.stays_within)
            return Plan(window, (ProbePoint(site.address, (site,), flags_live,
                                            self._counts_when_taken(site),
                                            site.stays_within),))
        raise Refused(reason)

    def _searched_window(self, site: Site, size: int) -> Optional[Plan]:
        """_inner_window()'s plan where the compiled search (sweep_search.py) finds
        its window, read as the Python search reads it: the same rows, the same checks
        of the instructions that move; None where it is left to the Python search."""
        search = self.model.compiled_search()
        if search is None:
            return None
        k = self.model.holding_index(site)
        fn = self.functions[k] if k is not None else None
        if fn is None or not fn.size or self._unknown_targets(site, fn):
            return None
        found = search.inner(site.address, k, size, self._padding_end)
        while True:
            if found is None:
                return None
            first, last, end, read = found
            try:
                window = self._read_window(fn, first, last, read)
            except Refused:
                return None  # (the Python search refuses so, in its own words)
            try:
                displaced = self._displaced(window)
                break
            except Refused:  # (as the Python search does: on to the next window)
                found = search.inner(site.address, k, size, self._padding_end, first)
        start = displaced[0].address
        flags_live = site.kind != KIND_RETURN or bool(site.stays_within)  # (as below)
        return Plan(Window(start, end - start, displaced),
                    (ProbePoint(site.address, (site,), flags_live, self._counts_when_taken(site),
                                site.stays_within),))

    def _windows(self, sites: List[Site]) -> list:
        """_window(site) of each site (its Plan, or why not: the Refused's text). The
        windows that the compiled search finds are asked of it all at once
        (SweepSearch.inner_batch, entry_batch) and read as _searched_window() and
        _searched_entry() read them, their marked rows made by _made_rows(); the rest
        one by one, as before (node: 117,000 exit windows and 78,000 entries, about
        50 µs each that way)."""
        found: list = [None] * len(sites)
        search = self.model.compiled_search()
        inner, entries = [], []  # (index in sites, function's index, landing pad's size)
        for j, site in enumerate(sites if search is not None else ()):
            if site.at_entry:
                fn = site.function
                k = self.model.index_of(fn)
                pad = self._entry_pad(fn) if fn.size and fn.address not in self.model.decoded \
                    and k is not None else None
                if pad is not None:
                    entries.append((j, k, pad))
                continue
            k = self.model.holding_index(site)
            if k is not None:
                fn = self.functions[k]
                if fn.size and fn.address not in self.model.decoded and \
                        not self._unknown_targets(site, fn):
                    inner.append((j, k, 0))

        def column(asked: list, values) -> bytes:
            return np.fromiter(values, np.int64, len(asked)).tobytes()

        size = self.backend.patch_size
        if inner:
            self._read_batch(sites, inner, *search.inner_batch(
                column(inner, (sites[j].address for j, _, _ in inner)),
                column(inner, (k for _, k, _ in inner)), size, self._padding_end), found)
        if entries:
            self._read_batch(sites, entries, *search.entry_batch(
                column(entries, (sites[j].address for j, _, _ in entries)),
                column(entries, (k for _, k, _ in entries)),
                column(entries, (pad for _, _, pad in entries)), size, self._padding_end), found)
        for j, site in enumerate(sites):
            if found[j] is None:
                try:
                    found[j] = self._window(site)
                except Refused as why:  # (its text: the exception would hold this frame)
                    found[j] = str(why)
        return found

    def _entry_pad(self, fn: Function) -> Optional[int]:
        """The size of the landing pad at a function's entry (its first row, where the
        sweep marks it, decoded alone, kept per byte string); None where that does not
        decode as swept (the Python planner then decides)."""
        sweep = self.model.sweep(fn)
        if sweep.marked[:1].tolist() != [0]:
            return 0
        start, end = sweep.edges[:2].tolist()
        code = self.elf.read(start, end - start)
        known = self._decoded_alone_as(code)
        return self.backend.landing_pad_size(known) if known else None

    def _read_batch(self, sites: List[Site], asked: list, windows: bytes, rows: bytes,
                    found: list) -> None:
        """Into `found`, the plans of the windows a batch of the compiled search gives
        (inner_batch, entry_batch: `asked`, (index in sites, function, landing pad) of
        each) whose rows it gives, where their instructions move."""
        rows = np.frombuffer(rows, np.int64).tolist()
        at, made_all = 0, []  # (index in sites, the window's end, its instructions)
        for (j, _, _), (first, last, end, made) in zip(
                asked, np.frombuffer(windows, np.int64).reshape(-1, 4).tolist()):
            if made != 1:
                continue
            n, m = rows[at], rows[at + 1]
            insns = self._made_rows(rows, at + 2, n)
            others = at + 3 + 3 * n
            at = others + 4 * m
            if insns is not None and all(
                    self._made_rows(rows[i:i + 4], 0, 1) for i in range(others, at, 4)):
                made_all.append((j, end, insns))
        self.model.learn_lengths([self.elf.read(insns[0].address, insns[-1].end - insns[0].address)
                             for _, _, insns in made_all])
        for j, end, insns in made_all:
            try:
                displaced = self._displaced(insns)
            except Refused:
                continue  # (an inner site's search goes on from there: asked alone)
            site, start = sites[j], insns[0].address
            if site.at_entry:  # (as _searched_entry)
                point = ProbePoint(start, (site,), self.backend.flags_live_at_entry())
            else:  # (as _searched_window)
                point = ProbePoint(site.address, (site,),
                                   site.kind != KIND_RETURN or bool(site.stays_within),
                                   self._counts_when_taken(site), site.stays_within)
            found[j] = Plan(Window(start, end - start, displaced), (point,))

    def _made_rows(self, rows: list, at: int, count: int) -> Optional[list]:
        """The instructions of `count` rows from rows[at] (SweepSearch.inner_batch's:
        first byte, what it is, target of each, then the last one's end) as BinaryModel.insns()
        makes them; None where BinaryModel.insns() would refuse them (one decodes differently)."""
        insns = []
        for i in range(at, at + 3 * count, 3):
            address, made, target, end = rows[i], rows[i + 1], rows[i + 2], rows[i + 3]
            if made == 0:
                insns.append(Insn(address, end - address, "", "", b""))
                continue
            code = self.elf.read(address, end - address)
            insn = None
            if made == 2:
                insn = self.backend.direct_branch(code, address, target)
            elif made != 4:  # a return or a landing pad: what it decodes to depends on its
                known = self._decoded_alone_as(code)  # bytes alone (kept per byte string)
                insn = known and (made == 1 or self.backend.landing_pad_size(known)) and \
                    Insn(address, known.size, known.mnemonic, known.op_str, b"")
            if not insn:  # (an indirect call or jump: decoded where it lies, as BinaryModel.insns()
                # decodes it, alone or in a run of marked rows: each decodes from its
                # first byte on, and one that does not end where the sweep says is refused)
                decoded = self.backend.decode(code, address)
                if len(decoded) != 1 or decoded[0].size != len(code):
                    return None
                insn = decoded[0]
            insns.append(insn)
        return insns

    def _decoded_alone_as(self, code: bytes):
        """`code` decoded (at 0) as one instruction, kept per byte string; None where it
        decodes otherwise. Its text is the instruction's wherever it lies only where it
        names no address (returns, landing pads: the rows _made_rows() decodes)."""
        known = self._decoded_alone.get(code, ())
        if known == ():
            decoded = self.backend.decode(code, 0)
            known = self._decoded_alone[code] = \
                decoded[0] if len(decoded) == 1 and decoded[0].size == len(code) else None
        return known

    def _unknown_targets(self, site: Site, fn: Function) -> Optional[str]:
        """Why branches may land on any instruction near an inner site, or None: the
        function holding it (or the function it is an exit of) has an indirect jump that
        is no recovered table, and it computes an address that could be the base of
        offsets to its cases: one inside the function (glibc's vfprintf adds offsets to
        a label's address), or of data whose first 4 bytes, read as an offset from
        there, lead into it (a table of offsets the recovery did not recognise). Tables
        of addresses are seen by the scans for taken addresses; a jump through a
        pointer to another function (a vtable's) computes no such base. A window there
        holds the site's instruction alone; hops and punned jumps keep to that."""
        # (kept per function asked of: node's 117,000 exit windows ask 78,000 functions)
        key = -site.function.address - 1 if site.kind == KIND_RETURN else fn.address
        if key not in self._unknown_known:
            self._unknown_known[key] = self._unknown_cases(
                self.model.parts(site.function) if site.kind == KIND_RETURN else [fn])
        return self._unknown_known[key]

    def _unknown_cases(self, functions: List[Function]) -> Optional[str]:
        """Why any instruction of `functions[0]` may be a case of a table not recognised
        (see _unknown_targets): an indirect jump of one of `functions` that is no
        recovered table, and a base of offsets into the first one's parts; or None."""
        jump = next((j for j in map(self.model.indirect_jump, functions) if j is not None), None)
        if jump is None:
            return None
        base = self._case_base(self.model.parts(functions[0]))  # (cases may lie in a part)
        if base is None:
            return None
        return (f"the indirect jump at {jump:#x} may go to any instruction of its function "
                f"(by offsets from {base:#x})")

    def _case_base(self, parts: List[Function]) -> Optional[int]:
        """The first address the parts compute that lies in them, or whose first 4 bytes,
        a signed offset from there, lead into them; or None."""
        key = parts[0].address
        if key not in self._offset_tables:
            found = None
            for part in parts:
                computed = self.model.computed.get(part.address)
                if computed is None:
                    computed = self.backend.computed_addresses(self.model.code(part), part.address)
                for base in computed:
                    at = self.elf.offset_of(base, 4)
                    target = base + int.from_bytes(self.elf.data[at:at + 4], "little",
                                                   signed=True) if at is not None else base
                    if any(p.address <= t < p.end for p in parts for t in (base, target)):
                        found = base
                        break
                if found is not None:
                    break
            self._offset_tables[key] = found
        return self._offset_tables[key]

    def _borrow_padding(self, fn: Function, start: int, fn_end: int, size: int) -> int:
        """Extend a window past a short function into the padding that follows it:
        alignment padding in its section, then the zero bytes between sections."""
        need = start + size
        section = self.elf.section_at(fn.address)
        gap_end = self._gap_after(section) if section is not None else 0
        if section is None or need > max(section.end, gap_end):
            raise Refused(f"it is {fn_end - start} bytes long, too short for a "
                           f"{size}-byte jump, and no padding follows it")
        k = bisect.bisect_right(self.model.starts, fn_end - 1)
        if k < len(self.model.starts) and self.model.starts[k] < need:
            raise Refused(f"it is {fn_end - start} bytes long, too short for a "
                           f"{size}-byte jump, and the next function "
                           f"follows without padding")
        # the padding instructions up to the next function (or the section's end); where
        # they stop short of `need`, at what is no padding or does not decode there,
        # the code after them is decoded for a closer look
        starts = self.model.starts
        limit = min(starts[k], section.end) if k < len(starts) else section.end
        ends = self._padding_run(self.elf.read(fn_end, limit - fn_end))
        at = fn_end + next((end for end in ends if end >= need - fn_end),
                           ends[-1] if ends else 0)
        if at >= need or at == limit:
            padding = []
        else:  # (the padding up to `need`, and the rest of an instruction that straddles it)
            padding = self.backend.decode(self.elf.read(fn_end, min(need - fn_end + 15,
                                                                    section.end - fn_end)),
                                          fn_end)
            at = fn_end
        for insn in padding:
            if at >= need:
                break
            if not self.backend.is_padding(insn):
                raise Refused(f"it is {fn_end - start} bytes long, too short for a "
                               f"{size}-byte jump, and what follows "
                               f"is not padding ('{insn}')")
            at = insn.end
        if at < need and at == section.end and need <= gap_end:
            return need  # nothing runs here: no instruction to return to in the gap
        next_start = self.model.starts[k] if k < len(self.model.starts) else section.end
        if at < need or at > next_start:
            raise Refused(f"it is {fn_end - start} bytes long and the padding after it "
                           f"is too short")
        return at  # whole padding instructions, so the trampoline can jump back to `at`

    def _padding_end(self, k: int, start: int, fn_end: int, size: int) -> int:
        """_borrow_padding() for function k, -1 where it refuses (sweep_search.py)."""
        try:
            return self._borrow_padding(self.functions[k], start, fn_end, size)
        except Refused:
            return -1

    def _padding_run(self, code: bytes) -> list:
        """free_space.padding_ends(), kept per byte string: the gaps after functions are
        alike (node: 43,000 windows borrow one)."""
        ends = self._padding_runs.get(code)
        if ends is None:
            ends = self._padding_runs[code] = free_space.padding_ends(self.backend, code)
        return ends

    def _gap_after(self, section) -> int:
        """Where the zero bytes the linker left after a section, in the same segment,
        end (the section's end when there are none). Code in no section runs only if
        something branches there, and the window checks see every branch."""
        if section.addr not in self._gaps:
            self._gaps[section.addr] = self._find_gap_after(section)
        return self._gaps[section.addr]

    def _find_gap_after(self, section) -> int:
        following = [s.addr for s in self.elf.sections if s.addr >= section.end and s.flags & 2]
        gap_end = min(following, default=section.end)  # 2: SHF_ALLOC
        if gap_end == section.end or self.elf.offset_of(section.end, gap_end - section.end) \
                != section.offset + section.size:
            return section.end
        gap = self.elf.read(section.end, gap_end - section.end)
        return section.end if gap.strip(b"\0") else gap_end
