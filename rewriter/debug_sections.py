"""What debuggers and profilers read of the new code: symbols and unwind rows.

A fault in an instruction a window moved happens at its trampoline address; gdb, a core
dump's reader or perf then look that address up. So the output gets, in sections no
loader reads (they change nothing at run time):

- symbols (.symtab, .strtab): each trampoline as `FUNCTION.urewrite` (as GCC names the
  parts it splits off, `f.cold`: a backtrace says which function, and `break f` stays
  one place), the runtime's routines as `urewrite.NAME`;
- unwind rows (.debug_frame): at each moved instruction, the rows .eh_frame gives its
  original address, so a debugger unwinds from it to the callers as from the original.
  The checks and out-of-line parts around them have no rows (an unwinder stops there,
  rather than guess): nothing there faults. A relocation that is several instructions
  (a call made a push and a jump) has its first instruction's row throughout.

An input with a symbol table keeps it: its entries, then the new local symbols after its
own, then its global ones (an index of a global moves: a file whose relocations name one
of its globals, as an object file's do, or whose table has a section group or extended
indexes, or names in a loaded section, gets no new symbols).
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from urewrite.rewriter.elf_file import ElfFile, Section
from urewrite.rewriter.functions import containing
from urewrite.rewriter.unwind_rows import Row, rows_at, section_contents

SHT_PROGBITS, SHT_SYMTAB, SHT_REL, SHT_RELA, SHT_GROUP, SHT_SYMTAB_SHNDX = 1, 2, 9, 4, 17, 18
SHF_ALLOC = 2
STT_FUNC, STB_LOCAL = 2, 0
SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
SUFFIX = ".urewrite"


@dataclass(frozen=True)
class Span:
    """A trampoline: [start, end) in the new code, made for the window at `window`;
    `moved`: (trampoline address, original address, size there) of each instruction."""
    start: int
    end: int
    window: int
    moved: Tuple[Tuple[int, int, int], ...]


@dataclass
class DebugSections:
    symtab: Optional[bytes]  # None: the input's table stays as it is
    strtab: Optional[bytes]
    locals_end: int  # the table's sh_info: the first global's index
    debug_frame: bytes  # the input's own entries first, where it has the section
    extends: Optional[Section] = None  # that section, whose place the output's takes


def build(elf: ElfFile, spans: Sequence[Span], routines: Sequence[Tuple[str, int, int]],
          function_at: Callable[[int], Optional[str]], text_section: int) -> DebugSections:
    """`routines`: (name, start, end) of the runtime's; `function_at(address)`: the name
    of the function an original address lies in; `text_section`: the index of the section
    that holds the new code."""
    symbols = [(f"urewrite.{name}", start, end - start) for name, start, end in routines]
    for span in spans:
        name = function_at(span.window)
        if name:
            symbols.append((name + SUFFIX, span.start, span.end - span.start))
    symtab, strtab, locals_end = _symbol_table(elf, symbols, text_section)
    own = _own_debug_frame(elf)
    frames = _debug_frame(elf, spans, own)
    return DebugSections(symtab, strtab, locals_end, frames,
                         own[0] if frames and own else None)


def _own_debug_frame(elf: ElfFile):
    """The input's .debug_frame section, which the output's extends (a debugger reads one
    section of the name: Go programs, and C built with -g and no .eh_frame, have one),
    and its contents (inflated: the output's is not compressed); None if none, False if
    it cannot be read."""
    section = elf.section_named(".debug_frame")
    if section is None:
        return None
    data = section_contents(elf, ".debug_frame") if section.type == SHT_PROGBITS else None
    return (section, data) if data is not None else False


def _symbol_table(elf: ElfFile, symbols, shndx: int):
    """(.symtab, .strtab, sh_info) with `symbols` ((name, address, size)) added as local
    functions in section `shndx`; (None, None, 0) where the input's cannot take them."""
    old = next((s for s in elf.sections if s.type == SHT_SYMTAB), None)
    if old is not None:
        if any(s.link == old.index and (s.type in (SHT_GROUP, SHT_SYMTAB_SHNDX) or
                                        _names_globals(elf, s, old.info)) for s in elf.sections) \
                or old.link == elf.shstrndx or old.entsize != SYMBOL.size \
                or not 0 < old.link < len(elf.sections) \
                or elf.sections[old.link].flags & SHF_ALLOC:  # (names loaded: .dynstr's)
            return None, None, 0
        names_section = elf.sections[old.link]
        strings = bytearray(elf.data[names_section.offset:
                                     names_section.offset + names_section.size])
        entries = elf.data[old.offset:old.offset + old.size - old.size % SYMBOL.size]
        split = min(old.info, len(entries) // SYMBOL.size) * SYMBOL.size
        head, tail, locals_end = entries[:split], entries[split:], old.info
    else:
        strings, head, tail, locals_end = bytearray(b"\0"), bytes(SYMBOL.size), b"", 1
    added = bytearray()
    for name, address, size in symbols:
        added += SYMBOL.pack(len(strings), STB_LOCAL << 4 | STT_FUNC, 0, shndx, address, size)
        strings += name.encode() + b"\0"
    return bytes(head) + bytes(added) + bytes(tail), bytes(strings), \
        locals_end + len(symbols)


def _names_globals(elf: ElfFile, section, first_global: int) -> bool:
    """Whether relocation `section` names a symbol of the table from `first_global` on,
    whose index the new local symbols would move. (A static executable's .rela.plt is
    linked to .symtab, its IRELATIVE entries naming symbol 0.)"""
    if section.type not in (SHT_REL, SHT_RELA):
        return False
    size = 24 if section.type == SHT_RELA else 16
    data = elf.data[section.offset:section.offset + section.size - section.size % size]
    return any(struct.unpack_from("<Q", data, k + 8)[0] >> 32  # r_info, in Rel and Rela
               >= first_global for k in range(0, len(data), size))


def _debug_frame(elf: ElfFile, spans: Sequence[Span], own) -> bytes:
    """The input's .debug_frame entries (`own`: _own_debug_frame's; CIE pointers are
    offsets in the section: its stay valid), then the rows of `spans`; b"" where there is
    nothing to add or no section it can go into."""
    if own is False:
        return b""
    rows = rows_at(elf, sorted({o for span in spans for _, o, _ in span.moved}),
                   own[1] if own else None)
    if not rows:
        return b""
    out = bytearray(own[1] if own else b"")
    cies: Dict[int, int] = {}  # return address register -> its CIE's offset
    for span in spans:
        run: List[Tuple[int, Row]] = []
        end = None
        for t, o, size in span.moved:
            row = rows.get(o)
            if row is None or (run and (t != end or row.return_register
                                        != run[0][1].return_register)):
                _fde(out, cies, run, end)
                run = []
            if row is not None:
                run.append((t, row))
                end = t + size
        _fde(out, cies, run, end)
    return bytes(out)


def _fde(out: bytearray, cies: Dict[int, int], run, end: Optional[int]) -> None:
    """An FDE for `run` ((address, row) from its first address on) up to `end`."""
    if not run:
        return
    ra = run[0][1].return_register
    if ra not in cies:
        cies[ra] = len(out)
        # version 1, no augmentation, code alignment 1, data alignment 1: locations
        # and offsets in bytes; no initial rule
        _entry(out, struct.pack("<I", 0xFFFFFFFF) + b"\x01\x00\x01\x01" + bytes([ra]))
    body = bytearray(struct.pack("<IQQ", cies[ra], run[0][0], end - run[0][0]))
    previous, at = None, run[0][0]
    for address, row in run:
        if previous is not None:
            if row == previous:
                continue
            body += _advance(address - at)
        body += _changes(previous, row)
        previous, at = row, address
    _entry(out, bytes(body))


def _entry(out: bytearray, body: bytes) -> None:
    """A CIE or FDE: its length, `body`, nops to an 8-byte boundary."""
    padding = -(4 + len(body)) % 8
    out += struct.pack("<I", len(body) + padding) + body + bytes(padding)


def _advance(delta: int) -> bytes:
    if delta < 0x40:
        return bytes([0x40 | delta])
    if delta < 0x100:
        return struct.pack("<BB", 0x02, delta)
    if delta < 0x10000:
        return struct.pack("<BH", 0x03, delta)
    return struct.pack("<BI", 0x04, delta)


@functools.lru_cache(maxsize=4096)  # (most trampolines' rows are a few functions' entry rows)
def _changes(previous: Optional[Row], row: Row) -> bytes:
    """The call frame instructions that turn `previous` (None: no rule at all) into `row`."""
    out = bytearray()
    if previous is None or row.cfa != previous.cfa:
        if row.cfa[0] == "register":
            _, reg, offset = row.cfa
            out += (bytes([0x0C]) + uleb128(reg) + uleb128(offset) if offset >= 0 else
                    bytes([0x12]) + uleb128(reg) + sleb128(offset))
        else:
            out += bytes([0x0F]) + uleb128(len(row.cfa[1])) + row.cfa[1]
    before = dict(previous.registers) if previous else {}
    after = dict(row.registers)
    for reg in sorted(set(before) | set(after)):
        if reg not in after:
            out += bytes([0x06]) + uleb128(reg)  # restore_extended: our CIE has no rule
        elif before.get(reg) != after[reg]:
            out += _rule(reg, after[reg])
    if row.return_address_signed != (previous.return_address_signed if previous else False):
        out.append(0x2D)
    return bytes(out)


def _rule(reg: int, rule: Tuple) -> bytes:
    kind = rule[0]
    if kind == "offset":
        return bytes([0x11]) + uleb128(reg) + sleb128(rule[1])
    if kind == "value":
        return bytes([0x15]) + uleb128(reg) + sleb128(rule[1])
    if kind == "register":
        return bytes([0x09]) + uleb128(reg) + uleb128(rule[1])
    if kind in ("undefined", "same"):
        return bytes([0x07 if kind == "undefined" else 0x08]) + uleb128(reg)
    op = 0x10 if kind == "expression" else 0x16
    return bytes([op]) + uleb128(reg) + uleb128(len(rule[1])) + rule[1]


def uleb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def sleb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        done = (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40)
        out.append(byte | (0 if done else 0x80))
        if done:
            return bytes(out)


def function_lookup(functions) -> Callable[[int], Optional[str]]:
    """function_at(address): the name of the function of `functions` (sorted by
    address) that holds it, or None."""
    starts = [fn.address for fn in functions]

    def function_at(address: int) -> Optional[str]:
        fn = containing(functions, starts, address)
        return fn.name if fn is not None else None
    return function_at
