"""Moves x86_64 instructions to a trampoline, rewriting what depends on their address.

Instructions come decoded in detail, or without detail where the planner found that
they run anywhere as they are (Backend.moves_verbatim): those are copied.

Rules:
- RIP-relative operands get a new displacement.
- Direct jmp/jcc become their rel32 forms; jrcxz/jecxz/loop* (rel8 only) expand
  into a short hop over a rel32 jmp.
- A call may only be the last displaced instruction. It becomes "push the
  original return address; jmp target", so the callee returns into the original
  code and unwinders see the original frames.
- Branches to an address inside the window go to that instruction's copy.
"""

from __future__ import annotations

import struct
from typing import Optional

from capstone import x86_const as X

from urewrite.arch.base import Insn
from urewrite.arch.x86_64.writer import RAX, RSP, Mem, Rip, Writer, rel32

_JCC = {
    X.X86_INS_JO: "o", X.X86_INS_JNO: "no", X.X86_INS_JB: "b", X.X86_INS_JAE: "ae",
    X.X86_INS_JE: "e", X.X86_INS_JNE: "ne", X.X86_INS_JBE: "be", X.X86_INS_JA: "a",
    X.X86_INS_JS: "s", X.X86_INS_JNS: "ns", X.X86_INS_JP: "p", X.X86_INS_JNP: "np",
    X.X86_INS_JL: "l", X.X86_INS_JGE: "ge", X.X86_INS_JLE: "le", X.X86_INS_JG: "g",
}
_LOOPS = {X.X86_INS_JRCXZ, X.X86_INS_JECXZ, X.X86_INS_LOOP, X.X86_INS_LOOPE, X.X86_INS_LOOPNE}
# the instructions that may have a direct target
_BRANCHES = frozenset({X.X86_INS_CALL, X.X86_INS_JMP, X.X86_INS_XBEGIN, *_JCC, *_LOOPS})

# Fixed sizes of what each relocated form takes, so a window's layout is known up front.
_CALL_EMULATION_PREFIX = 5 + 1 + 7 + 5 + 1  # lea rsp; push rax; lea rax,[rip]; mov [rsp+8],rax; pop rax


def _is_rip_relative(insn: Insn) -> bool:
    if "rip" not in insn.op_str:
        return False  # (asked before the operands: Capstone builds them on first use, slowly)
    d = insn.detail
    return any(op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RIP for op in d.operands)


def _uses_rsp(insn: Insn) -> bool:
    return any(op.type == X.X86_OP_MEM and X.X86_REG_RSP in (op.mem.base, op.mem.index)
               or op.type == X.X86_OP_REG and op.reg in (X.X86_REG_RSP, X.X86_REG_ESP)
               for op in insn.detail.operands)


def direct_target(insn: Insn) -> Optional[int]:
    """The target of a direct branch or call (decoded in detail), else None."""
    if insn.detail.id not in _BRANCHES:
        return None  # (asked before the operands: Capstone builds them on first use, slowly)
    ops = insn.detail.operands
    if len(ops) == 1 and ops[0].type == X.X86_OP_IMM:
        return ops[0].imm
    return None


def _is_call(insn: Insn) -> bool:
    return insn.detail.id == X.X86_INS_CALL


def _is_jump(insn: Insn) -> bool:
    return insn.detail.id == X.X86_INS_JMP or insn.detail.id in _JCC or insn.detail.id in _LOOPS


def call_problem(insn: Insn, is_last: bool, shadow_stack: bool) -> Optional[str]:
    """Why a call cannot run from a trampoline wherever it goes, or None: all there is
    to say of a direct call."""
    if not is_last:
        return f"'{insn}' would return into the displaced bytes"
    if shadow_stack:
        return f"'{insn}' cannot be emulated under the CET shadow stack this file enables"
    return None


def relocation_problem(insn: Insn, is_last: bool, shadow_stack: bool) -> Optional[str]:
    """Why this instruction cannot run from a trampoline, or None."""
    ident = insn.detail.id
    if ident == X.X86_INS_XBEGIN:
        return f"'{insn}' has an abort target relative to its address"
    if _is_call(insn):
        problem = call_problem(insn, is_last, shadow_stack)
        if problem is None and direct_target(insn) is None and _uses_rsp(insn):
            return f"'{insn}' takes its target relative to the stack pointer"
        return problem
    if _is_jump(insn) and direct_target(insn) is None and insn.detail.id != X.X86_INS_JMP:
        return f"'{insn}' is an indirect conditional branch"
    return None


def relocated_size(insn: Insn) -> int:
    """Bytes the relocated form of `insn` takes (see `relocate`)."""
    if insn.detail is None:  # known to run anywhere as it is (Backend.moves_verbatim)
        return insn.size
    ident = insn.detail.id
    if _is_call(insn):
        target = direct_target(insn)
        return _CALL_EMULATION_PREFIX + (5 if target is not None else insn.size)
    if direct_target(insn) is not None:
        if ident == X.X86_INS_JMP:
            return 5
        if ident in _JCC:
            return 6
        if ident in _LOOPS:
            return len(_prefixes(insn)) + 2 + 2 + 5
    return insn.size


def _prefixes(insn: Insn) -> bytes:
    """Legacy prefixes kept on a re-encoded loop/jrcxz (0x67 selects ecx)."""
    return bytes(b for b in insn.raw[:insn.size - 2] if b == 0x67)


def layout(insns, new_address: int, gaps: dict = None) -> dict:
    """Where each displaced instruction goes, with gaps[a] bytes kept free before the
    instruction at address a (a probe point): a branch to a goes to its gap."""
    gaps = gaps or {}
    where = {}
    at = new_address
    for insn in insns:
        where[insn.address] = at
        at += gaps.get(insn.address, 0) + relocated_size(insn)
    return where


def emit_one(w: Writer, insn: Insn, where: dict, taken_to: Optional[str] = None) -> bool:
    """Write one relocated instruction at w.pc; False when it never falls through.
    `taken_to`: a conditional jump goes to this label instead of its target."""
    if taken_to is not None:
        w.jcc(_JCC[insn.detail.id], taken_to)
        return True
    return _emit(w, insn, where)


def emit(w: Writer, insns, where: dict) -> bool:
    """Write relocated `insns` at w.pc; False when the last never falls through."""
    falls_through = True
    for insn in insns:
        falls_through = _emit(w, insn, where)
    return falls_through


def relocate(insns, new_address: int) -> tuple:
    """The displaced instructions, re-encoded to run from `new_address`.

    Returns (code, falls_through): falls_through is False when the last
    instruction never continues to the next one (jmp, ret, emulated call).
    """
    w = Writer(new_address)
    falls_through = emit(w, insns, layout(insns, new_address))
    return w.bytes(), falls_through


def _mapped(target: int, layout: dict) -> int:
    return layout.get(target, target)


def verbatim_returns(insn: Insn) -> bool:
    """Whether `insn` (decoded without detail) is a near return (`ret`, `ret imm16`,
    with prefixes such as `rep` or `bnd`): it runs anywhere as it is, and never goes on."""
    return insn.mnemonic.rpartition(" ")[2] in ("ret", "retq")


def _emit(w: Writer, insn: Insn, layout: dict) -> bool:
    if insn.detail is None:  # known to run anywhere as it is (Backend.moves_verbatim)
        w.raw(insn.raw)
        return not verbatim_returns(insn)
    ident = insn.detail.id
    target = direct_target(insn)
    if _is_call(insn):
        # push the original return address, then jump: the callee returns to the original code
        w.lea(RSP, Mem(RSP, disp=-8))
        w.push(RAX)
        w.lea(RAX, Rip(insn.end))
        w.mov(Mem(RSP, disp=8), RAX)
        w.pop(RAX)
        if target is not None:
            w.jmp(_mapped(target, layout))
        else:
            w.raw(_retarget_indirect(insn, w.pc, as_jump=True))
        return False
    if target is not None and ident == X.X86_INS_JMP:
        w.jmp(_mapped(target, layout))
        return False
    if target is not None and ident in _JCC:
        w.jcc(_JCC[ident], _mapped(target, layout))
        return True
    if target is not None and ident in _LOOPS:
        # <op> +2 ; jmp +5 ; jmp rel32 target
        w.raw(_prefixes(insn) + bytes((insn.raw[-2], 0x02, 0xEB, 0x05)))
        w.jmp(_mapped(target, layout))
        return True
    w.raw(_retarget_indirect(insn, w.pc, as_jump=False))
    # (every instruction of the RET group has "ret" in its mnemonic: asked first, as the
    # group makes Capstone build the instruction's whole detail)
    return not (ident == X.X86_INS_JMP or "ret" in insn.mnemonic and
                insn.detail.group(X.X86_GRP_RET))


def _retarget_indirect(insn: Insn, new_address: int, as_jump: bool) -> bytes:
    """The instruction's bytes at `new_address`, with a RIP-relative displacement fixed.

    With `as_jump`, an indirect call (FF /2) becomes the matching jump (FF /4).
    """
    code = bytearray(insn.raw)
    d = insn.detail
    if as_jump:
        code[d.modrm_offset] = (code[d.modrm_offset] & 0xC7) | (4 << 3)
    if _is_rip_relative(insn):
        old_target = insn.end + d.disp
        new_end = new_address + insn.size
        code[d.disp_offset:d.disp_offset + 4] = rel32(new_end, old_target)
    return bytes(code)



_KEPT_PREFIXES = (0x64, 0x65, 0x67)  # fs, gs, address size: they change what is read


def load_jump_target(insn: Insn, new_address: int, rsp_shift: int) -> bytes:
    """`mov rdx, <operand>` at `new_address`, for the indirect `jmp <operand>` (FF /4,
    decoded in detail): what the jump would go to, read the same way, with rsp
    lower by `rsp_shift` bytes than at the jump. notrack and bnd are dropped."""
    d = insn.detail
    raw = insn.raw
    opcode = d.modrm_offset - 1
    if raw[opcode] != 0xFF or (raw[d.modrm_offset] >> 3) & 7 != 4:
        raise ValueError(f"'{insn}' is not an indirect jmp")
    rex = d.rex if d.rex else 0
    legacy = bytes(b for b in raw[:opcode - (1 if rex else 0)] if b in _KEPT_PREFIXES)
    modrm = raw[d.modrm_offset]
    mod, rm = modrm >> 6, modrm & 7
    tail = raw[d.modrm_offset + 1:]  # SIB, displacement
    on_stack = mod != 3 and rm == 4 and tail[0] & 7 == 4 and not rex & 1  # base rsp
    if on_stack:
        disp = {0: 0, 1: struct.unpack("<b", tail[1:2])[0] if mod == 1 else 0,
                2: struct.unpack("<i", tail[1:5])[0] if mod == 2 else 0}[mod] + rsp_shift
        mod, tail = (1, tail[:1] + struct.pack("<b", disp)) if -128 <= disp < 128 else \
            (2, tail[:1] + struct.pack("<i", disp))
    code = bytearray(legacy + bytes((0x48 | rex & 3, 0x8B, mod << 6 | 2 << 3 | rm)) + tail)
    if mod == 0 and rm == 5:  # rip-relative: the displacement is the last 4 bytes
        code[-4:] = rel32(new_address + len(code), insn.end + d.disp)
    return bytes(code)
