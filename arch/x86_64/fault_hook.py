"""The fault hook: the trampoline at the entry of Go's signal handler (runtime.sigtramp)
that makes a fault in a moved instruction look as it does in the original.

A fault in an instruction a window moved happens at its trampoline address, which Go's
runtime finds in none of its tables (docs/design.md, "Go programs"). Before the
handler's own instructions, the hook looks the interrupted PC up in a table of every
moved instruction of Go code (trampoline address -> original address) and, for a
fault the kernel reports (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP with si_code > 0),
sets it to the original's: the registers there are the original's at that
instruction, so Go's handler panics, prints and recovers as in the original. A signal
another process or thread sends (si_code <= 0: preemption, profiling) is left alone,
as is any PC outside the table. It runs only when a signal arrives, never on a hit.

    [code]    lea r8, [table]; the signal and si_code tested; a binary search of the
              interrupted RIP (ucontext's) among the table's; on a match, RIP set
    [moved]   the handler's displaced instructions, then a jump back
    [table]   count, then (trampoline address, original address) pairs, both as
              offsets from the table, sorted by the first
"""

from __future__ import annotations

from typing import Sequence, Tuple

from urewrite.arch.base import Window
from urewrite.arch.fault_table import FAULT_SIGNALS, SI_CODE, encode
from urewrite.arch.x86_64 import relocator
from urewrite.arch.x86_64.writer import Writer

UC_RIP = 168  # ucontext_t: uc_flags, uc_link, uc_stack (40), then gregs[REG_RIP = 16]
LEA_SIZE = 7  # lea r8, [rip + disp32]: the first instruction


def _source(table_disp: int) -> str:
    tests = "".join(f"    cmp edi, {sig}\n    je fh_check\n" for sig in FAULT_SIGNALS[:-1])
    return f"""
    lea r8, [rip + {table_disp}]
{tests}    cmp edi, {FAULT_SIGNALS[-1]}
    jne fh_done
fh_check:
    cmp dword ptr [rsi + {SI_CODE}], 0
    jle fh_done
    mov rax, qword ptr [rdx + {UC_RIP}]
    sub rax, r8
    xor r9d, r9d
    mov r10, qword ptr [r8]
fh_loop:
    cmp r9, r10
    jae fh_done
    lea r11, [r9 + r10]
    shr r11, 1
    mov rcx, r11
    shl rcx, 4
    cmp rax, qword ptr [r8 + rcx + 8]
    je fh_found
    jl fh_below
    lea r9, [r11 + 1]
    jmp fh_loop
fh_below:
    mov r10, r11
    jmp fh_loop
fh_found:
    mov rax, qword ptr [r8 + rcx + 16]
    add rax, r8
    mov qword ptr [rdx + {UC_RIP}], rax
fh_done:
"""


def build(address: int, window: Window, moved: Sequence[Tuple[int, int]]) -> bytes:
    """The hook at `address` (its first byte is its entry), for the handler's
    `window` (decoded in detail) and the `moved` instructions ((trampoline address,
    original address) each)."""
    from urewrite.arch.runtime_asm import assemble_twice

    def code(disp: int) -> bytes:
        return assemble_twice(_source(disp), address, "KS_ARCH_X86", "KS_MODE_64",
                               "the fault hook")

    size = len(code(0x7fffff00))  # (a disp32 either way: the size does not change)
    w = Writer(address + size)
    if relocator.emit(w, window.insns, relocator.layout(window.insns, address + size)):
        w.jmp(window.end)
    displaced = w.bytes()
    table_at = address + size + len(displaced) + (-(size + len(displaced)) % 8)
    hook = code(table_at - (address + LEA_SIZE))
    assert len(hook) == size and hook[:3] == b"\x4c\x8d\x05", "lea r8, [rip + disp32] first"
    return (hook + displaced + bytes(table_at - address - size - len(displaced)) +
            encode(table_at, moved))
