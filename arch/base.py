"""The interface every architecture backend implements.

A backend answers questions about machine code ("where do instructions start?",
"can these bytes be moved?") and produces machine code (the patch jump, the
trampoline for one site, the runtime). Everything else in urewrite is shared.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from urewrite.trampolines.arguments import C_CONVENTION

if TYPE_CHECKING:
    from urewrite.arch.jump_tables import JumpTable


class Insn:
    """One decoded instruction. `detail` is the backend's own decoded form.

    A plain class with slots, not a dataclass: a big file has millions of them, and
    this one is created several times faster and takes about half the memory. Treat
    it as immutable."""

    __slots__ = ("address", "size", "mnemonic", "op_str", "raw", "detail")

    def __init__(self, address: int, size: int, mnemonic: str, op_str: str, raw: bytes,
                 detail: object = None):
        self.address = address
        self.size = size
        self.mnemonic = mnemonic
        self.op_str = op_str
        self.raw = raw
        self.detail = detail

    @property
    def end(self) -> int:
        return self.address + self.size

    def __reduce__(self):
        # (pickled as a call with its fields: `list` sends 100,000s of windows between
        # processes, and the default for slots is several times slower)
        return Insn, (self.address, self.size, self.mnemonic, self.op_str, self.raw,
                      self.detail)

    def _key(self) -> tuple:
        return self.address, self.size, self.mnemonic, self.op_str, self.raw

    def __eq__(self, other) -> bool:
        return isinstance(other, Insn) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Insn(address={self.address:#x}, size={self.size}, mnemonic={self.mnemonic!r}, "
                f"op_str={self.op_str!r})")

    def __str__(self) -> str:
        return f"{self.mnemonic} {self.op_str}".strip()


# What a sweep's instruction does to the flow of control (Sweep.kinds): all that the
# planner asks of most instructions. OTHER ones (indirect and far jumps, x86's loop and
# jrcxz, returns of other kinds) are decoded again and asked of the backend in full.
PLAIN, CALL, JUMP, BRANCH, RETURN, OTHER = range(6)


class Sweep:
    """A function's linear sweep in compact form: arrays, not an object per instruction
    (a big file has millions; objects cost seconds and gigabytes). It stops where the
    instructions stop decoding, as decode() does.

    `edges` holds the instruction starts, then the end of the last one. Only the
    instructions that branch or return have rows in `rows` (their indexes, ascending),
    `kinds` (CALL: a direct call or another instruction that goes on after it but may
    also go to its target; JUMP: a direct jump; BRANCH: a direct conditional branch
    that may leave as a tail call; RETURN; OTHER) and `targets` (the direct target, or
    -1). `marked` holds the indexes (ascending) of the instructions whose decoded form
    the planner may have to read: those that branch or call in any way (what
    Backend.needs_detail asks of), and landing pads (endbr64, bti). Any other
    instruction is plain code: its address and size say all the planner needs."""

    __slots__ = ("edges", "rows", "kinds", "targets", "marked")

    def __init__(self, edges, rows, kinds, targets, marked):
        self.edges, self.rows, self.kinds, self.targets = edges, rows, kinds, targets
        self.marked = marked

    @classmethod
    def of(cls, insns: list, flow_kind, marks) -> "Sweep":
        """The sweep of decoded instructions; `flow_kind(insn)` gives (kind, target),
        `marks(insn)` whether its decoded form may be read (see `marked`)."""
        edges = [i.address for i in insns] + ([insns[-1].end] if insns else [])
        rows, kinds, targets, marked = [], [], [], []
        for k, insn in enumerate(insns):
            kind, target = flow_kind(insn)
            if kind != PLAIN:
                rows.append(k)
                kinds.append(kind)
                targets.append(-1 if target is None else target)
            if kind != PLAIN or marks(insn):
                marked.append(k)
        return cls(np.array(edges, dtype=np.int64), np.array(rows, dtype=np.int64),
                   np.array(kinds, dtype=np.uint8), np.array(targets, dtype=np.int64),
                   np.array(marked, dtype=np.int64))

    @staticmethod
    def pack(sweeps: list) -> tuple:
        """Many sweeps as a few long arrays, quick to send to another process (pickling
        100,000 sweeps array by array took seconds); unpack() gives them back."""
        fields = [[getattr(sweep, name) for sweep in sweeps] for name in Sweep.__slots__]
        return tuple((np.concatenate(arrays) if arrays else np.zeros(0, np.int64),
                      np.array([len(a) for a in arrays], dtype=np.int64)) for arrays in fields)

    @staticmethod
    def unpack(packed: tuple) -> list:
        fields = []
        for values, lengths in packed:
            # (slices: np.split took 4 times as long, in the parent alone)
            ends = np.cumsum(lengths).tolist()
            fields.append([values[a:b] for a, b in zip([0] + ends[:-1], ends)])
        return [Sweep(*arrays) for arrays in zip(*fields)]

    def __len__(self) -> int:
        return max(len(self.edges) - 1, 0)

    @property
    def starts(self):
        return self.edges[:-1]

    @property
    def end(self) -> int:
        """Where the sweep stops (its function's end when it decodes whole)."""
        return int(self.edges[-1]) if len(self.edges) else 0

    def index_at(self, address: int) -> Optional[int]:
        """The instruction that starts at `address`, or None."""
        k = int(self.edges.searchsorted(address))
        return k if k < len(self) and self.edges[k] == address else None

    def index_holding(self, address: int) -> Optional[int]:
        """The instruction whose bytes hold `address`, or None."""
        k = int(self.edges.searchsorted(address, side="right")) - 1
        return k if 0 <= k < len(self) else None

    def branches(self) -> dict:
        """Direct target -> the addresses of the instructions that branch (or call) there,
        in order."""
        direct = self.targets >= 0
        found: dict = {}
        for target, source in zip(self.targets[direct].tolist(),
                                  self.edges[self.rows[direct]].tolist()):
            found.setdefault(target, []).append(source)
        return found


class NotAsSwept(Exception):
    """The decoder does not find an instruction where the sweep does."""


class SweptCode(Sequence):
    """A function's instructions where its sweep finds them, decoded (`decode`, the quick
    form) only where they are read, CHUNK at a time. A jump table's walk reads the few
    instructions before its jump, where a big file's functions with an indirect jump hold
    millions. Reading one that the decoder does not
    find where the sweep does raises NotAsSwept."""

    CHUNK = 32

    def __init__(self, sweep: Sweep, decode, read):
        self.sweep = sweep
        self.addresses = sweep.starts.tolist()
        self._insns: list = [None] * len(self.addresses)
        self._decode = decode  # (code, address) -> insns
        self.read = read  # (address, size) -> the file's bytes

    def __len__(self) -> int:
        return len(self._insns)

    def __getitem__(self, k):
        if isinstance(k, slice):
            lo, hi, step = k.indices(len(self))
            if step == 1 and lo < hi:
                self._load(lo, hi)
            elif lo != hi:
                self._load(0, len(self))
            return self._insns[k]
        insn = self._insns[k]
        if insn is None:
            k %= len(self)
            lo = k - k % self.CHUNK
            self._load(lo, min(lo + self.CHUNK, len(self)))
            insn = self._insns[k]
        return insn

    def __iter__(self):
        self._load(0, len(self))
        return iter(self._insns)

    def _load(self, lo: int, hi: int) -> None:
        """Decode instructions lo to hi (exclusive), those not yet decoded."""
        missing = [k for k in range(lo, hi) if self._insns[k] is None]
        if not missing:
            return
        a, b = missing[0], missing[-1] + 1
        start = self.addresses[a]
        end = self.addresses[b] if b < len(self) else self.sweep.end
        decoded = self._decode(self.read(start, end - start), start)
        if [i.address for i in decoded] != self.addresses[a:b] or decoded[-1].end != end:
            raise NotAsSwept(f"its instructions at {start:#x} decode differently")
        self._insns[a:b] = decoded


@dataclass
class SweepBatch:
    """Many functions' sweeps made at once (Backend.sweep_all): `sweeps`, one per
    function asked, views of a few long arrays, and where each lies in them, for code
    that reads those arrays in place (rewriter/sweep_search.py): `edges`, `rows`,
    `kinds`, `targets` and `marked`, the bytes of those arrays (int64, native order;
    kinds uint8); `spans`, per function (n, 6): its first edge and number of edges (-1:
    swept another way, in no array), its first row and number of rows, its first marked
    and their number."""

    sweeps: list
    edges: bytes
    rows: bytes
    kinds: bytes
    targets: bytes
    marked: bytes
    spans: np.ndarray


def value_class(cls):
    """A dataclass for the values a big file's plans make by the 100,000s (sites,
    windows, plans): with slots, and an __init__ of plain assignments. A frozen
    dataclass sets each field through object.__setattr__: several times slower to make,
    and a __dict__ each (more than twice the memory).
    Hashable and equal by their fields as frozen ones are, and treated as immutable
    as they are, without the check. Pickled as a call with its fields (the default
    for slots is several times slower: `list` sends windows between processes)."""
    made = dataclass(cls, slots=True, unsafe_hash=True) if sys.version_info >= (3, 10) \
        else dataclass(cls, unsafe_hash=True)
    names = tuple(f.name for f in fields(made))
    made.__reduce__ = lambda self: (made, tuple(getattr(self, n) for n in names))
    return made


@value_class
class Window:
    """The bytes a patch overwrites at one site, and the instructions they held.

    `insns` are the displaced instructions, re-executed from the trampoline.
    `size` may exceed their total size when the window borrows alignment
    padding after a short function.
    """

    address: int
    size: int
    insns: tuple

    @property
    def end(self) -> int:
        return self.address + self.size


# Bytes below sp a trampoline in Go code may use, with the runtime routines it
# calls (docs/design.md, "Go's stacks"). Go keeps no red zone, and guarantees only
# what its linker checks: every chain of nosplit functions, entered from a function
# that checked its stack, uses at most 800 bytes less a call (amd64: 792) or less the
# frame pointer saved below sp (arm64: 792). What the deepest chain of a program
# leaves below it is all a trampoline there may use: in Go 1.26's runtime, 584
# bytes on amd64 and 608 on arm64 (callRet -> reflectcallmove -> typedmemmove ...,
# from `go build -ldflags=-debugnosplit`), so 208 and 184 bytes.
GO_STACK_BUDGET = {"x86_64": 208, "aarch64": 184}


@dataclass(frozen=True)
class CountPoint:
    """Where, inside a window's displaced instructions, probes fire.

    A window may start before its site (when a branch target follows a USDT
    site), and may hold several points (an entry probe and a return probe of a
    short function): each fires before the displaced instruction at `address`.
    """

    address: int
    probes: tuple  # indexes of the probes counted here
    flags_live: bool  # whether the condition flags may carry a value here
    arguments: tuple = ()  # per probe: encoded argument descriptors for its events
    enters: bool = False  # a function measured for latency is entered here
    leaves: tuple = ()  # histograms of the measured functions that return here
    # a function entry whose return address is redirected: the CountPoint its
    # return stub counts (the return probe), else None
    redirect: Optional["CountPoint"] = None
    # the probes count only when the conditional branch at `address` is taken: a
    # conditional tail call out of the function, one of its exits
    taken: bool = False
    # an indirect jump at `address` that may stay in its function: the probes count
    # only when its target lies in none of these [start, end) ranges (docs/design.md,
    # "Return probes")
    stays_within: tuple = ()
    # in a Go function (listed in .gopclntab, not cgo's C): there is no red zone to
    # skip, and a goroutine's stack may hold little below sp (GO_STACK_BUDGET)
    go_code: bool = False
    # in Go code where the g register holds the goroutine at entry and at returns
    # (ABIInternal: r14, x28): latency pairs are kept per goroutine, not per thread
    g_register: bool = False
    # in Go code that only Go code runs (compiled Go, or assembly outside the runtime):
    # where a backend keeps g in one register in all Go code (arm64's x28), it holds
    # the goroutine here, whose stack bounds the trace path may read
    called_from_go: bool = False
    # the point's probe runs a program built into the rewrite: what its direct entry
    # was made of, which the trampoline may do itself, or None
    built_in: Optional["BuiltInCall"] = None


@dataclass(frozen=True)
class BuiltInCall:
    """A probe's direct entry in a program built into the rewrite
    (program_file.BuiltProgram): a backend whose trampoline can do what the entry does
    calls the function itself, with no table and one call less, while the process
    runs that program (its maps' run word is the program's)."""

    entry: object  # program_file.DirectEntry, its `function` 0 (the same for all probes
    # of one shape)
    function: int  # the address of the probe's function
    run: int  # the address of the program's run word (program_file.RUN_AT)
    entry_at: int = 0  # the address of the probe's direct entry (a backend may call it)


@dataclass(frozen=True)
class RuntimeRefs:
    """Addresses a trampoline needs from the runtime and the region layout."""

    state: int  # process state word: 0 = not set up, 1 = disarmed, else region address
    owners_offset: int  # offset of the per-thread owner table inside the region
    slow_hit: int  # runtime routine: the row of a thread whose hashed slot is not its own
    lazy_init: int  # runtime routine: one-time set-up (after fork, or before start-up ran)
    trace_event: int  # runtime routine: write one event into the ring
    lat_enter: int  # runtime routine: a latency-measured call begins
    lat_exit: int  # runtime routine: it returns: add its duration to a histogram
    shadow_push: int = 0  # runtime routine: redirect a return address (0: not available)
    shadow_pop: int = 0  # runtime routine: a redirected return: the original address back
    lazy_init_aside: int = 0  # runtime routine: lazy_init on a stack of its own (Go code)
    # runtime routine: trace_event where a goroutine's stack has room for it (Go code,
    # for backends whose trace path needs more than GO_STACK_BUDGET; 0: not needed)
    trace_event_go: int = 0


@dataclass(frozen=True)
class RuntimeSpec:
    """What the runtime is built around: where its data lives and what it starts."""

    base: int  # address the runtime code is assembled at
    state: int  # the process-state page (cleared in a forked child)
    state_size: int
    template: int  # region image to copy into the shared-memory region
    template_size: int
    region_size: int
    slot_count: int
    file_tag: bytes  # names the region file of this object
    exe_entry: Optional[int]  # original entry point to continue at, for executables
    dso_init: Optional[int]  # original DT_INIT to continue at, for shared objects
    go_program: bool = False  # a Go program: its threads may share one thread pointer
    lowest: int = 0  # the object's lowest link-time address: probe programs go below it


@dataclass(frozen=True)
class Runtime:
    code: bytes
    exe_start: int  # address of the start-up hook for executables (new e_entry)
    dso_start: int  # address of the DT_INIT hook for shared objects
    slow_hit: int
    lazy_init: int
    trace_event: int
    lat_enter: int
    lat_exit: int
    lazy_init_aside: int = 0
    shadow_push: int = 0  # return-address redirection, for backends that have it
    shadow_pop: int = 0
    trace_event_go: int = 0  # (RuntimeRefs.trace_event_go)
    routines: tuple = ()  # (name, address) of each routine, by address: the output's symbols


class Backend(ABC):
    """One instruction set. Subclasses live in arch/<name>/."""

    name: str
    elf_machine: int  # e_machine value
    patch_size: int  # bytes the site jump needs
    insn_alignment: int  # every instruction starts at a multiple of this
    branch_reach: int  # how far the site jump reaches, in bytes, either way
    state_size: int  # bytes of process-state memory the runtime needs
    # offsets in that memory of the fields a live tracer writes (trampolines/live_note.py
    # names them); empty: the backend's objects cannot be armed while they run
    live_state: dict = {}

    # -- reading -----------------------------------------------------------
    @abstractmethod
    def decode(self, code: bytes, address: int, detail: bool = False) -> list:
        """Linear sweep: the instructions of `code`, stopping at the first undecodable byte."""

    def boundaries(self, code: bytes, address: int) -> list:
        """Where decode()'s instructions of `code` start, then where the last one ends.
        (A backend may have a quicker way than making the instructions.)"""
        insns = self.decode(code, address)
        return [i.address for i in insns] + [insns[-1].end if insns else address]

    def sweep(self, code: bytes, address: int) -> Sweep:
        """decode()'s linear sweep in compact form. (This default decodes; a backend
        may have a faster way to the same rows.)"""
        return Sweep.of(self.decode(code, address), self.flow_kind,
                        lambda insn: self.needs_detail(insn) or self.landing_pad_size(insn))

    def sweep_all(self, data: bytes, spans) -> Optional["SweepBatch"]:
        """The sweeps of many functions at once, each (offset in `data`, size, address),
        as sweep() makes them, where the backend has a much faster way than one by one
        (x86_64's native sweep); else None, and the caller sweeps them as it goes."""
        return None

    # The planner's searches over a SweepBatch's arrays, compiled (rewriter/sweep_search.py),
    # where the backend's native module has them; None: the planner searches in Python.
    sweep_search_engine: Optional[type] = None
    # The first stubs of punned jumps that fit, searched compiled (rewriter/stub_space.py),
    # where the backend's native module has it; None: numpy answers.
    stub_places_engine: Optional[type] = None

    @abstractmethod
    def flow_kind(self, insn: Insn) -> tuple:
        """(kind, direct target or None) of an instruction for a Sweep: PLAIN, CALL,
        JUMP, BRANCH, RETURN or OTHER. The kind must agree with exit_kind(): a RETURN
        always leaves, a JUMP leaves when its target is outside the function, a BRANCH
        leaves then only when taken; PLAIN and CALL never leave; OTHER: ask exit_kind."""

    @abstractmethod
    def landing_pad_size(self, first: Insn) -> int:
        """Bytes at a function entry that must stay in place (endbr64, bti): 0 if none."""

    @abstractmethod
    def direct_branch_target(self, insn: Insn) -> Optional[int]:
        """The target of a direct branch or call, else None."""

    @abstractmethod
    def code_reference_table(self, code: bytes, base: int) -> tuple:
        """(sources, targets), two numpy int64 arrays: every direct branch and PC-relative
        address computation that code may hold, found by a vectorised scan of all its
        bytes (not only instruction starts), `source` being where the matching bytes
        start. May report pairs no real instruction makes, never misses a far one.
        x86_64's scan sees rel32 forms only; rel8 ones are decoded by the planner."""

    @abstractmethod
    def names_address(self, insn: Insn, target: int) -> bool:
        """Whether an instruction (decoded with detail) branches to `target` or computes
        it PC-relatively: tells a real reference of code_reference_table from a chance
        match of bytes."""

    @abstractmethod
    def holds_constant(self, insn: Insn, offset: int, value: int) -> bool:
        """Whether an instruction (decoded with detail) carries `value` as an absolute
        immediate or displacement whose field starts `offset` bytes into it: tells a
        real address constant in code (`mov edi, imm32` passing a function pointer)
        from 4 bytes that only look like one (parts of two instructions). Where the
        backend cannot tell, True."""

    @abstractmethod
    def exit_kind(self, insn: Insn, inside) -> tuple:
        """(leaves, problem): whether `insn` leaves its function for good (True: a
        return, a tail call; "taken": a conditional tail call, which leaves only when
        its branch is taken, counted then by a CountPoint with `taken`; "outside": an
        indirect jump, which leaves only when its target is outside the function,
        counted then by a CountPoint with `stays_within`), or a reason it may leave
        in a way no probe can follow. `inside(address)` tells whether an address
        belongs to the function."""

    def direct_branch(self, code: bytes, address: int, target: int) -> Optional[Insn]:
        """`code`, one direct branch or call to `target` as the sweep found it, decoded
        (quick form) as decode() would, maybe without decoding; None where the backend
        does not know it (the caller decodes it)."""
        return None

    def computed_addresses(self, code: bytes, address: int) -> list:
        """The addresses that the instructions of `code` (at `address`) put in registers,
        in order, where they may be addresses: computed relative to their own (x86_64:
        `lea reg, [rip + disp]`) or immediates (`mov reg, imm`, from 0x1000); where
        offsets to a function's code may be counted from. (A backend whose windows hold
        one instruction each has no use for them.)"""
        return []

    def is_indirect_jump(self, insn: Insn) -> bool:
        """Whether `insn` jumps to an address held in a register or in memory (not a
        call, not a return): what a switch's jump table ends in."""
        return False

    def jump_tables(self, insns: list, indexes: list, read) -> list:
        """The jump tables (arch/jump_tables.py) that the indirect jumps insns[k], k in
        `indexes`, of a function (`insns`, its instructions in order) go through, for
        those where every step matches exactly: the exact set of each one's targets,
        with the entry count taken from the bounds check that dominates the jump.
        `read(address, size)` gives the file's bytes there, or raises when they are not
        constant data."""
        return []

    redirects_returns = False  # whether its trampolines can redirect a return address
    shadow_stack_name = "a hardware shadow stack"  # what ElfFile.shadow_stack means here

    @abstractmethod
    def is_call_frame(self, frame) -> bool:
        """Whether an unwind frame (rewriter.eh_frame.Frame) at a function's first
        address is the one a call makes: else the code there is a part of another
        function, split off by the compiler and entered by a jump."""

    def return_redirect_problem(self, code: bytes, address: int) -> Optional[str]:
        """Why the return address of the function whose code is `code` may not be
        redirected to a return stub (it reads it, say), or None. Backends without
        redirection keep this refusal."""
        return f"return-address redirection is not implemented for {self.name}"

    @abstractmethod
    def is_padding(self, insn: Insn) -> bool:
        """Alignment filler a window may borrow (nop, int3)."""

    @abstractmethod
    def ends_flow(self, insn: Insn) -> bool:
        """Whether execution never continues to the next instruction (a return, an
        unconditional jump, a trap such as ud2): what follows it runs only if
        something branches there."""

    # -- short hops (docs/design.md, "Patch tactics") ----------------------
    # A backend whose jump does not fit every site may offer a shorter one, a
    # hop, to a `patch_size` landing nearby that holds the jump to the trampoline.
    hop_size: Optional[int] = None  # bytes the hop needs; None: no hops

    def hop_reach(self, address: int) -> tuple:
        """(lowest, highest) address a hop written at `address` can reach."""
        raise NotImplementedError(f"{self.name} has no short hops")

    def hop_patch(self, window: Window, landing: int) -> bytes:
        """The bytes that replace the window: a hop to `landing`, then filler."""
        raise NotImplementedError(f"{self.name} has no short hops")

    def is_call(self, insn: Insn) -> bool:
        """Whether `insn` is a call. Displaced, a call is emulated so that its callee
        returns into the original code, and that return is mispredicted at every hit:
        where a hop's shorter window leaves the call in place, the planner prefers the
        hop (rewriter/plan/tight_sites.py, hop_over_calls)."""
        return False

    # -- punned jumps (docs/design.md, "Patch tactics") ----------------------
    # A window shorter than the jump may still take one whose last bytes are the
    # bytes after the window, left as they are: the jump then goes wherever those
    # bytes say, and a stub placed there goes on to the trampoline.
    puns = False  # whether the backend offers them

    def pun(self, window: Window, following: bytes, stubs) -> Optional[tuple]:
        """(the bytes that replace the window, the stub address, the bytes the jump
        spans from the window's start) of a jump written in the window whose
        displacement ends in `following` (the bytes after the window, kept), for the
        first stub address that may take a stub; None if none. The stub holds a
        `site_patch` jump to the trampoline. `stubs` (rewriter/stub_space.py) finds the
        first of an array of stub addresses that may take the stub of the jump at a
        source (`first`; `first_in_rows` for rows of them, each with a stub taken)."""
        raise NotImplementedError(f"{self.name} has no punned jumps")

    def pun_over_successor(self, window: Window, stubs) -> Optional[tuple]:
        """A punned jump whose kept bytes are those of a jump written over the window that
        follows (the successor, moved to a trampoline of its own, E9Patch's successor
        eviction): both displacements chosen so that both go to free stubs. (the bytes
        that replace the window, its stub, the successor's jump's first bytes, its stub)
        for the first pair of stub addresses `stubs` (as for `pun`) takes; None if none."""
        raise NotImplementedError(f"{self.name} has no punned jumps")

    # -- Go's faults ---------------------------------------------------------
    translates_faults = False  # whether fault_hook() is there

    def moved_instructions(self, address: int, window: Window, points,
                           refs: RuntimeRefs) -> list:
        """(address in the trampoline, original address, size there) of each
        instruction of `window` (decoded in detail) in the trampoline that trampoline()
        makes for it at `address` with `points` and `refs`: for the fault hook's table
        and the unwind rows of the output's .debug_frame."""
        raise NotImplementedError(f"{self.name} cannot say where it moves instructions")

    def fault_hook(self, address: int, window: Window, moved) -> bytes:
        """The trampoline at `address` (entered at its first byte) of Go's signal
        handler's entry `window`: a fault the kernel reports at one of the `moved`
        instructions' trampoline addresses ((trampoline address, original address)
        each) is set to the original address before the handler reads it, then the
        handler's displaced instructions run (rewriter/plan/go_faults.py)."""
        raise NotImplementedError(f"{self.name} has no fault hook")

    # -- can I? ------------------------------------------------------------
    @abstractmethod
    def relocation_problem(self, insn: Insn, is_last: bool, shadow_stack: bool) -> Optional[str]:
        """Why `insn` cannot be executed from a trampoline, or None if it can."""

    def needs_detail(self, insn: Insn) -> bool:
        """Whether relocation_problem() needs `insn` decoded in detail to answer; if not,
        the instruction (decoded without detail) surely runs from a trampoline: what
        `list`, which generates no code, asks of the most windows. (Default: always.)"""
        return True

    def quick_relocation_problem(self, insn: Insn, is_last: bool,
                                 shadow_stack: bool) -> Optional[tuple]:
        """relocation_problem() of an instruction that needs_detail(), where its decode
        without detail is enough to say it: (the problem or None,); else None. (Most
        such windows end in a direct call.) (Default: never enough.)"""
        return None

    def moves_verbatim(self, insn: Insn) -> bool:
        """Whether `insn` (decoded without detail) runs from any address as its own
        bytes: no operand relative to where it lies, no branch to somewhere relative to
        it (a return may be one: the backend's relocator knows it by its name). A window
        of only such instructions is copied as it is, not decoded in detail to be moved
        (most windows). (Default: never.)"""
        return False

    def may_fault(self, insn: Insn, g_in_register: bool) -> bool:
        """Whether `insn` (decoded without detail) may fault where it runs: it reaches
        memory through anything but the stack pointer, its own code's constants or
        (`g_in_register`: Go's ABIInternal) the goroutine's g, or it divides, or it
        traps by design. Asked of Go code's windows only: a fault in a trampoline has
        a PC that Go's traceback and recover() do not know. (Default: any may.)"""
        return True

    @abstractmethod
    def flags_live_at_entry(self) -> bool:
        """Whether the ABI lets a caller pass condition flags into a function."""

    def flags_live_inside(self, read: Callable[[int, int], bytes], point: int) -> bool:
        """Whether the condition flags may be read after `point`, a probe point inside a
        function, the file's code as `read(address, size)` gives it (a UrewriteError
        where it has none): its trampoline keeps them where they may. True where the
        backend cannot tell."""
        return True

    # -- writing -----------------------------------------------------------
    @abstractmethod
    def site_patch(self, window: Window, trampoline: int) -> bytes:
        """The bytes that replace the window: a jump to the trampoline, then filler."""

    @abstractmethod
    def trampoline(self, address: int, window: Window, points: Sequence[CountPoint],
                   refs: RuntimeRefs) -> bytes:
        """The code a window jumps to: its displaced instructions, with each point's
        probes counted (and, when tracing, an event recorded) before the
        instruction at the point; then back."""

    def trampoline_apart(self, address: int, window: Window, points: Sequence[CountPoint],
                         refs: RuntimeRefs) -> Optional[tuple]:
        """trampoline()'s code in two parts, or None where this backend keeps it whole:
        (hot size, place), the hot part at `address` being what a counting hit runs,
        and place(cold address) -> (hot bytes, cold bytes) once the cold part's place is
        known (a multiple of 8)."""
        return None

    @abstractmethod
    def sdt_arguments(self, text: str, symbol) -> list:
        """ArgSpecs for an sdt.h argument string; `symbol(name)` gives link-time
        addresses. Raises ValueError for an operand it cannot evaluate."""

    @abstractmethod
    def abi_arguments(self, count: int, convention=C_CONVENTION) -> list:
        """ArgSpecs for the first `count` integer argument words at a function entry,
        in its calling convention (trampolines/arguments.py: the C ABI, Go's
        ABIInternal or ABI0); ValueError when the convention is not known."""

    @abstractmethod
    def return_value(self, convention=C_CONVENTION, returned: bool = False) -> list:
        """ArgSpecs of the return value, for return events: read at an exit, or once
        the return has left the function (`returned`: a redirected return address)."""

    @abstractmethod
    def runtime(self, spec: RuntimeSpec) -> Runtime:
        """The one-time set-up code and the slow paths, assembled at `spec.base`."""

    @abstractmethod
    def program_code(self, lowered, offsets) -> tuple:
        """(code, {probe text: its function's offset in the code}): a lowered probe
        program (programs/lower.py) as this machine's functions `void code(context *)`
        (trampolines/program_file.py), the maps' tables at `offsets` in their area."""

    # -- C callbacks (programs/callback.py) ----------------------------------
    gnu_triplet: str  # the GNU name of the machine: its cross compiler is TRIPLET-gcc
    # the compiler's flags that make C code a probe may run: no floating-point or
    # vector register (the probe saves the general ones only), atomics inline
    callback_flags: tuple = ()

    @abstractmethod
    def callback_stubs(self, address: int, stubs: Sequence[tuple], function: int) -> tuple:
        """(code at `address`, each stub's address): for each (probe number, kind, name
        address, area offset, arguments filled, arguments read, USES_*), code that fills
        in the context's probe and kind, name (its address) where USES_PROBE, area (the
        maps' address plus the offset) where USES_AREA, zeroes the arguments it reads
        from the first not filled on (the runtime fills in those before; those it does
        not read are left as they are),
        then jumps to `function`, the context in the first argument register
        (trampolines/urewrite.h, struct urewrite_context). Addresses are the callback
        file's, mapped as one."""

    def context_read(self, code: bytes, start: int):
        """The offsets of the 8-byte words of a C callback's context (its first argument)
        that the code at `start` (in `code`, the callback's file mapped as one) may
        read, as a frozenset; None where that is not known (then every word is filled
        in). The context's filler leaves the others out."""
        return None

    # whether this machine's trampolines call a program's direct entries (else every
    # hit of a program takes the trace path)
    direct_calls = False

    def direct_entries(self, base: int, run_at: int, entries: Sequence):
        """(code at `base` in a program's code, each entry's offset in it): the direct
        entries (program_file.DirectEntry) of a program file, the header's run at
        `run_at` from the code's start (where `direct_calls`); an entry None is one
        that sends every hit to the trace path. Entries `direct_supported` refuses are
        not asked for. A probe with no entry in the table runs nothing."""
        raise NotImplementedError

    def program_with_entries(self, lowered, offsets, run_at: int, entries: Sequence):
        """(code, each entry's offset in it), or None where this machine does not: a
        program's code as program_code() makes it (its functions where they are there),
        then its direct entries, each (DirectEntry or None, the key of `lowered.code`
        whose function it runs) with that function's code in line, not called."""
        return None

    def direct_supported(self, entry) -> bool:
        """Whether a direct entry can read the arguments as `entry.expected` says."""
        return False

    def registers_written(self, code: bytes, start: int,
                          memo: Optional[dict] = None) -> Optional[frozenset]:
        """The general registers (by name) that code run from offset `start` of `code`
        (a program's or callback's, at address 0) may write, following its jumps and
        calls; None where that cannot be told (an indirect jump or call, an
        instruction that cannot be read): any its calling convention lets it. A direct
        entry saves no others. `memo`: the backend's own, kept across the calls for one
        `code` (what a target shared by many starts gives is read once)."""
        return None

    def callback_refusal(self, code: bytes, address: int) -> Optional[str]:
        """Why compiled code at `address` cannot run as a callback (an instruction that
        uses a floating-point or vector register, or that cannot be decoded), or None."""
        insns = self.decode(code, address)
        end = insns[-1].end if insns else address
        if end < address + len(code):
            return f"its code cannot be read at {end:#x}"
        for insn in insns:
            if self.touches_unsaved_register(insn):
                return (f"{insn} (at {insn.address:#x}) uses a floating-point or vector "
                        f"register, which a probe does not save: compile with "
                        f"-mgeneral-regs-only")
        return None

    @abstractmethod
    def touches_unsaved_register(self, insn: Insn) -> bool:
        """Whether the instruction reads or writes a register the trace path does not
        save: a floating-point, vector or mask register (callback_refusal)."""
