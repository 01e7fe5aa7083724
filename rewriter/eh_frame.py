"""Reads the address ranges of the FDEs in .eh_frame: one per function with unwind info.

Only what finding functions needs: each FDE's initial location and range, for
which each CIE's pointer encoding ('R' in its augmentation) is read. Encodings
other than absolute and PC-relative (never seen in linked x86_64 or arm64 files)
raise UnsupportedEncoding, so the caller can fall back to LIEF. Bytes that do
not parse end the walk with what was read so far, as unwinders do.
"""

from __future__ import annotations

import struct
from typing import Dict, List, Optional, Tuple

from urewrite.rewriter.elf_file import ElfFile

DW_EH_PE_OMIT = 0xFF
DW_EH_PE_PCREL = 0x10
PCREL_SDATA4 = DW_EH_PE_PCREL | 0x0B
_TWO_SDATA4 = struct.Struct("<ii")
_FIXED = {0x00: "<Q", 0x02: "<H", 0x03: "<I", 0x04: "<Q", 0x0A: "<h", 0x0B: "<i", 0x0C: "<q"}
_ULEB, _SLEB = 0x01, 0x09


class UnsupportedEncoding(Exception):
    pass


class _Truncated(Exception):
    pass


def fde_ranges(elf: ElfFile) -> List[Tuple[int, int]]:
    """(start address, size) of every FDE of .eh_frame, in file order."""
    sec = elf.section_named(".eh_frame")
    if sec is None or sec.type == 8 or not sec.size:  # SHT_NOBITS: nothing in the file
        return []
    data = elf.data[sec.offset:sec.offset + sec.size]
    return _Walker(data, sec.addr).fdes()


class _Walker:
    def __init__(self, data: bytes, address: int):
        self.data = data
        self.address = address  # of data[0]
        self.cie_encodings: Dict[int, int] = {}

    def fdes(self) -> List[Tuple[int, int]]:
        out = []
        at = 0
        while at + 4 <= len(self.data):
            try:
                length, body = self._u32(at), at + 4
                if length == 0:  # the terminator
                    break
                if length == 0xFFFFFFFF:
                    length, body = self._fixed("<Q", at + 4), at + 12
                end = body + length
                if end > len(self.data) or length < 4:
                    break
            except _Truncated:
                break
            cie_pointer = self._u32(body)
            if cie_pointer:
                try:
                    fde = self._fde(body, cie_pointer, end)
                except _Truncated:  # this entry only: its length says where the next one is
                    fde = None
                if fde is not None:
                    out.append(fde)
            at = end
        return out

    def _fde(self, body: int, cie_pointer: int, end: int) -> Optional[Tuple[int, int]]:
        encoding = self._cie_encoding(body - cie_pointer)
        if encoding is None:
            return None
        if encoding == PCREL_SDATA4 and body + 12 <= end:  # what GCC and Clang emit: fast path
            start, size = _TWO_SDATA4.unpack_from(self.data, body + 4)
            return (self.address + body + 4 + start) & 0xFFFFFFFFFFFFFFFF, size & 0xFFFFFFFFFFFFFFFF
        start, at = self._pointer(body + 4, encoding, end)
        size, _ = self._pointer(at, encoding & 0x0F, end)
        return start, size

    def _cie_encoding(self, cie: int) -> Optional[int]:
        """The FDE pointer encoding of the CIE at offset `cie`; None when it is no CIE."""
        if cie in self.cie_encodings:
            return self.cie_encodings[cie]
        encoding = None
        if 0 <= cie and cie + 8 <= len(self.data) and self._u32(cie) not in (0, 0xFFFFFFFF) \
                and self._u32(cie + 4) == 0:
            try:
                encoding = self._read_cie(cie + 8, cie + 4 + self._u32(cie))
            except _Truncated:
                encoding = None
        self.cie_encodings[cie] = encoding
        return encoding

    def _read_cie(self, at: int, end: int) -> int:
        version = self._byte(at, end)
        nul = self.data.find(b"\0", at + 1, end)
        if nul < 0:
            raise _Truncated
        augmentation = self.data[at + 1:nul]
        at = nul + 1
        if augmentation.startswith(b"eh"):  # an old GCC's eh_ptr word
            at += 8
        _, at = self._leb(at, end, signed=False)  # code alignment
        _, at = self._leb(at, end, signed=True)  # data alignment
        if version == 1:
            at += 1  # return register, one byte
        else:
            _, at = self._leb(at, end, signed=False)
        if not augmentation.startswith(b"z"):
            return 0x00  # absolute pointers
        _, at = self._leb(at, end, signed=False)  # augmentation data length
        for letter in augmentation[1:]:
            if letter == ord("R"):
                return self._byte(at, end)
            if letter == ord("L"):
                at += 1
            elif letter == ord("P"):  # the personality routine: skipped, only its size matters
                personality = self._byte(at, end)
                if personality & 0x70 == 0x50:  # DW_EH_PE_aligned: padding we do not model
                    raise UnsupportedEncoding(f"personality encoding {personality:#x}")
                _, at = self._pointer(at + 1, personality & 0x0F, end)
            elif letter not in b"SBG":  # signal frame, arm64 key B, memory tagging: no data
                break  # an unknown letter hides where 'R' is
        if b"R" in augmentation:
            raise UnsupportedEncoding(f"CIE augmentation {augmentation!r}")
        return 0x00

    # -- reading values ----------------------------------------------------------
    def _pointer(self, at: int, encoding: int, end: int) -> Tuple[int, int]:
        """(value, next offset) of a pointer in `encoding` at offset `at`."""
        if encoding == DW_EH_PE_OMIT:
            return 0, at
        application, form = encoding & 0x70, encoding & 0x0F
        if encoding & 0x80 or application not in (0, DW_EH_PE_PCREL):
            raise UnsupportedEncoding(f"pointer encoding {encoding:#x}")
        if form in _FIXED:
            size = struct.calcsize(_FIXED[form])
            if at + size > end:
                raise _Truncated
            value, next_at = self._fixed(_FIXED[form], at), at + size
        elif form in (_ULEB, _SLEB):
            value, next_at = self._leb(at, end, signed=form == _SLEB)
        else:
            raise UnsupportedEncoding(f"pointer encoding {encoding:#x}")
        if application == DW_EH_PE_PCREL:
            value += self.address + at
        return value & 0xFFFFFFFFFFFFFFFF, next_at

    def _leb(self, at: int, end: int, signed: bool) -> Tuple[int, int]:
        value = shift = 0
        while True:
            byte = self._byte(at, end)
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if signed and byte & 0x40:
            value -= 1 << shift
        return value, at

    def _byte(self, at: int, end: int) -> int:
        if at >= end:
            raise _Truncated
        return self.data[at]

    def _u32(self, at: int) -> int:
        return self._fixed("<I", at)

    def _fixed(self, fmt: str, at: int) -> int:
        try:
            return struct.unpack_from(fmt, self.data, at)[0]
        except struct.error:
            raise _Truncated from None
