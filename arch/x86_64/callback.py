"""A C callback's stubs and checks on x86_64 (programs/callback.py): each probe's stub
fills in its part of the context, then jumps to the callback; compiled code that would
touch a register the probe does not save is refused."""

from __future__ import annotations

import re
from typing import List, Sequence, Tuple

from urewrite.arch.x86_64.writer import EAX, RAX, RDI, Mem, Rip, Writer
from urewrite.trampolines.program_file import (ARGUMENTS, CTX_AREA, CTX_ARGS, CTX_MAPS,
                                               CTX_NAME, CTX_PROBE)

FLAGS = ("-mgeneral-regs-only", "-fcf-protection=none")
# x87, MMX, SSE and AVX registers: what -mgeneral-regs-only keeps out
_NOT_SAVED = re.compile(r"\b([xyz]mm\d+|mm\d|st(\(\d\))?|k[0-7])\b")


def stubs(address: int, each: Sequence[tuple], function: int) -> Tuple[bytes, List[int]]:
    """Backend.callback_stubs: rdi holds the context."""
    w = Writer(address)
    starts = []
    for probe, kind, name, area, filled in each:
        starts.append(w.pc)
        if filled < ARGUMENTS:
            w.mov(EAX, 0)  # (a store each: no loop to mispredict)
            for i in range(filled, ARGUMENTS):
                w.mov(Mem(RDI, disp=CTX_ARGS + 8 * i), RAX)
        w.movabs(RAX, probe | kind << 32)  # probe, then kind
        w.mov(Mem(RDI, disp=CTX_PROBE), RAX)
        w.lea(RAX, Rip(name))
        w.mov(Mem(RDI, disp=CTX_NAME), RAX)
        w.mov(RAX, Mem(RDI, disp=CTX_MAPS))
        w.add(RAX, area, imm32=True)
        w.mov(Mem(RDI, disp=CTX_AREA), RAX)
        w.jmp(function)
    return w.bytes(), starts


def touches_unsaved_register(insn) -> bool:
    """Backend.touches_unsaved_register: x87, MMX, SSE, AVX and AVX-512's registers."""
    return bool(_NOT_SAVED.search(insn.op_str)) or \
        insn.mnemonic.startswith(("f", "v", "emms")) and insn.mnemonic not in ("fxsave", "fxrstor")
