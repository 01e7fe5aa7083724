"""x86_64 jump tables, as GCC emits them (arch/jump_tables.py has the walk).

    PIE, -O2:  cmp edi, N; ja default; lea rdx, [rip+T]; mov edi, edi
               movsxd rax, [rdx+rdi*4]; add rax, rdx; (notrack) jmp rax
    PIE, -O0:  cmp dword [rbp-4], N; ja default; mov eax, [rbp-4]; lea rdx, [rax*4]
               lea rax, [rip+T]; mov eax, [rdx+rax]; cdqe; lea rdx, [rip+T]
               add rax, rdx; (notrack) jmp rax
    non-PIE:   cmp edi, N; ja default; mov edi, edi; (notrack) jmp [T+rdi*8]
               (-O0: mov eax, [rbp-4]; mov rax, [T+rax*8]; jmp rax)

Only the instructions below have a meaning here; any other that writes a register
makes it unknown, any store forgets the compared stack slot.
"""

from __future__ import annotations

from typing import Optional

import capstone
from capstone import x86_const as X

from urewrite.arch.jump_tables import (INDEX, MASK64, Affine, Check, Entry, LowIndex,
                                       Semantics, WriterFacts, add, read_index, recover_all)

_CONDITIONAL = frozenset("jo jno jb jae je jne jbe ja js jns jp jnp jl jge jle jg jrcxz jecxz "
                         "jcxz loop loope loopne".split())
_NO_FALL_THROUGH = frozenset("jmp ret retf ud2 hlt".split())
# unsigned compare then: (taken when in range, limit - largest index)
# no segment, or ds: (a `notrack` prefix is a ds override, which 64-bit mode ignores)
_FLAT_SEGMENTS = (X.X86_REG_INVALID, X.X86_REG_DS)
_BOUND = {"ja": (False, 0), "jae": (False, 1), "jbe": (True, 0), "jb": (True, 1)}


def _register_table() -> dict:
    """capstone register name -> (64-bit family, bits it names)."""
    table = {}
    for a in "abcd":
        table.update({f"r{a}x": (f"r{a}x", 64), f"e{a}x": (f"r{a}x", 32),
                      f"{a}x": (f"r{a}x", 16), f"{a}l": (f"r{a}x", 8), f"{a}h": (f"r{a}x", 0)})
    for r in ("si", "di", "bp", "sp"):
        table.update({f"r{r}": (f"r{r}", 64), f"e{r}": (f"r{r}", 32), r: (f"r{r}", 16),
                      f"{r}l": (f"r{r}", 8)})
    for n in range(8, 16):
        table.update({f"r{n}": (f"r{n}", 64), f"r{n}d": (f"r{n}", 32), f"r{n}w": (f"r{n}", 16),
                      f"r{n}b": (f"r{n}", 8)})
    return table  # bits 0: ah..dh, not the low bits of anything


_REGISTERS = _register_table()


def _last_word(insn) -> str:
    return insn.mnemonic.split()[-1] if insn.mnemonic else ""


class _X86(Semantics):
    callee_saved = frozenset("rbx rbp r12 r13 r14 r15".split())

    def __init__(self, backend, insns, read):
        super().__init__(insns, read)
        self.backend = backend
        self.cs = backend._full
        self.facts = backend.jump_table_facts  # (may_write() says nothing here)

    def facts_of(self, raw: bytes) -> WriterFacts:
        quick = self.backend.decode(raw, 0)
        as_swept = len(quick) == 1 and quick[0].size == len(raw)
        detailed = next(self.cs.disasm(raw, 0), None)
        written = frozenset(self.written(detailed)) \
            if detailed is not None and detailed.size == len(raw) else None
        return WriterFacts(as_swept, as_swept and self.is_call(quick[0]), written)

    # -- control flow, on the quick decode -----------------------------------------
    def branch_target(self, insn):
        return self.backend.direct_branch_target(insn)

    def falls_through(self, insn) -> bool:
        return _last_word(insn) not in _NO_FALL_THROUGH

    def is_control(self, insn) -> bool:
        m = _last_word(insn)
        return m in _CONDITIONAL or m in _NO_FALL_THROUGH or m in ("call", "int3", "syscall")

    def is_call(self, insn) -> bool:
        return _last_word(insn) == "call"

    def is_indirect(self, insn) -> bool:
        return self.backend.is_indirect_jump(insn)

    def bound_branch(self, insn):
        return _BOUND.get(insn.mnemonic) if self.branch_target(insn) is not None else None

    def decode_detail(self, insn):
        try:
            code = self.read(insn.address, insn.size)
        except Exception:
            return None
        decoded = next(self.cs.disasm(code, insn.address), None)
        return decoded if decoded is not None and decoded.size == insn.size else None

    # -- values ----------------------------------------------------------------------
    def _reg(self, reg_id):
        return _REGISTERS.get(self.cs.reg_name(reg_id))

    def written(self, detailed) -> set:
        return {self._reg(r)[0] for r in detailed.regs_access()[1] if self._reg(r)}

    def constant_definition(self, detailed):
        ops = detailed.operands
        if detailed.mnemonic == "lea" and ops[0].size == 8 and ops[1].mem.base == X.X86_REG_RIP \
                and not ops[1].mem.index:
            return self._reg(ops[0].reg)[0], detailed.address + detailed.size + ops[1].mem.disp
        return None

    def check(self, cmp) -> Optional[Check]:
        if cmp.mnemonic != "cmp" or len(cmp.operands) != 2:
            return None
        what, limit = cmp.operands
        if limit.type != X.X86_OP_IMM:
            return None
        bits = 8 * what.size
        value = limit.imm & ((1 << bits) - 1)
        if what.type == X.X86_OP_REG:
            reg = self._reg(what.reg)
            if reg is None or reg[1] != bits:
                return None
            return Check(("reg", reg[0], bits), value)
        if what.type == X.X86_OP_MEM:
            mem = what.mem
            base = self._reg(mem.base) if mem.base else None
            if base is None or base[0] not in ("rbp", "rsp") or mem.index or \
                    mem.segment not in _FLAT_SEGMENTS:
                return None
            return Check(("slot", base[0], mem.disp, what.size), value)
        return None

    def keeps_flags(self, insn) -> bool:
        return insn.mnemonic in ("mov", "movzx", "movsx", "movsxd", "lea", "nop", "movabs")

    def initial_state(self, check: Check):
        if check.operand[0] == "slot":
            return {"regs": {}, "slot": check.operand[1:]}
        _, family, bits = check.operand
        # A 32-bit compare then a 64-bit index: GCC relies on the upper half being zero
        # (every 32-bit write clears it); were it not, the load would be wild anyway.
        return {"regs": {family: INDEX if bits >= 32 else LowIndex(bits)}, "slot": None}

    def _address(self, state, insn, op) -> Optional[Affine]:
        mem = op.mem
        if mem.segment not in _FLAT_SEGMENTS:
            return None
        total = Affine(0, mem.disp & MASK64)
        for reg_id, scale in ((mem.base, 1), (mem.index, mem.scale)):
            if not reg_id:
                continue
            if reg_id == X.X86_REG_RIP:
                total = total.plus(Affine(0, insn.address + insn.size))
                continue
            reg = self._reg(reg_id)
            value = self.value(state, reg[0]) if reg and reg[1] == 64 else None
            if not isinstance(value, Affine):
                return None
            total = total.plus(value.times(scale))
        return total

    def _load(self, state, insn, op, signed: bool):
        """A memory operand's value, zero-extended to 64 bits (or sign-extended)."""
        mem = op.mem
        base = self._reg(mem.base) if mem.base else None
        if state["slot"] and base and not mem.index and mem.segment in _FLAT_SEGMENTS and \
                state["slot"] == (base[0], mem.disp, op.size):
            return INDEX if not signed or state["count"] <= 1 << (8 * op.size - 1) else None
        address = self._address(state, insn, op)
        if address is None or address.scale != op.size:
            return None
        entry = Entry(address.offset, op.size)
        return entry.then(("sx", 8 * op.size)) if signed else entry

    def _source(self, state, insn, op, bits: int):
        """A register or immediate operand as a 64-bit value, zero-extended from `bits`."""
        if op.type == X.X86_OP_IMM:
            return Affine(0, op.imm & ((1 << bits) - 1))
        if op.type != X.X86_OP_REG:
            return None
        reg = self._reg(op.reg)
        if reg is None or reg[1] != bits:
            return None
        value = self.value(state, reg[0])
        if bits == 64:
            return value
        if isinstance(value, Affine) and value.scale == 0:
            return Affine(0, value.offset & ((1 << bits) - 1))
        if isinstance(value, Entry):
            return value.then(("zx", bits))
        return read_index(value, bits, state["count"])

    def _result(self, state, insn):
        """The value `insn` writes to its first operand, a register, or None."""
        m, ops = insn.mnemonic, insn.operands
        if m == "cdqe":
            value = self.value(state, "rax")
            if isinstance(value, Entry):
                return value.then(("sx", 32))
            if value == INDEX and state["count"] <= 1 << 31:
                return INDEX
            return None
        if not ops or ops[0].type != X.X86_OP_REG:
            return None
        dst_bits = 8 * ops[0].size
        src = ops[1] if len(ops) > 1 else None
        if m == "mov" and dst_bits in (32, 64):
            if src.type == X.X86_OP_MEM:
                return self._load(state, insn, src, signed=False)
            return self._source(state, insn, src, dst_bits)
        if m == "movzx" and dst_bits in (32, 64):
            if src.type == X.X86_OP_MEM:
                return self._load(state, insn, src, signed=False)
            return self._source(state, insn, src, 8 * src.size)
        if m in ("movsxd", "movsx") and dst_bits == 64 and src.type == X.X86_OP_MEM:
            return self._load(state, insn, src, signed=True)
        if m == "lea" and dst_bits == 64:
            return self._address(state, insn, src)
        if m == "add" and dst_bits == 64:
            a = self.value(state, self._reg(ops[0].reg)[0])
            b = self._source(state, insn, src, 64)
            return add(a, b)
        if m == "shl" and dst_bits == 64 and src.type == X.X86_OP_IMM and 0 <= src.imm < 8:
            a = self.value(state, self._reg(ops[0].reg)[0])
            if isinstance(a, Affine):
                return a.times(1 << src.imm)
            if isinstance(a, Entry):
                return a.then(("mul", 1 << src.imm))
        return None

    def step(self, state: dict, insn) -> bool:
        value = self._result(state, insn)
        families = self.written(insn)
        stores = any(op.type == X.X86_OP_MEM and op.access & capstone.CS_AC_WRITE
                     for op in insn.operands) or _last_word(insn).startswith(("push", "stos",
                                                                               "movs"))
        for family in families:
            state["regs"].pop(family, None)
            state["killed"].add(family)
        slot = state["slot"]
        if stores or (slot and slot[0] in families):
            state["slot"] = None
        if value is not None:
            state["regs"][self._reg(insn.operands[0].reg)[0] if insn.operands else "rax"] = value
        return True

    def jump_value(self, state: dict, insn) -> Optional[Entry]:
        if _last_word(insn) != "jmp" or len(insn.operands) != 1:
            return None
        op = insn.operands[0]
        if op.type == X.X86_OP_REG:
            reg = self._reg(op.reg)
            value = self.value(state, reg[0]) if reg and reg[1] == 64 else None
        elif op.type == X.X86_OP_MEM and op.size == 8:
            value = self._load(state, insn, op, signed=False)
        else:
            return None
        return value if isinstance(value, Entry) else None


def jump_tables(backend, insns: list, indexes: list, read) -> list:
    return recover_all(_X86(backend, insns, read), indexes)
