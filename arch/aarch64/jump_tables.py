"""AArch64 jump tables, as GCC emits them (arch/jump_tables.py has the walk).

    cmp   w0, #N                   the bounds check
    b.hi  default                  (or b.ls dispatch)
    adrp  x1, T ; add x1, x1, :lo12:T
    ldrb  w1, [x1, w0, uxtw]       entries of 1, 2 or 4 bytes (ldrh ... uxtw #1, ldr ... uxtw #2)
    adr   x0, base
    add   x1, x0, w1, sxtb #2      target = base + 4 * entry (sxth/sxtw, uxtb/uxth)
    br    x1

Only the instructions below have a meaning here; any other that writes a register
makes it unknown.
"""

from __future__ import annotations

import functools
import re
from typing import Optional

import capstone
from capstone import arm64_const as A

from urewrite.arch.jump_tables import (INDEX, MASK64, Affine, Check, Entry, Semantics,
                                       add, read_index, recover_all)

_NO_FALL_THROUGH = frozenset("b br braa brab braaz brabz ret retaa retab udf brk hlt".split())
_CALLS = frozenset("bl blr blraa blrab blraaz blrabz".split())
_CONDITIONAL = frozenset("cbz cbnz tbz tbnz".split())
_INDIRECT = frozenset("br braa brab braaz brabz".split())
# unsigned compare then: (taken when in range, limit - largest index)
_BOUND = {"b.hi": (False, 0), "b.hs": (False, 1), "b.cs": (False, 1),
          "b.ls": (True, 0), "b.lo": (True, 1), "b.cc": (True, 1)}
# extended register operands: ("zx" or "sx", bits)
_EXTEND = {A.ARM64_EXT_UXTB: ("zx", 8), A.ARM64_EXT_UXTH: ("zx", 16), A.ARM64_EXT_UXTW: ("zx", 32),
           A.ARM64_EXT_SXTB: ("sx", 8), A.ARM64_EXT_SXTH: ("sx", 16), A.ARM64_EXT_SXTW: ("sx", 32)}
_LOADS = {"ldrb": (1, False), "ldrh": (2, False), "ldr": (None, False),
          "ldrsb": (1, True), "ldrsh": (2, True), "ldrsw": (4, True)}


class _AArch64(Semantics):
    callee_saved = frozenset(f"x{n}" for n in range(19, 30))

    def __init__(self, backend, insns, read):
        super().__init__(insns, read)
        self.backend = backend
        self.cs = _detailed()

    # -- control flow, on the quick decode -----------------------------------------
    def branch_target(self, insn):
        return self.backend.direct_branch_target(insn)

    def falls_through(self, insn) -> bool:
        return insn.mnemonic not in _NO_FALL_THROUGH

    def is_control(self, insn) -> bool:
        m = insn.mnemonic
        return m in _NO_FALL_THROUGH or m in _CALLS or m in _CONDITIONAL or m.startswith("b.") \
            or m in ("svc", ".word")

    def is_call(self, insn) -> bool:
        return insn.mnemonic in _CALLS

    def is_indirect(self, insn) -> bool:
        return insn.mnemonic in _INDIRECT

    def bound_branch(self, insn):
        return _BOUND.get(insn.mnemonic)

    def keeps_flags(self, insn) -> bool:
        return insn.mnemonic in ("mov", "adrp", "adr", "nop")

    def decode_detail(self, insn):
        if insn.mnemonic == ".word":
            return None
        return next(self.cs.disasm(insn.raw, insn.address), None)

    # -- values ----------------------------------------------------------------------
    def _reg(self, reg_id):
        """(family, bits) of a general register: x5 and w5 are family x5."""
        name = self.cs.reg_name(reg_id) if reg_id else ""
        if name in ("sp", "wsp"):
            return "sp", 64 if name == "sp" else 32
        if len(name) > 1 and name[0] in "xw" and name[1:].isdigit():
            return "x" + name[1:], 64 if name[0] == "x" else 32
        return None  # xzr, wzr, vector registers, ...

    def may_write(self, insn, family: str) -> bool:
        # every register an instruction writes is named in its text, but x30 for calls
        return insn.mnemonic == ".word" or self.is_call(insn) or \
            re.search(rf"\b[xw]{family[1:]}\b" if family != "sp" else r"\b(w?sp)\b",
                      insn.op_str) is not None

    def written(self, detailed) -> set:
        return {r[0] for r in map(self._reg, detailed.regs_access()[1]) if r}

    def constant_definition(self, detailed):
        ops = detailed.operands
        if detailed.mnemonic == "adr" and self._reg(ops[0].reg):
            return self._reg(ops[0].reg)[0], ops[1].imm & MASK64
        return None

    def pair_definition(self, first, second):
        if first.mnemonic != "adrp" or second.mnemonic != "add" or len(second.operands) != 3:
            return None
        family = self._reg(first.operands[0].reg)
        d, n, imm = second.operands
        if family is None or self._reg(d.reg) != family or self._reg(n.reg) != family or \
                imm.type != A.ARM64_OP_IMM or imm.shift.type:
            return None
        return family[0], (first.operands[1].imm + imm.imm) & MASK64

    def check(self, cmp) -> Optional[Check]:
        if cmp.mnemonic != "cmp" or len(cmp.operands) != 2:
            return None
        what, limit = cmp.operands
        reg = self._reg(what.reg) if what.type == A.ARM64_OP_REG else None
        if reg is None or reg[0] == "sp" or limit.type != A.ARM64_OP_IMM:
            return None
        value = limit.imm
        if limit.shift.type:
            if limit.shift.type != A.ARM64_SFT_LSL:
                return None
            value <<= limit.shift.value
        return Check(("reg", reg[0], reg[1]), value)

    def initial_state(self, check: Check):
        # a compare of w0 then an index x0: every write of w0 clears the upper half
        return {"regs": {check.operand[1]: INDEX}}

    def _register(self, state, op):
        """A register operand's value as 64 bits, its extension and shift applied."""
        reg = self._reg(op.reg)
        if reg is None or reg[0] == "sp":
            return None
        value = self.value(state, reg[0])
        ext = _EXTEND.get(op.ext)
        if ext is None and op.ext:
            return None
        if ext is None and reg[1] == 32:
            ext = ("zx", 32)
        if ext is not None:
            if isinstance(value, Entry):
                value = value.then(ext)
            elif isinstance(value, Affine) and value.scale == 0:
                value = Affine(0, Entry(0, 8, (ext,)).value(value.offset))
            else:
                limit = ext[1] - (1 if ext[0] == "sx" else 0)
                value = read_index(value, limit, state["count"])
        shift = op.shift
        if shift.type:
            if shift.type != A.ARM64_SFT_LSL or value is None:
                return None
            value = value.times(1 << shift.value) if isinstance(value, Affine) else \
                value.then(("mul", 1 << shift.value))
        return value

    def _operand(self, state, op):
        if op.type == A.ARM64_OP_IMM:
            value = op.imm
            if op.shift.type:
                if op.shift.type != A.ARM64_SFT_LSL:
                    return None
                value <<= op.shift.value
            return Affine(0, value & MASK64)
        if op.type == A.ARM64_OP_REG:
            return self._register(state, op)
        return None

    def _load(self, state, insn):
        size, signed = _LOADS[insn.mnemonic]
        dst, mem = insn.operands[0], insn.operands[1]
        dst_reg = self._reg(dst.reg)
        if dst_reg is None or mem.type != A.ARM64_OP_MEM or insn.writeback:
            return None
        if size is None:
            size = dst_reg[1] // 8
        base = self._reg(mem.mem.base)
        address = self.value(state, base[0]) if base and base[1] == 64 else None
        if not isinstance(address, Affine):
            return None
        address = address.plus(Affine(0, mem.mem.disp & MASK64))
        if mem.mem.index:
            index = self._register(state, _IndexOperand(mem))
            if not isinstance(index, Affine):
                return None
            address = address.plus(index)
        if address.scale != size:
            return None
        entry = Entry(address.offset, size)
        if signed:
            entry = entry.then(("sx", 8 * size))
            if dst_reg[1] == 32:
                entry = entry.then(("zx", 32))
        return entry

    def _result(self, state, insn):
        m, ops = insn.mnemonic, insn.operands
        if not ops or ops[0].type != A.ARM64_OP_REG or self._reg(ops[0].reg) is None:
            return None
        bits = self._reg(ops[0].reg)[1]
        if m in ("adrp", "adr") and ops[1].type == A.ARM64_OP_IMM:
            return Affine(0, ops[1].imm & MASK64)
        if m == "mov" and len(ops) == 2 and ops[1].type == A.ARM64_OP_REG:
            value = self._register(state, ops[1])
            return value if bits == 64 or value == INDEX else None
        if m == "add" and len(ops) == 3 and bits == 64:
            a = self._register(state, ops[1])
            b = self._operand(state, ops[2])
            return add(a, b)
        if m in _LOADS:
            return self._load(state, insn)
        return None

    def step(self, state: dict, insn) -> bool:
        value = self._result(state, insn)
        for family in self.written(insn):
            state["regs"].pop(family, None)
            state["killed"].add(family)
        if value is not None:
            state["regs"][self._reg(insn.operands[0].reg)[0]] = value
        return True

    def jump_value(self, state: dict, insn) -> Optional[Entry]:
        if insn.mnemonic != "br":
            return None
        value = self._register(state, insn.operands[0])
        return value if isinstance(value, Entry) else None


@functools.lru_cache(maxsize=1)
def _detailed():
    cs = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
    cs.detail = True
    return cs


class _IndexOperand:
    """The index register of a memory operand, seen as a register operand."""

    def __init__(self, mem_op):
        self.reg = mem_op.mem.index
        self.ext = mem_op.ext
        self.shift = mem_op.shift


def jump_tables(backend, insns: list, indexes: list, read) -> list:
    return recover_all(_AArch64(backend, insns, read), indexes)
