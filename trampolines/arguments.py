"""Argument descriptors: what a traced hit records, and how to find it.

A backend turns an sdt.h argument string, or the first N integer arguments of
its calling convention, into ArgSpecs; here they are packed for the runtime,
which evaluates them against the registers the trampoline saved ("frame
slots", numbered by the backend) when a hit is traced.

    u64 count, then per argument 16 bytes:
    u8 kind, u8 size, u8 signed, u8 base slot, u8 index slot, u8 scale, u16 0, i64 value
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

REGISTER, MEMORY, CONSTANT, LINKED_MEMORY = 1, 2, 3, 4  # LINKED: value is a link-time address
NO_SLOT = 16  # "no register"; slot 15 is the stack pointer at the site
MAX_ARGUMENTS = 6


@dataclass(frozen=True)
class ArgSpec:
    kind: int
    size: int = 8
    signed: bool = False
    base: int = NO_SLOT
    index: int = NO_SLOT
    scale: int = 1
    value: int = 0


def encode(specs: Sequence[ArgSpec]) -> bytes:
    specs = list(specs)[:MAX_ARGUMENTS]
    out = struct.pack("<Q", len(specs))
    for a in specs:
        out += struct.pack("<BBBBBBHq", a.kind, a.size, int(a.signed), a.base, a.index,
                           a.scale, 0, a.value)
    return out


def split_sdt(text: str):
    """'-4@%edi 8@-16(%rbp)' -> [(4, True, '%edi'), (8, False, '-16(%rbp)')]."""
    out = []
    for token in text.split():
        size_text, _, operand = token.rpartition("@")
        if not size_text:
            out.append((8, False, operand))
            continue
        size = int(size_text)
        out.append((abs(size), size < 0, operand))
    return out
