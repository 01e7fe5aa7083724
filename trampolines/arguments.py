"""Argument descriptors: what a traced hit records, and how to find it.

A backend turns an sdt.h argument string, or the first N integer arguments of
its calling convention, into ArgSpecs; here they are packed for the runtime,
which evaluates them against the registers the trampoline saved ("frame
slots", numbered by the backend) when a hit is traced.

    u64 count, then per argument 16 bytes:
    u8 kind, u8 size, u8 signed, u8 base slot, u8 index slot, u8 scale, u8 shift, u8 0,
    i64 value

kinds: REGISTER (the slot's value >> shift: x86's %ah ... are bits 8-15 of their
register), MEMORY (base + index * scale + value, loaded), CONSTANT (value, as
the descriptor holds it: already cut to its size and extended), LINKED_MEMORY
(MEMORY, value a link-time address: the load bias is added), THREAD_MEMORY (MEMORY,
plus the thread pointer: x86_64's %fs segment). A loaded or register value is cut
to `size` bytes, then sign- or zero-extended.

This module also splits an sdt.h argument string into its arguments (the part
both architectures share): each is `[-]SIZE[f]@OPERAND`, `-` for signed, `f` for
a floating-point value (sdt.h 4.x writes it), separated by blanks; an x86 operand
has none inside, an arm64 one may (`[sp, 16]`).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import List, NamedTuple, Sequence

REGISTER, MEMORY, CONSTANT, LINKED_MEMORY, THREAD_MEMORY = 1, 2, 3, 4, 5
KINDS = (REGISTER, MEMORY, CONSTANT, LINKED_MEMORY, THREAD_MEMORY)
NO_SLOT = 16  # "no register" (x86_64); slot 15 is the stack pointer at the site
# as many as sdt.h writes (STAP_PROBE12), and as an event record holds (region.py)
MAX_ARGUMENTS = 12
SIZES = (1, 2, 4, 8)
_DESCRIPTOR = struct.Struct("<BBBBBBBBq")
_I64 = (-(1 << 63), 1 << 63)


@dataclass(frozen=True)
class ArgSpec:
    kind: int
    size: int = 8
    signed: bool = False
    base: int = NO_SLOT
    index: int = NO_SLOT
    scale: int = 1
    value: int = 0
    shift: int = 0  # REGISTER: bits to shift the register right by first (x86's %ah: 8)


# Calling conventions a function's arguments and results are read by: the platform's
# C ABI; Go's register ABI (ABIInternal: every function compiled from Go source);
# Go's stack ABI (ABI0: assembly, and the wrappers between the two); and none, where
# a file does not tell which (arguments then are not recorded, and `why` says so).
C_ABI, GO_REGISTERS, GO_STACK, UNKNOWN = "C", "Go ABIInternal", "Go ABI0", "unknown"


@dataclass(frozen=True)
class Convention:
    name: str = C_ABI
    frame_words: int = 0  # GO_STACK: the words of its frame, arguments then results
    why: str = ""  # UNKNOWN: why the convention cannot be told


C_CONVENTION = Convention()


def encode(specs: Sequence[ArgSpec]) -> bytes:
    specs = list(specs)[:MAX_ARGUMENTS]
    out = struct.pack("<Q", len(specs))
    for a in specs:
        check(a)
        out += _DESCRIPTOR.pack(a.kind, a.size, int(a.signed), a.base, a.index, a.scale,
                                a.shift, 0, a.value)
    return out


def count(encoded: bytes) -> int:
    """How many arguments `encode` packed."""
    return struct.unpack_from("<Q", encoded)[0]


def check(a: ArgSpec) -> ArgSpec:
    """`a` when the runtime can evaluate it as written; else ValueError (the parsers
    never make such a one: a last guard before its bytes are packed)."""
    if a.kind not in KINDS or a.size not in SIZES or a.scale not in SIZES:
        raise ValueError(f"descriptor {a} cannot be evaluated")
    if not (0 <= a.base < 256 and 0 <= a.index < 256 and 0 <= a.shift < 64):
        raise ValueError(f"descriptor {a} cannot be evaluated")
    if not _I64[0] <= a.value < _I64[1]:
        raise ValueError(f"{a.value:#x} does not fit in 64 bits")
    return a


def constant(size: int, signed: bool, value: int) -> ArgSpec:
    """A constant argument, its value as the runtime gives it: cut to `size` bytes,
    then sign- or zero-extended (GCC writes an unsigned char 200 as `1@$-56`)."""
    bits = 8 * size
    value &= (1 << bits) - 1
    if signed and value >> (bits - 1):
        value -= 1 << bits
    if value >= 1 << 63:  # an unsigned 64-bit value: the same bits, as an i64
        value -= 1 << 64
    return ArgSpec(CONSTANT, size, signed, value=value)


def fits_i64(value: int) -> bool:
    """A displacement the runtime can add: any 64-bit value, read as signed or not."""
    return -(1 << 63) <= value < (1 << 64)


def as_i64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def quote(text: str, limit: int = 80) -> str:
    """'text' for a one-line message: cut short when long, control characters escaped."""
    shown = text if len(text) <= limit else text[:limit] + "..."
    return "'" + shown.encode("unicode_escape").decode("ascii") + "'"


class Argument(NamedTuple):
    """One argument of an sdt.h string, as written."""
    size: int
    signed: bool
    floating: bool
    operand: str
    text: str  # the whole argument, for messages: "-4@%edi"


_SIZE = re.compile(r"(-?)(\d+)(f?)@")


def split_sdt(text: str) -> List[Argument]:
    """'-4@%edi 8@[sp, 16]' -> its Arguments. An argument without a size (sdt.h's
    oldest notes) is an unsigned 8-byte one. Raises ValueError, quoting the
    argument, for one that is not SIZE@OPERAND."""
    out = []
    for k, token in enumerate(_tokens(text), 1):
        m = _SIZE.match(token)
        if m is None:
            if "@" in token.split("[")[0].split("(")[0]:
                raise ValueError(f"argument {k} {quote(token)} is not SIZE@OPERAND")
            out.append(Argument(8, False, False, token, token))
            continue
        sign, digits, floating = m.groups()
        operand = token[m.end():]
        if len(digits) > 3 or int(digits) not in SIZES:
            raise ValueError(f"argument {k} {quote(token)} cannot be read: size "
                             f"{sign}{digits[:8]} is not 1, 2, 4 or 8")
        if not operand:
            raise ValueError(f"argument {k} {quote(token)} has no operand")
        out.append(Argument(int(digits), sign == "-", bool(floating), operand, token))
    return out


def _tokens(text: str) -> List[str]:
    """The blank-separated arguments of `text`; blanks inside brackets or
    parentheses belong to their argument ("8@[sp, 16]")."""
    out, depth, start = [], 0, None
    for k, c in enumerate(text):
        if c.isspace() and depth <= 0:
            if start is not None:
                out.append(text[start:k])
                start = None
            depth = 0
            continue
        if start is None:
            start = k
        if c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
    if start is not None:
        out.append(text[start:])
    return out


def parse_number(text: str):
    """An integer as an assembler writes it (123, -0x1f, 017, 0b101), or None."""
    text = text.strip()
    m = re.fullmatch(r"([-+]?)(0[xX][0-9a-fA-F]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)", text)
    if m is None or len(text) > 80:
        return None
    sign, digits = m.groups()
    if digits[:2] in ("0x", "0X", "0b", "0B"):
        value = int(digits, 0)
    elif digits.startswith("0") and len(digits) > 1:
        value = int(digits, 8)
    else:
        value = int(digits)
    return -value if sign == "-" else value
