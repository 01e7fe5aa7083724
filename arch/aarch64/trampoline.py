"""The code one AArch64 site branches to.

There is no red zone on arm64 Linux: the trampoline moves sp before storing.
Nothing on the hit path sets the condition flags (cbz/cbnz only), so they need
no saving even at a site inside a function.

            stp  x16, x17, [sp, #-48]!
    check:  x16 = state                 0 = not set up, 1 = disarmed, else region
            cbz  x16 - 1 -> resume       disarmed: one load, one branch
            cbz  x16 -> setup
    armed:  stp  x0, x1, [sp, #16]
            x17 = tpidr_el0 (thread pointer); x0 = &owner[hash(x17)]
            ldp  x1, x0, [x0]           owner thread, its counter row
            cbnz x1 - x17 -> slow
            ldxr/add/stxr on row[probe]  exclusive: a signal handler hitting the same
                                         probe mid-increment makes it retry, not lose
    counted: ldp x0, x1, [sp, #16]
    resume: ldp  x16, x17, [sp], #48
            displaced instruction, relocated
            b    back
"""

from __future__ import annotations

from urewrite.arch.aarch64 import relocator
from urewrite.arch.aarch64.writer import LR, SP, Writer
from urewrite.arch.base import RuntimeRefs, Window
from urewrite.trampolines import region

X0, X1, X16, X17 = 0, 1, 16, 17
FRAME = 48  # x16, x17 | x0, x1 | x30, pad


def _load_state(w: Writer, state: int) -> None:
    w.adrp(X16, state)
    w.ldr(X16, X16, state & 0xFFF)


def build(address: int, window: Window, points, refs: RuntimeRefs) -> bytes:
    # A window is the one instruction at its site, so it has one point, before it.
    # Events (tracing) are not recorded on AArch64 yet: the points' arguments go unused.
    (point,) = points
    assert point.address == window.address
    probe_indexes = point.probes
    w = Writer(address)
    w.stp_pre(X16, X17, SP, -FRAME)
    _load_state(w, refs.state)
    w.sub_imm(X17, X16, 1)
    w.cbz(X17, "resume")
    w.cbz(X16, "setup")

    w.label("armed")
    w.stp(X0, X1, SP, 16)
    w.mrs_tpidr_el0(X17)
    w.ldr_literal(X0, "hash")
    w.mul(X0, X17, X0)
    w.lsr(X0, X0, region.SLOT_SHIFT)
    w.and_mask(X0, X0, region.SLOT_MASK)
    w.add_reg(X0, X0, X16)
    w.add_imm(X0, X0, refs.owners_offset)
    w.ldp(X1, X0, X0)
    w.sub_reg(X1, X1, X17)
    w.cbnz(X1, "slow")
    offset = 0
    for index in probe_indexes:
        if 8 * index > offset:
            w.add_imm(X0, X0, 8 * index - offset)
            offset = 8 * index
        w.label(f"retry{index}")
        w.ldxr(X1, X0)
        w.add_imm(X1, X1, 1)
        w.stxr(X17, X1, X0)
        w.cbnz(X17, f"retry{index}", wide=False)
    w.label("counted")
    w.ldp(X0, X1, SP, 16)
    w.label("resume")
    w.ldp_post(X16, X17, SP, FRAME)
    code, falls_through = relocator.relocate(window.insns, w.pc)
    w.raw(code)
    if falls_through:
        w.b(window.end)

    w.label("slow")
    w.str_(LR, SP, 32)
    for index in probe_indexes:
        # slow_hit clobbers x16, x17: set them again for the next one
        _load_state(w, refs.state)
        w.mrs_tpidr_el0(X17)
        w.mov_imm(X0, 8 * index)
        w.bl(refs.slow_hit)
    w.ldr(LR, SP, 32)
    w.b("counted")

    w.label("setup")
    w.str_(LR, SP, 32)
    w.bl(refs.lazy_init)
    w.ldr(LR, SP, 32)
    _load_state(w, refs.state)
    w.sub_imm(X17, X16, 1)
    w.cbz(X17, "resume")
    w.cbz(X16, "resume")  # still not set up (no thread pointer yet): skip this hit
    w.b("armed")

    if w.pc % 8:
        w.word(relocator.NOP)
    w.label("hash")
    w.quad(region.HASH_MULTIPLIER)
    return w.bytes()
