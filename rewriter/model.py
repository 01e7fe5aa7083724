"""The binary model: what the planner and its passes ask of one file's code, worked out
once and kept. Each function is swept in compact form (Sweep: arrays); instructions as
objects are decoded only where a window, a jump table or a rare question needs them.
Beside the sweeps: branch targets, jump tables, fragments (parts split off by the
compiler), C++ landing pads, entry frames, the scans for taken addresses, and the code
the program copies at run time. Planner.prepare() fills the whole-file answers
(all_targets, entered, branch_pairs, ...) at once."""

from __future__ import annotations

import bisect
import itertools
import threading
from typing import Dict, List, Optional, Set

import numpy as np

from urewrite.arch.base import OTHER, Backend, Insn, Sweep, SweptCode, Window
from urewrite.arch.jump_tables import JumpTable
from urewrite.rewriter import (copied_code, except_table, jump_table_guard, redirection,
                               sweep_search, taken_addresses)
from urewrite.rewriter.elf_file import ElfFile
from urewrite.rewriter.functions import Function
from urewrite.rewriter.plan.results import Refused
from urewrite.rewriter.selectors import Site

NEAR_BRANCH_REACH = 130  # farthest a rel8 branch reaches, with its own size
MAX_LOOK_BACK = 24  # bytes a window may start before an inner site


class BinaryModel:
    """One file's functions and their code, each answer worked out once."""

    def __init__(self, elf: ElfFile, backend: Backend, functions: List[Function],
                 taken_index: Optional[taken_addresses.TakenIndex] = None):
        self.elf = elf
        self.backend = backend
        self.functions = functions
        self.starts = [f.address for f in functions]
        self.ends_so_far = list(itertools.accumulate((f.end for f in functions), max))
        self.decoded: Dict[int, list] = {}
        self.sweeps: Dict[int, Sweep] = {}  # function -> its sweep in compact form
        self.batch: Optional[tuple] = None  # (SweepBatch, its functions): sweep_all()
        self.search = None  # sweep_search.py's compiled search, once made (compiled_search())
        self._sweeping: Optional[tuple] = None  # (thread, functions, result): sweep_ahead()
        self._targets: Dict[int, Dict[int, int]] = {}
        # every branch target of every function, sorted, once prepare() has seen them
        # all: a window with none inside needs no look at its neighbours' targets
        self.all_targets: Optional[np.ndarray] = None
        # per function, with them: (whether the byte scans may enter it past its entry,
        # whether the functions' branches may), as BranchSafety.branch_from_outside asks
        self.entered: Optional[List[tuple]] = None
        self.branch_pairs: Optional[tuple] = None  # (their targets, sorted; sources), with them
        self.no_fragment_targets: Set[int] = set()  # with them: _clear_of_fragments()
        # functions whose sweeps have no row that may be an indirect jump (prepare())
        self.no_indirect_jumps: Set[int] = set()
        self.direct: Dict[int, Dict[int, int]] = {}
        self.tables: Dict[int, Dict[int, JumpTable]] = {}
        self.unknown_jumps: Dict[int, Optional[int]] = {}  # function -> indirect_jump()
        self._parts_of: Dict[int, List[Function]] = {}  # function -> parts()
        # function -> the addresses its instructions compute, in order (Windows.case_base):
        # noted where jump_tables() decodes a function with an unknown indirect jump
        self.computed: Dict[int, list] = {}
        self.lengths: Dict[bytes, list] = {}  # code -> its instructions' ends (Windows.displaced)
        self.by_name: Optional[Dict[str, Function]] = None
        self._frames: Optional[dict] = None  # FDE start -> frame there, when first needed
        self._fragments: Optional[Dict[int, Function]] = None
        self._taken_index = taken_index  # (else made when first needed)
        self._landing_pads: Optional[except_table.LandingPads] = None  # when first needed
        self._cold_parts: Dict[str, List[Function]] = {}  # "f" -> f.cold, f.cold.1, ...
        self.copied = copied_code.find(elf)  # code never to patch, sorted
        self._copied_starts = [c.start for c in self.copied]
        self._copied_reach = list(itertools.accumulate((c.end for c in self.copied), max))
        for f in functions:
            if ".cold" in f.name:
                self._cold_parts.setdefault(f.name.split(".cold")[0], []).append(f)

    def sweep(self, fn: Function) -> Sweep:
        found = self.sweeps.get(fn.address)
        if found is None:
            found = self.sweeps[fn.address] = self.backend.sweep(self.code(fn), fn.address)
        return found

    def code(self, fn: Function) -> bytes:
        """The function's bytes (none when the file does not hold them)."""
        offset, size = self.span(fn)
        return self.elf.data[offset:offset + size]

    def span(self, fn: Function) -> tuple:
        """(offset, size) of the function's bytes in the file; (0, 0) when it does not
        hold them."""
        offset = self.elf.offset_of(fn.address, max(fn.size, 1))
        return (offset, fn.size) if offset is not None else (0, 0)

    def sweep_ahead(self, functions: List[Function]) -> None:
        """Start sweep_all(functions) on a thread of its own, for the caller to go on
        meanwhile (prepare() of the same list waits for it): the native sweep releases
        the GIL while it decodes, so it takes the other core, beside
        making the sites of `list`. Nothing else may sweep until then. A sweep that
        fails on the thread is made again where it can be reported."""
        if self._sweeping is not None:
            return
        done = {}

        def sweep() -> None:
            try:
                done["swept"] = self.sweep_all(functions)
            except BaseException:  # (made again by swept_all(), and reported there)
                pass

        thread = threading.Thread(target=sweep, name="urewrite sweep", daemon=True)
        self._sweeping = (thread, functions, done)
        thread.start()

    def swept_all(self, functions: List[Function]) -> bool:
        """sweep_all(functions), or the sweep_ahead() of the same list, waited for."""
        if self._sweeping is not None:
            thread, ahead, done = self._sweeping
            thread.join()
            self._sweeping = None
            if ahead is functions and "swept" in done:
                return done["swept"]
        return self.sweep_all(functions)

    def sweep_all(self, functions: List[Function]) -> bool:
        """Sweep the functions not swept yet at once, if the backend has a much faster
        way for many (Backend.sweep_all); whether it had."""
        todo = [fn for fn in functions if fn.address not in self.sweeps]
        made = self.backend.sweep_all(self.elf.data,
                                      [self.span(fn) + (fn.address,) for fn in todo])
        if made is None:
            return False
        self.sweeps.update(zip((fn.address for fn in todo), made.sweeps))
        self.batch = (made, todo)
        return True

    def compiled_search(self):
        """The compiled search over the sweeps (sweep_search.py), made once every function's
        sweep and jump tables are known (prepare() of the whole file, native sweeps);
        else None."""
        if self.search is None and self.batch is not None and self.all_targets is not None \
                and self.backend.sweep_search_engine is not None:
            self.search = sweep_search.build(
                self.backend.sweep_search_engine, self.functions, *self.batch,
                self.tables, self.landing_pads(), NEAR_BRANCH_REACH, MAX_LOOK_BACK)
        return self.search

    def rows(self, fn: Function, first: int, end: int) -> list:
        """Instructions `first` to `end` (exclusive) of the function's sweep: the marked
        ones (Sweep.marked: branches, calls, landing pads) decoded, the others plain code
        that only their address and size describe (Refused if the decoder does not find
        the sweep's boundaries at a marked one). Windows are made of these: decoding
        every instruction of 200,000 windows took seconds; those that move are decoded
        in detail anyway (Windows.displaced)."""
        if fn.address in self.decoded:
            return self.decoded[fn.address][first:end]
        sweep = self.sweep(fn)
        lo, hi = sweep.marked.searchsorted((first, end)).tolist()
        marked = (sweep.marked[lo:hi] - first).tolist()
        direct = {}
        if marked:  # direct branches, most of them (calls): the backend may know them
            lo, hi = sweep.rows.searchsorted((first, end)).tolist()
            direct = {k - first: target for k, target in zip(sweep.rows[lo:hi].tolist(),
                                                             sweep.targets[lo:hi].tolist())
                      if target >= 0}
        return self.insns(sweep.edges[first:end + 1].tolist(), marked, direct)

    def insns(self, edges: list, marked: list, direct: dict) -> list:
        """rows(): the instructions between `edges`, those at the indexes `marked`
        decoded, from their direct target where `direct` has one (index -> target)."""
        insns = [Insn(a, b - a, "", "", b"") for a, b in zip(edges, edges[1:])]
        if direct:
            rest = []
            for k in marked:
                insn = self.backend.direct_branch(
                    self.elf.read(edges[k], edges[k + 1] - edges[k]), edges[k],
                    direct[k]) if k in direct else None
                if insn is None:
                    rest.append(k)
                else:
                    insns[k] = insn
            marked = rest
        run = 0
        while run < len(marked):  # each run of consecutive marked ones, decoded at once
            last = run
            while last + 1 < len(marked) and marked[last + 1] == marked[last] + 1:
                last += 1
            a, b = marked[run], marked[last] + 1
            decoded = self.backend.decode(self.elf.read(edges[a], edges[b] - edges[a]),
                                          edges[a])
            if [i.address for i in decoded] != edges[a:b] or decoded[-1].end != edges[b]:
                raise Refused(f"its instructions at {edges[0]:#x} decode differently "
                               f"in detail")
            insns[a:b] = decoded
            run = last + 1
        return insns

    def instruction(self, fn: Function, k: int):
        """Instruction `k` of the function's sweep, decoded; None if it does not decode
        alone as it does in the sweep."""
        try:
            insns = self.rows(fn, k, k + 1)
        except Refused:
            return None
        return insns[0] if len(insns) == 1 else None

    def instructions(self, fn: Function, keep: bool = True) -> list:
        """The function's whole sweep, decoded (kept for the next question unless not
        `keep`: a big file's jump tables alone would keep 100 MB of them)."""
        found = self.decoded.get(fn.address)
        if found is None:
            found = self.backend.decode(self.code(fn), fn.address)
            if keep:
                self.decoded[fn.address] = found
        return found

    def head(self, fn: Function, size: int) -> list:
        """The function's first instructions, decoded: those that start before `size`
        bytes after a landing pad (endbr64, bti: 4 bytes), and one more. (No fixed
        number of bytes: that decoded many more instructions than an entry needs.)"""
        sweep = self.sweep(fn)
        end_row = int(sweep.edges.searchsorted(fn.address + 4 + size)) + 1
        return self.rows(fn, 0, min(end_row, len(sweep)))

    def boundaries(self, fn: Function) -> Set[int]:
        return set(self.sweep(fn).starts.tolist())

    def branch_targets(self, fn: Function) -> Dict[int, int]:
        """Branch targets in a function, direct ones and those of its jump tables:
        target -> address of a branch to it."""
        if fn.address not in self._targets:
            targets = self.direct_targets(fn)
            tables = self.jump_tables(fn)
            if tables:  # (else the direct targets themselves: most functions, no copy)
                targets = dict(targets)
                for table in tables.values():
                    for target in table.targets:
                        targets.setdefault(target, table.jump)
            self._targets[fn.address] = targets
        return self._targets[fn.address]

    def direct_targets(self, fn: Function) -> Dict[int, int]:
        """target -> the first direct branch (or call) to it, in the function's order."""
        if fn.address not in self.direct:
            sweep = self.sweep(fn)
            direct = sweep.targets >= 0
            found: Dict[int, int] = {}  # (a few per function: a dict beats np.unique)
            for target, source in zip(sweep.targets[direct].tolist(),
                                      sweep.edges[sweep.rows[direct]].tolist()):
                if target not in found:
                    found[target] = source
            self.direct[fn.address] = found
        return self.direct[fn.address]

    def indirect_jumps(self, fn: Function) -> List[int]:
        """The indexes in its sweep of the function's indirect jumps."""
        sweep = self.sweep(fn)
        found = []
        for k in sweep.rows[sweep.kinds == OTHER].tolist():
            insn = self.instruction(fn, k)
            if insn is not None and self.backend.is_indirect_jump(insn):
                found.append(k)
        return found

    def jump_tables(self, fn: Function) -> Dict[int, JumpTable]:
        """The jump tables of a function's indirect jumps: jump address -> table. A jump
        not here is not known to be a table (jump_tables.py)."""
        if fn.address not in self.tables:
            if fn.address in self.no_indirect_jumps:  # (most functions: found at once)
                self.unknown_jumps[fn.address] = None
                self.tables[fn.address] = {}
                return self.tables[fn.address]
            jumps = self.indirect_jumps(fn)
            # (the recovery reads the instructions before a jump, decoded as it reads)
            insns = SweptCode(self.sweep(fn), self.backend.decode, self.elf.read) \
                if jumps else []
            tables = self.tables[fn.address] = jump_table_guard.recover(self, fn, jumps,
                                                                         insns)
            edges = self.sweep(fn).edges
            unknown = self.unknown_jumps[fn.address] = next(
                (a for a in (int(edges[k]) for k in jumps) if a not in tables), None)
            if unknown is not None:  # (Windows.case_base will ask: noted while at hand)
                self.computed[fn.address] = self.backend.computed_addresses(
                    self.code(fn), fn.address)
        return self.tables[fn.address]

    def has_indirect_jump(self, fn: Function) -> bool:
        """Whether the function has an indirect jump that is not a recovered jump table:
        where it goes is unknown, maybe into a window we would make."""
        return self.indirect_jump(fn) is not None

    def indirect_jump(self, fn: Function) -> Optional[int]:
        """The address of the first indirect jump of the function that is not a recovered
        jump table, or None."""
        if fn.address not in self.unknown_jumps:
            self.jump_tables(fn)  # (finds it)
        return self.unknown_jumps[fn.address]

    def entry_frames(self) -> Optional[dict]:
        if self._frames is None:
            self._frames = redirection.entry_frames(self.elf) or {}
        return self._frames

    def read_unwind_tables(self) -> None:
        """Read now what .eh_frame and the LSDAs tell (entry frames, fragments, landing
        pads), which return probes and windows of several instructions ask. (`list`
        has it done while the other process sweeps, not in each process of
        precompute().)"""
        self.fragments()
        self.landing_pads()

    def landing_pads(self) -> except_table.LandingPads:
        if self._landing_pads is None:
            self._landing_pads = except_table.landing_pads(self.elf)
        return self._landing_pads

    def fragments(self) -> Dict[int, Function]:
        """Functions whose FDE starts inside another function's frame: parts split off
        by the compiler (.cold parts, named or not), entered by a jump."""
        if self._fragments is None:
            frames = self.entry_frames()
            self._fragments = {}
            for f in self.functions:
                frame = frames.get(f.address)
                # (an undefined return address marks an outermost frame: _start)
                if frame is not None and frame.return_address != ("undefined",) \
                        and not self.backend.is_call_frame(frame):
                    self._fragments[f.address] = f
        return self._fragments

    def parts(self, fn: Function) -> List[Function]:
        """The function and the parts split off from it: its .cold parts by name, and
        every fragment its parts branch to directly."""
        if fn.address in self._parts_of:
            return self._parts_of[fn.address]
        parts = self._parts_of[fn.address] = [fn] + self._cold_parts.get(fn.name, [])
        fragments = self.fragments()
        for part in parts:  # grows while we walk it
            if part.address in self.no_fragment_targets:  # (prepare(): known at once)
                continue
            targets = self.branch_targets(part)
            # (most: asked at once, in C, over the fewer: two views)
            if targets.keys().isdisjoint(fragments.keys()):
                continue
            for target in targets:
                fragment = fragments.get(target)
                if fragment is not None and fragment not in parts:
                    parts.append(fragment)
        return parts

    @property
    def taken_index(self) -> taken_addresses.TakenIndex:
        """The file's scans for taken addresses and far branches, made once."""
        if self._taken_index is None:
            self._taken_index = taken_addresses.TakenIndex(self.elf, self.backend)
        return self._taken_index

    def copied_at(self, start: int, end: Optional[int] = None):
        """The copied code (copied_code.py) that overlaps [start, end), if any."""
        end = start + 1 if end is None else end
        # (asked for every window: a binary search, then a look only where one overlaps)
        k = bisect.bisect_left(self._copied_starts, end)  # the copies starting before `end`
        if k == 0 or self._copied_reach[k - 1] <= start:
            return None
        return next((c for c in self.copied[:k] if start < c.end), None)

    def holders(self, address: int) -> List[Function]:
        """Every function (of known size) whose range holds `address`: ranges may nest."""
        k = bisect.bisect_right(self.ends_so_far, address)
        holders = []
        while k < len(self.functions) and self.functions[k].address <= address:
            if address < self.functions[k].end:
                holders.append(self.functions[k])
            k += 1
        return holders

    def index_of(self, fn: Function) -> Optional[int]:
        """Where the function is in self.functions (None: not there)."""
        k = bisect.bisect_left(self.starts, fn.address)
        return k if k < len(self.functions) and self.functions[k] is fn else None

    def holding(self, site: Site) -> Function:
        """The function (or .cold part) whose code holds the site."""
        k = self.holding_index(site)
        return self.functions[k] if k is not None else site.function

    def holding_index(self, site: Site) -> Optional[int]:
        """Where the function (or .cold part) whose code holds the site is in
        self.functions: the site's own function if none of them holds it; None if that
        is not there either."""
        k = bisect.bisect_right(self.starts, site.address) - 1
        if k >= 0 and self.functions[k].address <= site.address < self.functions[k].end:
            return k
        return self.index_of(site.function)

    def near_functions(self, window: Window) -> List[Function]:
        """Functions with code within rel8 reach of the window. Ranges may overlap (one
        symbol inside another's), so the search starts at the first function whose end,
        or an earlier one's, reaches that far."""
        k = bisect.bisect_left(self.ends_so_far, window.address - NEAR_BRANCH_REACH)
        near = []
        while k < len(self.functions):
            fn = self.functions[k]
            if fn.address > window.end + NEAR_BRANCH_REACH:
                break
            if fn.end + NEAR_BRANCH_REACH >= window.address:
                near.append(fn)
            k += 1
        return near

    def targets_between(self, start: int, end: int) -> bool:
        """Whether any branch of the file may land in (start, end): False only when
        prepare() has seen every function's targets and none lies there."""
        if self.all_targets is None:
            return True
        k = int(self.all_targets.searchsorted(start, side="right"))
        return k < len(self.all_targets) and int(self.all_targets[k]) < end

    def insn_at(self, fn: Function, address: int, detail: bool = True):
        """The instruction of the function's linear sweep that holds `address`, decoded
        (with detail, or by the quick decoder with its bytes); None where the sweep
        does not reach it cleanly."""
        sweep = self.sweep(fn)
        k = sweep.index_holding(address)
        if k is None:
            return None
        start, size = int(sweep.edges[k]), int(sweep.edges[k + 1] - sweep.edges[k])
        code = self.elf.read(start, size)
        decoded = self.backend.decode(code, start, detail=detail)
        if len(decoded) != 1 or decoded[0].size != size:
            return None
        insn = decoded[0]
        return insn if detail else Insn(start, size, insn.mnemonic, insn.op_str, code)

    def sweep_branches(self, fn: Function, address: int, target: int) -> bool:
        """Whether the instruction of the function's sweep holding `address` is a direct
        branch (or call) to `target`."""
        sweep = self.sweep(fn)
        k = sweep.index_holding(address)
        row = int(sweep.rows.searchsorted(k)) if k is not None else len(sweep.rows)
        return row < len(sweep.rows) and sweep.rows[row] == k and sweep.targets[row] == target

    def last_instruction(self, fn: Function) -> Optional[Insn]:
        """The last instruction of the function's sweep, decoded; None where the sweep
        stops before the function's end or the decoder sees that instruction otherwise.
        (Not the whole function decoded for it.)"""
        sweep = self.sweep(fn)
        if not len(sweep) or sweep.end != fn.end:
            return None
        start = int(sweep.edges[-2])
        decoded = self.backend.decode(self.elf.read(start, fn.end - start), start)
        return decoded[0] if len(decoded) == 1 and decoded[0].end == fn.end else None

    def outermost(self, address: int) -> bool:
        """Whether a function starting at `address` is an outermost frame (its unwind info
        leaves the return address undefined: _start, clone's thread_start): a branch there
        starts a new thread of execution, it leaves no call."""
        frame = self.entry_frames().get(address)
        return frame is not None and frame.return_address == ("undefined",)

    def really_names(self, source: int, target: int) -> bool:
        return self.really_refers(taken_addresses.Match(taken_addresses.BRANCH, "", source),
                                   target)

    def really_refers(self, match: taken_addresses.Match, target: int) -> bool:
        """Whether a byte-scan match in code is real: the instruction holding its bytes
        branches to or computes `target` (a branch match), or carries it in an immediate
        or displacement field starting at those bytes (an immediate match); bytes inside
        other instructions only look like one. Code in no known function, or that does
        not decode cleanly there, counts as real; so does a match any holder confirms."""
        holders = self.holders(match.source)
        if not holders:
            return True
        branch = match.kind == taken_addresses.BRANCH
        for fn in holders:
            if branch and self.sweep_branches(fn, match.source, target):
                return True  # (what the decode below would find: no need to ask it)
            if not branch and self.no_field_at(fn, match.source):
                continue
            # (a branch is named by its mnemonic and operands: the quick decoder's)
            insn = self.insn_at(fn, match.source, detail=not branch)
            if insn is None:
                return True
            if branch:
                if self.backend.names_address(insn, target):
                    return True
            elif self.backend.holds_constant(insn, match.source - insn.address, target):
                return True
        return False

    def no_field_at(self, fn: Function, address: int) -> bool:
        """Whether no immediate or displacement field of 4 bytes or more can start at
        `address` in the function's instruction holding it (it is its first byte, or
        4 bytes from it pass its end), that instruction decoding alike in detail: the
        answer holds_constant() gives, without the detailed decode (most matches
        asked)."""
        sweep = self.sweep(fn)
        k = sweep.index_holding(address)
        if k is None:
            return False
        start, end = int(sweep.edges[k]), int(sweep.edges[k + 1])
        return (address == start or address + 4 > end) and \
            self.instruction_ends(self.elf.read(start, end - start)) == [end - start]

    def instruction_ends(self, code: bytes) -> list:
        """Where the decoder that moves instructions ends each one in `code`, from its
        start. Kept per byte string: where instructions lie does not change their
        lengths, and most windows hold code met before."""
        ends = self.lengths.get(code)
        if ends is None:
            ends = self.lengths[code] = self.backend.boundaries(code, 0)[1:]
        return ends

    def learn_lengths(self, codes: List[bytes]) -> None:
        """instruction_ends() of many byte strings at once, those not known yet: one
        decode of them all, one after another, not one each. A string where that decode has an instruction start
        and one end has the ends it would have alone: instructions decode from their
        first byte on. The others (an instruction across its end, a decode that stops
        before it) are decoded alone when asked."""
        new = [code for code in dict.fromkeys(codes) if code not in self.lengths]
        starts = list(itertools.accumulate(map(len, new), initial=0))
        i = 0
        while i + 1 < len(new):  # (from the first string left, each time the decode stops)
            bounds = self.backend.boundaries(b"".join(new[i:]), starts[i])
            while i < len(new) and starts[i + 1] <= bounds[-1]:
                k = bisect.bisect_left(bounds, starts[i])
                j = bisect.bisect_left(bounds, starts[i + 1], k)
                if bounds[k] == starts[i] and bounds[j] == starts[i + 1]:
                    self.lengths[new[i]] = [b - starts[i] for b in bounds[k + 1:j + 1]]
                i += 1
            i += 1  # (the one it stopped in: decoded alone when asked)
