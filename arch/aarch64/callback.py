"""A C callback's stubs and checks on arm64 (programs/callback.py): each probe's stub
fills in its part of the context, then branches to the callback; compiled code that
would touch a register the probe does not save is refused."""

from __future__ import annotations

import re
from typing import List, Sequence, Tuple

from urewrite.arch.aarch64.writer import Writer
from urewrite.trampolines.program_file import (CTX_AREA, CTX_ARGS, CTX_MAPS,
                                               CTX_NAME, CTX_PROBE, USES_AREA, USES_PROBE)

# no floating-point or SIMD register; atomics inline, not libgcc's outline helpers;
# landing pads (bti) where the callback is reached through a register in a file whose
# pages are BTI-guarded
FLAGS = ("-mgeneral-regs-only", "-mno-outline-atomics", "-mbranch-protection=bti")
BTI_C = 0xD503245F
X0, X9, X10, XZR = 0, 9, 10, 31  # (31 as the stored register: xzr)
# b0-b31, h, s, d, q, v: the FP/SIMD registers; z and p: SVE's
_NOT_SAVED = re.compile(r"\b([bhsdqvz]\d{1,2}|p\d{1,2})(\.\w+)?\b")


def stubs(address: int, each: Sequence[tuple], function: int) -> Tuple[bytes, List[int]]:
    """Backend.callback_stubs: x0 holds the context. The stub is called through a
    register (bti c)."""
    w = Writer(address)
    starts = []
    for probe, kind, name, area, filled, read, uses in each:
        starts.append(w.pc)
        w.word(BTI_C)
        for i in range(filled, read):  # (the arguments it does not read are not filled in)
            w.str_(XZR, X0, CTX_ARGS + 8 * i)
        if uses & USES_PROBE:
            w.mov_imm(X9, probe)
            w.word(0xF2C00000 | (kind & 0xFFFF) << 5 | X9)  # movk x9, kind, lsl 32
            w.str_(X9, X0, CTX_PROBE)
            w.address_of(X9, name)
            w.str_(X9, X0, CTX_NAME)
        if uses & USES_AREA:
            w.ldr(X9, X0, CTX_MAPS)
            w.mov_imm(X10, area)
            w.add_reg(X9, X9, X10)
            w.str_(X9, X0, CTX_AREA)
        w.b(function)
    return w.bytes(), starts


def touches_unsaved_register(insn) -> bool:
    """Backend.touches_unsaved_register: the FP/SIMD and SVE registers."""
    return bool(_NOT_SAVED.search(insn.op_str)) or insn.mnemonic.startswith("f")
