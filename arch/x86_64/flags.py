"""Whether the status flags may be live at a probe point inside a function (x86_64).

A trampoline's check and counting code change the six status flags (OF, SF, ZF, AF, CF,
PF). Where the code may read them after the probe point, the trampoline keeps them
(lahf and seto, then sahf: trampoline.py's "flags live" forms); where it surely does
not, the lighter forms do. They are dead at the point when the instructions from it
on, in order, change every one of them before any reads it:

- "undefined" counts as changed (`and` leaves AF undefined): no program can read such
  a flag before it sets it again, any more than a flag the trampoline changed;
- a shift or rotate by cl, a shld or shrd by cl, and a string instruction with a rep
  prefix change nothing when their count is 0: they kill no flag;
- a call or a return ends the walk, flags dead: the SysV ABI (and Go's) keep no flag
  across a call, as at a function's entry (Backend.flags_live_at_entry); a call of the
  next instruction (a push of its address) is no call;
- the walk follows the code as it runs: on past the window's end, and to a direct
  jump's target (a USDT site is often a `nop` then a `jmp` back to the code that
  skipped it: PostgreSQL's 13 such sites, and its LWLock probes, set the flags a few
  instructions on); any other branch, an instruction that reads flags still pending (a
  system call reads them all: the kernel keeps them), code it cannot read or decode, or
  more than WALK instructions: live.

It reads the input file's bytes (not the window's alone, and never a patched one), so
the sweep's two searches (Python and compiled) plan a site alike.
"""

from __future__ import annotations

from typing import Callable

import iced_x86
from iced_x86 import FlowControl, Mnemonic, OpKind

from urewrite.errors import UrewriteError

STATUS = 0x3F  # iced's RflagsBits: OF, SF, ZF, AF, CF, PF
WALK = 48  # instructions walked at most
_BY_COUNT = {Mnemonic.SHL, Mnemonic.SAL, Mnemonic.SHR, Mnemonic.SAR, Mnemonic.ROL,
             Mnemonic.ROR, Mnemonic.RCL, Mnemonic.RCR, Mnemonic.SHLD, Mnemonic.SHRD}
_ENDS_DEAD = {FlowControl.CALL, FlowControl.INDIRECT_CALL, FlowControl.RETURN}


def live_at(read: Callable[[int, int], bytes], point: int) -> bool:
    """Whether the status flags may be read after `point`, the code as `read(address,
    size)` gives it (an error where it has none)."""
    pending, address = STATUS, point
    for _ in range(WALK):
        insn = _decoded(read, address)
        if insn is None or insn.rflags_read & pending:
            return True
        if insn.flow_control in _ENDS_DEAD and not _calls_next(insn):
            return False
        if _kills(insn):
            pending &= ~insn.rflags_modified
            if not pending:
                return False
        if insn.flow_control == FlowControl.NEXT or _calls_next(insn):
            address = insn.next_ip
        elif insn.flow_control == FlowControl.UNCONDITIONAL_BRANCH and \
                insn.op0_kind == OpKind.NEAR_BRANCH64:
            address = insn.near_branch_target
        else:
            return True
    return True


def _calls_next(insn) -> bool:
    """A call of the next instruction: a push of its address (code that finds where it
    is), no call at all; the walk goes on."""
    return insn.flow_control == FlowControl.CALL and insn.op0_kind == OpKind.NEAR_BRANCH64 \
        and insn.near_branch_target == insn.next_ip


def _decoded(read, address: int):
    """The instruction at `address`, or None where there is none to read."""
    for size in range(15, 0, -1):  # (the longest an instruction is; less near an end)
        try:
            code = read(address, size)
        except UrewriteError:  # (outside the file's segments)
            continue
        insn = iced_x86.Decoder(64, code, ip=address).decode()
        return None if insn.code == iced_x86.Code.INVALID else insn
    return None


def _kills(insn) -> bool:
    """Whether the flags the instruction changes are changed whatever its operands."""
    if insn.has_rep_prefix or insn.has_repne_prefix:
        return False  # (a count of 0 runs no iteration)
    if insn.mnemonic in _BY_COUNT:  # by cl: maybe 0 (iced reads an immediate's count)
        return insn.op_kind(insn.op_count - 1) != OpKind.REGISTER
    return True
