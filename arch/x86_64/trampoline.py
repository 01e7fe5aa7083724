"""The code one x86_64 site jumps to.

    [lea rsp,-128; pushfq]          only where flags may be live (not a function entry)
    check:  cmp qword [state], 1
            je   resume                 disarmed: one load, one branch
            jb   setup                  not set up in this process yet
    armed:  [lea rsp,-128]              keep out of the red zone
            push rax, rcx, rdx
            rax = region; rcx = thread pointer (fs:[0]); rdx = hash(rcx) * 16
            cmp  owner[rdx].thread, rcx
            jne  slow                   this thread has no slot of its own yet
            rdx = owner[rdx].counters
            add  qword [rdx + 8 * probe], 1     plain add: the row belongs to this thread
    counted: pop rdx, rcx, rax; [lea rsp,+128]
    resume: [popfq; lea rsp,+128]
            displaced instructions, relocated
            jmp  back
    slow:   push rsi; mov esi, 8 * probe; call slow_hit; pop rsi; jmp counted
    setup:  call lazy_init; if armed now: jmp armed, else jmp resume
"""

from __future__ import annotations

from urewrite.arch.base import RuntimeRefs, Window
from urewrite.arch.x86_64 import relocator
from urewrite.arch.x86_64.writer import Writer
from urewrite.trampolines import region

RED_ZONE = 128
FIBONACCI = 0x9E3779B97F4A7C15  # multiplicative hash of the thread pointer

# The top bits of the hash pick an owner entry: (hash >> SHIFT) & MASK is the
# entry's byte offset, for power-of-two slot counts and entry sizes.
_SLOT_BITS = region.SLOT_COUNT.bit_length() - 1
_ENTRY_BITS = region.OWNER_ENTRY_SIZE.bit_length() - 1
assert 1 << _SLOT_BITS == region.SLOT_COUNT and 1 << _ENTRY_BITS == region.OWNER_ENTRY_SIZE
SLOT_SHIFT = 64 - _SLOT_BITS - _ENTRY_BITS
SLOT_MASK = (region.SLOT_COUNT - 1) * region.OWNER_ENTRY_SIZE


def build(address: int, probe_index: int, window: Window, flags_live: bool,
          refs: RuntimeRefs) -> bytes:
    w = Writer(address)
    if flags_live:
        w.lea_rsp(-RED_ZONE)
        w.pushfq()
    w.cmp_rip_qword_imm8(refs.state, 1)
    w.jcc("e", "resume")
    w.jcc("b", "setup")

    w.label("armed")
    if not flags_live:
        w.lea_rsp(-RED_ZONE)
    for reg in ("rax", "rcx", "rdx"):
        w.push(reg)
    w.mov_reg_rip("rax", refs.state)
    w.mov_rcx_fs0()
    w.movabs_rdx(FIBONACCI)
    w.imul_rdx_rcx()
    w.shr_rdx(SLOT_SHIFT)
    w.and_edx(SLOT_MASK)
    w.cmp_rax_rdx_disp_rcx(refs.owners_offset)
    w.jcc("ne", "slow")
    w.mov_rdx_rax_rdx_disp(refs.owners_offset + 8)
    w.inc_rdx_disp(8 * probe_index)
    w.label("counted")
    for reg in ("rdx", "rcx", "rax"):
        w.pop(reg)
    if not flags_live:
        w.lea_rsp(RED_ZONE)

    w.label("resume")
    if flags_live:
        w.popfq()
        w.lea_rsp(RED_ZONE)
    code, falls_through = relocator.relocate(window.insns, w.pc)
    w.raw(code)
    if falls_through:
        w.jmp(window.end)

    w.label("slow")
    w.push("rsi")
    w.mov_esi_imm(8 * probe_index)
    w.call(refs.slow_hit)
    w.pop("rsi")
    w.jmp("counted")

    w.label("setup")
    if not flags_live:
        w.lea_rsp(-RED_ZONE)
    w.call(refs.lazy_init)
    if not flags_live:
        w.lea_rsp(RED_ZONE)
    w.cmp_rip_qword_imm8(refs.state, 1)
    w.jcc("a", "armed")
    w.jmp("resume")
    return w.bytes()
