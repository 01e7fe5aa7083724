"""Finds the C++ landing pads of a file: where the unwinder resumes a frame.

A landing pad (a catch block, or a cleanup that runs destructors) is reached by
no branch: the personality routine reads it from the call-site table of the
function's LSDA (in .gcc_except_table), found through its FDE in .eh_frame. For
the planner it is a branch target like any other: no window may cover one after
its first byte, or the unwinder would resume in the middle of the jump.

An LSDA starts with a header (LPStart encoding and value, TType encoding and
offset, call-site encoding, call-site table length), then the call-site records
(start, length, landing pad, action); a landing pad is LPStart (by default the
FDE's start) + its offset, where that offset is not 0. Pointers and numbers are
read by eh_frame.py's ValueReader. What cannot be read is reported as a range
that may hold landing pads anywhere, so the planner stays on the safe side.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import List, Optional, Tuple

from urewrite.rewriter import eh_frame
from urewrite.rewriter.eh_frame import DW_EH_PE_OMIT, Truncated, UnsupportedEncoding, ValueReader
from urewrite.rewriter.elf_file import ElfFile, PT_LOAD

PT_GNU_EH_FRAME = 0x6474E550
_WHOLE_FILE = (0, 1 << 64)


@dataclass(frozen=True)
class LandingPads:
    pads: List[int]  # sorted, without duplicates
    unreadable: List[Tuple[int, int, str]]  # (start, end, what): pads there are unknown

    def first_inside(self, start: int, end: int) -> Optional[int]:
        """The first landing pad in (start, end), or None."""
        k = bisect.bisect_right(self.pads, start)
        return self.pads[k] if k < len(self.pads) and self.pads[k] < end else None

    def unknown_inside(self, start: int, end: int) -> Optional[Tuple[int, int, str]]:
        """An unreadable range that overlaps (start, end), or None."""
        return next((r for r in self.unreadable if r[0] < end and start + 1 < r[1]), None)


def landing_pads(elf: ElfFile) -> LandingPads:
    """Every landing pad of the file, from the LSDA of every FDE that has one."""
    if elf.section_named(".eh_frame") is None and \
            any(s.type == PT_GNU_EH_FRAME for s in elf.segments):
        return LandingPads([], [(*_WHOLE_FILE, "the file, whose .eh_frame has no section header")])
    try:
        fdes = eh_frame.fde_lsdas(elf)
    except UnsupportedEncoding as why:
        return LandingPads([], [(*_WHOLE_FILE, f"the file, whose .eh_frame uses an unsupported "
                                               f"{why}")])
    pads, unreadable = set(), []
    readers = {}  # PT_LOAD -> a ValueReader of its file bytes
    for start, size, lsda in fdes:
        if lsda == 0:
            continue
        try:
            if lsda is None:
                raise UnsupportedEncoding("LSDA pointer")
            pads.update(lsda_landing_pads(elf, readers, lsda, start))
        except (Truncated, UnsupportedEncoding) as why:
            unreadable.append((start, start + size,
                               f"the function at {start:#x}, whose LSDA cannot be read"
                               + (f" ({why})" if str(why) else "")))
    return LandingPads(sorted(pads), unreadable)


def lsda_landing_pads(elf: ElfFile, readers: dict, lsda: int, function_start: int) -> List[int]:
    segment = next((s for s in elf.segments if s.type == PT_LOAD
                    and s.vaddr <= lsda < s.vaddr + s.filesz), None)
    if segment is None:
        raise Truncated  # not in the file
    if segment.vaddr not in readers:
        view = memoryview(elf.data)[segment.offset:segment.offset + segment.filesz]
        readers[segment.vaddr] = ValueReader(view, segment.vaddr)
    return read_lsda(readers[segment.vaddr], lsda - segment.vaddr, segment.filesz,
                     function_start)


def read_lsda(reader: ValueReader, at: int, end: int, function_start: int) -> List[int]:
    """The landing pads of the LSDA at offset `at` of the reader's bytes."""
    lp_encoding, at = reader.byte(at, end), at + 1
    lp_start = function_start
    if lp_encoding != DW_EH_PE_OMIT:
        lp_start, at = reader.pointer(at, lp_encoding, end)
    ttype_encoding, at = reader.byte(at, end), at + 1
    if ttype_encoding != DW_EH_PE_OMIT:
        _, at = reader.leb(at, end, signed=False)  # TType offset: types are not needed
    site_encoding, at = reader.byte(at, end), at + 1
    if site_encoding & 0xF0:  # offsets, never pc-relative or indirect in GCC's or Clang's
        raise UnsupportedEncoding(f"call-site encoding {site_encoding:#x}")
    length, at = reader.leb(at, end, signed=False)
    table_end = at + length
    if table_end > end:
        raise Truncated
    pads = []
    while at < table_end:
        _, at = reader.pointer(at, site_encoding, table_end)  # start of the call site
        _, at = reader.pointer(at, site_encoding, table_end)  # its length
        pad, at = reader.pointer(at, site_encoding, table_end)
        _, at = reader.leb(at, table_end, signed=False)  # action
        if pad:
            pads.append((lp_start + pad) & 0xFFFFFFFFFFFFFFFF)
    return pads
