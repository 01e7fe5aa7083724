"""Finds code that the program copies elsewhere at run time, which must not be patched.

A patch is a PC-relative jump to a trampoline. Copied to another address, it
lands wherever the same offset leads from there: into data, or into nothing.
The known case is V8 (node, libnode, Chromium, Electron): it copies its embedded
builtins, the `Builtins_*` functions, into its own code range at start-up
("short builtin calls") and runs them there. The builtins lie between the
symbol `v8_Default_embedded_blob_code_` and that address plus the 32-bit value
stored at `v8_Default_embedded_blob_code_size_` (older V8 versions: one blob,
`v8_Default_embedded_blob_` and `v8_Default_embedded_blob_size_`).

The names are looked for in the string tables first, a byte search: files
without them (nearly all) pay no symbol walk. A stripped file has neither the
markers nor the `Builtins_*` names, so only an address probe can reach the
blob there; docs/design.md warns about it and `--exclude` leaves code out by name.
"""

from __future__ import annotations

import struct
from typing import List, NamedTuple, Optional

from urewrite.rewriter import elf_symbols
from urewrite.rewriter.elf_file import ElfFile

SHT_STRTAB = 3

# (symbol at the start, symbol holding the size as a u32, what the code is)
_MARKERS = (
    ("v8_Default_embedded_blob_code_", "v8_Default_embedded_blob_code_size_",
     "V8's embedded builtins"),
    ("v8_Default_embedded_blob_", "v8_Default_embedded_blob_size_", "V8's embedded blob"),
)


class CopiedCode(NamedTuple):
    start: int
    end: int
    what: str  # "V8's embedded builtins"
    marker: str  # the symbol that gives it away

    def reason(self) -> str:
        return (f"it lies in {self.what} ({self.marker}, {self.start:#x}-{self.end:#x}), "
                f"which the program copies elsewhere at run time; a patch there would jump "
                f"from the copy into nothing")


def find(elf: ElfFile) -> List[CopiedCode]:
    """The ranges of code the program is known to copy, sorted by address."""
    present = [m for m in _MARKERS if _in_string_tables(elf, m[0])]
    if not present:
        return []
    values = elf_symbols.table(elf).values_of(
        [name for marker in present for name in marker[:2]])
    found = []
    for start_name, size_name, what in present:
        start = values.get(start_name)
        if start is None:
            continue
        end = _end(elf, start, values.get(size_name))
        if end > start:
            found.append(CopiedCode(start, end, what, start_name))
    return sorted(found)


def _in_string_tables(elf: ElfFile, name: str) -> bool:
    """Whether a string table holds `name` (perhaps as the tail of a longer string)."""
    needle = name.encode() + b"\0"
    return any(elf.data.find(needle, s.offset, s.offset + s.size) >= 0
               for s in elf.sections if s.type == SHT_STRTAB)


def _end(elf: ElfFile, start: int, size_at: Optional[int]) -> int:
    """Where the copied code ends: by its size variable, else (no such symbol, or no
    bytes behind it) conservatively at the end of the section that holds it."""
    if size_at is not None:
        offset = elf.offset_of(size_at, 4)
        size = struct.unpack_from("<I", elf.data, offset)[0] if offset is not None else 0
        if size:
            return start + size
    section = elf.section_at(start)
    return section.end if section is not None else start
