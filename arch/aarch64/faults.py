"""Which arm64 instructions may fault, told from their quick decode (Capstone's
syntax), for Backend.may_fault: Go code's windows move none of them."""

from __future__ import annotations

from urewrite.arch.base import Insn

# trap by design; or reach memory at a register's address without brackets
_TRAPPING = frozenset(("brk", "udf", "hlt", "hvc", "smc", "dcps1", "dcps2", "dcps3",
                       ".word", "dc", "ic", "at", "sys", "sysl"))
_NO_ACCESS = ("prfm", "prfum", "prfb", "prfh", "prfw", "prfd")  # hints never fault
STACK_POINTER, G_REGISTER = "sp", "x28"  # Go's ABIInternal keeps g in x28


def may_fault(insn: Insn, g_in_register: bool) -> bool:
    if insn.mnemonic in _TRAPPING:
        return True
    if "[" not in insn.op_str or insn.mnemonic in _NO_ACCESS:
        return False  # (a literal load's address is its own code's: `ldr x0, #0x1234`)
    inside = insn.op_str[insn.op_str.index("[") + 1:insn.op_str.index("]")]
    parts = [p.strip() for p in inside.split(",")]
    base, rest = parts[0], parts[1:]
    safe = (STACK_POINTER, G_REGISTER) if g_in_register else (STACK_POINTER,)
    # one base that is always mapped, offset by a constant (`#n`), no index register
    return base not in safe or any(not p.startswith("#") for p in rest)
