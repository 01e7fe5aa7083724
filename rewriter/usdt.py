"""Finds USDT probe sites: the notes that <sys/sdt.h> leaves in .note.stapsdt.

Each note names one site: its address (pc), the link-time address of
.stapsdt.base (to undo prelinking), an optional semaphore, the provider, the
name and the argument string. Read from the section bytes: LIEF 1.0 does not
give every note of such files back.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import List

from urewrite.rewriter.elf_file import ElfFile

NT_STAPSDT = 3


@dataclass(frozen=True)
class UsdtSite:
    provider: str
    name: str
    pc: int
    semaphore: int  # 0 when the probe has none
    arguments: str  # as written by sdt.h, e.g. "-4@%edi 8@-16(%rbp)"

    @property
    def probe(self) -> str:
        return f"{self.provider}:{self.name}"


def discover(elf: ElfFile) -> List[UsdtSite]:
    base_section = elf.section_named(".stapsdt.base")
    sites = []
    for owner, kind, desc in elf.notes():
        if owner != b"stapsdt" or kind != NT_STAPSDT or len(desc) < 24:
            continue
        pc, base, semaphore = struct.unpack_from("<QQQ", desc)
        strings = desc[24:].split(b"\0")
        if len(strings) < 3:
            continue
        provider, name, arguments = (s.decode(errors="replace") for s in strings[:3])
        if base_section is not None and base:
            # prelink moved the file: move the addresses with .stapsdt.base
            shift = base_section.addr - base
            pc += shift
            semaphore += shift if semaphore else 0
        sites.append(UsdtSite(provider, name, pc, semaphore, arguments))
    return sites
