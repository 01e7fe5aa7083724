"""Reads an ELF file: checks it, and exposes the headers the writer changes.

Headers, segments, sections and the dynamic table are read here with `struct`,
because the writer rewrites them byte for byte; symbols and .eh_frame are read
by elf_symbols.py and eh_frame.py. Anything malformed becomes a UrewriteError.
"""

from __future__ import annotations

import bisect

import os
import struct
from dataclasses import dataclass
from typing import List, Optional, Tuple

from urewrite.arch import machine_name
from urewrite.errors import UrewriteError

ET_EXEC, ET_DYN = 2, 3
PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_PHDR, PT_TLS = 1, 2, 3, 6, 7
PT_GNU_PROPERTY = 0x6474E553
PF_X, PF_W, PF_R = 1, 2, 4
SHT_NOBITS = 8
SHF_EXECINSTR = 4
DT_NULL, DT_INIT, DT_TEXTREL, DT_FLAGS, DT_FLAGS_1 = 0, 12, 22, 30, 0x6FFFFFFB
DF_TEXTREL = 4
DF_1_PIE = 0x08000000
GNU_PROPERTY_X86_FEATURE_1_AND = 0xC0000002
GNU_PROPERTY_X86_FEATURE_1_SHSTK = 2
GNU_PROPERTY_AARCH64_FEATURE_1_AND = 0xC0000000
GNU_PROPERTY_AARCH64_FEATURE_1_GCS = 4  # the Guarded Control Stack, arm64's shadow stack

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
PHDR = struct.Struct("<IIQQQQQQ")
SHDR = struct.Struct("<IIQQQQIIQQ")


@dataclass
class Segment:
    type: int
    flags: int
    offset: int
    vaddr: int
    paddr: int
    filesz: int
    memsz: int
    align: int

    def pack(self) -> bytes:
        return PHDR.pack(self.type, self.flags, self.offset, self.vaddr, self.paddr,
                         self.filesz, self.memsz, self.align)


@dataclass
class Section:
    index: int
    name: str
    name_offset: int
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    addralign: int
    entsize: int

    @property
    def end(self) -> int:
        return self.addr + self.size

    def pack(self) -> bytes:
        return SHDR.pack(self.name_offset, self.type, self.flags, self.addr, self.offset,
                         self.size, self.link, self.info, self.addralign, self.entsize)


class ElfFile:
    """One ELF file, read whole into memory."""

    def __init__(self, path: str, data: bytes):
        self.path = path
        self.data = data
        self._check_and_parse()

    @classmethod
    def open(cls, path: str) -> "ElfFile":
        try:
            with open(path, "rb") as f:
                data = f.read()
        except IsADirectoryError:
            raise UrewriteError(f"{path}: is a directory")
        except OSError as e:
            raise UrewriteError(f"{path}: {e.strerror}")
        return cls(path, data)

    # -- parsing -------------------------------------------------------------
    def _fail(self, why: str):
        raise UrewriteError(f"{self.path}: {why}")

    def _check_and_parse(self) -> None:
        data = self.data
        if len(data) < 4 or data[:4] != b"\x7fELF":
            self._fail("not an ELF file")
        if len(data) < EHDR.size:
            self._fail("truncated ELF header")
        (ident, self.type, self.machine, _, self.entry, self.phoff, self.shoff, _,
         ehsize, phentsize, self.phnum, shentsize, self.shnum, self.shstrndx) = EHDR.unpack_from(data)
        if ident[4] != 2:
            self._fail("32-bit ELF files are not supported")
        if ident[5] != 1:
            self._fail("big-endian ELF files are not supported")
        if self.type not in (ET_EXEC, ET_DYN):
            self._fail("not an executable or shared object (relocatable objects and core files"
                       " are not supported)")
        from urewrite.arch import backend_for
        if backend_for(self.machine) is None:
            self._fail(f"unsupported machine {machine_name(self.machine)}")
        if phentsize != PHDR.size or self.phnum == 0:
            self._fail("corrupt ELF: bad program header table")
        if self.phoff + self.phnum * PHDR.size > len(data):
            self._fail("truncated ELF: program headers lie past the end of the file")
        self.segments: List[Segment] = [
            Segment(*PHDR.unpack_from(data, self.phoff + i * PHDR.size)) for i in range(self.phnum)]
        # (asked for every address read: a list made once)
        self._loads = tuple(s for s in self.segments if s.type == PT_LOAD)
        by_address = sorted(self._loads, key=lambda s: s.vaddr)
        self._loads_apart = all(a.vaddr + a.filesz <= b.vaddr
                                for a, b in zip(by_address, by_address[1:]))
        self._last_load: Optional[Segment] = None  # (offset_of's last answer)
        for seg in self.segments:
            # (a segment with no file bytes may have any offset, as a rewrite's state has)
            if seg.type in (PT_LOAD, PT_DYNAMIC) and seg.filesz and \
                    seg.offset + seg.filesz > len(data):
                self._fail("truncated ELF: a segment lies past the end of the file")
            if seg.type == PT_LOAD and seg.filesz > seg.memsz:
                self._fail("corrupt ELF: a segment is larger in the file than in memory")
        if not self.loads:
            self._fail("corrupt ELF: no loadable segment")
        self.sections: List[Section] = []
        self._section_starts: Optional[List[int]] = None  # (section_at's index, when made)
        if self.shnum:
            if shentsize != SHDR.size or self.shoff + self.shnum * SHDR.size > len(data):
                self._fail("truncated ELF: section headers lie past the end of the file")
            raw = [SHDR.unpack_from(data, self.shoff + i * SHDR.size) for i in range(self.shnum)]
            if self.shstrndx >= self.shnum:
                self._fail("corrupt ELF: bad section name table index")
            names = raw[self.shstrndx]
            for i, r in enumerate(raw):
                if r[1] != SHT_NOBITS and r[1] != 0 and r[4] + r[5] > len(data):
                    self._fail("truncated ELF: a section lies past the end of the file")
                name = self._cstring(names[4] + r[0], names[4] + names[5])
                self.sections.append(Section(i, name, r[0], *r[1:]))

    def _cstring(self, start: int, limit: int) -> str:
        end = self.data.find(b"\0", start, limit)
        return self.data[start:end if end >= 0 else limit].decode(errors="replace")

    # -- questions -------------------------------------------------------------
    @property
    def loads(self) -> Tuple[Segment, ...]:
        return self._loads

    def has_segment(self, kind: int) -> bool:
        return any(s.type == kind for s in self.segments)

    @property
    def is_executable(self) -> bool:
        """Started by the kernel (has an entry point that runs), not only loaded as a library."""
        if self.type == ET_EXEC or self.has_segment(PT_INTERP):
            return True
        flags = self.dynamic_value(DT_FLAGS_1)
        return bool(flags and flags & DF_1_PIE)

    def offset_of(self, vaddr: int, size: int = 1) -> Optional[int]:
        """File offset of `vaddr` when `size` bytes there are backed by the file."""
        seg = self._last_load  # (most reads follow one in the same segment: its code)
        if seg is not None and seg.vaddr <= vaddr and vaddr + size <= seg.vaddr + seg.filesz:
            return seg.offset + vaddr - seg.vaddr
        for seg in self.loads:
            if seg.vaddr <= vaddr and vaddr + size <= seg.vaddr + seg.filesz:
                # (kept only where no two loads overlap: else the first that holds
                # it is the answer, each time)
                self._last_load = seg if self._loads_apart else None
                return seg.offset + vaddr - seg.vaddr
        return None

    def read(self, vaddr: int, size: int) -> bytes:
        offset = self.offset_of(vaddr, size)
        if offset is None:
            raise UrewriteError(f"{self.path}: address {vaddr:#x} is not in the file")
        return self.data[offset:offset + size]

    def section_named(self, name: str) -> Optional[Section]:
        return next((s for s in self.sections if s.name == name), None)

    def section_at(self, vaddr: int) -> Optional[Section]:
        if self._section_starts is None:
            self._index_sections()
        if self._section_starts:  # (asked for every window that borrows padding)
            k = bisect.bisect_right(self._section_starts, vaddr) - 1
            found = self._sections_by_address[k] if k >= 0 else None
            return found if found is not None and vaddr < found.end else None
        for s in self.sections:
            if s.addr and s.addr <= vaddr < s.end and s.type != SHT_NOBITS:
                return s
        return None

    def _index_sections(self) -> None:
        """The sections section_at() may give, by address, where no two of them overlap
        (else it looks at each in order: the first that holds the address wins)."""
        held = sorted((s for s in self.sections if s.addr and s.size and s.type != SHT_NOBITS),
                      key=lambda s: s.addr)
        apart = all(a.end <= b.addr for a, b in zip(held, held[1:]))
        self._sections_by_address = held if apart else []
        self._section_starts = [s.addr for s in held] if apart else []

    def executable_sections(self) -> List[Section]:
        return [s for s in self.sections if s.flags & SHF_EXECINSTR and s.type != SHT_NOBITS]

    def dynamic_entries(self):
        """(tag, value, file offset of the entry) for each .dynamic entry."""
        seg = next((s for s in self.segments if s.type == PT_DYNAMIC), None)
        if seg is None:
            return []
        out = []
        for at in range(seg.offset, seg.offset + seg.filesz - 15, 16):
            tag, value = struct.unpack_from("<qQ", self.data, at)
            out.append((tag, value, at))
            if tag == DT_NULL:
                break
        return out

    def dynamic_value(self, tag: int) -> Optional[int]:
        return next((v for t, v, _ in self.dynamic_entries() if t == tag), None)

    def notes(self):
        """(owner, type, descriptor) of every note in PT_NOTE-style sections."""
        for sec in self.sections:
            if sec.type != 7:  # SHT_NOTE
                continue
            at, end = sec.offset, sec.offset + sec.size
            while at + 12 <= end:
                namesz, descsz, kind = struct.unpack_from("<III", self.data, at)
                name_at = at + 12
                desc_at = name_at + ((namesz + 3) & ~3)
                align = 8 if sec.addralign == 8 else 4
                next_at = desc_at + ((descsz + align - 1) & ~(align - 1))
                if next_at > end or desc_at + descsz > end:
                    break
                owner = self.data[name_at:name_at + namesz].rstrip(b"\0")
                yield owner, kind, self.data[desc_at:desc_at + descsz]
                at = next_at

    @property
    def build_id(self) -> bytes:
        for owner, kind, desc in self.notes():
            if owner == b"GNU" and kind == 3:
                return desc
        return b""

    @property
    def text_relocations(self) -> bool:
        """Whether the dynamic loader may write into the code (DT_TEXTREL)."""
        entries = {tag: value for tag, value, _ in self.dynamic_entries()}
        return DT_TEXTREL in entries or bool(entries.get(DT_FLAGS, 0) & DF_TEXTREL)

    @property
    def shadow_stack(self) -> bool:
        """Whether the GNU property note marks the file as compatible with a hardware
        shadow stack: CET's on x86_64, the Guarded Control Stack on arm64."""
        for owner, kind, desc in self.notes():
            if owner != b"GNU" or kind != 5:
                continue
            at = 0
            while at + 8 <= len(desc):
                ptype, size = struct.unpack_from("<II", desc, at)
                if ptype == GNU_PROPERTY_X86_FEATURE_1_AND and size >= 4:
                    value = struct.unpack_from("<I", desc, at + 8)[0]
                    return bool(value & GNU_PROPERTY_X86_FEATURE_1_SHSTK)
                if ptype == GNU_PROPERTY_AARCH64_FEATURE_1_AND and size >= 4:
                    value = struct.unpack_from("<I", desc, at + 8)[0]
                    return bool(value & GNU_PROPERTY_AARCH64_FEATURE_1_GCS)
                at += 8 + ((size + 7) & ~7)
        return False

    @property
    def name(self) -> str:
        return os.path.basename(self.path)
