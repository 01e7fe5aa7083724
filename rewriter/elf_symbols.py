"""Reads the symbol tables (.symtab, then .dynsym) of an ElfFile.

Our own reader rather than LIEF's: importing LIEF costs about 0.3 s, more than
the rest of a one-probe rewrite (docs/benchmarks.md, section 4). A malformed
table or name is cut short, never an exception: symbols only add knowledge.
"""

from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

from urewrite.rewriter.elf_file import ElfFile

SHT_SYMTAB, SHT_DYNSYM = 2, 11
STT_FUNC = 2
SHN_UNDEF = 0
SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size


class Symbol(NamedTuple):  # a tuple: a large file has 100,000s of symbols
    name: str
    type: int  # STT_*
    shndx: int
    value: int
    size: int
    table: str  # "symtab" or "dynsym"


def symbols(elf: ElfFile) -> Iterator[Symbol]:
    """Every symbol of .symtab, then of .dynsym, in table order (index 0 left out)."""
    for kind, table in ((SHT_SYMTAB, "symtab"), (SHT_DYNSYM, "dynsym")):
        for sec in elf.sections:
            if sec.type == kind:
                yield from _read_table(elf, sec, table)


def _read_table(elf: ElfFile, sec, table: str) -> Iterator[Symbol]:
    data = elf.data
    if sec.link >= len(elf.sections):
        return
    strings = elf.sections[sec.link]
    str_start, str_end = strings.offset, min(strings.offset + strings.size, len(data))
    count = min(sec.size, len(data) - sec.offset) // SYM.size
    for name_at, info, _, shndx, value, size in SYM.iter_unpack(
            data[sec.offset + SYM.size:sec.offset + count * SYM.size]):
        start = str_start + name_at
        if start >= str_end:
            name = ""
        else:
            end = data.find(b"\0", start, str_end)
            name = data[start:end if end >= 0 else str_end].decode("utf-8", "replace")
        yield Symbol(name, info & 0xF, shndx, value, size, table)
