"""The walk both backends' `context_read` share (Backend.context_read): a C callback's
code read path by path from its start, with the registers that hold the context's
pointer on each path; what one instruction does with them is each backend's
(arch/*/callback.py, `examine`)."""

from __future__ import annotations

from typing import Callable, Optional

_STATES = 100_000  # instructions read with the holders they had, at most


def words_read(decoder, code: bytes, start: int, first: str, window: int,
               examine: Callable, jump: str) -> Optional[frozenset]:
    """The offsets of the context's 8-byte words the code at `start` may read, the
    pointer in register `first` there; None where it may go further than loads through
    it, control goes through a register or out of `code`, or bytes cannot be decoded.
    `examine(insn, holders, words)` adds the words `insn` reads through a holder and
    gives the holders after it, or None. A path ends at a return, at an unconditional
    jump (`jump`: its mnemonic; its target is read) or where no register holds the
    pointer (never copied, it cannot come back). A call passes the holders on: its
    target is read with them, and what follows it too (they may still hold it)."""
    from capstone import CS_GRP_CALL, CS_GRP_JUMP, CS_GRP_RET, CS_OP_IMM
    words, seen, todo = set(), set(), [(start, frozenset((first,)))]
    while todo:
        at, holders = todo.pop()
        while holders and (at, holders) not in seen:
            if not 0 <= at < len(code) or len(seen) > _STATES:
                return None
            seen.add((at, holders))
            insn = next(decoder.disasm(code[at:at + window], at, 1), None)
            if insn is None:
                return None
            holders = examine(insn, holders, words)
            if holders is None:
                return None
            if insn.group(CS_GRP_RET):
                break
            if insn.group(CS_GRP_JUMP) or insn.group(CS_GRP_CALL):
                target = insn.operands[-1] if insn.operands else None  # (x86: its only
                # operand; arm64's cbz and tbz: the last)
                if target is None or target.type != CS_OP_IMM:
                    return None
                todo.append((target.imm, holders))
                if insn.mnemonic == jump:
                    break
            at += insn.size
    return frozenset(words)
