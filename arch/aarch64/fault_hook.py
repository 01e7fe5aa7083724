"""The fault hook on arm64 (x86_64's fault_hook.py says what it does and why): at the
entry of Go's signal handler, x0 = signal, x1 = siginfo, x2 = ucontext; x9-x15 are free.

    [code]    adr x9, table; the signal and si_code tested; a binary search of the
              interrupted PC (the ucontext's) among the table's; on a match, PC set
    [moved]   the handler's displaced instruction, then a branch back
    [table]   count, then (trampoline address, original address) pairs, both as
              offsets from the table, sorted by the first
"""

from __future__ import annotations

import struct
from typing import Sequence, Tuple

from urewrite.arch.aarch64 import relocator
from urewrite.arch.aarch64.writer import b_imm
from urewrite.arch.base import Window
from urewrite.arch.fault_table import FAULT_SIGNALS, SI_CODE, encode

# ucontext: uc_flags, uc_link, uc_stack, uc_sigmask and its padding to 1024 bits (176),
# then sigcontext: fault_address, regs[31], sp, pc
UC_PC = 176 + 8 + 31 * 8 + 8
TABLE_REGISTER = 9


def _source() -> str:
    tests = "".join(f"    cmp w0, #{sig}\n    b.eq fh_check\n" for sig in FAULT_SIGNALS[:-1])
    return f"""
{tests}    cmp w0, #{FAULT_SIGNALS[-1]}
    b.ne fh_done
fh_check:
    ldr w10, [x1, #{SI_CODE}]
    cmp w10, #0
    b.le fh_done
    ldr x10, [x2, #{UC_PC}]
    sub x10, x10, x9
    mov x11, #0
    ldr x12, [x9]
fh_loop:
    cmp x11, x12
    b.hs fh_done
    add x13, x11, x12
    lsr x13, x13, #1
    add x14, x9, x13, lsl #4
    ldr x15, [x14, #8]
    cmp x10, x15
    b.eq fh_found
    b.lt fh_below
    add x11, x13, #1
    b fh_loop
fh_below:
    mov x12, x13
    b fh_loop
fh_found:
    ldr x15, [x14, #16]
    add x15, x15, x9
    str x15, [x2, #{UC_PC}]
fh_done:
"""


def _adr(rd: int, offset: int) -> int:
    """adr rd, .+offset (Keystone mis-encodes arm64 references to addresses)."""
    return 0x10000000 | (offset & 3) << 29 | ((offset >> 2) & 0x7FFFF) << 5 | rd


def build(address: int, window: Window, moved: Sequence[Tuple[int, int]]) -> bytes:
    """The hook at `address` (its first word is its entry), for the handler's `window`
    and the `moved` instructions ((trampoline address, original address) each)."""
    from urewrite.arch.runtime_asm import assemble_twice

    body = assemble_twice(_source(), address + 4, "KS_ARCH_ARM64", "KS_MODE_LITTLE_ENDIAN",
                           "the fault hook")
    at = address + 4 + len(body)
    displaced, falls_through = relocator.relocate(window.insns, at)
    if falls_through:
        displaced += struct.pack("<I", b_imm(at + len(displaced), window.end))
    end = at + len(displaced)
    table_at = end + (-end % 8)
    return (struct.pack("<I", _adr(TABLE_REGISTER, table_at - address)) + body + displaced +
            bytes(table_at - end) + encode(table_at, moved))
