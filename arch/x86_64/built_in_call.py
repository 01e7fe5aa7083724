"""x86_64: a trampoline that calls a built-in program's function itself.

A program or C callback built into the rewrite (program_file.BuiltProgram) gives each
of its probes a direct entry (direct_entry.py), which a trampoline reaches through the
direct table: a load, an indirect call, then the entry's own call of the function.
Where the entry's work is simple, the probe's trampoline does it instead, with one
direct call, in line on the counting path after the count (trampoline.armed_path: a
process of this file runs its built-in program whenever it is armed). An empty C
callback: +2.2 ns over counting through the table and the entry, +0.9 this way
(docs/benchmarks.md §10, "Callbacks built in", and "One call less"):

    rsi = the binding (direct_entry.DIRECT)
    rcx = the bound maps ; none: by_table
    their run word is not the program's (a tracer's program is bound): by_table
    rdx = the region ; 1 (disarmed since): done
    push rdi, rbp [, r8 .. r11 where the function may write them] [, rax: the flags]
    rbp = rsp ; [a leading predicate false: on to the pops]
    the context below it (aligned for C code): the maps, the arguments (registers and
    constants), pid, the printf routine, the clock, the thread's id and name where read
    rdi = the context ; call the function ; rsp = rbp ; the pops
    done: the site's registers back (trampoline.back_to_site)
    by_table: the trace path, which goes the direct table's way

An entry with a floating-point predicate or an argument in memory stays with the direct
table (`takes` is False): the entry reads those. An argument in part of a register
(a USDT operand such as `-4@%r14d`) is extended here as the entry extends it. A
leading predicate on an argument and a constant is checked once the frame is made
(false: the pops, and back); the clock, the thread's id and name are read by the
entries' own code (direct_entry.clock_and_thread).
"""

from __future__ import annotations

import functools
from typing import List

from urewrite.arch.x86_64 import direct_entry
from urewrite.arch.x86_64.arguments import SLOT
from urewrite.arch.x86_64.direct_entry import BINDING_EVENT, BINDING_MAPS, DIRECT
from urewrite.arch.x86_64.program_code import _extend, condition, negated
from urewrite.arch.x86_64.writer import (EAX, GPR64, R8, R9, R10, R11, RAX, RBP, RCX, RDI, RDX,
                                         RSI, RSP, Mem, Rip, Writer)
from urewrite.trampolines import program_file as P
from urewrite.trampolines import region
from urewrite.trampolines.arguments import CONSTANT, REGISTER, encode

_NAMES = {slot: name for name, slot in SLOT.items()}
_BY_NAME = {r.name: r for r in GPR64}
_TRAMPOLINE_SAVED = {"rsi": 0, "rdx": 8, "rax": 16, "rcx": 24}  # above the pushes here
_CLOCK_AND_THREAD = P.USES_NSECS | P.USES_TID | P.USES_COMM
_READ_HERE = P.USES_PID | P.USES_EVENT | P.USES_MAPS | P.USES_PROBE | P.USES_AREA | \
    _CLOCK_AND_THREAD


def takes(entry, arguments: bytes) -> bool:
    """Whether a trampoline does what `entry` does (at a point whose argument
    descriptors are `arguments`, encoded)."""
    if entry.predicate is not None and len(entry.predicate) != 4 or entry.uses & ~_READ_HERE:
        return False  # (a floating-point register's predicate: the entry's)
    reads = min(entry.reads, P.ARGUMENTS)
    if not reads:
        return True
    return encode(entry.expected) == arguments and \
        all(_simple(spec) for spec in entry.expected[:reads])


def _simple(spec) -> bool:
    return spec.kind == CONSTANT or spec.kind == REGISTER and spec.base in _NAMES and \
        spec.size in (1, 2, 4, 8) and (not spec.shift or spec.size == 1)


@functools.lru_cache(maxsize=None)
def _extension(size: int, signed: bool) -> bytes:
    """rax's low `size` bytes sign- or zero-extended (a USDT operand such as `-4@%r14d`
    or `1@%ah`): the entries' own instructions (program_code._extend), assembled once."""
    return _assembled(_extend(size, signed), "a built-in call's argument extension")


def emit(w: Writer, L, entry, run: int, flags_live: bool, red: int) -> None:
    """The block above into `w` (rsi = the binding), on to L.by_table where the table's
    way is to be taken; it calls L.built_in (the probe's function: each point's own)."""
    w.mov(RCX, Mem(RSI, disp=BINDING_MAPS))
    w.test(RCX, RCX)
    w.jcc("e", L.by_table)
    w.mov(RDX, Mem(RCX, disp=8))
    w.cmp(RDX, Rip(run))
    w.jcc("ne", L.by_table)
    w.mov(RDX, Mem(RSI, disp=-DIRECT))
    w.cmp(RDX, 1)
    w.jcc("be", L.built_in_done)
    saved = _saved(entry, flags_live)
    for register in saved:
        w.push(register)
    w.mov(RBP, RSP)
    above = 8 * len(saved)  # the trampoline's saves, from rbp
    if entry.predicate is not None:  # arg N OP constant, or nothing to do
        _predicate(w, L, entry, saved, above, red)
    w.sub(RSP, P.CTX_SIZE, imm32=True)
    if entry.aligned:  # (C code: the SysV ABI's 16 bytes at the call)
        w.and_(RSP, -16)
    if entry.uses & P.USES_MAPS:
        w.mov(Mem(RSP, disp=P.CTX_MAPS, disp32=True), RCX)
    for j in range(min(entry.reads, P.ARGUMENTS)):
        if j < len(entry.expected):
            _value(w, entry.expected[j], saved, above, red)
        else:  # the probe has no such argument: it reads 0
            w.mov(EAX, 0)
        w.mov(Mem(RSP, disp=P.CTX_ARGS + 8 * j, disp32=True), RAX)
    if entry.uses & P.USES_PID:
        w.mov(EAX, Mem(RDX, disp=region.OFF_PID, disp32=True))
        w.mov(Mem(RSP, disp=P.CTX_PID, disp32=True), RAX)
    if entry.uses & P.USES_EVENT:
        w.mov(RAX, Mem(RSI, disp=BINDING_EVENT))
        w.mov(Mem(RSP, disp=P.CTX_EVENT, disp32=True), RAX)
    if entry.uses & _CLOCK_AND_THREAD:  # (rdx: the region, rsi: the binding, as an entry's)
        w.raw(_clock_and_thread(entry.uses & _CLOCK_AND_THREAD))
    w.mov(RDI, RSP)
    w.call(L.built_in)
    w.label(L.built_in_false)
    w.mov(RSP, RBP)
    for register in reversed(saved):
        w.pop(register)


@functools.lru_cache(maxsize=None)
def _clock_and_thread(uses: int) -> bytes:
    """The direct entries' code for nsecs, tid and comm (direct_entry.clock_and_thread:
    position-independent), assembled once."""
    return _assembled(direct_entry.clock_and_thread("b", uses),
                      "a built-in call's clock and thread")


def _assembled(lines: List[str], what: str) -> bytes:
    """Position-independent lines of the entries' code as bytes (none: none)."""
    from urewrite.arch.runtime_asm import assemble_with_starts
    text = "".join(line + "\n" for line in lines)
    return assemble_with_starts(text, [], 0, "KS_ARCH_X86", "KS_MODE_64", what)[0] \
        if text else b""


def _saved(entry, flags_live: bool) -> List:
    """What the block saves: rdi (the context) and rbp (its frame), which it changes
    itself; r8 to r11 where the function may write them (the SysV ABI lets it; its
    callers' other registers it keeps); rax where it holds the flags (lahf's: the
    site's rax is in its slot then, as rcx, rdx and rsi are)."""
    writes = entry.writes
    return [RDI, RBP] + [r for r in (R8, R9, R10, R11) if writes is None or r.name in writes] + \
        ([RAX] if flags_live else [])


def _predicate(w: Writer, L, entry, saved: list, above: int, red: int) -> None:
    """On to L.built_in_false (nothing run) unless arg N compares so with the
    constant (a program's leading predicate: DirectEntry.predicate)."""
    n, constant, op, signed = entry.predicate
    if n < len(entry.expected):
        _value(w, entry.expected[n], saved, above, red)
    else:  # the probe has no such argument: it reads 0
        w.mov(EAX, 0)
    if -(1 << 31) <= constant < 1 << 31:
        w.cmp(RAX, constant, imm32=True)
    else:  # (in rdi, then the site's rdi back from its slot: an argument may be read there)
        w.movabs(RDI, constant)
        w.cmp(RAX, RDI)
        w.mov(RDI, Mem(RBP, disp=8 * (len(saved) - 1 - saved.index(RDI)), disp32=True))
    w.jcc(negated(condition(op, signed)), L.built_in_false)


def _value(w: Writer, spec, saved: list, above: int, red: int) -> None:
    """rax = the argument `spec` describes (a register of the site's, or a constant)."""
    if spec.kind == CONSTANT:
        w.movabs(RAX, spec.value)
        return
    name = _NAMES[spec.base]
    if name in _TRAMPOLINE_SAVED:
        w.mov(RAX, Mem(RBP, disp=above + _TRAMPOLINE_SAVED[name], disp32=True))
    elif name == "rbp":  # (pushed here: its slot)
        w.mov(RAX, Mem(RBP, disp=8 * (len(saved) - 1 - saved.index(RBP)), disp32=True))
    elif name == "rsp":  # the site's: above the saves and the red zone skipped
        w.lea(RAX, Mem(RBP, disp=above + 8 * len(_TRAMPOLINE_SAVED) + red, disp32=True))
    else:  # (rdi and the others: as at the site until the call)
        w.mov(RAX, _BY_NAME[name])
    if spec.shift:  # (%ah and the like: bits 8 to 15)
        w.shr(RAX, spec.shift)
    w.raw(_extension(spec.size, bool(spec.signed)))
