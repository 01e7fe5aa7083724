"""Reads the FDEs of .eh_frame: each one's address range, and the frame at its start.

Finding functions needs each FDE's initial location and range, for which each
CIE's pointer encoding ('R' in its augmentation) is read. Return probes also
need the frame at an FDE's first address (`entry_frames`): a function entered by
a call starts with the frame the call made, while a part of a function split off
by the compiler (a .cold part, named or not) starts inside its parent's frame.
except_table.py reads C++ landing pads from each FDE's LSDA pointer (`fde_lsdas`),
with the same value readers (`ValueReader`); unwind_rows.py every row of an FDE, with
the same interpreter of call frame instructions (`FrameRules`). Encodings
other than absolute and PC-relative (never seen in linked x86_64 or arm64 files)
raise UnsupportedEncoding, so the caller can fall back to LIEF. Bytes that do
not parse end the walk with what was read so far, as unwinders do.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from urewrite.arch.base import value_class
from urewrite.rewriter.elf_file import ElfFile

DW_EH_PE_OMIT = 0xFF
DW_EH_PE_PCREL = 0x10
PCREL_SDATA4 = DW_EH_PE_PCREL | 0x0B
_TWO_SDATA4 = struct.Struct("<ii")
_LENGTH_AND_ID = struct.Struct("<II")  # an entry's 32-bit length and CIE id or pointer
_UNREAD = object()
_FIXED = {0x00: "<Q", 0x02: "<H", 0x03: "<I", 0x04: "<Q", 0x0A: "<h", 0x0B: "<i", 0x0C: "<q"}
_ULEB, _SLEB = 0x01, 0x09


class UnsupportedEncoding(Exception):
    pass


class Truncated(Exception):
    pass


def fde_ranges(elf: ElfFile) -> List[Tuple[int, int]]:
    """(start address, size) of every FDE of .eh_frame, in file order."""
    sec = elf.section_named(".eh_frame")
    if sec is None or sec.type == 8 or not sec.size:  # SHT_NOBITS: nothing in the file
        return []
    data = elf.data[sec.offset:sec.offset + sec.size]
    return _Walker(data, sec.addr).fdes()


@value_class
class Frame:
    """The unwind rule at an address: CFA = cfa_register + cfa_offset (DWARF register
    numbers), and where the return address is: ("offset", n) = saved at CFA + n,
    ("same",) = still in its register, as at a call on arm64."""
    cfa_register: int
    cfa_offset: int
    return_address: Tuple


def entry_frames(elf: ElfFile) -> Dict[int, Optional[Frame]]:
    """FDE start address -> the frame at that address; None where the rules use
    what this reader does not follow (expressions, remembered states)."""
    sec = elf.section_named(".eh_frame")
    if sec is None or sec.type == 8 or not sec.size:
        return {}
    data = elf.data[sec.offset:sec.offset + sec.size]
    walker = _Walker(data, sec.addr, frames=True)
    walker.fdes()
    return walker.frames


def fde_lsdas(elf: ElfFile) -> List[Tuple[int, int, Optional[int]]]:
    """(start address, size, LSDA address) of every FDE whose CIE gives FDEs an LSDA
    ('L' in its augmentation), in file order. The LSDA address is 0 where the FDE has
    none, None where it cannot be read."""
    sec = elf.section_named(".eh_frame")
    if sec is None or sec.type == 8 or not sec.size:
        return []
    data = elf.data[sec.offset:sec.offset + sec.size]
    walker = _Walker(data, sec.addr, lsdas=True)
    walker.fdes()
    return walker.lsdas


class ValueReader:
    """Reads the values of exception-handling tables from `data`, found at `address`:
    pointers in their DW_EH_PE encodings, LEB128 numbers, bytes. Offsets index `data`;
    `end` bounds each read (Truncated past it)."""

    def __init__(self, data, address: int):
        self.data = data
        self.address = address  # of data[0]

    def pointer(self, at: int, encoding: int, end: int) -> Tuple[int, int]:
        """(value, next offset) of a pointer in `encoding` at offset `at`."""
        if encoding == DW_EH_PE_OMIT:
            return 0, at
        application, form = encoding & 0x70, encoding & 0x0F
        if encoding & 0x80 or application not in (0, DW_EH_PE_PCREL):
            raise UnsupportedEncoding(f"pointer encoding {encoding:#x}")
        if form in _FIXED:
            size = struct.calcsize(_FIXED[form])
            if at + size > end:
                raise Truncated
            value, next_at = self._fixed(_FIXED[form], at), at + size
        elif form in (_ULEB, _SLEB):
            value, next_at = self.leb(at, end, signed=form == _SLEB)
        else:
            raise UnsupportedEncoding(f"pointer encoding {encoding:#x}")
        if application == DW_EH_PE_PCREL:
            value += self.address + at
        return value & 0xFFFFFFFFFFFFFFFF, next_at

    def leb(self, at: int, end: int, signed: bool) -> Tuple[int, int]:
        value = shift = 0
        while True:
            byte = self.byte(at, end)
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if signed and byte & 0x40:
            value -= 1 << shift
        return value, at

    def byte(self, at: int, end: int) -> int:
        if at >= end:
            raise Truncated
        return self.data[at]

    def _u32(self, at: int) -> int:
        return self._fixed("<I", at)

    def _fixed(self, fmt: str, at: int) -> int:
        try:
            return struct.unpack_from(fmt, self.data, at)[0]
        except struct.error:
            raise Truncated from None


class _Walker(ValueReader):
    def __init__(self, data: bytes, address: int, frames: bool = False, lsdas: bool = False):
        super().__init__(data, address)
        self.cie_encodings: Dict[int, int] = {}
        self.want_frames = frames
        self.cies: Dict[int, Cie] = {}  # with frames: what the rules need of each CIE
        self.frames: Dict[int, Optional[Frame]] = {}
        self._cie_frames: Dict[int, Optional[Frame]] = {}  # (CIE instructions -> its frame)
        self.want_lsdas = lsdas
        self.lsda_encodings: Dict[int, Optional[int]] = {}  # CIE with 'L' -> LSDA encoding
        self.lsdas: List[Tuple[int, int, Optional[int]]] = []

    def fdes(self) -> List[Tuple[int, int]]:
        out = []
        data, size = self.data, len(self.data)
        at = 0
        while at + 8 <= size:
            # the usual entry, read inline (most of a big file's): a 32-bit length, and an FDE
            # of a CIE with GCC's and Clang's encoding, with no frame or LSDA to read
            length, cie_pointer = _LENGTH_AND_ID.unpack_from(data, at)
            end = at + 4 + length
            if not 4 <= length < 0xFFFFFFFF or end > size:
                break  # (the general loop below knows each case)
            at += 4
            if cie_pointer:
                cie = at - cie_pointer
                encoding = self.cie_encodings.get(cie, _UNREAD)
                frame = self._cie_frame_at(cie, at + 12, end) if self.want_frames else None
                if encoding == PCREL_SDATA4 and at + 12 <= end and \
                        (not self.want_frames or frame is not _UNREAD) and \
                        not (self.want_lsdas and cie in self.lsda_encodings):
                    start, extent = _TWO_SDATA4.unpack_from(data, at + 4)
                    start = (self.address + at + 4 + start) & 0xFFFFFFFFFFFFFFFF
                    out.append((start, extent & 0xFFFFFFFFFFFFFFFF))
                    if self.want_frames:
                        self.frames[start] = frame
                else:
                    try:
                        fde = self._fde(at, cie_pointer, end)
                    except Truncated:
                        fde = None
                    if fde is not None:
                        out.append(fde)
            at = end
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
            except Truncated:
                break
            cie_pointer = self._u32(body)
            if cie_pointer:
                try:
                    fde = self._fde(body, cie_pointer, end)
                except Truncated:  # this entry only: its length says where the next one is
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
            start = (self.address + body + 4 + start) & 0xFFFFFFFFFFFFFFFF
            size &= 0xFFFFFFFFFFFFFFFF
            at = body + 12
        else:
            start, at = self.pointer(body + 4, encoding, end)
            size, at = self.pointer(at, encoding & 0x0F, end)
        if self.want_frames:
            self.frames[start] = self._entry_frame(self.cies.get(body - cie_pointer), at, end)
        if self.want_lsdas and body - cie_pointer in self.lsda_encodings:
            self.lsdas.append((start, size, self._lsda(body - cie_pointer, at, end)))
        return start, size

    def _cie_frame_at(self, cie: int, at: int, end: int):
        """The frame at the first address of the FDE whose augmentation (a one-byte
        length) starts at `at`, when it is its CIE's own (no instruction but nops before
        the first advance), worked out already: most FDEs, read inline; else _UNREAD (_entry_frame() knows)."""
        known = self.cies.get(cie)
        if known is None or not known.augmented or at >= end or self.data[at] & 0x80:
            return _UNREAD
        at += 1 + self.data[at]
        while at < end and self.data[at] == 0:  # nops (a leaf function's FDE: only those)
            at += 1
        if at < end and not self._advances(self.data[at]):
            return _UNREAD
        return self._cie_frames.get(known.instructions, _UNREAD)

    def _lsda(self, cie: int, at: int, end: int) -> Optional[int]:
        """The LSDA address in an FDE's augmentation data (0: none); None when it
        cannot be read."""
        encoding = self.lsda_encodings[cie]
        if encoding is None:
            return None
        if encoding == DW_EH_PE_OMIT:
            return 0
        try:
            length, at = self.leb(at, end, signed=False)
            end = min(end, at + length)
            raw, _ = self.pointer(at, encoding & 0x0F, end)
            # as libgcc reads it: a zero stays zero, whatever the application
            return self.pointer(at, encoding, end)[0] if raw else 0
        except (Truncated, UnsupportedEncoding):
            return None

    def _entry_frame(self, cie: Optional["Cie"], at: int, end: int) -> Optional[Frame]:
        """The frame at an FDE's first address: the CIE's initial rules, then the FDE's
        up to its first advance."""
        if cie is None:
            return None
        try:
            if cie.augmented:
                length, at = self.leb(at, end, signed=False)
                at += length
            if at >= end or self._advances(self.data[at]):
                # nothing before the first advance: the CIE's own frame (most FDEs),
                # worked out once per CIE
                if cie.instructions not in self._cie_frames:
                    state = _entry_rules(self, cie)
                    ok = state.run(cie.instructions, cie.end, entry=True)
                    self._cie_frames[cie.instructions] = state.frame() if ok else None
                return self._cie_frames[cie.instructions]
            state = _entry_rules(self, cie)
            if not state.run(cie.instructions, cie.end, entry=True) or \
                    not state.run(at, end, entry=True):
                return None
        except Truncated:
            return None
        return state.frame()

    @staticmethod
    def _advances(op: int) -> bool:
        """Whether a call frame instruction advances the location (advance_loc*,
        set_loc)."""
        return op & 0xC0 == 0x40 or op in (0x01, 0x02, 0x03, 0x04)

    def _cie_encoding(self, cie: int) -> Optional[int]:
        """The FDE pointer encoding of the CIE at offset `cie`; None when it is no CIE."""
        if cie in self.cie_encodings:
            return self.cie_encodings[cie]
        encoding = None
        if 0 <= cie and cie + 8 <= len(self.data) and self._u32(cie) not in (0, 0xFFFFFFFF) \
                and self._u32(cie + 4) == 0:
            try:
                encoding = self._read_cie(cie + 8, cie + 4 + self._u32(cie), cie)
            except Truncated:
                encoding = None
        self.cie_encodings[cie] = encoding
        return encoding

    def _read_cie(self, at: int, end: int, offset: int = -1) -> int:
        """The FDE pointer encoding of the CIE whose version byte is at `at`; what the
        walk wants of it (its rules, its LSDA encoding) recorded by `offset`."""
        cie = read_cie(self, at, end)
        if self.want_frames:
            self.cies[offset] = cie
        if not cie.augmented:
            return 0x00  # absolute pointers
        if self.want_lsdas and b"L" in cie.augmentation:
            self.lsda_encodings[offset] = cie.lsda_encoding  # None: its place is unknown
        if cie.pointer_encoding is not None:
            return cie.pointer_encoding
        if b"R" in cie.augmentation:  # past a letter this reader does not know
            raise UnsupportedEncoding(f"CIE augmentation {cie.augmentation!r}")
        return 0x00


def _entry_rules(reader: ValueReader, cie: "Cie") -> "FrameRules":
    return FrameRules(reader, cie.data_alignment, return_register=cie.return_register)


@dataclass(frozen=True)
class Cie:
    """A CIE's fields as read_cie reads them; each reader of call frame information
    (this walk, unwind_rows) decides what a CIE it cannot fully read means."""
    version: int
    augmentation: bytes
    code_alignment: int
    data_alignment: int
    return_register: int
    augmented: bool  # 'z': FDEs carry an augmentation data length
    instructions: int  # offset of its initial instructions
    end: int
    pointer_encoding: Optional[int]  # 'R''s: FDE pointers (None: no 'R' read)
    lsda_encoding: Optional[int]  # 'L''s: FDEs' LSDA pointers (None: no 'L' read)
    unknown_letter: bool  # the letters stop at one this reader does not know, whose
    # data's size is unknown: nothing after it is read


def read_cie(reader: ValueReader, at: int, end: int, debug: bool = False) -> Cie:
    """The CIE whose version byte is at `at` (its id before it checked by the caller),
    ending at `end`; `debug`: .debug_frame's (version 4 adds the address and segment
    selector sizes). Truncated where it runs past `end`; UnsupportedEncoding for a
    personality pointer padded to alignment, or a .debug_frame CIE whose addresses
    are not 8 bytes (or that has segments)."""
    version = reader.byte(at, end)
    nul = reader.data.find(b"\0", at + 1, end)
    if nul < 0:
        raise Truncated
    augmentation = bytes(reader.data[at + 1:nul])
    at = nul + 1
    if augmentation.startswith(b"eh"):  # an old GCC's eh_ptr word
        at += 8
    if debug and version >= 4:  # address and segment selector sizes
        if reader.byte(at, end) != 8 or reader.byte(at + 1, end) != 0:
            raise UnsupportedEncoding("a .debug_frame CIE of other address sizes")
        at += 2
    code_alignment, at = reader.leb(at, end, signed=False)
    data_alignment, at = reader.leb(at, end, signed=True)
    if version == 1:
        return_register, at = reader.byte(at, end), at + 1
    else:
        return_register, at = reader.leb(at, end, signed=False)
    augmented = augmentation.startswith(b"z")
    encoding = lsda = None
    unknown = False
    if augmented:
        length, at = reader.leb(at, end, signed=False)  # augmentation data length
        data, at = at, at + length
        for letter in augmentation[1:]:
            if letter == ord("R"):
                encoding, data = reader.byte(data, end), data + 1
            elif letter == ord("L"):
                lsda, data = reader.byte(data, end), data + 1
            elif letter == ord("P"):  # the personality routine: skipped, only its size matters
                personality = reader.byte(data, end)
                if personality & 0x70 == 0x50:  # DW_EH_PE_aligned: padding we do not model
                    raise UnsupportedEncoding(f"personality encoding {personality:#x}")
                _, data = reader.pointer(data + 1, personality & 0x0F, end)
            elif letter not in b"SBG":  # signal frame, arm64 key B, memory tagging: no data
                unknown = True  # an unknown letter hides where the next ones are
                break
    return Cie(version, augmentation, code_alignment, data_alignment, return_register,
               augmented, at, end, encoding, lsda, unknown)


_ADVANCE_FIXED = {0x02: "<B", 0x03: "<H", 0x04: "<I"}  # advance_loc1, 2, 4
# what the first rows of a function need (entry frames); the rest: expressions,
# remember/restore state, arm64's return address signing (unwind_rows reads them)
_ENTRY_OPS = frozenset({0x00, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0C, 0x0D, 0x0E, 0x11, 0x12, 0x13,
                        0x14, 0x15, 0x2E, 0x2F})


class FrameRules:
    """The rules while call frame instructions run: the CFA (("register", reg, offset)
    or ("expression", bytes)), each register's rule (unwind_rows.Row says which), and
    whether arm64's return address is signed; offsets in bytes."""

    def __init__(self, reader: ValueReader, data_alignment: int, code_alignment: int = 1,
                 return_register: int = -1):
        self.reader = reader
        self.data_alignment, self.code_alignment = data_alignment, code_alignment
        self.return_register = return_register
        self.cfa: Optional[Tuple] = None
        self.registers: Dict[int, Tuple] = {}
        self.initial: Dict[int, Tuple] = {}  # the CIE's, for restore (none: unspecified)
        self.signed = False
        self.saved: list = []  # remember_state's stack

    def frame(self) -> Optional[Frame]:
        if self.cfa is None or self.cfa[0] != "register":
            return None
        rule = self.registers.get(self.return_register, ("same",))
        return Frame(self.cfa[1], self.cfa[2], rule)

    def run(self, at: int, end: int, loc: int = 0, reached=None, entry: bool = False) -> bool:
        """Runs the instructions in [at, end) from location `loc`. At each advance,
        `reached(new location)` (it returns False to stop there). `entry`: up to the
        first advance only, and False at any instruction an entry frame does not read.
        False at one this reader does not follow."""
        t, align = self.reader, self.data_alignment
        while at < end:
            op = t.byte(at, end)
            at += 1
            high, low = op & 0xC0, op & 0x3F
            if high == 0x40 or op in _ADVANCE_FIXED or op == 0x01:
                if entry:
                    return True
                if op == 0x01:  # set_loc: an absolute address (never seen in these files)
                    return False
                if high == 0x40:
                    delta = low
                else:
                    delta = t._fixed(_ADVANCE_FIXED[op], at)
                    at += struct.calcsize(_ADVANCE_FIXED[op])
                loc += delta * self.code_alignment
                if reached is not None and not reached(loc):
                    return True
                continue
            if entry and high == 0 and op not in _ENTRY_OPS:
                return False
            uleb = lambda: t.leb(at, end, signed=False)  # noqa: E731
            sleb = lambda: t.leb(at, end, signed=True)  # noqa: E731
            if high == 0x80:  # offset
                n, at = uleb()
                self.registers[low] = ("offset", n * align)
            elif high == 0xC0 or op == 0x06:  # restore, restore_extended
                if op == 0x06:
                    low, at = uleb()
                if low in self.initial:
                    self.registers[low] = self.initial[low]
                else:
                    self.registers.pop(low, None)
            elif op == 0x00:  # nop
                pass
            elif op in (0x05, 0x11, 0x2F):  # offset_extended(_sf), GNU negative offset
                reg, at = uleb()
                n, at = sleb() if op == 0x11 else uleb()
                self.registers[reg] = ("offset", -n * align if op == 0x2F else n * align)
            elif op in (0x07, 0x08):  # undefined, same_value
                reg, at = uleb()
                self.registers[reg] = ("undefined",) if op == 0x07 else ("same",)
            elif op == 0x09:  # register
                reg, at = uleb()
                other, at = uleb()
                self.registers[reg] = ("register", other)
            elif op == 0x0A:  # remember_state
                self.saved.append((dict(self.registers), self.cfa, self.signed))
            elif op == 0x0B:  # restore_state: the CFA too (as GCC's unwinder, gdb, readelf)
                if not self.saved:
                    return False
                self.registers, self.cfa, self.signed = self.saved.pop()
            elif op in (0x0C, 0x12):  # def_cfa(_sf)
                reg, at = uleb()
                n, at = uleb() if op == 0x0C else sleb()
                self.cfa = ("register", reg, n if op == 0x0C else n * align)
            elif op in (0x0D, 0x0E, 0x13):  # def_cfa_register, def_cfa_offset(_sf)
                if self.cfa is None or self.cfa[0] != "register":
                    return False
                _, reg, offset = self.cfa
                if op == 0x0D:
                    reg, at = uleb()
                else:
                    offset, at = uleb() if op == 0x0E else sleb()
                    offset = offset if op == 0x0E else offset * align
                self.cfa = ("register", reg, offset)
            elif op in (0x14, 0x15):  # val_offset(_sf)
                reg, at = uleb()
                n, at = uleb() if op == 0x14 else sleb()
                self.registers[reg] = ("value", n * align)
            elif op == 0x0F:  # def_cfa_expression
                block, at = self._block(at, end)
                self.cfa = ("expression", block)
            elif op in (0x10, 0x16):  # expression, val_expression
                reg, at = uleb()
                block, at = self._block(at, end)
                self.registers[reg] = ("expression" if op == 0x10 else "value_expression", block)
            elif op == 0x2D:  # AArch64's negate_ra_state (GNU_window_save elsewhere: SPARC only)
                self.signed = not self.signed
            elif op == 0x2E:  # GNU_args_size
                _, at = uleb()
            else:  # vendor ops
                return False
        return True

    def _block(self, at: int, end: int) -> Tuple[bytes, int]:
        size, at = self.reader.leb(at, end, signed=False)
        if at + size > end:
            raise Truncated
        return bytes(self.reader.data[at:at + size]), at + size
