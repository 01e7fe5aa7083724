"""The jump tables of one function, as far as the rest of the file lets us trust them.

The backend (arch/jump_tables.py) recovers a table from the function alone: the
bounds check, the dispatch after it, the entries. Two things it cannot see:
- whether code outside the function branches into the dispatch past its check
  (or into its first instruction from anywhere but the check): then the index
  there may be out of range, and the table's count proves nothing;
- whether the table is constant: entries in writable memory, or in words a
  dynamic relocation rewrites at load time, are not what the file holds.
A table failing either is dropped: its jump stays an unknown indirect jump.
"""

from __future__ import annotations

import bisect
import struct
from typing import Dict, List

from urewrite.arch.base import NotAsSwept, Window
from urewrite.arch.jump_tables import JumpTable
from urewrite.rewriter.elf_file import ET_DYN, PF_W, ElfFile
from urewrite.rewriter.functions import Function

PT_GNU_RELRO = 0x6474E552
SHT_RELA, SHT_RELR = 4, 19
SHF_ALLOC = 2


def recover(model, fn: Function, jumps: List[int], insns: list) -> Dict[int, JumpTable]:
    """jump address -> table, for the indirect jumps of `fn` (`jumps`: their indexes in
    its sweep) that are trusted tables; `insns`: the function's instructions as its
    sweep finds them (SweptCode)."""
    backend = model.backend
    if not jumps:
        return {}
    read = constant_reader(model.elf)
    try:
        tables = {table.jump: table for table in backend.jump_tables(insns, jumps, read)}
    except NotAsSwept:  # (the walk needs instructions the decoder does not see alike)
        return {}
    if not tables:
        return {}
    case_labels = set().union(*(t.targets for t in tables.values()))
    watched = set().union(*(t.guarded | {t.entry} for t in tables.values()))
    entered = _entered_from_outside(model, fn, watched)
    return {jump: t for jump, t in tables.items()
            if not (t.guarded | {t.entry}) & (case_labels | entered)}


def _entered_from_outside(model, fn: Function, watched) -> set:
    """Addresses of `watched` that code outside `fn` branches to."""
    found = set()
    references = model.taken_index.branch_sources(watched)  # far branches, by a scan
    for target, sources in references.items():
        for source in sources:
            if not fn.address <= source < fn.end and model.really_names(source, target):
                found.add(target)
    for near in model.near_functions(Window(fn.address, fn.size, ())):
        if near.address != fn.address:  # short branches of the neighbours, decoded
            found.update(t for t in model.direct_targets(near) if t in watched)
    return found


_readers: Dict[int, object] = {}


def constant_reader(elf: ElfFile):
    """read(address, size) of bytes that stay as the file holds them at run time:
    in a loaded segment that is not writable (or is made read-only after relocation,
    PT_GNU_RELRO) and, in a position-independent file, no dynamic relocation writes."""
    if id(elf) in _readers and _readers[id(elf)][0] is elf:
        return _readers[id(elf)][1]
    relro = [(s.vaddr, s.vaddr + s.memsz) for s in elf.segments if s.type == PT_GNU_RELRO]
    relocated = sorted(_relocated_places(elf)) if elf.type == ET_DYN else []

    def read(address: int, size: int) -> bytes:
        segment = next((s for s in elf.loads
                        if s.vaddr <= address and address + size <= s.vaddr + s.filesz), None)
        if segment is None:
            raise ValueError(f"{address:#x} is not in the file")
        if segment.flags & PF_W and not any(lo <= address and address + size <= hi
                                            for lo, hi in relro):
            raise ValueError(f"{address:#x} is writable")
        k = bisect.bisect_left(relocated, address - 7)
        if k < len(relocated) and relocated[k] < address + size:
            raise ValueError(f"{address:#x} is relocated at load time")
        return elf.read(address, size)

    _readers.clear()
    _readers[id(elf)] = (elf, read)
    return read


def _relocated_places(elf: ElfFile) -> List[int]:
    """Addresses of the words dynamic relocations (RELA, RELR) write."""
    places = []
    for section in elf.sections:
        if not section.flags & SHF_ALLOC:
            continue
        data = elf.data[section.offset:section.offset + section.size]
        if section.type == SHT_RELA:
            places += [offset for offset, _, _ in
                       struct.iter_unpack("<QQq", data[:len(data) // 24 * 24])]
        elif section.type == SHT_RELR:
            base = 0
            for (entry,) in struct.iter_unpack("<Q", data[:len(data) // 8 * 8]):
                if entry & 1 == 0:
                    places.append(entry)
                    base = entry + 8
                else:
                    places += [base + 8 * i for i in range(63) if entry >> (i + 1) & 1]
                    base += 8 * 63
    return places
