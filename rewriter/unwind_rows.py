"""The unwind rule rows of .eh_frame (or .debug_frame) at given addresses: what a
debugger needs to unwind from an instruction the rewrite moved, as from the one it was.

A row is every rule at one address: the CFA, each register's saved place, and on arm64
whether the return address is signed (DW_CFA_AARCH64_negate_ra_state). Call frame
instructions run (eh_frame.FrameRules) from the CIE's initial ones through the FDE's up
to the address (advance, remember/restore state, expressions kept as their bytes),
once per FDE for all the addresses in it. An FDE is found
through .eh_frame_hdr's sorted table, so a few rows of a big file read a few FDEs; a
file without one (a static executable may have none), and .debug_frame, are walked.
An address no FDE covers, or one whose FDE this reader cannot follow, has no row.
"""

from __future__ import annotations

import bisect
import struct
import zlib
from dataclasses import dataclass, replace
from typing import Dict, Iterable, Optional, Tuple

from urewrite.rewriter.eh_frame import (DW_EH_PE_OMIT, PCREL_SDATA4, Cie, FrameRules,
                                        Truncated, UnsupportedEncoding, ValueReader, read_cie)
from urewrite.rewriter.elf_file import ElfFile

SHF_COMPRESSED, ELFCOMPRESS_ZLIB = 0x800, 1
_DATAREL_SDATA4 = 0x3B
_TWO_SDATA4 = struct.Struct("<ii")  # .eh_frame_hdr's table, as linkers write it


@dataclass(frozen=True)
class Row:
    """cfa: ("register", reg, offset) or ("expression", bytes); registers: (reg,
    rule) sorted, a rule one of ("offset", n), ("value", n) (CFA + n), ("register",
    r), ("undefined",), ("same",), ("expression", bytes), ("value_expression",
    bytes); offsets in bytes. A register without a rule is unspecified.
    return_register: the column of the return address (its CIE's)."""
    cfa: Tuple
    registers: Tuple
    return_address_signed: bool
    return_register: int


def rows_at(elf: ElfFile, addresses: Iterable[int],
            debug_frame: Optional[bytes] = None) -> Dict[int, Row]:
    """The row at each of `addresses` that an FDE of .eh_frame (else of .debug_frame)
    covers and this reader follows. `debug_frame`: the .debug_frame's contents, where
    the caller has them already (inflated)."""
    out: Dict[int, Row] = {}
    left = sorted(set(addresses))
    for read in (UnwindTable.of, lambda elf: UnwindTable.of_debug_frame(elf, debug_frame)):
        table = read(elf) if left else None  # (.debug_frame only for what is left)
        if table is None:
            continue
        by_fde: Dict[int, list] = {}
        for address in left:
            by_fde.setdefault(bisect.bisect_right(table.starts, address) - 1, []).append(address)
        for k, targets in by_fde.items():
            if k >= 0:
                out.update(table.rows_in(k, targets))
        left = [address for address in left if address not in out]
    return out


class UnwindTable(ValueReader):
    """.eh_frame with its .eh_frame_hdr index; or .debug_frame (`debug`), indexed by a
    walk of its entries (CIE pointers are then offsets in the section, addresses
    absolute)."""

    def __init__(self, data: bytes, address: int, starts, fdes, debug: bool = False):
        super().__init__(data, address)
        self.starts, self.fdes = starts, fdes  # sorted initial locations, FDE offsets
        self.debug = debug
        self._cies: Dict[int, Optional[Cie]] = {}
        self._initials: Dict[Cie, Optional[tuple]] = {}
        self._rows: Dict[tuple, Dict[int, Row]] = {}

    @classmethod
    def of(cls, elf: ElfFile) -> Optional["UnwindTable"]:
        frame, header = elf.section_named(".eh_frame"), elf.section_named(".eh_frame_hdr")
        if frame is None or frame.type == 8:
            return None
        if header is None or header.type == 8:  # (a static executable may have none)
            return cls._walked(bytes(elf.data[frame.offset:frame.offset + frame.size]),
                               frame.addr, debug=False)
        hdr = elf.data[header.offset:header.offset + header.size]
        try:
            reader = ValueReader(hdr, header.addr)
            if len(hdr) < 4 or hdr[0] != 1 or hdr[3] != _DATAREL_SDATA4:
                return None
            _, at = reader.pointer(4, hdr[1], len(hdr))  # .eh_frame's address
            count, at = reader.pointer(at, hdr[2], len(hdr))
        except (Truncated, UnsupportedEncoding):
            return None
        if hdr[2] == DW_EH_PE_OMIT or at + 8 * count > len(hdr):
            return None
        pairs = struct.unpack_from(f"<{2 * count}i", hdr, at)
        starts = [(header.addr + v) & 0xFFFFFFFFFFFFFFFF for v in pairs[0::2]]
        fdes = [header.addr + v - frame.addr for v in pairs[1::2]]
        data = elf.data[frame.offset:frame.offset + frame.size]
        return cls(data, frame.addr, starts, fdes)

    @classmethod
    def of_debug_frame(cls, elf: ElfFile, data: Optional[bytes] = None) \
            -> Optional["UnwindTable"]:
        data = data if data is not None else section_contents(elf, ".debug_frame")
        return cls._walked(data, 0, debug=True) if data else None

    @classmethod
    def _walked(cls, data: bytes, address: int, debug: bool) -> "UnwindTable":
        """The table of `data`, indexed by a walk of its entries."""
        table, fdes, at = cls(data, address, [], [], debug=debug), [], 0
        while at + 8 <= len(data):
            length, pointer = struct.unpack_from("<II", data, at)
            if length in (0, 0xFFFFFFFF) or at + 4 + length > len(data):
                break
            if pointer != (0xFFFFFFFF if debug else 0):  # an FDE
                cie = table._cie(pointer if debug else at + 4 - pointer)
                try:
                    if cie is not None:
                        start, _ = table.pointer(at + 8, cie.pointer_encoding, at + 4 + length)
                        fdes.append((start, at))
                except (Truncated, UnsupportedEncoding):
                    pass
            at += 4 + length
        fdes.sort()
        table.starts, table.fdes = [start for start, _ in fdes], [at for _, at in fdes]
        return table

    def rows_in(self, k: int, targets) -> Dict[int, Row]:
        """The rows at `targets` (sorted addresses) of the k-th FDE (by start): those
        it covers, when this reader follows it that far."""
        found = self._fde(k)
        if found is None:
            return {}
        cie, start, size, instructions = found
        offsets = tuple(t - start for t in targets if start <= t < start + size)
        # (many functions share their call frame instructions, and the offsets asked:
        # leaf functions, prologues; their rows are worked out once)
        key = (id(cie), bytes(self.data[instructions[0]:instructions[1]]), offsets)  # (CIEs
        # stay in self._cies: an id names one)
        if key not in self._rows:
            self._rows[key] = self._rows_at(cie, instructions, offsets)
        return {start + offset: row for offset, row in self._rows[key].items()}

    def _rows_at(self, cie: Cie, instructions, offsets) -> Dict[int, Row]:
        """The rows at `offsets` (sorted) from the start of an FDE of `cie` with
        `instructions` ((start, end) in the data)."""
        left = list(reversed(offsets))  # (last first)
        initial = self._initial(cie)
        if initial is None:
            return {}
        rules = self._rules(cie)
        rules.cfa, rules.registers, rules.initial = initial[0], dict(initial[1]), initial[1]
        found: Dict[int, Row] = {}

        def reached(loc: int) -> bool:
            """The rules so far are those of every target before `loc`."""
            row = None
            while left and left[-1] < loc:
                row = row or _row(rules, cie)
                address = left.pop()
                if row is not None:
                    found[address] = row
            return bool(left)

        try:
            if rules.run(*instructions, 0, reached):
                reached(1 << 64)  # (the last rules hold to the FDE's end)
        except (Truncated, UnsupportedEncoding):
            pass
        return found

    def _rules(self, cie: Cie) -> FrameRules:
        return FrameRules(self, cie.data_alignment, cie.code_alignment, cie.return_register)

    def _initial(self, cie: Cie):
        """(CFA, registers) after the CIE's initial instructions; None if not followed."""
        if cie not in self._initials:
            rules = self._rules(cie)
            try:
                ok = rules.run(cie.instructions, cie.end)
            except (Truncated, UnsupportedEncoding):
                ok = False
            self._initials[cie] = (rules.cfa, rules.registers) if ok else None
        return self._initials[cie]

    def _fde(self, k: int):
        """(its CIE, its start, its size, its instructions' (start, end)) of the k-th
        FDE; None where it cannot be read."""
        at = self.fdes[k]
        try:
            length = self._fixed("<I", at)
            if length in (0, 0xFFFFFFFF):  # (64-bit entries: never in linked x86_64 or arm64 files)
                return None
            body, end = at + 4, at + 4 + length
            pointer = self._fixed("<I", body)
            cie = self._cie(pointer if self.debug else body - pointer)
            if cie is None:
                return None
            if cie.pointer_encoding == PCREL_SDATA4 and body + 13 <= end:  # GCC's and Clang's
                start, size = _TWO_SDATA4.unpack_from(self.data, body + 4)
                start = (self.address + body + 4 + start) & 0xFFFFFFFFFFFFFFFF
                rest = body + 12
            else:
                start, rest = self.pointer(body + 4, cie.pointer_encoding, end)
                size, rest = self.pointer(rest, cie.pointer_encoding & 0x0F, end)
            if cie.augmented and self.data[rest] < 0x80:  # (a one-byte length: most)
                rest += 1 + self.data[rest]
            elif cie.augmented:
                skip, rest = self.leb(rest, end, signed=False)
                rest += skip
        except (Truncated, UnsupportedEncoding):
            return None
        return cie, start, size, (rest, end)

    def _cie(self, at: int) -> Optional[Cie]:
        if at not in self._cies:
            try:
                self._cies[at] = self._read_cie(at)
            except (Truncated, UnsupportedEncoding):
                self._cies[at] = None
        return self._cies[at]

    def _read_cie(self, at: int) -> Optional[Cie]:
        """The CIE at `at` (its length first), or None: not a CIE, or one with a letter
        this reader does not know (the rules could not be followed past it)."""
        length = self._fixed("<I", at)
        end = at + 4 + length
        if length in (0, 0xFFFFFFFF) or self._fixed("<I", at + 4) != (
                0xFFFFFFFF if self.debug else 0):
            return None
        cie = read_cie(self, at + 8, end, self.debug)
        if cie.unknown_letter:
            return None
        return replace(cie, pointer_encoding=cie.pointer_encoding or 0)  # (no 'R': absolute)


def _row(rules: FrameRules, cie: Cie) -> Optional[Row]:
    if rules.cfa is None:
        return None
    return Row(rules.cfa, tuple(sorted(rules.registers.items())), rules.signed,
               cie.return_register)


def section_contents(elf: ElfFile, name: str) -> Optional[bytes]:
    """A section's bytes, inflated where it is compressed with zlib (Go's linker
    compresses its DWARF); None if absent, in no file bytes, or compressed otherwise."""
    section = elf.section_named(name)
    if section is None or section.type == 8:
        return None
    data = bytes(elf.data[section.offset:section.offset + section.size])
    if not section.flags & SHF_COMPRESSED:
        return data
    if len(data) < 24 or struct.unpack_from("<I", data)[0] != ELFCOMPRESS_ZLIB:
        return None
    try:
        return zlib.decompress(data[24:])  # (after the Elf64_Chdr)
    except zlib.error:
        return None
