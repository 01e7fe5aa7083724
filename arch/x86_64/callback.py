"""A C callback's stubs and checks on x86_64 (programs/callback.py): each probe's stub
fills in its part of the context, then jumps to the callback; compiled code that would
touch a register the probe does not save is refused; the registers a callback's (or a
program's) code may write, so that its direct entry saves those only."""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

from urewrite.arch.x86_64.writer import EAX, RAX, RDI, Mem, Rip, Writer
from urewrite.trampolines.program_file import (CTX_AREA, CTX_ARGS, CTX_MAPS,
                                               CTX_NAME, CTX_PROBE, USES_AREA, USES_PROBE)

FLAGS = ("-mgeneral-regs-only", "-fcf-protection=none")
# x87, MMX, SSE and AVX registers: what -mgeneral-regs-only keeps out
_NOT_SAVED = re.compile(r"\b([xyz]mm\d+|mm\d|st(\(\d\))?|k[0-7])\b")


def stubs(address: int, each: Sequence[tuple], function: int) -> Tuple[bytes, List[int]]:
    """Backend.callback_stubs: rdi holds the context."""
    w = Writer(address)
    starts = []
    for probe, kind, name, area, filled, read, uses in each:
        starts.append(w.pc)
        if filled < read:  # (the arguments it does not read are not filled in)
            w.mov(EAX, 0)  # (a store each: no loop to mispredict)
            for i in range(filled, read):
                w.mov(Mem(RDI, disp=CTX_ARGS + 8 * i), RAX)
        if uses & USES_PROBE:
            w.movabs(RAX, probe | kind << 32)  # probe, then kind
            w.mov(Mem(RDI, disp=CTX_PROBE), RAX)
            w.lea(RAX, Rip(name))
            w.mov(Mem(RDI, disp=CTX_NAME), RAX)
        if uses & USES_AREA:
            w.mov(RAX, Mem(RDI, disp=CTX_MAPS))
            w.add(RAX, area, imm32=True)
            w.mov(Mem(RDI, disp=CTX_AREA), RAX)
        w.jmp(function)
    return w.bytes(), starts


_GPRS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
         "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
_FULL = {**{name: name for name in _GPRS},
         **{f"r{n}{suffix}": f"r{n}" for n in range(8, 16) for suffix in "dwb"},
         **{"e" + name[1:]: name for name in _GPRS[:8]},
         **{name[1:]: name for name in _GPRS[:8]},
         "al": "rax", "ah": "rax", "bl": "rbx", "bh": "rbx", "cl": "rcx", "ch": "rcx",
         "dl": "rdx", "dh": "rdx", "sil": "rsi", "dil": "rdi", "bpl": "rbp", "spl": "rsp"}
_NAMED = re.compile(r"\b(" + "|".join(sorted(_FULL, key=len, reverse=True)) + r")\b")
# what the kernel writes at a system call (Capstone lists none of it); the 32-bit
# entries (int 0x80) cleared r8 to r11 too before Linux 4.17
_CLOBBERED_BY = {"syscall": ("rax", "rcx", "r11"),
                 **{name: ("rax", "rcx", "r8", "r9", "r10", "r11") for name in ("sysenter", "int")}}


def registers_written(decoder, code: bytes, start: int,
                      memo: Optional[dict] = None) -> Optional[frozenset]:
    """Backend.registers_written, over-approximated: every instruction reachable from
    `start` (through branches, jumps and calls whose targets lie in `code`), and the
    64-bit registers it names or Capstone says it reads or writes (its lists of
    implicit writes miss some, as cmpxchg's rax: no x86 instruction writes r8-r15
    without naming them but a system call, which is added); None at an indirect jump
    or call, a target outside the code, or bytes that cannot be decoded. `memo` keeps
    the answer for each start and each call's or jump's target, so that a callback's
    thousands of stubs, each a jump to the same function, read that function once."""
    return _written_from(decoder, code, start, {} if memo is None else memo, [])


_DEPTH = 32  # targets read as starts of their own, one inside another, at most


def _written_from(decoder, code: bytes, start: int, memo: dict,
                  open_starts: list) -> Optional[frozenset]:
    if start not in memo:
        open_starts.append(start)
        memo[start] = _read_from(decoder, code, start, memo, open_starts)
        open_starts.pop()
    return memo[start]


def _read_from(decoder, code: bytes, start: int, memo: dict,
               open_starts: list) -> Optional[frozenset]:
    """_written_from's reading: the target of a call or an unconditional jump is read
    as a start of its own (its answer kept), unless one whose reading is under way
    further up (a loop back), or too deep: then its instructions are read here."""
    from capstone import CS_GRP_CALL, CS_GRP_JUMP, CS_GRP_RET, CS_OP_IMM
    written, seen, todo = set(), set(), [start]
    while todo:
        at = todo.pop()
        while at not in seen:
            if not 0 <= at < len(code):
                return None
            seen.add(at)
            insn = next(decoder.disasm(code[at:at + 16], at, 1), None)
            if insn is None:
                return None
            read, wrote = insn.regs_access()
            written.update(_FULL.get(decoder.reg_name(r), "") for r in read + wrote)
            written.update(_FULL[name] for name in _NAMED.findall(insn.op_str))
            written.update(_CLOBBERED_BY.get(insn.mnemonic, ()))
            if insn.group(CS_GRP_RET):
                break
            if insn.group(CS_GRP_JUMP) or insn.group(CS_GRP_CALL):
                operand = insn.operands[0] if len(insn.operands) == 1 else None
                if operand is None or operand.type != CS_OP_IMM:
                    return None  # (where it goes is not in the code)
                target = operand.imm
                whole = insn.mnemonic in ("jmp", "call")
                if whole and target not in open_starts and len(open_starts) < _DEPTH:
                    found = _written_from(decoder, code, target, memo, open_starts)
                    if found is None:
                        return None
                    written |= found
                else:
                    todo.append(target)
                if insn.mnemonic == "jmp":
                    break
            at += insn.size
    return frozenset(written - {"", "rsp"})


def touches_unsaved_register(insn) -> bool:
    """Backend.touches_unsaved_register: x87, MMX, SSE, AVX and AVX-512's registers."""
    return bool(_NOT_SAVED.search(insn.op_str)) or \
        insn.mnemonic.startswith(("f", "v", "emms")) and insn.mnemonic not in ("fxsave", "fxrstor")


def context_read(decoder, code: bytes, start: int) -> Optional[frozenset]:
    """Backend.context_read (arch/context_walk.py): the context's pointer in rdi at
    `start`, followed into any register a 64-bit `mov` copies it to. A holder read
    otherwise than as the only register of a memory operand (pushed, stored, added
    to, an lea, an index, a string instruction's implicit use) or written in part:
    None."""
    from urewrite.arch.context_walk import words_read
    return words_read(decoder, code, start, "rdi", 16,
                      lambda insn, holders, words: _examine(decoder, insn, holders, words),
                      "jmp")


def _examine(decoder, insn, holders: frozenset, words: set) -> Optional[frozenset]:
    """context_walk's `examine` on x86_64."""
    from capstone import CS_AC_READ, CS_AC_WRITE
    from capstone.x86 import X86_OP_MEM, X86_OP_REG, X86_REG_INVALID

    def full(register: int) -> str:
        return _FULL.get(decoder.reg_name(register) or "", "")

    if any(full(r) in holders for r in insn.regs_read):
        return None  # (an implicit use: movs, stos, ...)
    copied = None
    operands = insn.operands
    for k, op in enumerate(operands):
        if op.type == X86_OP_REG and full(op.reg) in holders and op.access & CS_AC_READ:
            dst = operands[0]  # (a copy: mov reg64, holder)
            if insn.mnemonic != "mov" or len(operands) != 2 or k != 1 or \
                    dst.type != X86_OP_REG or dst.size != 8 or op.size != 8:
                return None
            copied = full(dst.reg)
        if op.type != X86_OP_MEM:
            continue
        base, index = op.mem.base, op.mem.index
        if index != X86_REG_INVALID and full(index) in holders:
            return None
        if base == X86_REG_INVALID or full(base) not in holders:
            continue
        if index != X86_REG_INVALID or op.size <= 0 or insn.mnemonic == "lea" or \
                op.mem.segment != X86_REG_INVALID or decoder.reg_name(base) != full(base):
            return None
        first, last = op.mem.disp, op.mem.disp + op.size - 1
        words.update(range(first - first % 8, last + 1, 8))
    written = {(full(op.reg), op.size) for op in operands
               if op.type == X86_OP_REG and op.access & CS_AC_WRITE} | \
        {(full(r), 8) for r in insn.regs_write}
    if any(name in holders and size < 4 for name, size in written):
        return None  # (a holder written in part: a pointer near the context)
    return holders - {name for name, _ in written} | ({copied} if copied else set())
