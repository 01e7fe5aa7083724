"""The code one x86_64 site jumps to.

    displaced instructions before the probe point, relocated (none at a function entry)
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
    counted: when tracing: jmp trace (saves all registers, calls trace_event per probe)
    traced: pop rdx, rcx, rax; [lea rsp,+128]
    resume: [popfq; lea rsp,+128]
            displaced instructions from the probe point on, relocated
            jmp  back
    slow:   push rsi; mov esi, 8 * probe; call slow_hit; pop rsi; jmp counted
    setup:  call lazy_init; if armed now: jmp armed, else jmp resume
"""

from __future__ import annotations

from urewrite.arch.base import RuntimeRefs, Window
from urewrite.arch.x86_64 import relocator
from urewrite.arch.x86_64.arguments import TRACE_PUSHES
from urewrite.arch.x86_64.writer import Writer
from urewrite.trampolines import region
from urewrite.trampolines.arguments import encode

RED_ZONE = 128
TRACING = 16  # state page: 1 when the region has an event ring
FIBONACCI = 0x9E3779B97F4A7C15  # multiplicative hash of the thread pointer

# The top bits of the hash pick an owner entry: (hash >> SHIFT) & MASK is the
# entry's byte offset, for power-of-two slot counts and entry sizes.
_SLOT_BITS = region.SLOT_COUNT.bit_length() - 1
_ENTRY_BITS = region.OWNER_ENTRY_SIZE.bit_length() - 1
assert 1 << _SLOT_BITS == region.SLOT_COUNT and 1 << _ENTRY_BITS == region.OWNER_ENTRY_SIZE
SLOT_SHIFT = 64 - _SLOT_BITS - _ENTRY_BITS
SLOT_MASK = (region.SLOT_COUNT - 1) * region.OWNER_ENTRY_SIZE


def build(address: int, probe_indexes, window: Window, flags_live: bool,
          refs: RuntimeRefs, arguments=()) -> bytes:
    """Displaced instructions before the probe point, the counting block, the rest."""
    before = [i for i in window.insns if i.address < window.probe_address]
    after = [i for i in window.insns if i.address >= window.probe_address]
    block_size = len(_counting_block(Writer(address), probe_indexes, flags_live, refs,
                                     dry_run=True))
    where = relocator.layout(window.insns, address, window.probe_address if before else None,
                             block_size)
    w = Writer(address)
    relocator.emit(w, before, where)
    _counting_block(w, probe_indexes, flags_live, refs)
    falls_through = relocator.emit(w, after, where) if after else True
    if falls_through:
        w.jmp(window.end)
    _out_of_line(w, probe_indexes, flags_live, refs)
    _trace_path(w, probe_indexes, flags_live, refs, arguments)
    return w.bytes()


def _counting_block(w: Writer, probe_indexes, flags_live: bool, refs: RuntimeRefs,
                    dry_run: bool = False):
    if flags_live:
        w.lea_rsp(-RED_ZONE)
        w.pushfq()
    w.label("check")
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
    for index in probe_indexes:
        w.inc_rdx_disp(8 * index)
    w.label("counted")
    w.cmp_rip_byte_imm8(refs.state + TRACING, 0)
    w.jcc("ne", "trace")
    w.label("traced")
    for reg in ("rdx", "rcx", "rax"):
        w.pop(reg)
    if not flags_live:
        w.lea_rsp(RED_ZONE)

    w.label("resume")
    if flags_live:
        w.popfq()
        w.lea_rsp(RED_ZONE)
    if dry_run:  # only the size is wanted: give the out-of-line labels a place
        w.label("slow")
        w.label("setup")
        w.label("trace")
        return w.bytes()
    return None


def _out_of_line(w: Writer, probe_indexes, flags_live: bool, refs: RuntimeRefs) -> None:
    w.label("slow")
    w.push("rsi")
    for index in probe_indexes:
        w.mov_esi_imm(8 * index)
        w.call(refs.slow_hit)
        if index != probe_indexes[-1]:  # slow_hit clobbers rax, rcx, rdx: set them again
            w.mov_reg_rip("rax", refs.state)
            w.mov_rcx_fs0()
            w.movabs_rdx(FIBONACCI)
            w.imul_rdx_rcx()
            w.shr_rdx(SLOT_SHIFT)
            w.and_edx(SLOT_MASK)
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


def _trace_path(w: Writer, probe_indexes, flags_live: bool, refs: RuntimeRefs,
                arguments) -> None:
    """Save every register as the frame trace_event reads arguments from; one event
    per probe at this site."""
    w.label("trace")
    for n in TRACE_PUSHES:
        w.push_r(n)
    frame_size = 8 * (len(TRACE_PUSHES) + 3)  # and rax, rcx, rdx, pushed first
    site_rsp = frame_size + (8 if flags_live else 0) + RED_ZONE
    for k, index in enumerate(probe_indexes):
        w.mov_rdi_rsp()
        w.lea_rcx_rsp(site_rsp)
        w.mov_esi_imm(index)
        w.lea_reg_rip("rdx", f"arguments{k}")
        w.call(refs.trace_event)
    for n in reversed(TRACE_PUSHES):
        w.pop_r(n)
    w.jmp("traced")
    w.align(8)
    for k, _ in enumerate(probe_indexes):
        w.label(f"arguments{k}")
        w.raw(arguments[k] if k < len(arguments) else encode(()))
