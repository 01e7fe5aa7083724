"""How far below the site's stack pointer a trampoline and the runtime routines it
calls reach, found by walking every path of their code (x86_64 and arm64).

The walk follows branches inside the given code, enters calls (a callee's depth
adds to its caller's), and ends a path at a return or at a jump out of the code
(back to the program, where the stack pointer must be the site's again). A move
of the stack pointer to somewhere else (lazy_init_aside's own stack) stops the
count until it comes back. A loop that pushes on each turn is followed TURNS
turns. Used by tests/test_go_stack.py.
"""

from __future__ import annotations

import re

import capstone

LIMIT = 1 << 16  # a path reaching this deep has a loop that pushes: a defect
# a loop that pushes on each turn (append_decimal: one digit each) is followed this
# many turns: a u64 has 20 decimal digits
TURNS = 20


class Code:
    """Code bytes at `base`, decoded on demand."""

    def __init__(self, arch: str, pieces):
        self.arch = arch
        self.pieces = sorted(pieces)  # (address, bytes)
        if arch == "x86_64":
            self.cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        else:
            self.cs = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
        self._cache = {}
        self.callees = {}
        # routines a branch enters only where the room they need was checked at run
        # time: the walk stops there (their own depth is checked against that room)
        self.stops = set()

    def holds(self, address: int) -> bool:
        return any(a <= address < a + len(b) for a, b in self.pieces)

    def insn(self, address: int):
        if address not in self._cache:
            for a, b in self.pieces:
                if a <= address < a + len(b):
                    self._cache[address] = next(self.cs.disasm(b[address - a:address - a + 16],
                                                               address, 1))
                    break
            else:
                raise KeyError(hex(address))
        return self._cache[address]

    def depth(self, entry: int, writes_below=None) -> tuple:
        """(deepest, popped): the most bytes below the stack pointer at `entry` that
        any path from there uses, and what its returns take off the stack beyond
        the return address (x86 `ret n`). `writes_below`: a set that receives the
        offsets (from the entry's sp, negative) of stores by sp-based addresses
        (arm64), to check which slots the code writes."""
        deepest, popped = 0, None
        seen, turns = set(), {}
        todo = [(entry, 0, False)]
        while todo:
            address, offset, aside = todo.pop()
            if (address, offset, aside) in seen:
                continue
            seen.add((address, offset, aside))
            turns[address, aside] = turns.get((address, aside), 0) + 1
            if turns[address, aside] > TURNS:
                continue
            if -offset > LIMIT:
                raise AssertionError(f"stack use grows without bound at {address:#x}")
            deepest = max(deepest, -offset)
            step = (self._x86 if self.arch == "x86_64" else self._arm64)(
                self.insn(address), offset, aside, writes_below)
            for kind, value in step:
                if kind == "deepest":
                    deepest = max(deepest, value)
                elif kind == "return":
                    if popped is not None and popped != value:
                        raise AssertionError(f"returns pop {popped} and {value} bytes")
                    popped = value
                else:
                    todo.append(value)
        return deepest, popped or 0

    def _callee(self, target: int):
        if target not in self.callees:
            self.callees[target] = self.depth(target)
        return self.callees[target]

    def _leave(self, address: int, offset: int, aside: bool):
        """A jump out of the code: back to the program, at the site's stack pointer."""
        if aside or offset != 0:
            raise AssertionError(f"leaves the code at {address:#x} with sp {offset:+d} "
                                 f"from the site's{' (on the set-up stack)' if aside else ''}")
        return []

    def _call(self, insn, target: int, offset: int, aside: bool, ret_size: int):
        after = (insn.address + insn.size, offset, aside)
        if not self.holds(target):
            raise AssertionError(f"a call out of the code at {insn.address:#x}")
        callee, popped = self._callee(target)
        if aside:
            return [("next", after)]
        after = (after[0], offset + popped, aside)
        return [("deepest", -offset + ret_size + callee), ("next", after)]

    # -- x86_64 ------------------------------------------------------------------
    def _x86(self, insn, offset: int, aside: bool, _writes):
        m, ops = insn.mnemonic, insn.op_str
        nxt = insn.address + insn.size
        move = 0 if aside else 1
        if m in ("push", "pushfq"):
            return [("next", (nxt, offset - 8 * move, aside))]
        if m in ("pop", "popfq"):
            return [("next", (nxt, offset + 8 * move, aside))]
        if m == "call" and not ops.startswith("0x"):
            # through a pointer: a probe program's code (run_program), which never runs
            # in Go code (programs/attach.py refuses Go programs): its return address only
            return [("deepest", -offset + 8), ("next", (nxt, offset, aside))]
        if m == "call":
            return self._call(insn, int(ops, 16), offset, aside, 8)
        if m == "ret":
            return [("return", int(ops, 0) if ops else 0)]
        if m in ("ud2", "int3", "hlt"):
            return []
        if m == "jmp":
            if not ops.startswith("0x"):
                return self._leave(insn.address, offset, aside)
            target = int(ops, 16)
            if not self.holds(target):
                return self._leave(insn.address, offset, aside)
            return [("next", (target, offset, aside))]
        if m.startswith("j") or m.startswith("loop"):
            target = int(ops, 16)
            if not self.holds(target):  # a conditional tail call, taken
                return self._leave(insn.address, offset, aside) + [("next", (nxt, offset, aside))]
            return [("next", (target, offset, aside)), ("next", (nxt, offset, aside))]
        if ops.startswith("rsp,") or ops == "rsp":
            lea = re.fullmatch(r"rsp, \[rsp(?: ([+-]) (0x[0-9a-f]+|\d+))?\]", ops)
            if m == "lea" and lea:
                delta = int(lea[2], 0) * (-1 if lea[1] == "-" else 1) if lea[1] else 0
                return [("next", (nxt, offset + delta * move, aside))]
            imm = re.fullmatch(r"rsp, (0x[0-9a-f]+|\d+)", ops)
            if m in ("add", "sub") and imm:
                delta = int(imm[1], 0) * (1 if m == "add" else -1)
                return [("next", (nxt, offset + delta * move, aside))]
            if m in ("mov", "lea"):  # to another stack, or back
                return [("next", (nxt, offset, not aside))]
            if m in ("cmp", "test"):
                return [("next", (nxt, offset, aside))]
            raise AssertionError(f"unknown write of rsp at {insn.address:#x}: {m} {ops}")
        return [("next", (nxt, offset, aside))]

    # -- arm64 -------------------------------------------------------------------
    def _arm64(self, insn, offset: int, aside: bool, writes):
        m, ops = insn.mnemonic, insn.op_str
        nxt = insn.address + insn.size
        move = 0 if aside else 1
        if m == "bl":
            return self._call(insn, int(ops.lstrip("#"), 16), offset, aside, 0)
        if m == "ret":
            return [("return", 0)]
        if m in ("brk", "udf"):
            return []
        if m == "blr":
            # a probe program's code (run_program), which never runs in Go code
            # (NO_PROGRAMS): the call itself takes no stack
            return [("next", (nxt, offset, aside))]
        if m == "br":
            return self._leave(insn.address, offset, aside)
        if m == "b":
            target = int(ops.lstrip("#"), 16)
            if target in self.stops:
                return []
            if not self.holds(target):
                return self._leave(insn.address, offset, aside)
            return [("next", (target, offset, aside))]
        if m.startswith("b.") or m in ("cbz", "cbnz", "tbz", "tbnz"):
            target = int(ops.split("#")[-1], 16)
            return [("next", (target, offset, aside)), ("next", (nxt, offset, aside))]
        memory = re.search(r"\[sp(?:, #(-?0x[0-9a-f]+|-?\d+))?\](!)?(?:, #(-?0x[0-9a-f]+|-?\d+))?$",
                           ops)
        if memory and m.startswith(("st", "ld")):
            disp = int(memory[1], 0) if memory[1] else 0
            if m.startswith("st") and writes is not None and not aside:
                size = 16 if m.startswith("stp") else 8
                writes.update(range(offset + disp, offset + disp + size, 8))
            if memory[2]:  # pre-index: sp moves first
                return [("next", (nxt, offset + disp * move, aside))]
            if memory[3]:  # post-index
                return [("next", (nxt, offset + int(memory[3], 0) * move, aside))]
            return [("next", (nxt, offset, aside))]
        if ops.startswith("sp, ") and m != "cmp":  # (cmp sp, xN writes only the flags)
            imm = re.fullmatch(r"sp, sp, #(0x[0-9a-f]+|\d+)", ops)
            if m in ("add", "sub") and imm:
                delta = int(imm[1], 0) * (1 if m == "add" else -1)
                return [("next", (nxt, offset + delta * move, aside))]
            if m == "mov":  # to another stack, or back
                return [("next", (nxt, offset, not aside))]
            raise AssertionError(f"unknown write of sp at {insn.address:#x}: {m} {ops}")
        return [("next", (nxt, offset, aside))]
