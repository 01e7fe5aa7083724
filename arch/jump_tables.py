"""Jump-table recovery shared by the backends: the dispatch a switch compiles to.

    cmp   INDEX, N              the bounds check: INDEX <= N (unsigned) past it
    ja    default               (or `jbe dispatch`, reached only by that branch)
    dispatch: ...               compute an entry address from INDEX, load it,
    jmp   TARGET                maybe scale it and add a base: the case label

Each backend (arch/<isa>/jump_tables.py) gives the meaning of its instructions
as operations on symbolic values (`Affine`, `Entry`); this module finds the
bounds check that dominates the jump, runs the dispatch symbolically and reads
the N + 1 entries. The count comes only from the check: nothing is guessed from
what the table holds. Anything that does not match exactly gives None.

The jump is dominated by the check when the dispatch is straight-line code that
is entered only past the check: by falling through a `ja default` right before
it, or by a `jbe dispatch` when nothing falls into it. Inside the function this
module verifies that from its direct branches; `JumpTable.guarded` and `.entry`
let the caller check that no code outside it (and no other table) enters the
dispatch elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional, Set, Tuple

from urewrite.arch.base import CALL, SweptCode

MASK64 = (1 << 64) - 1
MAX_DISPATCH = 16  # instructions between the check and the jump, at most
MAX_BETWEEN = 3  # flag-neutral instructions between the compare and its branch
MAX_ENTRIES = 1 << 16  # a bound larger than this is not a switch


@dataclass(frozen=True)
class Affine:
    """scale * INDEX + offset, exactly, as a 64-bit value (scale 0: a constant)."""
    scale: int
    offset: int

    def plus(self, other: "Affine") -> "Affine":
        return Affine(self.scale + other.scale, (self.offset + other.offset) & MASK64)

    def times(self, k: int) -> "Affine":
        return Affine(self.scale * k, (self.offset * k) & MASK64)

    @property
    def is_index(self) -> bool:
        return self.scale == 1 and self.offset == 0


INDEX = Affine(1, 0)


@dataclass(frozen=True)
class LowIndex:
    """A register whose low `bits` bits hold INDEX; its upper bits are unknown."""
    bits: int


@dataclass(frozen=True)
class Entry:
    """The entry INDEX of a table at `table` (`size` bytes each, zero-extended when
    read), then `ops` in order: ("sx", b) sign-extends from b bits, ("zx", b) keeps
    the low b bits, ("mul", k), ("add", c); all in 64-bit arithmetic."""
    table: int
    size: int
    ops: Tuple = ()

    def then(self, *ops) -> "Entry":
        return Entry(self.table, self.size, self.ops + ops)

    def value(self, raw: int) -> int:
        v = raw
        for op, arg in self.ops:
            if op == "sx":
                v &= (1 << arg) - 1
                if v >> (arg - 1):
                    v -= 1 << arg
            elif op == "zx":
                v &= (1 << arg) - 1
            elif op == "mul":
                v *= arg
            elif op == "add":
                v += arg
            v &= MASK64
        return v


@dataclass(frozen=True)
class Check:
    """A bounds check: `operand` (a backend-defined description of what is compared:
    a register, or a stack slot) against `limit`, unsigned."""
    operand: object
    limit: int


@dataclass(frozen=True)
class JumpTable:
    jump: int  # address of the indirect jump
    table: int
    count: int  # entries, from the bounds check (the largest, if several checks lead there)
    targets: FrozenSet[int]
    # instructions that only the paths followed here may enter: the checks' branches
    # and the dispatch after its first instruction
    guarded: FrozenSet[int]
    entry: int  # the dispatch's first instruction, which only `entry_sources` branch to
    entry_sources: FrozenSet[int]


@dataclass(frozen=True)
class WriterFacts:
    """What writers() asks of an instruction, the same wherever its bytes lie: whether
    the quick decoder finds it as the sweep does (one instruction, all of its bytes),
    whether that is a call, and the register families it writes (None: it does not
    decode in detail)."""
    as_swept: bool
    call: bool
    written: Optional[FrozenSet[str]]


class Semantics:
    """What a backend tells the shared walk about its instructions. One instance per
    function: `insns` its instructions (quick decode: a list, or a SweptCode that
    decodes those the walk reads), `read` the file's bytes."""

    callee_saved: FrozenSet[str] = frozenset()
    # instruction bytes -> WriterFacts, kept by the backend across functions, where its
    # may_write() says nothing (every instruction decoded): writers() then looks up
    # each instruction's bytes instead of decoding the whole function
    facts: Optional[Dict[bytes, "WriterFacts"]] = None

    def __init__(self, insns: list, read: Callable[[int, int], bytes]):
        self.insns = insns
        self.read = read
        # facts of the function, shared by the walks from each of its indirect jumps
        self._details: Dict[int, object] = {}
        self._owners: Dict[str, object] = {}  # register -> writers()
        self._targets: Optional[Dict[int, List[int]]] = None
        self._position: Optional[Dict[int, int]] = None
        self._facts_list: Optional[list] = None
        # of the walk from one jump (recover)
        self._invariants: Dict[str, object] = {}
        self.dispatch = 0  # position of the dispatch's first instruction

    def targets(self) -> Dict[int, List[int]]:
        """Direct branch target -> the addresses of the branches to it (from the sweep,
        when `insns` come from one: it has them without decoding)."""
        if self._targets is None:
            if isinstance(self.insns, SweptCode):
                self._targets = self.insns.sweep.branches()
                return self._targets
            self._targets = {}
            for insn in self.insns:
                target = self.branch_target(insn)
                if target is not None:
                    self._targets.setdefault(target, []).append(insn.address)
        return self._targets

    def position(self) -> Dict[int, int]:
        """Instruction address -> its index in `insns`."""
        if self._position is None:
            addresses = self.insns.addresses if isinstance(self.insns, SweptCode) else \
                [i.address for i in self.insns]
            self._position = {a: k for k, a in enumerate(addresses)}
        return self._position

    def branch_target(self, insn) -> Optional[int]:
        raise NotImplementedError

    def falls_through(self, insn) -> bool:
        """False for an unconditional jump, return or trap."""
        raise NotImplementedError

    def is_control(self, insn) -> bool:
        """Any branch, call or return: the end of straight-line code."""
        raise NotImplementedError

    def is_call(self, insn) -> bool:
        raise NotImplementedError

    def is_indirect(self, insn) -> bool:
        """An indirect jump (not a call, not a return)."""
        raise NotImplementedError

    def bound_branch(self, insn) -> Optional[Tuple[bool, int]]:
        """For a conditional branch after an unsigned compare: (whether taking it means
        "in range", how much to subtract from the compared limit for the largest index
        in range: 0 for > / <=, 1 for >= / <); else None."""
        raise NotImplementedError

    def decode_detail(self, insn):
        """The instruction decoded with operands (None when it cannot be)."""
        raise NotImplementedError

    def may_write(self, insn, family: str) -> bool:
        """False when the quick decode shows `insn` cannot write the register."""
        return True

    def written(self, detailed) -> Set[str]:
        """Register families a detailed instruction writes."""
        raise NotImplementedError

    def constant_definition(self, detailed) -> Optional[Tuple[str, int]]:
        """(family, address) when the instruction sets a register to a constant address
        by itself (lea r, [rip+X]; adr x, X)."""
        raise NotImplementedError

    def check(self, cmp) -> Optional[Check]:
        raise NotImplementedError

    def initial_state(self, check: Check) -> Optional[dict]:
        """Register values right after the check."""
        raise NotImplementedError

    def keeps_flags(self, insn) -> bool:
        """A move or address computation (quick decode): it neither reads nor writes
        the condition flags, so it may sit between a compare and its branch."""
        raise NotImplementedError

    def step(self, state: dict, insn) -> bool:
        """Apply one dispatch instruction to `state`; False when it cannot be followed."""
        raise NotImplementedError

    def jump_value(self, state: dict, insn) -> Optional[Entry]:
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------
    def detail(self, insn):
        if insn.address not in self._details:
            self._details[insn.address] = self.decode_detail(insn)
        return self._details[insn.address]

    def value(self, state: dict, family: str):
        """A register's value in the dispatch: what the dispatch set it to, else a
        table base the function sets once, at its start (hoisted out of a loop)."""
        if family in state["regs"]:
            return state["regs"][family]
        if family in state["killed"]:
            return None
        return self.invariant(family)

    def invariant(self, family: str):
        """The address a register holds at the dispatch when the one instruction writing
        it in the whole function sets it (an adrp/add pair counts as one), every path
        to the dispatch runs that instruction, and no call can change it; else None."""
        if family not in self._invariants:
            self._invariants[family] = self._find_invariant(family)
        return self._invariants[family]

    def writers(self, family: str) -> Optional[list]:
        """(position, detailed) of every instruction of the function that writes the
        register; None when a call may change it or an instruction does not decode."""
        if family not in self._owners:
            owners = []
            if family not in self.callee_saved and self._has_direct_call():
                self._owners[family] = None  # (known without decoding the rest)
                return None
            facts = self._all_facts()
            if facts is not None:
                self._owners[family] = self.writers_by_facts(family, facts)
                return self._owners[family]
            for k, insn in enumerate(self.insns):
                if self.is_call(insn) and family not in self.callee_saved:
                    owners = None
                    break
                if not self.may_write(insn, family):
                    continue
                detailed = self.detail(insn)
                if detailed is None:
                    owners = None
                    break
                if family in self.written(detailed):
                    owners.append((k, detailed))
            self._owners[family] = owners
        return self._owners[family]

    def _all_facts(self) -> Optional[list]:
        """WriterFacts of each instruction, by its bytes where the sweep puts it; None where
        there are none to use (no shared facts, instructions not from a sweep), or
        where one does not decode alone as the sweep has it (then decoding the whole
        function fails as before)."""
        if self.facts is None or not isinstance(self.insns, SweptCode):
            return None
        if self._facts_list is None:
            edges = self.insns.addresses + [self.insns.sweep.end]
            start = edges[0]
            code = self.insns.read(start, edges[-1] - start)
            known, found = self.facts, []
            for a, b in zip(edges, edges[1:]):
                raw = code[a - start:b - start]
                fact = known.get(raw)
                if fact is None:
                    fact = known[raw] = self.facts_of(raw)
                found.append(fact)
            self._facts_list = found if all(f.as_swept for f in found) else ()
        return self._facts_list or None

    def writers_by_facts(self, family: str, facts: list) -> Optional[list]:
        """writers() from each instruction's facts: the same answer, with only the
        writers themselves decoded where they lie."""
        owners = []
        for k, fact in enumerate(facts):
            if fact.call and family not in self.callee_saved:
                return None
            if fact.written is None:
                return None
            if family in fact.written:
                owners.append((k, self.detail(self.insns[k])))
        return owners

    def facts_of(self, raw: bytes) -> "WriterFacts":
        """The facts of one instruction's bytes, decoded alone."""
        raise NotImplementedError

    def _has_direct_call(self) -> bool:
        """Whether the function has a direct call, found among the rows of its sweep
        when `insns` come from one (else False: writers() finds any call anyway)."""
        if not isinstance(self.insns, SweptCode):
            return False
        sweep = self.insns.sweep
        return any(self.is_call(self.insns[k]) for k in sweep.rows[sweep.kinds == CALL].tolist())

    def _find_invariant(self, family: str):
        owners = self.writers(family)
        if owners is None:
            return None
        if len(owners) == 1:
            definition = self.constant_definition(owners[0][1])
        elif len(owners) == 2 and self._dominates(owners[0][0], owners[1][0]):  # adrp, add
            definition = self.pair_definition(owners[0][1], owners[1][1])
        else:
            return None
        if definition is None or definition[0] != family:
            return None
        if not self._dominates(owners[-1][0], self.dispatch):
            return None  # some path reaches the dispatch without setting it
        return Affine(0, definition[1])

    def _dominates(self, at: int, dispatch: int) -> bool:
        """Whether every path from the function's entry to insns[dispatch] runs
        insns[at] first: the function's own direct branches and fall-throughs, where
        any indirect jump reached first could lead anywhere."""
        position = self.position()
        seen, todo = set(), [0]
        while todo:
            k = todo.pop()
            if k in seen or k == at:
                continue
            if k == dispatch or self.is_indirect(self.insns[k]):
                return False
            seen.add(k)
            insn = self.insns[k]
            if self.falls_through(insn) and k + 1 < len(self.insns):
                todo.append(k + 1)
            target = self.branch_target(insn)
            if target in position and not self.is_call(insn):
                todo.append(position[target])
        return True

    def pair_definition(self, first, second) -> Optional[Tuple[str, int]]:
        """(family, address) when two instructions set a register to a constant address
        together (adrp, then add of the low bits)."""
        return None


def recover_all(sem: Semantics, indexes: List[int]) -> List[JumpTable]:
    """The jump tables of the indirect jumps sem.insns[k] for k in `indexes` (those
    recovered), the function's facts worked out once for all of them."""
    return [t for t in (recover(sem, k) for k in indexes) if t is not None]


def recover(sem: Semantics, index: int) -> Optional[JumpTable]:
    """The jump table of the indirect jump sem.insns[index], or None."""
    insns = sem.insns
    targets = sem.targets()
    sem._invariants = {}  # (they depend on where the dispatch is)
    # the dispatch: straight-line code back from the jump
    start = index
    while start > 0 and insns[start].address not in targets:
        if sem.is_control(insns[start - 1]) or index - start >= MAX_DISPATCH:
            break
        start -= 1
    if start == 0 or index - start >= MAX_DISPATCH:
        return None
    first, before = insns[start], insns[start - 1]
    if any(i.address in targets for i in insns[start + 1:index + 1]):
        return None
    position = sem.position()
    sem.dispatch = start
    paths = [(start - 1, False)] if sem.falls_through(before) else []
    hops = []  # unconditional jumps to the dispatch, right after a check's branch
    for source in targets.get(first.address, []):
        k = position[source]
        if sem.bound_branch(insns[k]) is None and not sem.falls_through(insns[k]) and \
                insns[k].address not in targets and k > 0:
            paths.append((k - 1, False))
            hops.append(source)
        else:
            paths.append((k, True))
    if not paths:
        return None
    found, tables, guarded_between = set(), [], set()
    for at, taken_in_range in paths:
        table = _through(sem, at, taken_in_range, start, index, targets)
        if table is None:
            return None
        entry, count, between = table
        guarded_between.update(between)
        try:
            data = sem.read(entry.table, entry.size * count)
        except Exception:  # not in the file, or not constant data
            return None
        if data is None or len(data) != entry.size * count:
            return None
        found.update(entry.value(int.from_bytes(data[k:k + entry.size], "little"))
                     for k in range(0, len(data), entry.size))
        tables.append((count, entry.table))
    guarded = {insns[at].address for at, _ in paths} | set(hops) | guarded_between
    guarded.update(i.address for i in insns[start + 1:index + 1])
    count, table = max(tables)
    return JumpTable(insns[index].address, table, count, frozenset(found), frozenset(guarded),
                     first.address, frozenset(targets.get(first.address, [])))


def _through(sem: Semantics, at: int, taken_in_range: bool, start: int, index: int,
             targets: Dict[int, List[int]]) -> Optional[Tuple[Entry, int, list]]:
    """(table entry, count, addresses between the compare and its branch) along one
    path into the dispatch: the check before the branch insns[at], then the dispatch
    insns[start:index], then the jump."""
    insns = sem.insns
    branch = insns[at]
    bound = sem.bound_branch(branch)
    if at == 0 or bound is None or bound[0] != taken_in_range or branch.address in targets:
        return None
    # the compare, maybe with moves that leave the flags alone between it and the branch
    cmp_at = at - 1
    while cmp_at > 0 and at - cmp_at <= MAX_BETWEEN and sem.keeps_flags(insns[cmp_at]):
        cmp_at -= 1
    if any(i.address in targets for i in insns[cmp_at + 1:at]):
        return None
    cmp = sem.detail(insns[cmp_at])
    check = sem.check(cmp) if cmp is not None else None
    if check is None or not 0 <= check.limit - bound[1] < MAX_ENTRIES:
        return None
    count = check.limit - bound[1] + 1
    state = sem.initial_state(check)
    if state is None:
        return None
    state["count"] = count
    state["killed"] = set()
    for insn in insns[cmp_at + 1:at] + insns[start:index]:
        detailed = sem.detail(insn)
        if detailed is None or not sem.step(state, detailed):
            return None
    jump = sem.detail(insns[index])
    entry = sem.jump_value(state, jump) if jump is not None else None
    between = [i.address for i in insns[cmp_at + 1:at]]
    return (entry, count, between) if entry is not None else None


def add(a, b):
    """The sum of two symbolic values, where the model can say it: two affine values,
    or a table entry plus a constant (a table of offsets from a base). Else None."""
    if isinstance(a, Affine) and isinstance(b, Affine):
        return a.plus(b)
    for x, y in ((a, b), (b, a)):
        if isinstance(x, Entry) and isinstance(y, Affine) and y.scale == 0:
            return x.then(("add", y.offset))
    return None


def read_index(value, bits: int, count: int):
    """What reading the low `bits` bits of a register holding `value` gives, zero-extended:
    INDEX when those bits hold all of it (every index below 2**bits), else None."""
    if count > 1 << bits:
        return None
    if value == INDEX or (isinstance(value, LowIndex) and bits <= value.bits):
        return INDEX
    return None
