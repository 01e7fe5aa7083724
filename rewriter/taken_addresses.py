"""Finds code addresses that a file takes: stores as data, or computes in code.

A patch window must not hold an address that anything may jump to after its
first byte. Direct branches are decoded by the planner; what remains are
addresses *taken*, which reach a jump later (a function pointer, sa_restorer,
a jump table of absolute addresses):
- computed by PC-relative code (the backend's byte scan);
- relocation addends (RELA) and relocated words (RELR) in PIE files and
  shared objects;
- plain constants in position-dependent executables, which need no relocation:
  8-byte words in data, and 4-byte immediates anywhere in code.
All scans over-approximate: a match may be a coincidence, never a miss. A match
in code says where its bytes are (`source`), so that the planner can check it
against the instruction holding them; matches in data are real data and count.
"""

from __future__ import annotations

import re
import struct
from array import array
from dataclasses import dataclass
from typing import Dict, List, Optional, Set

from urewrite.rewriter.elf_file import ET_EXEC, SHT_NOBITS, ElfFile

SHT_RELA, SHT_RELR = 4, 19
SHF_ALLOC = 2

BRANCH, IMMEDIATE, RELOCATION, CONSTANT = "branch", "immediate", "relocation", "constant"


@dataclass(frozen=True)
class Match:
    """Bytes that may name `target`: in code at `source` (BRANCH, IMMEDIATE), or data."""
    kind: str
    section: str
    source: Optional[int] = None  # where the matching bytes are, for matches in code

    def describe(self) -> str:
        at = f" at {self.source:#x}" if self.source is not None else ""
        return {BRANCH: f"a branch or address computation{at} in {self.section}",
                IMMEDIATE: f"an immediate{at} in {self.section}",
                RELOCATION: f"a relocation in {self.section}",
                CONSTANT: f"a constant in {self.section}"}[self.kind]


def find(elf: ElfFile, backend, wanted: Set[int]) -> Dict[int, List[Match]]:
    """Each address of `wanted` that the file may take, with every match naming it:
    matches in data first (they need no checking), then those in code."""
    found: Dict[int, List[Match]] = {}
    if not wanted:
        return found

    def add(address: int, match: Match):
        found.setdefault(address, []).append(match)

    for section in elf.sections:
        if section.type == SHT_RELA:
            for address in _rela_addends(_contents(elf, section)) & wanted:
                add(address, Match(RELOCATION, section.name))
        elif section.type == SHT_RELR:
            for address in _relr_values(elf, _contents(elf, section)) & wanted:
                add(address, Match(RELOCATION, section.name))
    code_sections = elf.executable_sections()
    if elf.type == ET_EXEC:
        for section in elf.sections:
            if section.type == SHT_NOBITS or not section.flags & SHF_ALLOC:
                continue
            data = _contents(elf, section)
            for address in _words(data, "Q", aligned=True) & wanted:
                add(address, Match(CONSTANT, section.name))
    for section in code_sections:
        code = _contents(elf, section)
        for source, address in backend.code_addresses_in(code, section.addr, wanted):
            add(address, Match(BRANCH, section.name, source))
        if elf.type == ET_EXEC:
            for offset, address in _words_at(code, wanted):
                add(address, Match(IMMEDIATE, section.name, section.addr + offset))
    return found


def _contents(elf: ElfFile, section) -> bytes:
    return elf.data[section.offset:section.offset + section.size]


def _words(data: bytes, code: str, aligned: bool) -> Set[int]:
    size = array(code).itemsize
    values: Set[int] = set()
    for shift in range(1 if aligned else size):
        usable = (len(data) - shift) // size * size
        if usable > 0:
            values.update(array(code, data[shift:shift + usable]))
    return values


def _words_at(data: bytes, wanted: Set[int]):
    """(offset, value) of every 4-byte little-endian word of `data`, at any offset, whose
    value is in `wanted`. A regular expression finds the offsets whose two high bytes
    could belong to a wanted value (few: they are a code address's), Python the rest."""
    high: Dict[int, Set[int]] = {}
    for value in wanted:
        if value < 1 << 32:
            high.setdefault(value >> 24, set()).add(value >> 16 & 0xFF)
    if not high:
        return
    shapes = b"|".join(b"..[" + b"".join(re.escape(bytes([b])) for b in sorted(thirds)) + b"]"
                       + re.escape(bytes([fourth])) for fourth, thirds in sorted(high.items()))
    for m in re.finditer(b"(?=(?:" + shapes + b"))", data, re.DOTALL):
        value = int.from_bytes(data[m.start():m.start() + 4], "little")
        if value in wanted:
            yield m.start(), value


def _rela_addends(data: bytes) -> Set[int]:
    return {addend & 0xFFFFFFFFFFFFFFFF for _, _, addend in struct.iter_unpack("<QQq", data[:len(data) // 24 * 24])}


def _relr_values(elf: ElfFile, data: bytes) -> Set[int]:
    """The words that RELR entries relocate (their stored values are the targets)."""
    values: Set[int] = set()
    base = 0
    for (entry,) in struct.iter_unpack("<Q", data[:len(data) // 8 * 8]):
        if entry & 1 == 0:
            places = [entry]
            base = entry + 8
        else:
            places = [base + 8 * i for i in range(63) if entry >> (i + 1) & 1]
            base += 8 * 63
        for place in places:
            offset = elf.offset_of(place, 8)
            if offset is not None:
                values.add(struct.unpack_from("<Q", elf.data, offset)[0])
    return values
