"""Return exits: the instructions that leave a function for good (returns, tail calls,
conditional tail calls, indirect jumps that may leave), where a return probe's sites go;
or why they cannot all be seen (code shared with another function, an unknown extent,
an instruction that decodes otherwise alone). Where they cannot, the planner redirects
the return address instead (redirection.py)."""

from __future__ import annotations

from typing import Dict, List, Optional, Set

from urewrite.arch.base import BRANCH, JUMP, OTHER, RETURN
from urewrite.rewriter.functions import Function
from urewrite.rewriter.model import BinaryModel
from urewrite.rewriter.plan.branch_safety import BranchSafety
from urewrite.rewriter.plan.results import Refused
from urewrite.rewriter.selectors import Site


class ReturnExits:
    """The exits of one file's functions, asked of its model."""

    def __init__(self, model: BinaryModel, safety: BranchSafety):
        self.model = model
        self.safety = safety
        self.backend = model.backend
        self.functions = model.functions
        self.known: Dict[int, object] = {}  # function -> exit_points() (or why not): precompute
        self.conditional: Set[int] = set()  # exits that leave only when taken
        self.siteless: List[Site] = []  # return probes of functions without an exit

    def exit_sites(self, site: Site) -> List[Site]:
        """One site per instruction that leaves the function for good."""
        found = self.known.get(site.function.address)  # (precompute)
        if isinstance(found, str):
            raise Refused(found)
        points, conditional = found if found is not None else self.exit_points(site)
        self.conditional |= conditional
        exits = [site.at_exit(*point) for point in points]
        if not exits:  # it never returns: its probe exists, with no site to patch
            self.siteless.append(site)
        return exits

    def exit_points(self, site: Site) -> tuple:
        """(exits, conditional): (address, tail call, stays_within) of each instruction
        that leaves the function for good; the addresses of those that leave only when
        their branch is taken."""
        fn = site.function
        if not fn.size:
            raise Refused("its size is unknown (no symbol size and no .eh_frame entry)")
        if fn.address in self.model.fragments() or ".cold" in fn.name:
            raise Refused("it is a part of another function, split off by the compiler "
                           "and entered by a jump: its exits return for that function")
        if fn.size_inferred:
            self.check_inferred_extent(fn)
        parts = self.model.parts(fn)

        if len(parts) == 1:  # the usual case, asked for every branch: kept quick
            start, end = fn.address, fn.end

            def inside(address: int) -> bool:
                return start <= address < end
        else:
            def inside(address: int) -> bool:
                return any(p.address <= address < p.end for p in parts)

        exits, conditional = [], set()
        index = self.model.index_of(fn) if len(parts) == 1 else None
        for part in parts:
            tables = self.model.jump_tables(part)
            sweep = self.model.sweep(part)
            if sweep.end != part.end:
                raise Refused(f"its code does not decode past {sweep.end:#x}: an exit may "
                               f"lie beyond")
            for k, kind, target, address in self.exit_rows(part, inside, index):
                if kind == RETURN:  # (most: as below, quicker)
                    exits.append((address, False, ()))
                    continue
                if kind == OTHER:
                    table = tables.get(address)
                    if table is not None and all(inside(t) for t in table.targets):
                        continue  # a switch: its cases are all in the function
                    insn = self.model.instruction(part, k)
                    if insn is None:
                        raise Refused(f"its instruction at {address:#x} decodes differently "
                                       f"alone")
                    leaves, problem = self.backend.exit_kind(insn, inside)
                    target = self.backend.direct_branch_target(insn) if leaves else None
                else:  # a return, a tail call, a conditional tail call (when taken)
                    leaves, problem = "taken" if kind == BRANCH else True, None
                    target = None if kind == RETURN else target
                if problem:
                    raise Refused(f"a return probe cannot see every exit: {problem}")
                if leaves == "outside":  # an indirect jump: checked where it goes, each time
                    within = self.stays_within(fn, parts)
                    if within:
                        exits.append((address, True, within))
                        continue
                    leaves, target = True, None  # the jump is all there is: it can only leave
                if target is not None and self.model.outermost(target):
                    continue  # a new thread's first frame (clone's child): this call never ends
                if leaves:  # a return, or a tail call (a direct jump: it has a target)
                    exits.append((address, target is not None, ()))
                if leaves == "taken":
                    conditional.add(address)
        shared = self.safety.branch_from_outside(fn, parts, inside, index)
        if shared:
            raise Refused("other code branches into it (at {:#x}, from {:#x}): its exits "
                           "are not only its own".format(*shared))
        return exits, conditional

    def exit_rows(self, part: Function, inside, index: Optional[int]) -> list:
        """(row, kind, target, address) of each instruction of the part's sweep that may
        leave the function (`inside`: whether an address is in it): returns, direct
        jumps and branches out, and the rest to ask of (OTHER). The compiled search
        answers for a function of one part, at `index` in self.functions
        (sweep_search.py)."""
        search = self.model.compiled_search() if index is not None else None
        if search is not None:
            found = search.exits(index)
            if found is not None:
                return found
        sweep = self.model.sweep(part)
        found = []
        # (in Python: most functions have a few dozen rows, too few for numpy)
        for k, kind, target in zip(sweep.rows.tolist(), sweep.kinds.tolist(),
                                   sweep.targets.tolist()):
            if kind == JUMP or kind == BRANCH:
                if inside(target):
                    continue
            elif kind != RETURN and kind != OTHER:
                continue
            found.append((k, kind, target, int(sweep.edges[k])))
        return found

    def stays_within(self, fn: Function, parts: List[Function]) -> tuple:
        """The [start, end) ranges an indirect jump of `fn` may go to and stay in the
        function: its parts, less its entry (going there enters it anew: its entry
        probe fires again, so this call has ended). Empty when no instruction of the
        function lies in them."""
        if len(parts) == 1 and len(self.model.sweep(fn)) <= 1:
            return ()
        return ((fn.address + 1, fn.end),) + tuple((p.address, p.end) for p in parts[1:])

    def check_inferred_extent(self, fn: Function) -> None:
        """A function without a size extends to whatever follows it (functions.py).
        Its exits are trusted only when that extent decodes whole and its last
        instruction before any padding never falls through: else code of another
        function may follow, or the function may run on past the extent."""
        insns = self.model.instructions(fn)
        if not insns or insns[-1].end != fn.end:
            raise Refused(f"its size is unknown and its code up to the {fn.sized_by} "
                           f"does not decode whole")
        body = list(insns)
        while body and self.backend.is_padding(body[-1]):
            body.pop()
        if not body or not self.backend.ends_flow(body[-1]):
            raise Refused(f"its size is unknown and its code up to the {fn.sized_by} "
                           f"does not end in a return or jump")
