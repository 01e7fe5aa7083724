"""Windows: the whole instructions a site's patch displaces. At an entry, from its first
instruction after a landing pad; at an inner site (USDT, address, exit), around it,
tried from the site back one instruction at a time. A window holds no branch target
after its first byte, no instruction that cannot run from a trampoline, and runs past
its function only into padding (borrowed). The compiled search (sweep_search.py) is asked
first; what it leaves is found here in Python, with the same rules."""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import Dict, List, Optional

import numpy as np

from urewrite.arch.base import Insn, Window
from urewrite.errors import UrewriteError
from urewrite.rewriter import free_space
from urewrite.rewriter.functions import Function
from urewrite.rewriter.model import MAX_LOOK_BACK, BinaryModel
from urewrite.rewriter.plan.branch_safety import BranchSafety
from urewrite.rewriter.plan.go_faults import GoFaults
from urewrite.rewriter.plan.results import Plan, ProbePoint, Refused
from urewrite.rewriter.plan.return_exits import ReturnExits
from urewrite.rewriter.selectors import Site
from urewrite.trampolines.region import KIND_RETURN


class Windows:
    """The windows of one file's sites, asked of its model; what decoding finds per byte
    string is kept (instruction ends, verbatim moves, padding runs)."""

    MAX_LOOK_BACK = MAX_LOOK_BACK  # bytes a window may start before an inner site

    def __init__(self, model: BinaryModel, safety: BranchSafety, exits: ReturnExits):
        self.model = model
        self.safety = safety
        self.exits = exits
        self.elf = model.elf
        self.backend = model.backend
        self.functions = model.functions
        self._decoded_alone: Dict[bytes, object] = {}  # (decoded_alone_as)
        self._gaps: Dict[int, int] = {}  # section -> gap_after()
        self._offset_tables: Dict[int, Optional[int]] = {}  # function -> case_base()
        # function (its return probe's exits: -address - 1) -> unknown_targets()
        self._unknown_known: Dict[int, Optional[str]] = {}
        self._verbatim: Dict[bytes, list] = {}  # code -> its instructions, or [] (moves_verbatim)
        self._padding_runs: Dict[bytes, list] = {}  # code -> padding_run()
        self.shadow_stack = model.elf.shadow_stack
        self.go_faults = GoFaults(model, self.window)

    def counts_when_taken(self, site: Site) -> bool:
        """Whether the site is a conditional exit, counted on its taken edge only."""
        return site.kind == KIND_RETURN and site.address in self.exits.conditional

    def window(self, site: Site, size: Optional[int] = None, avoid_taken: bool = False) -> Plan:
        """The window a jump of `size` bytes (the backend's jump by default) needs.
        `avoid_taken`: an inner site's window also keeps clear of taken addresses."""
        size = size or self.backend.patch_size
        if not site.at_entry:
            return self.inner_window(site, size, avoid_taken)
        fn = site.function
        if not fn.size:
            raise Refused("its size is unknown (no symbol size and no .eh_frame entry)")
        found = self.searched_entry(site, size)
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
            covered = self.borrow_padding(fn, start, covered, size)
        window = Window(start, covered - start, self.displaced(chosen))
        return Plan(window, (ProbePoint(start, (site,), self.backend.flags_live_at_entry()),))

    def searched_entry(self, site: Site, size: int) -> Optional[Plan]:
        """window()'s plan at a function's entry where the compiled search finds it
        (as searched_window()); None where it is left to the Python planner."""
        search = self.model.compiled_search()
        fn = site.function
        k = self.model.index_of(fn)
        if search is None or k is None:
            return None
        pad = self.entry_pad(fn)
        if pad is None:
            return None
        found = search.entry(site.address, k, size, self.padding_end, pad)
        if found is None:
            return None
        first, last, end, read = found
        try:
            displaced = self.displaced(self.read_window(fn, first, last, read))
        except Refused:  # (the Python planner refuses in its own words)
            return None
        start = site.address + pad
        return Plan(Window(start, end - start, displaced),
                    (ProbePoint(start, (site,), self.backend.flags_live_at_entry()),))

    def displaced(self, insns) -> tuple:
        """`insns` (from the quick sweep), once every one is known to run from a
        trampoline; else the reason it cannot. Plans keep these light instructions
        (a detailed one holds its decoder's whole record, and a big file has 100,000s
        of windows): the code that moves them decodes them in detail (detailed())."""
        start, end = insns[0].address, insns[-1].end
        last = len(insns) - 1
        # (what the quick decode tells of those relocation_problem() asks in detail)
        problems = [self.backend.quick_relocation_problem(insn, k == last, self.shadow_stack)
                    for k, insn in enumerate(insns) if self.backend.needs_detail(insn)]
        if None in problems:
            problem = self.in_detail(insns)[1] or self.go_faults.problem(start, end)
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
        problem = self.go_faults.problem(start, end)
        if problem:
            raise Refused(problem)
        return tuple(insns)

    def read_window(self, fn: Function, first: int, last: int, read: tuple) -> list:
        """Rows `first` to `last` of the function's sweep, found by the compiled search,
        read as rows() reads them and what the Python planner reads with them (`read`,
        what SweepSearch.rows_read gives: its first row, the edges, the marked, the
        direct targets); Refused where rows() would refuse them."""
        if fn.address in self.model.decoded:  # (decoded whole: rows() gives those instructions)
            return self.model.rows(fn, first, last + 1)
        lo, edges, marked, direct = read
        insns = self.model.insns(edges, marked, dict(direct) if direct else {})
        return insns[first - lo:last - lo + 1]

    def in_detail(self, insns) -> tuple:
        """(`insns` decoded in detail, why they cannot run from a trampoline or None)."""
        start, end = insns[0].address, insns[-1].end
        detailed = self.backend.decode(self.elf.read(start, end - start), start, detail=True)
        if [(i.address, i.size) for i in detailed] != [(i.address, i.size) for i in insns]:
            return detailed, f"its instructions at {start:#x} decode differently in detail"
        for k, insn in enumerate(detailed):
            problem = self.backend.relocation_problem(insn, k == len(detailed) - 1,
                                                      self.shadow_stack)
            if problem:
                return detailed, f"cannot relocate {problem}"
        return detailed, None

    def detailed(self, plan: Plan) -> Plan:
        """The plan with the instructions of its windows (its own, and the neighbour
        it moves away) decoded in detail, for the code that moves them. (Done when
        the trampolines are made, on every core.)"""
        window = self.detailed_window(plan.window)
        hop, pun = plan.hop, plan.pun
        if hop is not None and hop.evicted is not None:
            hop = replace(hop, evicted=self.detailed_window(hop.evicted))
        if pun is not None and pun.successor is not None:
            pun = replace(pun, successor=self.detailed_window(pun.successor))
        return Plan(window, plan.points, hop, pun)  # (replace() checks every field: slower)

    def detailed_window(self, window: Window) -> Window:
        if not window.insns:
            return window
        start, end = window.insns[0].address, window.insns[-1].end
        code = self.elf.read(start, end - start)
        verbatim = self.moves_verbatim(code, window.insns)
        if verbatim:  # copied as they are: their bytes (and names, which say a return)
            return Window(window.address, window.size, tuple(
                Insn(start + at, end - at, mnemonic, op_str, code[at:end])
                for at, end, mnemonic, op_str in verbatim))
        detailed, problem = self.in_detail(window.insns)
        if problem:  # (planning checked each window as displaced() does: never met)
            raise UrewriteError(f"internal error: the window at {window.address:#x} was "
                                f"planned, yet {problem}")
        return Window(window.address, window.size, tuple(detailed))

    def moves_verbatim(self, code: bytes, insns) -> Optional[list]:
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

    def inner_window(self, site: Site, size: int, avoid_taken: bool = False) -> Plan:
        """A window around a site inside a function (USDT, address, exit).

        Tried in order: starting at the site, then one more instruction before it
        each time. Windows with a known branch target inside, or an instruction
        that cannot move, are skipped; the first that fits wins. With `avoid_taken`,
        so are windows with a taken address inside (the scans are asked only then:
        the first window rarely has one, and _plan_sites checks every window).
        """
        found = self.searched_window(site, size) if not avoid_taken else None
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
        alone = self.unknown_targets(site, fn)
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
                    end = self.borrow_padding(fn, start, insns[last].end, size)
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
                displaced = self.displaced(insns[first:last + 1])
            except Refused as why:
                reason = str(why)
                continue
            window = Window(start, end - start, displaced)
            return Plan(window, (ProbePoint(site.address, (site,), self.flags_live(site),
                                            self.counts_when_taken(site),
                                            site.stays_within),))
        raise Refused(reason)

    def searched_window(self, site: Site, size: int) -> Optional[Plan]:
        """inner_window()'s plan where the compiled search (sweep_search.py) finds
        its window, read as the Python search reads it: the same rows, the same checks
        of the instructions that move; None where it is left to the Python search."""
        search = self.model.compiled_search()
        if search is None:
            return None
        k = self.model.holding_index(site)
        fn = self.functions[k] if k is not None else None
        if fn is None or not fn.size or self.unknown_targets(site, fn):
            return None
        found = search.inner(site.address, k, size, self.padding_end)
        while True:
            if found is None:
                return None
            first, last, end, read = found
            try:
                window = self.read_window(fn, first, last, read)
            except Refused:
                return None  # (the Python search refuses so, in its own words)
            try:
                displaced = self.displaced(window)
                break
            except Refused:  # (as the Python search does: on to the next window)
                found = search.inner(site.address, k, size, self.padding_end, first)
        start = displaced[0].address
        window = Window(start, end - start, displaced)
        return Plan(window, (ProbePoint(site.address, (site,), self.flags_live(site),
                                        self.counts_when_taken(site), site.stays_within),))

    def flags_live(self, site: Site) -> bool:
        """Whether a point inside a function keeps the flags: at a return or tail call
        they carry nothing (SysV ABI), as at an entry (a conditional tail call is
        counted on its taken edge, into the callee); an indirect jump may stay in the
        function, flags and all; elsewhere, unless the code from the point on changes
        them all before it reads any (Backend.flags_live_inside)."""
        if site.stays_within:
            return True
        if site.kind == KIND_RETURN:
            return False
        return self.backend.flags_live_inside(self.elf.read, site.address)

    def of_sites(self, sites: List[Site]) -> list:
        """window(site) of each site (its Plan, or why not: the Refused's text). The
        windows that the compiled search finds are asked of it all at once
        (SweepSearch.inner_batch, entry_batch) and read as searched_window() and
        searched_entry() read them, their marked rows made by made_rows(); the rest
        one by one, in Python (the reference)."""
        found: list = [None] * len(sites)
        search = self.model.compiled_search()
        inner, entries = [], []  # (index in sites, function's index, landing pad's size)
        for j, site in enumerate(sites if search is not None else ()):
            if site.at_entry:
                fn = site.function
                k = self.model.index_of(fn)
                pad = self.entry_pad(fn) if fn.size and fn.address not in self.model.decoded \
                    and k is not None else None
                if pad is not None:
                    entries.append((j, k, pad))
                continue
            k = self.model.holding_index(site)
            if k is not None:
                fn = self.functions[k]
                if fn.size and fn.address not in self.model.decoded and \
                        not self.unknown_targets(site, fn):
                    inner.append((j, k, 0))

        def column(asked: list, values) -> bytes:
            return np.fromiter(values, np.int64, len(asked)).tobytes()

        size = self.backend.patch_size
        if inner:
            self.read_batch(sites, inner, *search.inner_batch(
                column(inner, (sites[j].address for j, _, _ in inner)),
                column(inner, (k for _, k, _ in inner)), size, self.padding_end), found)
        if entries:
            self.read_batch(sites, entries, *search.entry_batch(
                column(entries, (sites[j].address for j, _, _ in entries)),
                column(entries, (k for _, k, _ in entries)),
                column(entries, (pad for _, _, pad in entries)), size, self.padding_end), found)
        for j, site in enumerate(sites):
            if found[j] is None:
                try:
                    found[j] = self.window(site)
                except Refused as why:  # (its text: the exception would hold this frame)
                    found[j] = str(why)
        return found

    def entry_pad(self, fn: Function) -> Optional[int]:
        """The size of the landing pad at a function's entry (its first row, where the
        sweep marks it, decoded alone, kept per byte string); None where that does not
        decode as swept (the Python planner then decides)."""
        sweep = self.model.sweep(fn)
        if sweep.marked[:1].tolist() != [0]:
            return 0
        start, end = sweep.edges[:2].tolist()
        code = self.elf.read(start, end - start)
        known = self.decoded_alone_as(code)
        return self.backend.landing_pad_size(known) if known else None

    def read_batch(self, sites: List[Site], asked: list, windows: bytes, rows: bytes,
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
            insns = self.made_rows(rows, at + 2, n)
            others = at + 3 + 3 * n
            at = others + 4 * m
            if insns is not None and all(
                    self.made_rows(rows[i:i + 4], 0, 1) for i in range(others, at, 4)):
                made_all.append((j, end, insns))
        self.model.learn_lengths([self.elf.read(insns[0].address, insns[-1].end - insns[0].address)
                             for _, _, insns in made_all])
        for j, end, insns in made_all:
            try:
                displaced = self.displaced(insns)
            except Refused:
                continue  # (an inner site's search goes on from there: asked alone)
            site, start = sites[j], insns[0].address
            window = Window(start, end - start, displaced)
            if site.at_entry:  # (as searched_entry)
                point = ProbePoint(start, (site,), self.backend.flags_live_at_entry())
            else:  # (as searched_window)
                point = ProbePoint(site.address, (site,), self.flags_live(site),
                                   self.counts_when_taken(site), site.stays_within)
            found[j] = Plan(window, (point,))

    def made_rows(self, rows: list, at: int, count: int) -> Optional[list]:
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
                known = self.decoded_alone_as(code)  # bytes alone (kept per byte string)
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

    def decoded_alone_as(self, code: bytes):
        """`code` decoded (at 0) as one instruction, kept per byte string; None where it
        decodes otherwise. Its text is the instruction's wherever it lies only where it
        names no address (returns, landing pads: the rows made_rows() decodes)."""
        known = self._decoded_alone.get(code, ())
        if known == ():
            decoded = self.backend.decode(code, 0)
            known = self._decoded_alone[code] = \
                decoded[0] if len(decoded) == 1 and decoded[0].size == len(code) else None
        return known

    def unknown_targets(self, site: Site, fn: Function) -> Optional[str]:
        """Why branches may land on any instruction near an inner site, or None: the
        function holding it (or the function it is an exit of) has an indirect jump that
        is no recovered table, and it computes an address that could be the base of
        offsets to its cases: one inside the function (glibc's vfprintf adds offsets to
        a label's address), or of data whose first 4 bytes, read as an offset from
        there, lead into it (a table of offsets the recovery did not recognise). Tables
        of addresses are seen by the scans for taken addresses; a jump through a
        pointer to another function (a vtable's) computes no such base. A window there
        holds the site's instruction alone; hops and punned jumps keep to that."""
        # (kept per function asked of: a function's exit windows all ask it)
        key = -site.function.address - 1 if site.kind == KIND_RETURN else fn.address
        if key not in self._unknown_known:
            self._unknown_known[key] = self.unknown_cases(
                self.model.parts(site.function) if site.kind == KIND_RETURN else [fn])
        return self._unknown_known[key]

    def unknown_cases(self, functions: List[Function]) -> Optional[str]:
        """Why any instruction of `functions[0]` may be a case of a table not recognised
        (see unknown_targets): an indirect jump of one of `functions` that is no
        recovered table, and a base of offsets into the first one's parts; or None."""
        jump = next((j for j in map(self.model.indirect_jump, functions) if j is not None), None)
        if jump is None:
            return None
        base = self.case_base(self.model.parts(functions[0]))  # (cases may lie in a part)
        if base is None:
            return None
        return (f"the indirect jump at {jump:#x} may go to any instruction of its function "
                f"(by offsets from {base:#x})")

    def case_base(self, parts: List[Function]) -> Optional[int]:
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

    def borrow_padding(self, fn: Function, start: int, fn_end: int, size: int) -> int:
        """Extend a window past a short function into the padding that follows it:
        alignment padding in its section, then the zero bytes between sections."""
        need = start + size
        section = self.elf.section_at(fn.address)
        gap_end = self.gap_after(section) if section is not None else 0
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
        ends = self.padding_run(self.elf.read(fn_end, limit - fn_end))
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

    def padding_end(self, k: int, start: int, fn_end: int, size: int) -> int:
        """borrow_padding() for function k, -1 where it refuses (sweep_search.py)."""
        try:
            return self.borrow_padding(self.functions[k], start, fn_end, size)
        except Refused:
            return -1

    def padding_run(self, code: bytes) -> list:
        """free_space.padding_ends(), kept per byte string: the gaps after functions are
        alike."""
        ends = self._padding_runs.get(code)
        if ends is None:
            ends = self._padding_runs[code] = free_space.padding_ends(self.backend, code)
        return ends

    def gap_after(self, section) -> int:
        """Where the zero bytes the linker left after a section, in the same segment,
        end (the section's end when there are none). Code in no section runs only if
        something branches there, and the window checks see every branch."""
        if section.addr not in self._gaps:
            self._gaps[section.addr] = self.find_gap_after(section)
        return self._gaps[section.addr]

    def find_gap_after(self, section) -> int:
        following = [s.addr for s in self.elf.sections if s.addr >= section.end and s.flags & 2]
        gap_end = min(following, default=section.end)  # 2: SHF_ALLOC
        if gap_end == section.end or self.elf.offset_of(section.end, gap_end - section.end) \
                != section.offset + section.size:
            return section.end
        gap = self.elf.read(section.end, gap_end - section.end)
        return section.end if gap.strip(b"\0") else gap_end
