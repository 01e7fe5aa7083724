"""x86_64 argument specs: sdt.h operands (AT&T syntax) and the SysV integer arguments.

Frame slots are where the trampoline saved each register (see trampoline.py):
r15 at slot 0 ... r8 at 7, then rdi, rbp, rbx, rsi, rdx, rax, rcx; 15 is the
stack pointer at the site.
"""

from __future__ import annotations

import re
from typing import Callable, List, Optional

from urewrite.trampolines.arguments import (CONSTANT, LINKED_MEMORY, MEMORY, REGISTER, ArgSpec,
                                            split_sdt)

SLOT = {"r15": 0, "r14": 1, "r13": 2, "r12": 3, "r11": 4, "r10": 5, "r9": 6, "r8": 7,
        "rdi": 8, "rbp": 9, "rbx": 10, "rsi": 11, "rdx": 12, "rax": 13, "rcx": 14, "rsp": 15}
# Pushed by the trace path after rcx, rax, rdx, rsi; the last one lands at slot 0.
TRACE_PUSHES = (3, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15)  # rbx rbp rdi r8 ... r15

_LEGACY = {"ax": "rax", "bx": "rbx", "cx": "rcx", "dx": "rdx", "si": "rsi", "di": "rdi",
           "bp": "rbp", "sp": "rsp"}
_ABI = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")
_MEMORY = re.compile(r"^(?P<disp>[^()]*)\((?P<base>%\w+)?(?:,(?P<index>%\w+)(?:,(?P<scale>\d))?)?\)$")


def register_slot(name: str) -> int:
    """Frame slot of a register named in any width: %eax, %ax, %al, %r9d, %sil ..."""
    name = name.lstrip("%")
    if name in SLOT:
        return SLOT[name]
    m = re.fullmatch(r"(r\d+)[dwb]?", name)
    if m and m.group(1) in SLOT:
        return SLOT[m.group(1)]
    if len(name) == 3 and name[0] == "e" and name[1:] in _LEGACY:
        return SLOT[_LEGACY[name[1:]]]
    if name in _LEGACY:
        return SLOT[_LEGACY[name]]
    if len(name) == 2 and name[1] == "l" and name[0] + "x" in _LEGACY:
        return SLOT[_LEGACY[name[0] + "x"]]
    if name in ("sil", "dil", "bpl", "spl"):
        return SLOT[_LEGACY[name[:2]]]
    raise ValueError(f"register {name} is not supported")


def sdt_arguments(text: str, symbol: Callable[[str], Optional[int]]) -> List[ArgSpec]:
    specs = []
    for size, signed, operand in split_sdt(text):
        specs.append(_operand(size, signed, operand, symbol))
    return specs


def _operand(size: int, signed: bool, operand: str, symbol) -> ArgSpec:
    if operand.startswith("$"):
        return ArgSpec(CONSTANT, size, signed, value=int(operand[1:], 0))
    if operand.startswith("%"):
        return ArgSpec(REGISTER, size, signed, base=register_slot(operand))
    m = _MEMORY.match(operand)
    if not m:
        raise ValueError(f"operand {operand} is not understood")
    disp = m.group("disp") or "0"
    if m.group("base") == "%rip":
        name, _, offset = re.match(r"([^+-]*)(([+-]\d+)?)$", disp).groups()[0:3]
        address = symbol(name) if name else None
        if address is None:
            raise ValueError(f"operand {operand}: symbol {name or '?'} not found")
        return ArgSpec(LINKED_MEMORY, size, signed, value=address + int(offset or 0))
    base = register_slot(m.group("base")) if m.group("base") else 16
    index = register_slot(m.group("index")) if m.group("index") else 16
    return ArgSpec(MEMORY, size, signed, base=base, index=index,
                   scale=int(m.group("scale") or 1), value=int(disp, 0))


def abi_arguments(count: int) -> List[ArgSpec]:
    return [ArgSpec(REGISTER, 8, True, base=SLOT[r]) for r in _ABI[:count]]


def abi_return() -> List[ArgSpec]:
    return [ArgSpec(REGISTER, 8, True, base=SLOT["rax"])]
