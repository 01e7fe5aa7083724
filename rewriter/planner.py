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

The planner orchestrates; the work is done by the file's model (model.py) and the
passes over it (plan/): the whole-file precompute, return exits, windows, branch
safety, and the tactics for tight sites.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Set

from urewrite.arch.base import Backend, Window
from urewrite.rewriter import go_runtime, layout, parallel, redirection, taken_addresses
from urewrite.rewriter.elf_file import ElfFile
from urewrite.rewriter.functions import Function
from urewrite.rewriter.model import BinaryModel
from urewrite.rewriter.plan.branch_safety import BranchSafety
from urewrite.rewriter.plan.return_exits import ReturnExits
from urewrite.rewriter.plan.results import (UNKNOWN, Outcome, Plan, Precomputed, ProbePoint,
                                            Refusal, Refused, Verdict, WindowFound)
from urewrite.rewriter.plan.tactics import TACTICS
from urewrite.rewriter.plan.tight_sites import TightSites
from urewrite.rewriter.plan.whole_file import WholeFile
from urewrite.rewriter.plan.windows import Windows
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
        self.windows = Windows(self.model, self.safety, self.exits)
        self._windows_known: Dict[tuple, object] = {}  # _window_key() -> window (or why not)
        # _window_key() -> _retried_window() as precompute found it (None: no window)
        self._retried_known: Dict[tuple, Optional[WindowFound]] = {}
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
            # (the first round's plans are made again: not kept beside the second's, which
            # would raise the peak memory)
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
                for target, found in zip(targets, self.windows.of_sites(targets)):
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
            # return address may be redirected instead: a walk over the whole function,
            # answered here on both cores
            problems = {address: self._redirect_problem(fn) for address, fn in at_risk.items()}
            return Precomputed(exits, windows, problems, retried)

        # (the child leaves the last 64 pieces to this process: it also sends what it
        # found, which this process must read, so it stops first)
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
                self.windows.counts_when_taken(site))

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
                                        self.windows.counts_when_taken(site),
                                        site.stays_within),)), reason

    def by_address(self, items, site_of=lambda site: site) -> list:
        """Sites (or items holding one) grouped by the point they share, in address
        order (a conditional exit counts on its taken edge only, an indirect jump's
        when it leaves: they share no point)."""
        groups: Dict[tuple, list] = {}
        for item in items:
            site = site_of(item)
            key = (site.address, self.windows.counts_when_taken(site), site.stays_within)
            groups.setdefault(key, []).append(item)
        return [groups[key] for key in sorted(groups)]

    def group_window(self, group: List[Site], size: Optional[int] = None,
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
        """(group_window(), what may branch into it when precompute found out: None or
        why, or UNKNOWN: a Verdict). `found`: that for the primary site already, or why it has
        no window (_plan_sites: _found_windows())."""
        primary = self._primary(group)
        if found is None:
            known = self._known_window(primary) if size is None and not avoid_taken else None
            found = known or (self.windows.window(primary, size, avoid_taken), UNKNOWN)
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
        groups = self.by_address(sites)
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
                    merged = self.merge(previous, outcome, taken)
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
            outcomes = self.tight_sites.place(outcomes)
        if self.backend.hop_size and "hop" in self.tactics:
            outcomes = self.tight_sites.hop_over_calls(outcomes)
        return outcomes

    def _found_windows(self, groups: List[List[Site]]) -> list:
        """For each group, its primary site's window as precompute found it, else found
        now, those of all the groups at once (Windows.of_sites()): (plan, what may branch into
        it: a Verdict), or why it has none."""
        found: list = []
        for group in groups:
            try:
                found.append(self._known_window(self._primary(group)))
            except Refused as why:
                found.append(str(why))
        missing = [k for k, known in enumerate(found) if known is None]
        for k, window in zip(missing, self.windows.of_sites([self._primary(groups[k])
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
            retried = self.group_window(sites, avoid_taken=True)
        except Refused:
            return None, None
        return retried, self.safety.branch_into(retried, self.safety.taken_in_windows([retried]))

    def merge(self, a: Plan, b: Plan, taken: Dict[int, list]) -> Optional[Plan]:
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
















