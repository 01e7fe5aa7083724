"""Whether an AArch64 function uses its return address other than to return (then
its return address may not be redirected to a return stub).

At its first instruction a function's return address is in x30; a redirected
function finds its return stub's address there instead. That is only sound
where x30 is saved, restored and returned through, and nothing else:
- pointer authentication: paciasp/pacibsp (or any other PAC instruction on x30,
  retaa/retab) sign the address with sp as the modifier, and the entry trampoline
  runs after the landing pad, so the stub's address would fail authentication;
- any other read of x30 (`mov x1, x30`, `xpaclri`, `br x30`: what
  __builtin_return_address compiles to), and a store of it anywhere but through
  sp or x29 (into a jmp_buf, say);
- a load of the slot it was saved in, into another register: along the paths from
  the entry (direct branches), with sp and x29 followed as offsets from the
  entry's sp (sub/add of a constant, pre- and post-index writeback, mov x29, sp);
  and once x29 points at the frame record {x29, x30}, any load of [x29 + 8].
Reads through a copied pointer are not seen; docs/design.md says so.
"""

from __future__ import annotations

from typing import Iterator, Optional

import capstone
from capstone import arm64_const as A

_decoder = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
_decoder.detail = True

LR, FP, SP = A.ARM64_REG_X30, A.ARM64_REG_X29, A.ARM64_REG_SP
_READ, _WRITE = capstone.CS_AC_READ, capstone.CS_AC_WRITE
# hint-space PAC instructions on x30 (paciaz, paciasp, pacibz, pacibsp, autiaz,
# autiasp, autibz, autibsp) and retaa, retab
_PAC_WORDS = {0xD503231F, 0xD503233F, 0xD503235F, 0xD503237F, 0xD503239F, 0xD50323BF,
              0xD50323DF, 0xD50323FF, 0xD65F0BFF, 0xD65F0FFF}
# bti c, bti jc, paciasp, pacibsp: what may precede the entry window
_LANDING_PADS = {0xD503245F, 0xD50324DF, 0xD503233F, 0xD503237F}
_ENDS = ("ret", "retaa", "retab", "br", "braa", "brab", "braaz", "brabz", "eret", "udf",
         "brk", "hlt")
_CONDITIONAL = ("cbz", "cbnz", "tbz", "tbnz")
_BYTES = {"b": 1, "h": 2, "w": 4, "s": 4, "x": 8, "d": 8, "q": 16, "v": 16}


def problem(code: bytes, address: int) -> Optional[str]:
    insns = list(_instructions(code, address))
    for insn in insns:
        if _signs_return_address(insn):
            return (f"'{_text(insn)}' at {insn.address:#x} signs or authenticates its return "
                    f"address (pointer authentication): the stub's address would fail it")
    for insn in insns:
        why = _uses_x30(insn)
        if why:
            return f"'{_text(insn)}' at {insn.address:#x} {why}"
    loop = _branch_to_entry(insns, address)
    if loop:
        return loop
    return _reads_saved_slot(insns, address)


def _branch_to_entry(insns, address: int) -> Optional[str]:
    """A jump from the function to its own entry (a loop, a self tail call) would run
    the entry trampoline again, redirect again, and count a return per pass."""
    entry = {address}
    if insns and insns[0].address == address and \
            int.from_bytes(insns[0].bytes, "little") in _LANDING_PADS:
        entry.add(address + 4)
    for insn in insns:
        jump = insn.mnemonic == "b" or insn.mnemonic.startswith("b.") or \
            insn.mnemonic in _CONDITIONAL
        if jump and insn.operands[-1].type == A.ARM64_OP_IMM and \
                insn.operands[-1].imm in entry:
            return (f"'{_text(insn)}' at {insn.address:#x} jumps back to its entry, which "
                    f"would redirect again and count a return per pass")
    return None


def _instructions(code: bytes, address: int) -> Iterator:
    """Every word that decodes (data words in code are skipped: they read nothing)."""
    for at in range(0, len(code) - 3, 4):
        insn = next(_decoder.disasm(code[at:at + 4], address + at), None)
        if insn is not None:
            yield insn


def _text(insn) -> str:
    return f"{insn.mnemonic} {insn.op_str}".strip()


def _signs_return_address(insn) -> bool:
    word = int.from_bytes(insn.bytes, "little")
    if word in _PAC_WORDS:
        return True
    # pacia/pacib/autia/autib (and their z forms) with x30 as the register signed
    return word & 0xFFFFC000 == 0xDAC10000 and word & 31 == 30


def _is_store(insn) -> bool:
    return insn.mnemonic.startswith("st")


def _uses_x30(insn) -> Optional[str]:
    """Why this instruction uses x30 as a value, other than saving it on the stack
    or returning through it; else None."""
    if insn.mnemonic == "ret" and not insn.operands:
        return None
    read, _ = insn.regs_access()
    if LR not in read:
        return None
    if _is_store(insn):
        base = next((op.mem.base for op in insn.operands if op.type == A.ARM64_OP_MEM), None)
        data = [op.reg for op in insn.operands if op.type == A.ARM64_OP_REG]
        if base in (SP, FP) and LR in data and not insn.mnemonic.startswith("stx") \
                and not insn.mnemonic.startswith("stlx"):
            return None
        return "stores its return address elsewhere than its stack frame"
    return "reads its return address"


def _reads_saved_slot(insns, address: int) -> Optional[str]:
    at = {insn.address: insn for insn in insns}
    # sp and x29 as offsets from the entry's sp (x29: None when unknown), along the
    # paths from the entry; the offsets x30 was saved at
    state = {address: (0, None)} if address in at else {}
    pending = list(state)
    slots = set()
    order = []
    while pending:
        insn = at[pending.pop()]
        sp, fp = state[insn.address]
        order.append(insn)
        mem = next((op for op in insn.operands if op.type == A.ARM64_OP_MEM), None)
        base = {SP: sp, FP: fp}.get(mem.mem.base) if mem is not None and not mem.mem.index \
            else None
        if base is not None and _is_store(insn):
            where = base + _pre_index(insn, mem)
            slots.update(offset for reg, offset in _data_registers(insn, where) if reg == LR)
        following = _next_state(insn, sp, fp, mem)
        if following is None:
            continue  # sp set some other way: unknown from here
        for successor in _successors(insn):
            if successor in at and successor not in state:
                state[successor] = following
                pending.append(successor)
    for insn in order:  # loads of a slot x30 was saved in, into another register
        sp, fp = state[insn.address]
        mem = next((op for op in insn.operands if op.type == A.ARM64_OP_MEM), None)
        if mem is None or mem.mem.index or _is_store(insn) or not _is_load(insn):
            continue
        base = {SP: sp, FP: fp}.get(mem.mem.base)
        if base is None:
            continue
        for reg, offset in _data_registers(insn, base + _pre_index(insn, mem)):
            if reg != LR and any(offset < slot + 8 and slot < offset + _size(insn, reg)
                                 for slot in slots):
                return f"'{_text(insn)}' at {insn.address:#x} reads its return address"
    framed = any(fp is not None and fp + 8 in slots for _, fp in state.values())
    if framed:  # x29 points at the frame record: [x29 + 8] is the saved x30
        for insn in insns:
            mem = next((op for op in insn.operands if op.type == A.ARM64_OP_MEM), None)
            if mem is None or mem.mem.base != FP or mem.mem.index or not _is_load(insn):
                continue
            for reg, offset in _data_registers(insn, _pre_index(insn, mem)):
                if reg != LR and offset < 16 and 8 < offset + _size(insn, reg):
                    return f"'{_text(insn)}' at {insn.address:#x} reads its return address"
    return None


def _is_load(insn) -> bool:
    return insn.mnemonic.startswith(("ld", "cas", "swp"))


def _pre_index(insn, mem) -> int:
    """The offset the access is at (a post-indexed access is at its base)."""
    post = any(op.type == A.ARM64_OP_IMM for op in insn.operands)
    return 0 if post else mem.mem.disp


def _data_registers(insn, where: int):
    """(register, offset) of each register a load or store transfers, in order."""
    offset = where
    for op in insn.operands:
        if op.type != A.ARM64_OP_REG or not op.access & (_READ | _WRITE):
            continue
        if insn.mnemonic.startswith(("stx", "stlx")) and op is insn.operands[0]:
            continue  # the status register of a store-exclusive
        yield op.reg, offset
        offset += _size(insn, op.reg)


def _size(insn, reg) -> int:
    mnemonic = insn.mnemonic
    if mnemonic.endswith("b") and mnemonic.startswith(("ldr", "ldur", "str", "stur")):
        return 1
    if mnemonic.endswith("h") and mnemonic.startswith(("ldr", "ldur", "str", "stur")):
        return 2
    if mnemonic in ("ldrsw", "ldursw", "ldpsw"):
        return 4
    if mnemonic.startswith(("ld1", "ld2", "ld3", "ld4", "st1", "st2", "st3", "st4")):
        return 64  # a structure load: as far as it may reach
    return _BYTES.get(insn.reg_name(reg)[0], 8)


def _next_state(insn, sp: int, fp, mem) -> Optional[tuple]:
    """(sp, x29) after `insn`, or None when sp changes in a way not followed."""
    ops = insn.operands
    writes = [op.reg for op in ops if op.type == A.ARM64_OP_REG and op.access & _WRITE]
    if mem is not None and insn.writeback and mem.mem.base == SP:
        post = [op.imm for op in ops if op.type == A.ARM64_OP_IMM]
        sp += post[0] if post else mem.mem.disp
    elif SP in writes:
        value = _offset_of(insn, {SP: sp, FP: fp})
        if value is None:
            return None
        sp = value
    if FP in writes:
        fp = _offset_of(insn, {SP: sp, FP: fp})
    return sp, fp


def _offset_of(insn, known: dict) -> Optional[int]:
    """The value `mov rd, sp|x29` or `add|sub rd, sp|x29, #imm` gives rd, as an offset
    from the entry's sp, or None."""
    ops = insn.operands
    if insn.mnemonic == "mov" and len(ops) == 2 and ops[1].type == A.ARM64_OP_REG:
        return known.get(ops[1].reg)
    if insn.mnemonic in ("add", "sub") and len(ops) == 3 and ops[1].type == A.ARM64_OP_REG \
            and ops[2].type == A.ARM64_OP_IMM and known.get(ops[1].reg) is not None:
        imm = ops[2].imm << (ops[2].shift.value if ops[2].shift.type else 0)
        return known[ops[1].reg] + (imm if insn.mnemonic == "add" else -imm)
    return None


def _successors(insn) -> tuple:
    following = insn.address + 4
    mnemonic = insn.mnemonic
    if mnemonic in _ENDS:
        return ()
    if mnemonic in ("bl", "blr", "blraa", "blrab", "blraaz", "blrabz"):
        return (following,)
    target = insn.operands[-1].imm if insn.operands and \
        insn.operands[-1].type == A.ARM64_OP_IMM else None
    if mnemonic == "b":
        return (target,) if target is not None else ()
    if mnemonic.startswith("b.") or mnemonic in _CONDITIONAL:
        return (following, target) if target is not None else (following,)
    return (following,)
