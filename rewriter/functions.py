"""Finds the functions of an ELF file: symbols first, then .eh_frame for what they miss.

A stripped executable still has an FDE per function in .eh_frame; those get the
name fn_<address>. PLT stubs have FDEs too but are not functions of the file.
A function whose symbol has no size and no FDE (_init, _fini, the crtstuff
functions, hand-written assembly) extends to the next thing that starts after
it: a symbol, an FDE, or the end of its section. The planner checks more before
it trusts such an extent with a return probe (it must end in a return or jump).
Both tables are read by our own readers (elf_symbols.py, eh_frame.py): LIEF's
import alone costs more than a one-probe rewrite. LIEF still reads an .eh_frame
whose pointer encodings ours does not know.
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Tuple

import numpy as np

from urewrite.arch.base import value_class
from urewrite.rewriter import eh_frame
from urewrite.rewriter.elf_file import ElfFile
from urewrite.rewriter.elf_symbols import SHN_UNDEF, STT_FUNC
from urewrite.rewriter.elf_symbols import table as symbol_table


@value_class
class Function:
    name: str
    address: int
    size: int  # 0 when neither a symbol nor an FDE gives it
    origin: str  # "symtab", "dynsym" or "eh_frame"
    aliases: tuple = ()
    # where the size comes from: "symbol", "eh_frame", or "next symbol" / "next FDE" /
    # "section end" for an extent inferred up to what follows it
    sized_by: str = "symbol"

    @property
    def size_inferred(self) -> bool:
        return self.sized_by not in ("symbol", "eh_frame")

    @property
    def end(self) -> int:
        return self.address + self.size

    @property
    def names(self) -> tuple:
        return (self.name,) + self.aliases


def discover(elf: ElfFile) -> List[Function]:
    """Functions sorted by address; symbols at one address merge into one function."""
    in_code = _code_ranges(elf)
    by_address: Dict[int, dict] = {}
    table = symbol_table(elf)
    defined = (table.shndx != SHN_UNDEF) & (table.values != 0) & in_code(table.values)
    # addresses in code where something starts -> what
    marks: Dict[int, str] = dict.fromkeys(table.values[defined].tolist(), "next symbol")
    functions = np.flatnonzero(defined & (table.types == STT_FUNC))
    for name, value, size, origin in zip(table.names(functions),
                                         table.values[functions].tolist(),
                                         table.sizes[functions].tolist(),
                                         table.table_names(functions)):
        if not name:
            continue
        entry = by_address.get(value)
        if entry is None:
            by_address[value] = {"names": [name], "size": size, "origin": origin,
                                 "sized_by": "symbol"}
            continue
        if name not in entry["names"]:
            entry["names"].append(name)
        entry["size"] = entry["size"] or size
    fdes = _fde_ranges(elf)
    addresses = np.array([a if a < 1 << 63 else -1 for a, _ in fdes], dtype=np.int64)
    for (address, size), code in zip(fdes, in_code(addresses).tolist()):
        if not size or not code:
            continue
        marks.setdefault(address, "next FDE")
        entry = by_address.get(address)
        if entry is None:
            by_address[address] = {"names": [f"fn_{address:x}"], "size": size,
                                   "origin": "eh_frame", "sized_by": "eh_frame"}
        elif not entry["size"]:
            entry["size"], entry["sized_by"] = size, "eh_frame"
    _infer_extents(elf, by_address, marks)
    return [Function(e["names"][0], address, e["size"], e["origin"], tuple(e["names"][1:]),
                     e["sized_by"])
            for address, e in sorted(by_address.items())]


def _infer_extents(elf: ElfFile, by_address: Dict[int, dict], marks: Dict[int, str]) -> None:
    """Sizes for functions that have none: up to the next symbol or FDE start, or
    the end of the section, whichever comes first."""
    starts = sorted(marks)
    for address, entry in by_address.items():
        if entry["size"]:
            continue
        section = elf.section_at(address)
        end, why = section.end, "section end"
        k = bisect.bisect_right(starts, address)
        if k < len(starts) and starts[k] < end:
            end, why = starts[k], marks[starts[k]]
        entry["size"], entry["sized_by"] = end - address, why


def _code_ranges(elf: ElfFile):
    """in_code(addresses): a mask of the addresses (a numpy int64 array) that lie in an
    executable section other than the PLT's."""
    ranges = sorted((s.addr, s.end) for s in elf.executable_sections()
                    if s.size and not s.name.startswith(".plt"))
    starts = np.array([start for start, _ in ranges] or [0], dtype=np.int64)
    ends = np.array([end for _, end in ranges] or [0], dtype=np.int64)

    def in_code(addresses: np.ndarray) -> np.ndarray:
        # sections do not overlap, so only the last one starting at or before it can hold it
        i = np.searchsorted(starts, addresses, side="right") - 1
        return (i >= 0) & (addresses < ends[np.maximum(i, 0)])
    return in_code


def _fde_ranges(elf: ElfFile) -> List[Tuple[int, int]]:
    try:
        return eh_frame.fde_ranges(elf)
    except eh_frame.UnsupportedEncoding:
        return _fde_ranges_by_lief(elf)


def _fde_ranges_by_lief(elf: ElfFile) -> List[Tuple[int, int]]:
    import lief  # 0.3 s to import: only for the rare file our reader does not know
    lief.logging.disable()
    binary = lief.parse(elf.path)
    if binary is None:
        from urewrite.errors import UrewriteError
        raise UrewriteError(f"{elf.path}: corrupt ELF (LIEF could not parse it)")
    return [(fn.address, fn.size) for fn in binary.functions]
