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
All scans over-approximate: a match may be a coincidence, never a miss.
"""

from __future__ import annotations

import struct
from array import array
from typing import Dict, Set

from urewrite.rewriter.elf_file import ET_EXEC, SHT_NOBITS, ElfFile

SHT_RELA, SHT_RELR = 4, 19
SHF_ALLOC = 2


def find(elf: ElfFile, backend, wanted: Set[int]) -> Dict[int, str]:
    """Each address of `wanted` that the file takes, with where it is taken."""
    found: Dict[int, str] = {}
    if not wanted:
        return found
    for section in elf.executable_sections():
        code = _contents(elf, section)
        for address in backend.code_addresses_in(code, section.addr, wanted):
            found.setdefault(address, f"a branch or address computation in {section.name}")
    for section in elf.sections:
        if section.type == SHT_RELA:
            for address in _rela_addends(_contents(elf, section)) & wanted:
                found.setdefault(address, f"a relocation in {section.name}")
        elif section.type == SHT_RELR:
            for address in _relr_values(elf, _contents(elf, section)) & wanted:
                found.setdefault(address, f"a relocation in {section.name}")
    if elf.type == ET_EXEC:
        for section in elf.sections:
            if section.type == SHT_NOBITS or not section.flags & SHF_ALLOC:
                continue
            data = _contents(elf, section)
            for address in _words(data, "Q", aligned=True) & wanted:
                found.setdefault(address, f"a constant in {section.name}")
            if section in elf.executable_sections():
                for address in _words(data, "I", aligned=False) & wanted:
                    found.setdefault(address, f"an immediate in {section.name}")
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
