"""Writes the rewritten file. Nothing of the original moves.

- site windows are overwritten in place (same offsets, same addresses);
- a new program header table goes at the start of the new code segment, with
  PT_PHDR pointing at it and the two new PT_LOADs after the last original one, then
  one per run of pages holding punned jumps' stubs, their bytes after the code's;
- a new section header table goes at the very end, with the new sections
  (.urewrite.rodata, .urewrite.text, .urewrite.state, .urewrite.live, and what debuggers
  read: .debug_frame, and .symtab and .strtab where the input has none) appended after
  the original ones so that every section index stays valid; the section name table
  is re-emitted there with the new names added, and so are an input's .symtab and
  .strtab with the new symbols (rewriter/debug_sections.py);
- the output appears under its name only once complete (temporary file + rename), written
  straight into that file: the original bytes once, then the changes in place.
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import replace
from typing import BinaryIO, Callable, Optional

from urewrite.errors import UrewriteError
from urewrite.rewriter.elf_file import (PF_R, PF_W, PF_X, PT_LOAD, PT_PHDR,
                                        ElfFile, Section, Segment)
from urewrite.rewriter import layout
from urewrite.rewriter.layout import PAGE, Placement, align_up
from urewrite.rewriter.debug_sections import DebugSections
from urewrite.rewriter.segment import SegmentImage
from urewrite.rewriter.unwind_rows import SHF_COMPRESSED

SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_NOBITS = 1, 2, 3, 8
SYMBOL_SIZE = 24  # Elf64_Sym
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 1, 2, 4
_E_ENTRY, _E_PHOFF, _E_SHOFF = 24, 32, 40
_E_PHNUM, _E_SHNUM = 56, 60


def render(elf: ElfFile, placement: Placement, image: SegmentImage,
           new_entry: Optional[int], dt_init_slot: Optional[int], out: BinaryIO,
           debug: Optional[Callable[[int], DebugSections]] = None) -> None:
    """Writes the output into the file `out`: the original bytes once, then each change
    in place, then what follows them; no second copy of a big file in memory.
    `debug(index)`: the symbols and unwind rows of the new code, given the index of the
    section that holds it."""
    out.write(elf.data)
    for address, patch in image.patches:
        out.seek(elf.offset_of(address, len(patch)))
        out.write(patch)
    if new_entry is not None:
        out.seek(_E_ENTRY)
        out.write(struct.pack("<Q", new_entry))
    if dt_init_slot is not None:
        out.seek(dt_init_slot)
        out.write(struct.pack("<qQ", 12, image.dso_start))  # DT_INIT

    state = Segment(PT_LOAD, PF_R | PF_W, placement.state_offset, placement.state_vaddr,
                    placement.state_vaddr, 0, placement.state_size, placement.align)
    code = Segment(PT_LOAD, PF_R | PF_X, placement.code_offset, placement.code_vaddr,
                   placement.code_vaddr, len(image.code), len(image.code), placement.align)
    stub_runs, at = [], align_up(placement.code_offset + len(image.code), PAGE)
    for address, stubs in layout.stub_pages(image.stubs):
        stub_runs.append((Segment(PT_LOAD, PF_R | PF_X, at, address, address, len(stubs),
                                  len(stubs), PAGE), stubs))
        at += len(stubs)
    last_load = max(i for i, s in enumerate(elf.segments) if s.type == PT_LOAD)
    table = []
    for i, seg in enumerate(elf.segments):
        if seg.type == PT_PHDR:
            seg = replace(seg, offset=placement.code_offset, vaddr=placement.code_vaddr,
                          paddr=placement.code_vaddr, filesz=placement.phdr_size,
                          memsz=placement.phdr_size)
        table.append(seg)
        if i == last_load:
            table += [code, state] + [run for run, _ in stub_runs]  # in address order
    assert len(table) == placement.phdr_count
    segment = bytearray(image.code)
    segment[:placement.phdr_size] = b"".join(s.pack() for s in table)

    out.seek(len(elf.data))
    out.write(bytes(placement.code_offset - len(elf.data)))
    out.write(segment)
    end = placement.code_offset + len(segment)
    for run, stubs in stub_runs:
        out.write(bytes(run.offset - end))
        out.write(stubs)
        end = run.offset + len(stubs)
    out.seek(_E_PHOFF)
    out.write(struct.pack("<Q", placement.code_offset))
    out.seek(_E_PHNUM)
    out.write(struct.pack("<H", len(table)))
    if elf.sections:
        _append_sections(elf, out, end, placement, image, debug)


def _append_sections(elf: ElfFile, out: BinaryIO, end: int, placement: Placement,
                     image: SegmentImage, debug=None) -> None:
    """The section name table and the section headers, appended at `end` (the end of
    the file so far), with the debug sections (not loaded) before them."""
    names_section = elf.sections[elf.shstrndx]
    names = bytearray(elf.data[names_section.offset:names_section.offset + names_section.size])
    new = []

    def add(name: str, type_: int, flags: int, addr: int, size: int, align: int) -> None:
        new.append(Section(len(elf.sections) + len(new), name, len(names), type_, flags, addr,
                           placement.code_offset + addr - placement.code_vaddr, size, 0, 0,
                           align, 0))
        names.extend(name.encode() + b"\0")

    add(".urewrite.rodata", SHT_PROGBITS, SHF_ALLOC, *image.template, 8)
    add(".urewrite.text", SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, *image.text, 16)
    add(".urewrite.state", SHT_NOBITS, SHF_ALLOC | SHF_WRITE, placement.state_vaddr,
        placement.state_size, PAGE)
    new[-1] = replace(new[-1], offset=placement.state_offset)
    if image.live:  # not loaded: a live tracer reads it from the file (trampolines/live_note.py)
        live_at = align_up(end, 8)
        out.seek(end)
        out.write(bytes(live_at - end) + image.live)
        add(".urewrite.live", SHT_PROGBITS, 0, 0, len(image.live), 8)
        new[-1] = replace(new[-1], addr=0, offset=live_at)
        end = live_at + len(image.live)

    replaced = {}  # index -> the section, its contents moved to the end
    if debug is not None:
        info = debug(len(elf.sections) + 1)  # (.urewrite.text: the second one added)

        def append(data: bytes) -> int:
            nonlocal end
            at = align_up(end, 8)
            out.seek(end)
            out.write(bytes(at - end) + data)
            end = at + len(data)
            return at

        if info.extends is not None:  # the input's, extended (and no longer compressed)
            section = info.extends
            replaced[section.index] = replace(
                section, offset=append(info.debug_frame), size=len(info.debug_frame),
                flags=section.flags & ~SHF_COMPRESSED, addralign=8)
        elif info.debug_frame:
            add(".debug_frame", SHT_PROGBITS, 0, 0, len(info.debug_frame), 8)
            new[-1] = replace(new[-1], addr=0, offset=append(info.debug_frame))
        old = next((s for s in elf.sections if s.type == SHT_SYMTAB), None)
        if info.symtab is not None and old is not None:  # the same table, grown
            strings = elf.sections[old.link]
            replaced[old.index] = replace(old, offset=append(info.symtab),
                                          size=len(info.symtab), info=info.locals_end)
            replaced[strings.index] = replace(strings, offset=append(info.strtab),
                                              size=len(info.strtab))
        elif info.symtab is not None:
            strtab_index = len(elf.sections) + len(new) + 1
            add(".symtab", SHT_SYMTAB, 0, 0, len(info.symtab), 8)
            new[-1] = replace(new[-1], addr=0, offset=append(info.symtab),
                              link=strtab_index, info=info.locals_end, entsize=SYMBOL_SIZE)
            add(".strtab", SHT_STRTAB, 0, 0, len(info.strtab), 1)
            new[-1] = replace(new[-1], addr=0, offset=append(info.strtab))

    names_at = end
    sections = [replace(s, offset=names_at, size=len(names)) if s.index == elf.shstrndx else
                replaced.get(s.index, s) for s in elf.sections] + new
    shoff = align_up(names_at + len(names), 8)
    out.seek(names_at)
    out.write(names + bytes(shoff - names_at - len(names)))
    out.write(b"".join(s.pack() for s in sections))
    out.seek(_E_SHOFF)
    out.write(struct.pack("<Q", shoff))
    out.seek(_E_SHNUM)
    out.write(struct.pack("<H", len(sections)))


def write_atomically(path: str, write: Callable[[BinaryIO], None], mode: int) -> None:
    """Create `path` with what `write(file)` writes, so that `path` is either untouched or
    complete."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, temporary = tempfile.mkstemp(prefix=".urewrite-", dir=directory)
    except OSError as e:
        raise UrewriteError(f"cannot write {path}: {e.strerror}")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            os.fchmod(f.fileno(), mode & 0o7777)
        os.replace(temporary, path)
    except BaseException as e:
        os.unlink(temporary)
        if isinstance(e, OSError):
            raise UrewriteError(f"cannot write {path}: {e.strerror}")
        raise
