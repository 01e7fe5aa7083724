"""AArch64 argument specs: sdt.h operands (as GCC prints them) and the AAPCS64 integer arguments.

Frame slots are where trace_event (runtime.s) puts the site's registers: slot n
holds xn for n = 0 ... 30, slot 31 the site's sp; NONE and above read as 0.

The forms GCC emits for sdt.h's "nor" constraint: a register (`-4@x0`, `8@w1`:
the size before the @ governs, within the register's width), a constant (`4@5`,
`-8@-100000`, cut to its size: `1@-56` is 200), and offsettable memory
(`-8@[x19]`, `4@[sp, 12]`, `8@[x29, -16]`). Register plus register (`[x0, x1]`,
`[x0, x1, lsl 3]`) is accepted too (libbpf's forms and more). Anything else
(symbols such as `:lo12:`, floating-point values and registers, extended or
written-back addresses) is refused with its reason: an argument is never guessed.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import List, Optional

from urewrite.trampolines.arguments import (C_CONVENTION, GO_STACK, MAX_ARGUMENTS, MEMORY,
                                            REGISTER, UNKNOWN, ArgSpec, Convention, as_i64,
                                            constant, fits_i64, parse_number, quote, split_sdt)

SP_SLOT = 31
NONE = 32  # "no register": reads as 0 (xzr, a missing base or index)
ABI_REGISTERS = 6  # x0 ... x5: as many as an event holds

_NUMBER = r"#?[-+]?(?:0x[0-9a-fA-F]+|\d+)"
_MEMORY = re.compile(r"^\[\s*(?P<base>\w+)\s*(?:,\s*(?P<second>[^,\]]+?)\s*"
                     r"(?:,\s*lsl\s*#?(?P<shift>\d+)\s*)?)?\]$")


def register_slot(name: str) -> int:
    """Frame slot of x0-x30 / w0-w30, sp / wsp, xzr / wzr (NONE: reads 0)."""
    return _register(name)[0]


def _register(name: str):
    """(frame slot, width in bytes) of a general register."""
    name = name.strip().lower()
    if name in ("sp", "wsp"):
        return SP_SLOT, 8 if name == "sp" else 4
    if name in ("xzr", "wzr"):
        return NONE, 8 if name == "xzr" else 4
    m = re.fullmatch(r"([xw])(\d{1,2})", name)
    if m and int(m.group(2)) <= 30:
        return int(m.group(2)), 8 if m.group(1) == "x" else 4
    if re.fullmatch(r"[bhsdqv]\d+(\.\w+)?", name):
        raise ValueError(f"{name} is a floating-point or vector register: not recorded")
    raise ValueError(f"register {name} is not understood")


def _number(text: str) -> Optional[int]:
    text = text.strip()
    if not re.fullmatch(_NUMBER, text) or len(text) > 40:
        return None
    return parse_number(text.replace("#", "", 1))


def sdt_arguments(text: str, symbols=None) -> List[ArgSpec]:
    """ArgSpecs of an sdt.h argument string; ValueError naming the argument that cannot
    be read and why. `symbols` is unused: GCC addresses a global through a register
    on AArch64 (adrp first), so no operand it writes names one; `:lo12:` forms are
    refused."""
    specs = []
    for k, arg in enumerate(split_sdt(text), 1):
        try:
            if arg.floating:
                raise ValueError("a floating-point value (trace records integers)")
            specs.append(_operand(arg.size, arg.signed, arg.operand))
        except ValueError as e:
            raise ValueError(f"argument {k} {quote(arg.text)} cannot be read: {e}") from None
    return specs


def _operand(size: int, signed: bool, operand: str) -> ArgSpec:
    operand = operand.strip()
    constant_value = _number(operand)
    if constant_value is not None:
        if not fits_i64(constant_value):
            raise ValueError(f"constant {operand} does not fit in 64 bits")
        return replace(constant(size, signed, constant_value), base=NONE, index=NONE)
    if not operand.startswith("["):
        slot, width = _register(operand)
        return ArgSpec(REGISTER, min(size, width), signed, base=slot, index=NONE)
    if ":" in operand:
        raise ValueError(f"operand {operand} names a symbol: not supported")
    m = _MEMORY.match(operand)
    if not m:
        raise ValueError(f"operand {operand} is not understood")
    try:
        base, width = _register(m.group("base"))
    except ValueError as e:
        raise ValueError(f"operand {operand}: {e}")
    if width != 8 or base == NONE:
        raise ValueError(f"operand {operand}: {m.group('base')} is no base register")
    second, shift = m.group("second"), m.group("shift")
    if second is None:
        return ArgSpec(MEMORY, size, signed, base=base, index=NONE)
    displacement = _number(second)
    if displacement is not None:
        if shift is not None or not fits_i64(displacement):
            raise ValueError(f"operand {operand} is not understood")
        return ArgSpec(MEMORY, size, signed, base=base, index=NONE, value=as_i64(displacement))
    if not re.fullmatch(r"x\d+", second.strip().lower()):  # w index: an extend we do not do
        raise ValueError(f"operand {operand} is not understood")
    try:
        index = register_slot(second)
    except ValueError as e:
        raise ValueError(f"operand {operand}: {e}")
    scale = 1 << (int(shift) if shift and len(shift) <= 2 else 0 if not shift else 9)
    if scale > 8:
        raise ValueError(f"operand {operand}: shift {shift} is not an address shift")
    return ArgSpec(MEMORY, size, signed, base=base, index=index, scale=scale)


def abi_arguments(count: int, convention: Convention = C_CONVENTION) -> List[ArgSpec]:
    """The first `count` integer argument words at a function's entry: x0, x1 ... in
    AAPCS64 and in Go's ABIInternal alike; or Go's stack frame (ABI0), no more words
    than it holds. ValueError for a convention that is not known."""
    if convention.name == GO_STACK:
        return _frame_words(min(count, convention.frame_words))
    _known(convention)
    if count > ABI_REGISTERS:
        raise ValueError(f"at most {ABI_REGISTERS} arguments are recorded (x0-x5)")
    return [ArgSpec(REGISTER, 8, True, base=n, index=NONE) for n in range(count)]


def abi_return(convention: Convention = C_CONVENTION, returned: bool = False) -> List[ArgSpec]:
    """The return value: x0 in AAPCS64 and ABIInternal (the first result word); in
    ABI0 every word of the frame, arguments then results (which of them are results
    the table does not tell). `ret` leaves sp as it is: `returned` changes nothing."""
    if convention.name == GO_STACK:
        return _frame_words(min(convention.frame_words, MAX_ARGUMENTS))
    _known(convention)
    return [ArgSpec(REGISTER, 8, True, base=0, index=NONE)]


def _frame_words(count: int) -> List[ArgSpec]:
    # an ABI0 frame starts a word above sp: 0(sp) is the caller's saved link register
    return [ArgSpec(MEMORY, 8, True, base=SP_SLOT, index=NONE, value=8 + 8 * k)
            for k in range(count)]


def _known(convention: Convention) -> None:
    if convention.name == UNKNOWN:
        raise ValueError(convention.why)
