"""Which x86_64 instructions may fault, told from their quick decode (Capstone's
Intel syntax), for Backend.may_fault: Go code's windows move none of them."""

from __future__ import annotations

import re

from urewrite.arch.base import Insn

# memory operands: an optional segment, then the bracketed address
_MEMORY = re.compile(r"(?:([cdefgs]s):)?\[([^\]]*)\]")
# trap by design, divide, or fault in user mode without any memory operand
_TRAPPING = frozenset((
    "ud0", "ud1", "ud2", "int3", "int", "int1", "into", "hlt", "div", "idiv", "xlatb",
    "in", "out", "insb", "insw", "insd", "outsb", "outsw", "outsd", "cli", "sti",
    "rdmsr", "wrmsr", "iretq", "iretd", "sysret", "sysexit"))
# operands in brackets that are no access: an address computed, a hint
_NO_ACCESS = ("lea", "nop", "prefetch")
STACK_POINTER, G_REGISTER = "rsp", "r14"  # Go's ABIInternal keeps g in r14


def may_fault(insn: Insn, g_in_register: bool) -> bool:
    words = insn.mnemonic.split()
    bare = words[-1] if words else ""
    if bare in _TRAPPING:
        return True
    if "[" not in insn.op_str or bare.startswith(_NO_ACCESS):
        return False
    safe = (STACK_POINTER, "rip", G_REGISTER) if g_in_register else (STACK_POINTER, "rip")
    return any(_address_may_fault(segment, address, safe)
               for segment, address in _MEMORY.findall(insn.op_str))


def _address_may_fault(segment: str, address: str, safe: tuple) -> bool:
    terms = [t.strip() for t in re.split(r"[+-]", address) if t.strip()]
    registers = [t for t in terms if not t[0].isdigit()]
    if segment in ("fs", "gs"):  # the thread's own block, at a constant offset
        return bool(registers)
    # one base register that is always mapped, no index (a scaled one has a `*`)
    return len(registers) != 1 or registers[0] not in safe
