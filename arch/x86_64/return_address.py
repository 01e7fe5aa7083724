"""Whether an x86_64 function reads its own return address (then it may not be redirected).

A redirected function finds its return stub's address where its return address
was. Code that reads that slot (setjmp-like helpers, __builtin_return_address)
would see the stub. Found here:
- along the paths from the entry (direct branches), with the stack depth followed
  through push, pop, and rsp plus or minus a constant: a read of the slot, or a
  pop of it;
- in a function that starts with `push rbp; mov rbp, rsp`: any read of [rbp + 8].
A jump from the function to its own entry (a loop, a self tail call) is refused
too: it would run the entry trampoline again and count a return per pass.
Reads through a copied pointer are not seen; docs/design.md says so.

The native module (native/src/return_address.rs) makes the same walk over iced-x86's
decode where it was built, and answers for most functions; this file words what it
finds, and walks the rest itself with Capstone.
"""

from __future__ import annotations

from typing import Optional

import capstone
from capstone import x86_const as X

from urewrite.arch.x86_64.linear_sweep import native_sweep

_decoder = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_decoder.detail = True

# Capstone's Python binding builds an instruction's detail (operands, groups) on first
# use, slowly, and return probes ask it of whole functions. So detail is read only where it
# can matter: groups once per instruction id (they depend on nothing else), operands of
# jumps, and of instructions whose text names rsp or rbp (a memory operand based on
# one, or rsp written, always shows it).
_GROUPS = (X.X86_GRP_JUMP, X.X86_GRP_CALL, X.X86_GRP_RET, X.X86_GRP_INT, X.X86_GRP_IRET)
_groups_of_id: dict = {}


def _groups(insn) -> frozenset:
    """Which of _GROUPS the instruction is in."""
    found = _groups_of_id.get(insn.id)
    if found is None:
        found = _groups_of_id[insn.id] = frozenset(g for g in _GROUPS if insn.group(g))
    return found


def _operands(insn, register: str) -> list:
    """The instruction's operands when its text names `register`; else none that
    matter here."""
    return insn.operands if register in insn.op_str else []


def problem(code: bytes, address: int) -> Optional[str]:
    found = native_sweep and native_sweep.return_address_problem(code, address)
    if found is None:  # (no native module, or a function it leaves to this one)
        return python_problem(code, address)
    kind, at = found
    if kind == native_sweep.RETURN_ADDRESS_FINE:
        return None
    insn = next(_decoder.disasm(code[at - address:], at, 1))
    if kind == native_sweep.RETURN_ADDRESS_JUMPS_TO_ENTRY:
        return _jumps_back(insn)
    if kind == native_sweep.RETURN_ADDRESS_POPS:
        return _pops(insn)
    return _reads(insn)


def python_problem(code: bytes, address: int) -> Optional[str]:
    insns = list(_decoder.disasm(code, address))
    body = insns[1:] if insns and insns[0].id == X.X86_INS_ENDBR64 else insns
    entry = {address, body[0].address} if body else set()
    for insn in insns:
        if X.X86_GRP_JUMP not in _groups(insn):
            continue
        ops = insn.operands
        if len(ops) == 1 and ops[0].type == X.X86_OP_IMM and ops[0].imm in entry:
            return _jumps_back(insn)
    framed = (len(body) >= 2 and body[0].id == X.X86_INS_PUSH and body[0].op_str == "rbp"
              and body[1].id == X.X86_INS_MOV and body[1].op_str == "rbp, rsp")
    if framed:
        for insn in insns:
            if any(op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RBP
                   and op.mem.index == 0 and op.mem.disp == 8 for op in _operands(insn, "rbp")):
                return _reads(insn)
    # the stack depth (bytes pushed since the entry: the return address is at
    # [rsp + depth]) along the paths from the entry, as far as it is known
    at = {insn.address: insn for insn in insns}
    depth_at = {address: 0} if insns else {}
    pending = [address] if insns else []
    while pending:
        insn = at[pending.pop()]
        depth = depth_at[insn.address]
        if any(op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RSP and op.mem.index == 0
               and op.mem.disp == depth for op in _operands(insn, "rsp")):
            return _reads(insn)
        if insn.id == X.X86_INS_POP and depth == 0:
            return _pops(insn)
        change = _stack_change(insn)
        if change is None:
            continue  # rsp set some other way: the depth is unknown from here
        for successor in _successors(insn):
            if successor in at and successor not in depth_at:
                depth_at[successor] = depth + change
                pending.append(successor)
    return None


def _reads(insn) -> str:
    return f"'{insn.mnemonic} {insn.op_str}' at {insn.address:#x} reads its return address"


def _pops(insn) -> str:
    return f"'{insn.mnemonic} {insn.op_str}' at {insn.address:#x} pops its return address"


def _jumps_back(insn) -> str:
    return (f"'{insn.mnemonic} {insn.op_str}' at {insn.address:#x} jumps back to its entry, "
            f"which would redirect again and count a return per pass")


def _successors(insn) -> tuple:
    following = insn.address + insn.size
    groups = _groups(insn)
    if X.X86_GRP_RET in groups or X.X86_GRP_INT in groups or X.X86_GRP_IRET in groups:
        return ()
    if X.X86_GRP_CALL in groups:
        return (following,)  # the callee pops what the call pushed
    if X.X86_GRP_JUMP in groups:
        ops = insn.operands
        target = (ops[0].imm,) if len(ops) == 1 and ops[0].type == X.X86_OP_IMM else ()
        return target if insn.id == X.X86_INS_JMP else target + (following,)
    return (following,)


def _stack_change(insn) -> Optional[int]:
    """Bytes `insn` pushes (negative: pops), or None when rsp changes otherwise."""
    if insn.id in (X.X86_INS_PUSH, X.X86_INS_PUSHFQ):
        return 8
    if insn.id in (X.X86_INS_POP, X.X86_INS_POPFQ):
        return -8
    ops = _operands(insn, "rsp")
    writes_rsp = ops and ops[0].type == X.X86_OP_REG and ops[0].reg == X.X86_REG_RSP \
        and ops[0].access & capstone.CS_AC_WRITE
    if not writes_rsp:
        return 0
    if insn.id in (X.X86_INS_SUB, X.X86_INS_ADD) and len(ops) == 2 and ops[1].type == X.X86_OP_IMM:
        return ops[1].imm if insn.id == X.X86_INS_SUB else -ops[1].imm
    if insn.id == X.X86_INS_LEA and ops[1].mem.base == X.X86_REG_RSP and ops[1].mem.index == 0:
        return -ops[1].mem.disp
    return None
