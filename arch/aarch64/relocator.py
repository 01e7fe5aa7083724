"""Moves one AArch64 instruction to a trampoline, rewriting what depends on its address.

A site displaces exactly one 4-byte instruction. PC-relative ones become
equivalent sequences at the new address:
    ADR / ADRP            -> adrp (+ add) of the same address (nop into xzr)
    LDR/LDRSW literal     -> adrp + add into the destination, then a plain load
    LDR S/D/Q literal     -> the same through x16, saved around it
    PRFM literal          -> nop (a prefetch changes no state)
    B                     -> b to the same target
    BL / BLR              -> x30 = original return address, then b / br
    B.cond, CB(N)Z, TB(N)Z -> the same test hopping over "b next", then b target
Everything else is copied as it is.
"""

from __future__ import annotations

from typing import Optional

from urewrite.arch.base import Insn
from urewrite.arch.aarch64.writer import LR, SP, Writer

NOP = 0xD503201F
X16, X17 = 16, 17


def _sext(value: int, bits: int) -> int:
    return value - (1 << bits) if value >> (bits - 1) & 1 else value


def word_of(insn: Insn) -> int:
    return int.from_bytes(insn.raw[:4], "little")


def _is(word: int, mask: int, value: int) -> bool:
    return word & mask == value


def relocation_problem(insn: Insn, is_last: bool, shadow_stack: bool) -> Optional[str]:
    word = word_of(insn)
    if _is(word, 0xFEFFF800, 0xD63F0800) or _is(word, 0xFEFFF800, 0xD73F0800):
        return f"'{insn}' is an authenticated call"
    if shadow_stack and (_is(word, 0xFC000000, 0x94000000) or _is(word, 0xFFFFFC1F, 0xD63F0000)):
        return (f"'{insn}' is a call, and the file enables the Guarded Control Stack: the "
                f"trampoline's emulated call would not push the return address on it")
    return None


def relocate(insns, new_address: int) -> tuple:
    """(code, falls_through) for the displaced instruction(s) at `new_address`."""
    w = Writer(new_address)
    falls_through = True
    for insn in insns:
        falls_through = _emit(w, insn)
    return w.bytes(), falls_through


def emit_condition(w: Writer, insn: Insn) -> int:
    """A conditional branch (B.cond, CB(N)Z, TB(N)Z) whose taken edge falls through to
    what is written next, its other edge back to after the original; its target."""
    word, pc = word_of(insn), insn.address
    if _is(word, 0x7E000000, 0x36000000):  # TBZ/TBNZ (imm14 at bit 5)
        target = pc + 4 * _sext(word >> 5 & 0x3FFF, 14)
        w.word(word & ~(0x3FFF << 5) | 2 << 5)
    else:  # B.cond, BC.cond, CBZ/CBNZ (imm19 at bit 5)
        target = pc + 4 * _sext(word >> 5 & 0x7FFFF, 19)
        w.word(word & ~(0x7FFFF << 5) | 2 << 5)
    w.b(pc + 4)
    return target


def _emit(w: Writer, insn: Insn) -> bool:
    word, pc = word_of(insn), insn.address
    if _is(word, 0x7C000000, 0x14000000):  # B / BL
        target = pc + 4 * _sext(word & 0x3FFFFFF, 26)
        if word >> 31:
            w.address_of(LR, pc + 4)
        w.b(target)
        return False
    if _is(word, 0xFF000000, 0x54000000) or _is(word, 0x7E000000, 0x34000000):
        # B.cond and BC.cond (bit 4), CBZ/CBNZ (imm19 at bit 5)
        target = pc + 4 * _sext(word >> 5 & 0x7FFFF, 19)
        w.word(word & ~(0x7FFFF << 5) | 2 << 5)
        w.b(pc + 4)
        w.b(target)
        return False
    if _is(word, 0x7E000000, 0x36000000):  # TBZ/TBNZ (imm14 at bit 5)
        target = pc + 4 * _sext(word >> 5 & 0x3FFF, 14)
        w.word(word & ~(0x3FFF << 5) | 2 << 5)
        w.b(pc + 4)
        w.b(target)
        return False
    if _is(word, 0x1F000000, 0x10000000):  # ADR / ADRP
        rd = word & 31
        if rd == 31:  # xzr: the result goes nowhere (and "add x31" would mean sp)
            w.word(NOP)
            return True
        imm = _sext((word >> 5 & 0x7FFFF) << 2 | (word >> 29 & 3), 21)
        if word >> 31:
            w.adrp(rd, (pc & ~0xFFF) + (imm << 12))
        else:
            w.address_of(rd, pc + imm)
        return True
    if _is(word, 0x3B000000, 0x18000000):  # load literal
        return _emit_literal_load(w, word, pc)
    if _is(word, 0xFFFFFC1F, 0xD63F0000):  # BLR xn
        w.mov(X16, word >> 5 & 31)
        w.address_of(LR, pc + 4)
        w.br(X16)  # br through x16 is call-compatible for BTI
        return False
    w.word(word)
    return True


_GP_LOAD = {0: 0xB9400000, 1: 0xF9400000, 2: 0xB9800000}  # ldr wt / ldr xt / ldrsw xt, [xn]
_FP_LOAD = {0: 0xBD400000, 1: 0xFD400000, 2: 0x3DC00000}  # ldr st / dt / qt, [xn]


def _emit_literal_load(w: Writer, word: int, pc: int) -> bool:
    opc, vector, rt = word >> 30, word >> 26 & 1, word & 31
    target = pc + 4 * _sext(word >> 5 & 0x7FFFF, 19)
    if not vector and (opc == 3 or rt == 31):
        # PRFM is a hint; a load into xzr/wzr reads the file's own literal pool,
        # which cannot fault: dropping either changes nothing
        w.word(NOP)
    elif not vector:
        w.address_of(rt, target)
        w.word(_GP_LOAD[opc] | rt << 5 | rt)
    else:  # SIMD/FP destination: through x16, saved around it
        w.stp_pre(X16, X17, SP, -16)
        w.address_of(X16, target)
        w.word(_FP_LOAD[opc] | X16 << 5 | rt)
        w.ldp_post(X16, X17, SP, 16)
    return True
