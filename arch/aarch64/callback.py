"""A C callback's stubs and checks on arm64 (programs/callback.py): each probe's stub
fills in its part of the context, then branches to the callback; compiled code that
would touch a register the probe does not save is refused."""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

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


def context_read(decoder, code: bytes, start: int) -> Optional[frozenset]:
    """Backend.context_read on arm64 (arch/context_walk.py), as x86_64's: the
    context's pointer in x0, followed into the registers a 64-bit `mov` copies it to;
    each load or store through one (no index, no writeback) names the words its bytes
    cover (its size from its mnemonic and registers). Read otherwise (added to, stored,
    a narrower copy, an index, a base written back): None."""
    from urewrite.arch.context_walk import words_read
    return words_read(decoder, code, start, "x0", 4,
                      lambda insn, holders, words: _examine(decoder, insn, holders, words),
                      "b")


def _examine(decoder, insn, holders: frozenset, words: set) -> Optional[frozenset]:
    """context_walk's `examine` on arm64."""
    from capstone import CS_AC_READ, CS_AC_WRITE
    from capstone.arm64 import ARM64_OP_MEM, ARM64_OP_REG, ARM64_REG_INVALID

    def full(register: int) -> str:
        name = decoder.reg_name(register) or ""
        name = {"fp": "x29", "lr": "x30", "w29": "x29", "w30": "x30"}.get(name, name)
        return "x" + name[1:] if name[:1] in "wx" and name[1:].isdigit() else name

    if any(full(r) in holders for r in insn.regs_read):
        return None
    operands = insn.operands
    copied = None
    for k, op in enumerate(operands):
        if op.type == ARM64_OP_REG and full(op.reg) in holders and op.access & CS_AC_READ \
                and not (k == 0 and insn.mnemonic in _WRITE_ONLY_FIRST):
            dst = operands[0]
            if insn.mnemonic != "mov" or len(operands) != 2 or k != 1 or \
                    dst.type != ARM64_OP_REG or not decoder.reg_name(dst.reg).startswith("x") \
                    or not decoder.reg_name(op.reg).startswith("x"):
                return None
            copied = full(dst.reg)
        if op.type != ARM64_OP_MEM:
            continue
        base, index = op.mem.base, op.mem.index
        if index != ARM64_REG_INVALID and full(index) in holders:
            return None
        if base == ARM64_REG_INVALID or full(base) not in holders:
            continue
        if index != ARM64_REG_INVALID or insn.writeback:
            return None
        size = _access_size(insn.mnemonic, [decoder.reg_name(o.reg) for o in operands[:k]
                                            if o.type == ARM64_OP_REG])
        first, last = op.mem.disp, op.mem.disp + size - 1
        words.update(range(first - first % 8, last + 1, 8))
    written = {full(op.reg) for op in operands
               if op.type == ARM64_OP_REG and op.access & CS_AC_WRITE} | \
        {full(r) for r in insn.regs_write}
    return holders - written | ({copied} if copied else set())


# Capstone 5 marks the destination of these read and written; they only write it
# (UBFM, SBFM and EXTR's aliases, the variable shifts): BFM's (bfi, bfxil) and movk do
# read theirs
_WRITE_ONLY_FIRST = frozenset(("lsl", "lsr", "asr", "ror", "ubfx", "sbfx", "ubfiz", "sbfiz",
                               "uxtb", "uxth", "sxtb", "sxth", "sxtw"))


def _access_size(mnemonic: str, registers: list) -> int:
    """The bytes a load or store moves: byte and halfword forms by their suffix, ldrsw's
    four, else its first register's width, twice for a pair."""
    if mnemonic.endswith("b"):
        each = 1
    elif mnemonic.endswith("h"):
        each = 2
    elif mnemonic.endswith("sw"):
        each = 4
    else:
        each = 8 if registers and registers[0].startswith("x") else 4
    return each * (2 if mnemonic.rstrip("sw").endswith("p") else 1)  # (ldp, ldpsw, ldxp, ...)
