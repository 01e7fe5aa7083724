"""The code one AArch64 site branches to.

There is no red zone on arm64 Linux: the trampoline moves sp before storing.
Nothing on the hit path sets the condition flags (cbz/cbnz only; the runtime
routines it calls save them), so they need no saving even inside a function.

            stp  x16, x17, [sp, #-48]!   frame: x16, x17 | x0, x1 | x30, pad
    check:  x16 = state                 0 = not set up, 1 = disarmed, else region
            cbz  x16 - 1 -> resume       disarmed: one load, one branch
            cbz  x16 -> setup
    armed:  stp  x0, x1, [sp, #16]
            [br xN that may stay in its function: x0 = xN; per range of the
             function: x1 = x0 - start, tbnz x1 sign; x1 -= size, tbnz x1 sign -> traced]
            x17 = tpidr_el0 (thread pointer); x0 = &owner[hash(x17)]
            ldp  x1, x0, [x0]           owner thread, its counter row
            cbnz x1 - x17 -> slow
    owned:  ldxr/add/stxr on row[probe]  exclusive: a signal handler hitting the same
                                         probe mid-increment makes it retry, not lose
            [bl lat_enter | lat_exit]    a function measured for latency enters | returns
                                         (x17 = site sp, + 1 where x28 holds g)
    counted: [a function entry whose return is redirected: x30 into the frame,
              x17 = its stub, bl shadow_push, x30 = the frame's: now the stub]
            x17 = region.ring ; cbnz x17 -> trace   (x16 = region)
    traced: ldp  x0, x1, [sp, #16]
    resume: ldp  x16, x17, [sp], #48
            displaced instruction, relocated
            b    back
    slow:   bl slow_hit                 x0 = the thread's own row (found or claimed
            cbz  x1 -> owned             near the hashed entry), or the shared row:
            ldxr/add/stxr on row[probe] ; b counted     counted, never measured
                                         (but by goroutine: bl lat_enter | lat_exit)
    trace:  [a program with a direct table (x16 = binding, acquire): its entry for the
             probe, x1 = the point's descriptors; done unless it says otherwise]
            x16 = this point's event table ; bl trace_event ; b traced

Such an entry's return stub follows (docs/design.md, "Return probes"):
    stub:   stp x16, x17, [sp, #-48]! ; bl shadow_pop ; ldr x30, [sp, #32]
            the check and the rest of a point, as at a `ret`, with `ret` displaced

trace_event and lat_enter/lat_exit read the frame above: runtime.py passes
these offsets to runtime.s.
"""

from __future__ import annotations

from urewrite.arch.aarch64 import direct_entry, relocator
from urewrite.arch.aarch64.writer import LR, SP, Writer
from urewrite.arch.base import RuntimeRefs, Window
from urewrite.trampolines import region
from urewrite.trampolines.arguments import encode

X0, X1, X16, X17 = 0, 1, 16, 17
FRAME = 48  # the site's sp is sp + FRAME while the trampoline runs
FRAME_X16 = 0  # the site's x16, x17
FRAME_X0 = 16  # the site's x0, x1 (stored once armed)
FRAME_LR = 32  # x30 while the trampoline calls the runtime


def _load_state(w: Writer, state: int) -> None:
    w.adrp(X16, state)
    w.ldr(X16, X16, state & 0xFFF)


def _sub_imm(w: Writer, rd: int, rn: int, imm: int) -> None:
    """rd = rn - imm, for imm < 2**24 (Writer.sub_imm takes 12 bits)."""
    if imm >> 24:
        raise OverflowError(f"immediate {imm:#x} too large")
    if imm >> 12:
        w.word(0xD1400000 | (imm >> 12) << 10 | rn << 5 | rd)
        rn = rd
    if imm & 0xFFF or rn != rd:
        w.word(0xD1000000 | (imm & 0xFFF) << 10 | rn << 5 | rd)


def _count(w: Writer, probe_indexes, tag: str) -> int:
    """Adds 1 to each probe's counter in the row at x0 (exclusive: a signal handler
    hitting the same probe mid-increment makes it retry, not lose). Clobbers x1, x17;
    returns how far x0 was moved."""
    offset = 0
    for index in probe_indexes:
        if 8 * index > offset:
            w.add_imm(X0, X0, 8 * index - offset)
            offset = 8 * index
        w.label(f"{tag}{index}")
        w.ldxr(X1, X0)
        w.add_imm(X1, X1, 1)
        w.stxr(X17, X1, X0)
        w.cbnz(X17, f"{tag}{index}", wide=False)
    return offset


RET = 0xD65F03C0  # ret: the last instruction of a return stub


def build(address: int, window: Window, points, refs: RuntimeRefs) -> bytes:
    # A window is the one instruction at its site, so it has one point, before it.
    (point,) = points
    assert point.address == window.address
    w = Writer(address)
    if point.taken:  # a conditional tail call: counted on its taken edge, then on to the callee
        (branch,) = window.insns
        target = relocator.emit_condition(w, branch)
        w.stp_pre(X16, X17, SP, -FRAME)
        _point(w, _Labels(""), point, refs, lambda: w.b(target))
        return w.bytes()
    _body(w, window, point, refs, lambda: _displaced(w, window))
    if point.redirect:
        _return_stub(w, point.redirect, refs)
    return w.bytes()


def moved_instructions(address: int, window: Window, points, refs: RuntimeRefs) -> list:
    """(address in the trampoline build() makes, original address, size there) of the
    window's instruction; none for a conditional tail call's (a branch: it never faults)."""
    (point,) = points
    if point.taken:
        return []
    w, at = Writer(address), []
    _body(w, window, point, refs, lambda: at.append(w.pc))
    code, _ = relocator.relocate(window.insns, at[0])
    return [(at[0], window.address, len(code))]


def _body(w: Writer, window: Window, point, refs: RuntimeRefs, displaced) -> None:
    """The frame pushed, then the point, which runs `displaced()` where the window's
    instruction goes."""
    w.stp_pre(X16, X17, SP, -FRAME)
    _point(w, _Labels(""), point, refs, displaced, window.insns[0])


def _displaced(w: Writer, window: Window) -> None:
    code, falls_through = relocator.relocate(window.insns, w.pc)
    w.raw(code)
    if falls_through:
        w.b(window.end)


def _return_stub(w: Writer, point, refs: RuntimeRefs) -> None:
    """Where a function whose return address was redirected returns to: with a frame
    laid out as a trampoline's, shadow_pop puts the original return address in its
    x30 slot, whatever the state (a forked child returns from its parent's calls);
    then the return probe counts as at a `ret` of the function, and that `ret`.
    Every register the caller sees is as the function left it."""
    w.label("stub")
    w.stp_pre(X16, X17, SP, -FRAME)
    w.bl(refs.shadow_pop)
    w.ldr(LR, SP, FRAME_LR)
    _point(w, _Labels("r_"), point, refs, lambda: w.word(RET))


def calls_direct(point) -> bool:
    """Whether a point's trace path calls its probe's direct entry first: a point of
    one probe outside Go code (direct_entry.py; Go programs run no program)."""
    return len(point.probes) == 1 and not point.go_code


def _direct_call(w: Writer, L, index: int, refs: RuntimeRefs) -> None:
    """The probe's direct entry, where the program has a direct table: from the table,
    by the binding's pointer (0: no table, read with acquire: the binding's words are
    written before it); a probe it gives no entry runs nothing. x1 = the point's
    argument descriptors, x16 = the binding. Back with x0 = 0: done; else on to the
    trace path (its runtime routine reads the arguments as the descriptors say)."""
    w.address_of(X16, refs.state + direct_entry.DIRECT)
    w.word(0xC8DFFC00 | X16 << 5 | X17)  # ldar x17, [x16]
    w.cbz(X17, L.events_call)
    if index < 4096:
        w.ldr(X0, X17, 8 * index)
    else:
        w.mov_imm(X0, index)
        w.word(0xF8607800 | X0 << 16 | X17 << 5 | X0)  # ldr x0, [x17, x0, lsl #3]
    w.cbz(X0, L.direct_done)  # the program has no code here
    w.add_reg(X0, X17, X0)
    w.adr(X1, L.descriptors)
    w.word(0xD63F0000 | X0 << 5)  # blr x0
    w.cbz(X0, L.direct_done)
    w.label(L.events_call)


def _built_in_call(w: Writer, L, call, refs: RuntimeRefs) -> None:
    """Where the probe runs a program built into the rewrite, which a process of this
    file runs whenever it is armed: in line on the counting path, that program's direct
    entry for the probe called with a direct branch, no table (x86_64 does the entry's
    work itself: arch/x86_64/built_in_call.py), while the maps bound are the program's
    (their run word is its); else (a tracer's program, or none bound yet) the trace
    path, the table's way. x17 = the region's ring offset, 0 when not tracing."""
    w.cbz(X17, L.traced)
    w.str_(LR, SP, FRAME_LR)
    w.address_of(X16, refs.state + direct_entry.DIRECT)  # x16 = the binding, as an entry's
    w.ldr(X17, X16, 8)  # the maps bound
    w.cbz(X17, L.by_table)
    w.ldr(X17, X17, 8)  # their run word
    w.address_of(X0, call.run)
    w.ldr(X0, X0, 0)
    w.sub_reg(X0, X0, X17)
    w.cbnz(X0, L.by_table)
    w.adr(X1, L.descriptors)
    w.bl(call.entry_at)
    w.cbnz(X0, L.events_call)  # (its arguments are not the entry's: the trace path's event)
    w.ldr(LR, SP, FRAME_LR)
    w.b(L.traced)
    w.label(L.by_table)
    w.b(L.trace)


class _Labels:
    """Label names of one point: the entry and its return stub each have their own."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __getattr__(self, name: str) -> str:
        return self.prefix + name


def _exit_check(w: Writer, L: _Labels, point, rn: int) -> None:
    """`br xN` that may stay in its function, armed: its probes count only when it
    goes outside the function's ranges (a tail call, or its own entry anew). x0, x1
    are saved in the frame, every other register is as at the branch; no flags are
    set (tbnz on the sign of differences: addresses are below 2**63)."""
    if rn in (X16, X17):
        w.ldr(X0, SP, FRAME_X16 + 8 * (rn - X16))
    elif rn != X0:
        w.mov(X0, rn)  # (x1 is still the site's)
    for k, (start, end) in enumerate(point.stays_within):
        w.address_of(X1, start)
        w.sub_reg(X1, X0, X1)  # target - start
        w.tbnz(X1, 63, f"{L.below}{k}")
        _sub_imm(w, X1, X1, end - start)
        w.tbnz(X1, 63, L.traced)  # start <= target < end: it stays, nothing to count
        w.label(f"{L.below}{k}")


def _latency(w: Writer, point, refs: RuntimeRefs, offset: int, untimed: str) -> None:
    """x0 = the row + `offset`, x16 = region. x17 = the site's sp, plus 1 where x28
    holds the goroutine: the runtime then keys the call by goroutine, not by thread.
    Nothing (on to `untimed`, after it) unless the region's flags ask for latency."""
    if not (point.enters or point.leaves):
        return
    _unless_timed(w, untimed)
    if offset:
        _sub_imm(w, X0, X0, offset)  # x0 = the row
    w.str_(LR, SP, FRAME_LR)
    w.add_imm(X17, SP, FRAME + (1 if point.g_register else 0))  # which call this is
    if point.enters:
        w.bl(refs.lat_enter)
    for histogram in point.leaves:
        w.mov_imm(X1, histogram)
        w.bl(refs.lat_exit)
    w.ldr(LR, SP, FRAME_LR)
    w.label(untimed)


def _unless_timed(w: Writer, untimed: str) -> None:
    """On to `untimed` unless the region (x16) times calls; the flags untouched."""
    w.ldr_w(X17, X16, region.OFF_FLAGS)
    w.tbz(X17, region.FLAG_LATENCY.bit_length() - 1, untimed)


def _point(w: Writer, L: _Labels, point, refs: RuntimeRefs, displaced, jump=None) -> None:
    """From the check on, with the frame pushed: count the point's probes, then run
    `displaced()`, then the out-of-line parts. `jump`: the point's instruction."""
    probe_indexes = point.probes
    _load_state(w, refs.state)
    w.sub_imm(X17, X16, 1)
    w.cbz(X17, L.resume)
    w.cbz(X16, L.setup)

    w.label(L.armed)
    w.stp(X0, X1, SP, FRAME_X0)
    if point.stays_within:
        _exit_check(w, L, point, relocator.word_of(jump) >> 5 & 31)
    w.mrs_tpidr_el0(X17)
    w.ldr_literal(X0, L.hash)
    w.mul(X0, X17, X0)
    w.lsr(X0, X0, region.SLOT_SHIFT)
    w.and_mask(X0, X0, region.SLOT_MASK)
    w.add_reg(X0, X0, X16)
    w.add_imm(X0, X0, refs.owners_offset)
    w.ldp(X1, X0, X0)
    w.sub_reg(X1, X1, X17)
    w.cbnz(X1, L.slow)
    w.label(L.owned)  # x0 = this thread's row, x16 = region
    offset = _count(w, probe_indexes, L.retry)
    # latency: in the thread's own row (found by the hash or by slow_hit); a hit
    # in the shared row goes unmeasured, but where pairs are kept by goroutine
    _latency(w, point, refs, offset, L.untimed)
    w.label(L.counted)  # x16 = region
    if point.redirect:  # a function entered here returns through its stub
        w.str_(LR, SP, FRAME_LR)
        w.adr(X17, "stub")
        w.bl(refs.shadow_push)
        w.ldr(LR, SP, FRAME_LR)
    w.ldr(X17, X16, region.OFF_RING)
    if point.built_in is not None and calls_direct(point):
        _built_in_call(w, L, point.built_in, refs)
    else:
        w.cbnz(X17, L.trace)
    w.label(L.traced)
    w.ldp(X0, X1, SP, FRAME_X0)
    w.label(L.resume)
    w.ldp_post(X16, X17, SP, FRAME)
    displaced()

    # The hashed owner entry is not this thread's: slow_hit looks at the next ones
    # (x16 = region, x17 = thread pointer; it clobbers x0, x1). Its own row counts
    # and measures as on the fast path; the shared row only counts.
    w.label(L.slow)
    w.str_(LR, SP, FRAME_LR)
    w.bl(refs.slow_hit)
    w.ldr(LR, SP, FRAME_LR)
    w.cbz(X1, L.owned)
    offset = _count(w, probe_indexes, L.shared)
    if point.g_register:  # (x28 holds the goroutine: pairs need no row of the thread's own)
        _latency(w, point, refs, offset, L.untimed_shared)
    elif point.leaves:
        _unless_timed(w, L.counted)
    for k, _ in enumerate(() if point.g_register else point.leaves):
        w.add_imm(X0, X16, region.OFF_LATENCY_MISSED)  # a return without a sample: say so
        w.label(f"{L.missed}{k}")
        w.ldxr(X1, X0)
        w.add_imm(X1, X1, 1)
        w.stxr(X17, X1, X0)
        w.cbnz(X17, f"{L.missed}{k}", wide=False)
    w.b(L.counted)

    w.label(L.setup)  # (in Go code, on a stack of its own: lazy_init needs more than
    w.str_(LR, SP, FRAME_LR)  # a goroutine's stack may hold below sp)
    w.bl(refs.lazy_init_aside if point.go_code else refs.lazy_init)
    w.ldr(LR, SP, FRAME_LR)
    _load_state(w, refs.state)
    w.sub_imm(X17, X16, 1)
    w.cbz(X17, L.resume)
    w.cbz(X16, L.resume)  # still not set up (no thread pointer yet): skip this hit
    w.b(L.armed)

    # tracing: trace_event saves every register as the frame it reads arguments from,
    # more than a goroutine's stack may hold: in Go code only Go runs (x28 = g),
    # trace_event_go runs it where g's stack has room, else counts the event dropped;
    # in the runtime's assembly (x28 may be anything where C enters it) the event is
    # dropped
    w.label(L.trace)  # (x16 = region, x17 = the ring's offset; x0, x1 saved)
    w.str_(LR, SP, FRAME_LR)
    if point.go_code:
        w.add_reg(X0, X16, X17)  # x0 = the ring
        if point.called_from_go:
            w.adr(X16, L.events)
            w.bl(refs.trace_event_go)
        else:
            w.add_imm(X0, X0, region.RING_DROPPED)
            w.label(L.dropped)
            w.ldxr(X1, X0)
            w.add_imm(X1, X1, 1)
            w.stxr(X17, X1, X0)
            w.cbnz(X17, L.dropped, wide=False)
    else:
        if calls_direct(point):
            _direct_call(w, L, probe_indexes[0], refs)
        w.adr(X16, L.events)
        w.bl(refs.trace_event)
        w.label(L.direct_done)
    w.ldr(LR, SP, FRAME_LR)
    w.b(L.traced)

    if w.pc % 8:
        w.word(relocator.NOP)
    w.label(L.hash)
    w.quad(region.HASH_MULTIPLIER)
    # the point's events: u64 count, then per probe u64 index and its descriptors
    w.label(L.events)
    w.quad(len(probe_indexes))
    for k, index in enumerate(probe_indexes):
        w.quad(index)
        if k == 0:
            w.label(L.descriptors)
        w.raw(point.arguments[k] if k < len(point.arguments) else encode(()))
