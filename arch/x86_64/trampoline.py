"""The code one x86_64 site jumps to.

    displaced instructions before the probe point, relocated (none at a function entry)
    check, at a function entry (flags carry nothing there, SysV ABI):
            cmp qword [state], 1 ; ja armed ; jb setup      disarmed: falls through
    check, inside a function (flags may be live; none of this touches them):
            lea rsp,[rsp-128] ; push rcx      keep out of the red zone (none in Go code)
            rcx = state - 1 ; jrcxz resume    disarmed
            jmp armed                         (an indirect jump that may stay in
                                              the function: jmp exit_check)
    resume: [pop rcx ; lea rsp,[rsp+128]]
            displaced instructions from the probe point on, relocated
            jmp back
    exit_check (out of line): push rcx ; rcx = the site's ; push rdx
            rdx = the jump's target, read as the jump reads it
            push rax ; seto al ; lahf                 the flags, into rax
            per range of the function: jb stays when start <= rdx < end
            add al,0x7f ; sahf ; pop rax, rdx, rcx ; jmp armed     it leaves: count
    stays:  add al,0x7f ; sahf ; pop rax, rdx, rcx ; jmp resume
    armed (out of line):
            [lea rsp,-128 ; push rcx] push rax [seto al ; lahf: flags into rax]
            push rdx, rsi ; rdx = region (0: set up first)
            rcx = thread pointer (fs:[0]) ; rsi = hash(rcx) * entry size
            cmp owner[rsi].thread, rcx ; jne slow   this thread has no row of its own yet
            rsi = owner[rsi].row ; add qword [rsi + 8 * probe], 1   plain add: the row is this thread's
            [when the region times calls (out of line: an untimed hit takes no branch):
             call lat_enter | lat_exit: a function measured for latency enters | returns;
             rcx = the site's rsp, + 1 where r14 holds the goroutine: paired by goroutine,
             in the shared row too]
            [call shadow_push: the return address of a function entered here is
             redirected to its return stub, which follows the out-of-line parts]
    counted: when tracing: jmp trace: [a program with a direct table: call the probe's
             entry (direct_entry.py), rcx = the point's descriptors; done unless it
             says otherwise] saves every register, calls trace_event per probe
    traced: pop rsi, rdx ; [add al,0x7f ; sahf] pop rax ... jmp resume

A function entry whose return probe redirects the return address (docs/design.md)
also gets its return stub, after the out-of-line parts:
    stub:   lea rsp,[rsp-8] ; call shadow_pop     rsp on the slot, the original address in it
            the check and out-of-line parts of the return point, as at a `ret`
            lea rsp,[rsp+8] ; jmp [rsp-8]         the `ret` as a jump (a `ret` in Go code):
                                                  the CPU's return predictions stay paired

In Go code (go_code) there is no red zone: every `lea rsp,[rsp-128]` and its undoing
are left out, and the set-up runs through lazy_init_aside (docs/design.md, "Go's stacks").

The registers stand on the stack as rcx, rax, rdx, rsi (then, when tracing,
rbx, rbp, rdi, r8 ... r15): arguments.py's frame slots.

The armed and trace paths of a point are written once per shape, as two templates
(what a counting hit runs; the rest) with holes for the probes' and histograms'
numbers, and copied to each point of that shape (`counting`): the same bytes as
writing them out (tests/test_x86_templates.py). build() writes a trampoline whole;
build_apart() writes what a counting hit runs (the displaced instructions, the checks,
the armed paths up to `jmp resume`) apart from the rest (from `timed` and `fs_base` on,
the trace path, the stub's counting), which the segment places after the hot parts of
a block of trampolines (rewriter/segment.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from urewrite.arch.base import BuiltInCall, CountPoint, RuntimeRefs, Window
from urewrite.arch.x86_64 import built_in_call, direct_entry, relocator
from urewrite.arch.x86_64.arguments import TRACE_PUSHES
from urewrite.arch.x86_64.writer import (AL, ESI, GPR64, RAX, RCX, RDI, RDX, RSI, RSP, Hole, Mem,
                                         Rip, Writer)
from urewrite.trampolines import region
from urewrite.trampolines.arguments import encode

RED_ZONE = 128
TRACING = 16  # state page: 1 when the region has an event ring
# state memory, in the page that survives fork: 1 when the kernel lets rdfsbase run
# (AT_HWCAP2 has HWCAP2_FSGSBASE), read by a thread whose fs:[0] is no thread pointer
FSBASE_USABLE = 4096 + 24
SAVED = 4  # rcx, rax, rdx, rsi
ARGUMENTS_ALIGN = 8  # of a trace path's argument descriptors


def build(address: int, window: Window, points, refs: RuntimeRefs) -> bytes:
    """The displaced instructions with each point's check before its instruction; then
    the out-of-line parts of each point."""
    w = Writer(address)
    _write(w, w, window, points, refs)
    return w.bytes()


def build_apart(address: int, window: Window, points, refs: RuntimeRefs) -> tuple:
    """build()'s code in two parts: what a counting hit runs (the displaced
    instructions, the checks, the armed paths up to their way back) at `address`,
    and the rest (latency calls, set-up, slow and trace paths: cold), to be placed
    with the cold parts of other trampolines. (hot size, place): place(cold address,
    a multiple of ARGUMENTS_ALIGN) gives the two parts' bytes."""
    hot, cold = Writer(address), Writer(0)
    _write(hot, cold, window, points, refs)

    def place(cold_address: int) -> tuple:
        assert cold_address % ARGUMENTS_ALIGN == 0
        cold.move_to(cold_address)
        labels = {**hot.labels, **cold.labels}
        hot.labels = cold.labels = labels
        return hot.bytes(), cold.bytes()
    return len(hot.code), place


def _write(w: Writer, c: Writer, window: Window, points, refs: RuntimeRefs) -> None:
    """build()'s code: what a counting hit runs into `w`, the rest into `c` (the same
    writer, or one placed after others' hot parts)."""
    address = w.pc
    where = relocator.layout(window.insns, address, _gaps(points))
    by_address = {p.address: (k, p) for k, p in enumerate(points)}
    falls_through = True
    for insn in window.insns:
        k, point = by_address.get(insn.address, (None, None))
        if point is not None and not point.taken:
            _check(w, _Labels(k), point, refs)
        taken_to = _Labels(k).taken if point is not None and point.taken else None
        falls_through = relocator.emit_one(w, insn, where, taken_to)
    if falls_through:
        w.jmp(window.end)
    for k, point in enumerate(points):
        if point.taken:  # a conditional tail call, taken: count, then on to its target
            w.label(_Labels(k).taken)
            _check(w, _Labels(k), point, refs, flags_live=False)  # nothing flows into a callee
            branch = next(i for i in window.insns if i.address == point.address)
            w.jmp(relocator.direct_target(branch))
        if point.stays_within:
            _exit_check(w, _Labels(k), point, window)
        counting(w, c, _Labels(k), point, refs)
        if point.redirect:
            _return_stub(w, c, _Labels(k), _Labels(f"r{k}"), point.redirect, refs)


def moved_instructions(address: int, window: Window, points) -> list:
    """(address in the trampoline build() makes, original address, size there) of each
    instruction."""
    gaps = _gaps(points)  # (a point's check goes where layout() puts its instruction)
    where = relocator.layout(window.insns, address, gaps)
    return [(where[insn.address] + gaps.get(insn.address, 0), insn.address,
             relocator.relocated_size(insn)) for insn in window.insns]


def _gaps(points) -> dict:
    """Bytes each point's check takes before its instruction."""
    return {p.address: _check_size(p.flags_live, p.go_code) for p in points if not p.taken}


def red_zone(point) -> int:
    """Bytes below rsp the code at `point` may use without moving rsp: SysV's red
    zone; none in Go code, whose ABI has none and whose goroutine stacks may hold
    little below sp (base.GO_STACK_BUDGET)."""
    return 0 if point.go_code else RED_ZONE


def _return_stub(w: Writer, c: Writer, entry: _Labels, L: _Labels, point,
                 refs: RuntimeRefs) -> None:
    """Where a function whose return address was redirected returns to: the original
    address goes back into its slot, and with rsp on that slot again the return
    probe counts as at a `ret` of the function (flags carry nothing there); then
    that `ret`. Every register the caller sees is as the function left it."""
    w.label(entry.stub)
    w.lea(RSP, Mem(RSP, disp=-8))
    w.call(refs.shadow_pop)
    _check(w, L, point, refs, flags_live=False)
    if point.go_code:
        w.ret()
    else:  # the `ret` done as a jump: a `ret` here would take the caller's entry off
        # the CPU's stack of return addresses, and each return above would mispredict.
        # (The slot stays in the red zone, which no signal frame overwrites; Go code
        # has none, where an asynchronous preemption pushes a call.)
        w.lea(RSP, Mem(RSP, disp=8))
        w.raw(b"\xff\x64\x24\xf8")  # jmp qword ptr [rsp - 8]
    counting(w, c, L, point, refs)


class _Labels:
    """Label names of one point: every point has its own check and out-of-line parts."""

    def __init__(self, k):
        self.prefix = f"p{k}_"

    def __getattr__(self, name: str) -> str:
        return self.prefix + name


def counting(w: Writer, c: Writer, L: _Labels, point, refs: RuntimeRefs) -> None:
    """The armed path of `point` into `w` up to its way back, the rest of it and the
    trace path into `c`, copied from the templates of its shape: points differ in
    little more than their probes' indexes (a big file has 100,000s of points, of a
    few shapes)."""
    call = point.built_in if point.built_in is not None and calls_direct(point) and \
        built_in_call.takes(point.built_in.entry, point.arguments[0]) else None
    shape = (refs, point.flags_live, len(point.probes), point.enters, len(point.leaves),
             point.redirect is not None, point.arguments, point.go_code, point.g_register,
             dataclasses.replace(call, function=0, entry_at=0) if call else None)
    values = point.probes + point.leaves
    fixed = {"built_in": call.function} if call else None  # (each probe's own function)
    w.splice(counting_template(0, *shape)[0], L.prefix, values, fixed)
    c.splice(counting_template(len(c.code) % ARGUMENTS_ALIGN, *shape)[1], L.prefix, values)


@functools.lru_cache(maxsize=4096)
def counting_template(phase: int, refs: RuntimeRefs, flags_live: bool, probes: int,
                       enters: bool, leaves: int, redirect: bool, arguments: tuple,
                       go_code: bool, g_register: bool = False,
                       built_in: Optional[BuiltInCall] = None) -> tuple:
    """(hot, cold) templates of a point of this shape: the armed path up to its way
    back; the rest of it and the trace path, written `phase` bytes past an
    ARGUMENTS_ALIGN boundary. With holes for the indexes of its probes, then of its
    histograms. `built_in`: the built-in program's call its trampoline makes itself
    (built_in_call.py; its function at the label `built_in`)."""
    w, c = Writer(0), Writer(0)
    c.raw(bytes(phase))
    L = _Labels("@")
    shape = CountPoint(0, tuple(Hole(k) for k in range(probes)), flags_live, arguments,
                       enters, tuple(Hole(probes + k) for k in range(leaves)),
                       CountPoint(0, (), False) if redirect else None, go_code=go_code,
                       g_register=g_register, built_in=built_in)
    armed_path(w, c, L, shape, refs)
    trace_path(c, L, shape.probes, refs, shape.arguments, red_zone(shape))
    return w.template(L.prefix), c.template(L.prefix, phase)


@functools.lru_cache(maxsize=None)
def _check_size(flags_live: bool, go_code: bool) -> int:
    """Bytes of a point's check (the same for every point with these flags)."""
    w = Writer(0)
    _check(w, _Labels(0), CountPoint(0, (), flags_live, go_code=go_code),
           RuntimeRefs(0, 0, 0, 0, 0, 0, 0))
    return len(w.code)


def _check(w: Writer, L: _Labels, point, refs: RuntimeRefs, flags_live: bool = None) -> None:
    flags_live = point.flags_live if flags_live is None else flags_live
    red = red_zone(point)
    if flags_live:
        if red:
            w.lea(RSP, Mem(RSP, disp=-red))
        w.push(RCX)
        w.mov(RCX, Rip(refs.state))
        w.lea(RCX, Mem(RCX, disp=-1))
        w.jrcxz(5)  # over the jmp below
        w.jmp(L.exit_check if point.stays_within else L.armed)
        w.label(L.resume)
        w.pop(RCX)
        if red:
            w.lea(RSP, Mem(RSP, disp=red))
    else:  # disarmed falls through: no taken branch; armed, one
        w.cmp(Rip(refs.state), 1)
        w.jcc("a", L.armed)
        w.jcc("b", L.set_up_first)
        w.label(L.resume)


def _exit_check(w: Writer, L: _Labels, point, window: Window) -> None:
    """An indirect jump that may stay in its function, armed: its probes count only
    when it goes outside the function's ranges (a tail call, or its own entry anew).
    Entered from the flags-live check (rcx = state - 1, the site's rcx on the stack);
    the target is read as the jump reads it, every register and flag as at the jump."""
    jump = next(i for i in window.insns if i.address == point.address)
    w.label(L.exit_check)
    w.push(RCX)  # state - 1, for the armed path
    w.mov(RCX, Mem(RSP, disp=8))  # the site's rcx
    w.push(RDX)
    w.raw(relocator.load_jump_target(jump, w.pc, red_zone(point) + 3 * 8))  # rdx = the target
    w.push(RAX)  # then the flags into rax (lahf and seto: pushfq/popfq cost ~10 ns)
    w.setcc("o", AL)
    w.lahf()
    for start, end in point.stays_within:
        w.lea(RCX, Rip(start))
        w.sub(RDX, RCX)
        w.cmp(RDX, end - start, imm32=True)
        w.jcc("b", L.stays)  # unsigned: start <= target < end
        w.add(RDX, RCX)
    _restore_after_exit_check(w)
    w.jmp(L.armed)  # it leaves: count
    w.label(L.stays)
    _restore_after_exit_check(w)
    w.jmp(L.resume)


def _restore_after_exit_check(w: Writer) -> None:
    w.add(AL, 0x7F)  # OF set exactly when al (seto's) is 1
    w.sahf()
    w.pop(RAX)
    w.pop(RDX)
    w.pop(RCX)  # state - 1 again


def armed_path(w: Writer, c: Writer, L: _Labels, point, refs: RuntimeRefs) -> None:
    """Into `w` what a counting hit runs, up to its way back; the rest into `c`."""
    probe_indexes, flags_live, red = point.probes, point.flags_live, red_zone(point)
    site_rsp = 8 * SAVED + red  # from rsp, once the trampoline saved its registers
    w.label(L.armed)
    if flags_live:
        w.push(RAX)
        w.setcc("o", AL)
        w.lahf()
        w.push(RDX)
        w.push(RSI)
        w.lea(RDX, Mem(RCX, disp=1))  # rcx held state - 1
        w.test(RDX, RDX)
        w.jcc("e", L.set_up)
    else:
        if red:
            w.lea(RSP, Mem(RSP, disp=-red))
        for reg in (RCX, RAX, RDX, RSI):
            w.push(reg)
        w.mov(RDX, Rip(refs.state))
        # read again since the check: a live tracer may have disarmed (1) or re-armed (0)
        # the probes in between; this hit then goes uncounted (flags carry nothing here)
        w.cmp(RDX, 1)
        w.jcc("be", L.traced)
    w.label(L.count)
    _owner_entry(w, L, refs)
    w.cmp(Mem(RDX, RSI, disp=refs.owners_offset), RCX)
    w.jcc("ne", L.slow)
    w.mov(RSI, Mem(RDX, RSI, disp=refs.owners_offset + 8))
    w.label(L.own_row)
    for index in probe_indexes:  # (disp32: the size of a template's hole, for any index)
        w.add(Mem(RSI, disp=8 * index, disp32=True), 1)
    # latency: rsi = the thread's own row (a thread counting in the shared row has
    # no stack of open calls: only calls paired by goroutine are measured there);
    # out of line, so that an untimed hit takes no branch here
    timed = point.enters or point.leaves
    if timed:
        w.test_byte(Mem(RDX, disp=region.OFF_FLAGS), region.FLAG_LATENCY)
        w.jcc("ne", L.timed)
    w.label(L.counted)
    if point.redirect:  # armed at a function entry: its return goes through its stub
        # (rsp-relative leas take a disp32 even where a byte would do: the bytes
        # trampolines have always had)
        w.lea(RCX, Mem(RSP, disp=site_rsp, disp32=True))  # the slot of the return address
        w.lea(RSI, Rip(L.stub))
        w.call(refs.shadow_push)
    w.cmp(Rip(refs.state + TRACING, bits=8), 0)
    direct = calls_direct(point)
    if point.built_in is not None:
        # A process of this file is expected to run the program built in: its call
        # in line, on the counting path (a taken branch and a cold line less, 0.3 ns)
        w.jcc("e", L.traced)
        w.lea(RSI, Rip(refs.state + direct_entry.DIRECT))
        built_in_call.emit(w, L, point.built_in.entry, point.built_in.run, flags_live, red)
        w.label(L.built_in_done)
        back_to_site(w, L, flags_live, red)
        w.label(L.by_table)  # (a tracer's program, or none bound yet)
        w.jmp(L.direct if direct else L.trace)
    else:
        w.jcc("ne", L.direct if direct else L.trace)
    w.label(L.traced)
    back_to_site(w, L, flags_live, red)
    if direct:
        # The direct entry's call here, beside the counting path, not with the cold
        # parts: in a server, a line and a page more on each hit of a loaded program
        # (PostgreSQL: about 4% of its CPU a transaction, all its probes taking it)
        w.label(L.direct)
        _direct_call(w, L, probe_indexes[0], refs, flags_live, red)

    w = c  # the rest: none of it runs on a counting hit
    if timed:
        w.label(L.timed)
        _latency_calls(w, point, refs, site_rsp)
        w.jmp(L.counted)

    w.label(L.fs_base)
    w.cmp(Rip(refs.state + FSBASE_USABLE, bits=8), 0)
    w.jcc("e", L.slow)  # rcx = 0: slow_hit gives the shared row
    w.rdfsbase(RCX)
    w.test(RCX, RCX)
    w.jcc("ne", L.identified)
    w.jmp(L.slow)

    # The hashed owner entry is not this thread's: slow_hit finds or claims one
    # nearby (rdx = region, rcx = thread pointer, rsi = entry offset; it clobbers
    # rsi and flags). Its own row counts as on the fast path; the shared row, owned
    # by no thread, needs atomic adds.
    w.label(L.slow)
    w.call(refs.slow_hit)
    w.jcc("e", L.own_row)
    for index in probe_indexes:
        w.add(Mem(RSI, disp=8 * index, disp32=True), 1, lock=True)
    if point.g_register:  # pairs kept by goroutine need no row of the thread's own
        _latency(w, point, refs, site_rsp, L.untimed_shared)
    elif point.leaves:
        _unless_timed(w, L.counted)
        for _ in point.leaves:  # a return without a latency sample: the region says how many
            w.add(Mem(RDX, disp=region.OFF_LATENCY_MISSED), 1, lock=True)
    w.jmp(L.counted)

    if flags_live:  # first hit in this process (or in a forked child): set up, then count
        w.label(L.set_up)
        w.call(_lazy_init(point, refs))
        w.mov(RDX, Rip(refs.state))
        w.cmp(RDX, 1)
        w.jcc("a", L.count)
        w.jmp(L.traced)  # still not armed: this hit goes uncounted
    else:
        w.label(L.set_up_first)
        if red:
            w.lea(RSP, Mem(RSP, disp=-red))
        w.call(_lazy_init(point, refs))
        if red:
            w.lea(RSP, Mem(RSP, disp=red))
        w.cmp(Rip(refs.state), 1)
        w.jcc("a", L.armed)
        w.jmp(L.resume)


def back_to_site(w: Writer, L: _Labels, flags_live: bool, red: int) -> None:
    """The registers the armed path saved restored, then on to the displaced code."""
    w.pop(RSI)
    w.pop(RDX)
    if flags_live:
        w.add(AL, 0x7F)
        w.sahf()
        w.pop(RAX)
    else:
        w.pop(RAX)
        w.pop(RCX)
        if red:
            w.lea(RSP, Mem(RSP, disp=red))
    w.jmp(L.resume)


def _latency(w: Writer, point, refs: RuntimeRefs, site_rsp: int, untimed: str) -> None:
    """rsi = the row, rdx = region. rcx = the site's rsp, plus 1 where r14 holds the
    goroutine: the runtime then keys the call by goroutine, not by thread. Nothing (on
    to `untimed`, after it) unless the region's flags ask for latency."""
    if not (point.enters or point.leaves):
        return
    _unless_timed(w, untimed)
    _latency_calls(w, point, refs, site_rsp)
    w.label(untimed)


def _latency_calls(w: Writer, point, refs: RuntimeRefs, site_rsp: int) -> None:
    """lat_enter and lat_exit as `point` needs them (rsi = the row, rdx = region)."""
    g = 1 if point.g_register else 0
    if point.enters:
        w.lea(RCX, Mem(RSP, disp=site_rsp + g, disp32=True))
        w.call(refs.lat_enter)
    for histogram in point.leaves:  # (lat_exit takes the histogram off the stack)
        w.push(histogram, imm32=True)  # (a template's hole, or the same size without)
        w.lea(RCX, Mem(RSP, disp=site_rsp + 8 + g, disp32=True))
        w.call(refs.lat_exit)


def _unless_timed(w: Writer, untimed: str) -> None:
    """On to `untimed` unless the region (rdx) times calls (flags: dead or saved here)."""
    w.test_byte(Mem(RDX, disp=region.OFF_FLAGS), region.FLAG_LATENCY)
    w.jcc("e", untimed)


def _lazy_init(point, refs: RuntimeRefs) -> int:
    """The set-up routine: in Go code, the one that runs on a stack of its own (it
    needs more than a goroutine's stack may hold below sp)."""
    return refs.lazy_init_aside if point.go_code else refs.lazy_init


def _owner_entry(w: Writer, L: _Labels, refs: RuntimeRefs) -> None:
    """rcx = the thread's identity, rsi = offset of its owner entry (rdx = region).
    The identity is the thread pointer (fs:[0], the TLS ABI's self pointer); where
    that word is 0 (Go points fs at its own per-thread data), the fs base itself,
    read with rdfsbase where the kernel allows it (out of line); else none, and
    slow_hit counts in the shared row: a free entry's 0 must never match."""
    w.mov(RCX, Mem(seg="fs"))  # fs:[0]
    w.test(RCX, RCX)
    w.jcc("e", L.fs_base)
    w.label(L.identified)
    w.movabs(RSI, region.HASH_MULTIPLIER)
    w.imul(RSI, RCX)
    w.shr(RSI, region.SLOT_SHIFT)
    w.and_(ESI, region.SLOT_MASK)


def trace_path(w: Writer, L: _Labels, probe_indexes, refs: RuntimeRefs, arguments,
                red: int = RED_ZONE) -> None:
    """Save every register as the frame trace_event reads arguments from; one event
    per probe at this point (where a point calls its probe's direct entry, after it:
    armed_path)."""
    w.label(L.trace)
    for n in TRACE_PUSHES:
        w.push(GPR64[n])
    site_rsp = 8 * (len(TRACE_PUSHES) + SAVED) + red
    for k, index in enumerate(probe_indexes):
        w.mov(RDI, RSP)
        w.lea(RCX, Mem(RSP, disp=site_rsp, disp32=True))
        w.mov(ESI, index)
        w.lea(RDX, Rip(f"{L.arguments}{k}"))
        w.call(refs.trace_event)
    for n in reversed(TRACE_PUSHES):
        w.pop(GPR64[n])
    w.jmp(L.traced)
    w.align(ARGUMENTS_ALIGN)
    for k, _ in enumerate(probe_indexes):
        w.label(f"{L.arguments}{k}")
        w.raw(arguments[k] if k < len(arguments) else encode(()))


def calls_direct(point) -> bool:
    """Whether a point's trace path calls its probe's direct entry first: a point of
    one probe (whose entry, one call, runs all it does) outside Go code (whose stacks
    have no red zone; Go programs run no program)."""
    return len(point.probes) == 1 and not point.go_code


def _direct_call(w: Writer, L: _Labels, index, refs: RuntimeRefs, flags_live: bool,
                 red: int) -> None:
    """The probe's direct entry, where the program has a direct table: from the table,
    by the binding's pointer (0: no table); a probe it gives no entry runs nothing.
    rcx = the point's argument descriptors, rsi = the binding. Back with ecx = 0:
    done; else on to the trace path (its runtime routine reads the arguments as the
    descriptors say)."""
    w.lea(RSI, Rip(refs.state + direct_entry.DIRECT))
    w.mov(RCX, Mem(RSI))
    w.test(RCX, RCX)
    w.jcc("e", L.trace)
    w.mov(RDX, Mem(RCX, disp=8 * index, disp32=True))
    w.test(RDX, RDX)
    w.jcc("e", L.traced)  # the program has no code here
    w.add(RDX, RCX)
    w.lea(RCX, Rip(f"{L.arguments}0"))
    w.raw(b"\xff\xd2")  # call rdx
    w.test(RCX, RCX)
    w.jcc("ne", L.trace)
    back_to_site(w, L, flags_live, red)  # (a copy: a taken jump less on every hit)
