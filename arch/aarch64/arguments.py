"""AArch64 argument specs: sdt.h operands (as GCC prints them) and the AAPCS64 integer arguments.

Frame slots are where trace_event (runtime.s) puts the site's registers: slot n
holds xn for n = 0 ... 30, slot 31 the site's sp; NONE and above read as 0.

The forms GCC emits for sdt.h's "nor" constraint: a register (`-4@x0`, `8@w1`,
the width is the size's business), a constant (`4@5`, `-8@-100000`), and
offsettable memory (`-8@[x19]`, `4@[sp, 12]`, `8@[x29, -16]`). Register plus
register (`[x0, x1]`, `[x0, x1, lsl 3]`) is accepted too. Anything else
(symbols such as `:lo12:`, floating-point registers, extended or written-back
addresses) is refused with its reason: an argument is never guessed.
"""

from __future__ import annotations

import re
from typing import Callable, List, Optional

from urewrite.trampolines.arguments import CONSTANT, MEMORY, REGISTER, ArgSpec

SP_SLOT = 31
NONE = 32  # "no register": reads as 0 (xzr, a missing base or index)
SIZES = (1, 2, 4, 8)
ABI_REGISTERS = 6  # x0 ... x5: as many as an event holds

_NUMBER = r"#?-?(?:0x[0-9a-fA-F]+|\d+)"
# one argument: "SIZE@OPERAND"; a memory operand holds spaces ("[sp, 44]")
_ARGUMENT = re.compile(r"\s*(?:(?P<size>-?\d+)@)?(?P<operand>\[[^\]]*\]|[^\s\[]+)")
_MEMORY = re.compile(r"^\[\s*(?P<base>\w+)\s*(?:,\s*(?P<second>[^,\]]+?)\s*"
                     r"(?:,\s*lsl\s*#?(?P<shift>\d+)\s*)?)?\]$")


def register_slot(name: str) -> int:
    """Frame slot of x0-x30 / w0-w30, sp / wsp, xzr / wzr (NONE: reads 0)."""
    name = name.strip().lower()
    if name in ("sp", "wsp"):
        return SP_SLOT
    if name in ("xzr", "wzr"):
        return NONE
    m = re.fullmatch(r"[xw](\d+)", name)
    if m and int(m.group(1)) <= 30:
        return int(m.group(1))
    if re.fullmatch(r"[bhsdqv]\d+(\.\w+)?", name):
        raise ValueError(f"{name} is a floating-point or vector register: not recorded")
    raise ValueError(f"register {name} is not understood")


def _number(text: str) -> Optional[int]:
    text = text.strip()
    if not re.fullmatch(_NUMBER, text):
        return None
    return int(text.lstrip("#"), 0)


def split_sdt(text: str) -> List[tuple]:
    """'-4@x0 8@[sp, 16]' -> [(4, True, 'x0'), (8, False, '[sp, 16]')]."""
    out, at = [], 0
    while text[at:].strip():
        m = _ARGUMENT.match(text, at)
        if not m or text[m.end():m.end() + 1].strip():  # "[x0, 8]!": write-back
            raise ValueError(f"argument string {text!r} is not understood at {text[at:]!r}")
        size = int(m.group("size") or 8)
        out.append((abs(size), size < 0, m.group("operand")))
        at = m.end()
    return out


def sdt_arguments(text: str, symbol: Callable[[str], Optional[int]]) -> List[ArgSpec]:
    # `symbol` is unused: GCC addresses a global through a register on AArch64
    # (adrp first), so no operand names one; `:lo12:` forms are refused below.
    return [_operand(size, signed, operand) for size, signed, operand in split_sdt(text)]


def _operand(size: int, signed: bool, operand: str) -> ArgSpec:
    if size not in SIZES:
        raise ValueError(f"operand {operand}: size {size} is not 1, 2, 4 or 8")
    constant = _number(operand)
    if constant is not None:
        return ArgSpec(CONSTANT, size, signed, base=NONE, index=NONE, value=constant)
    if not operand.startswith("["):
        return ArgSpec(REGISTER, size, signed, base=register_slot(operand), index=NONE)
    if ":" in operand:
        raise ValueError(f"operand {operand} names a symbol: not supported")
    m = _MEMORY.match(operand.strip())
    if not m:
        raise ValueError(f"operand {operand} is not understood")
    try:
        base = register_slot(m.group("base"))
    except ValueError as e:
        raise ValueError(f"operand {operand}: {e}")
    second, shift = m.group("second"), m.group("shift")
    if second is None:
        return ArgSpec(MEMORY, size, signed, base=base, index=NONE)
    displacement = _number(second)
    if displacement is not None:
        if shift is not None:
            raise ValueError(f"operand {operand} is not understood")
        return ArgSpec(MEMORY, size, signed, base=base, index=NONE, value=displacement)
    if not re.fullmatch(r"x\d+", second.strip().lower()):  # w index: an extend we do not do
        raise ValueError(f"operand {operand} is not understood")
    try:
        index = register_slot(second)
    except ValueError as e:
        raise ValueError(f"operand {operand}: {e}")
    scale = 1 << int(shift or 0)
    if scale > 8:
        raise ValueError(f"operand {operand}: shift {shift} is not an address shift")
    return ArgSpec(MEMORY, size, signed, base=base, index=index, scale=scale)


def abi_arguments(count: int) -> List[ArgSpec]:
    if count > ABI_REGISTERS:
        raise ValueError(f"at most {ABI_REGISTERS} arguments are recorded (x0-x5)")
    return [ArgSpec(REGISTER, 8, True, base=n, index=NONE) for n in range(count)]


def abi_return() -> List[ArgSpec]:
    return [ArgSpec(REGISTER, 8, True, base=0, index=NONE)]
