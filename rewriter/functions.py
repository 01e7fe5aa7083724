"""Finds the functions of an ELF file: symbols first, then .eh_frame for what they miss.

A stripped executable still has an FDE per function in .eh_frame; those get the
name fn_<address>. PLT stubs have FDEs too but are not functions of the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import lief

from urewrite.rewriter.elf_file import ElfFile

lief.logging.disable()


@dataclass(frozen=True)
class Function:
    name: str
    address: int
    size: int  # 0 when neither a symbol nor an FDE gives it
    origin: str  # "symtab", "dynsym" or "eh_frame"
    aliases: tuple = ()

    @property
    def end(self) -> int:
        return self.address + self.size

    @property
    def names(self) -> tuple:
        return (self.name,) + self.aliases


def discover(elf: ElfFile) -> List[Function]:
    """Functions sorted by address; symbols at one address merge into one function."""
    binary = lief.parse(elf.path)
    if binary is None:
        from urewrite.errors import UrewriteError
        raise UrewriteError(f"{elf.path}: corrupt ELF (LIEF could not parse it)")
    code_sections = [s for s in elf.executable_sections() if not s.name.startswith(".plt")]

    def in_code(address: int) -> bool:
        return any(s.addr <= address < s.end for s in code_sections)

    by_address: Dict[int, dict] = {}
    for origin, symbols in (("symtab", binary.symtab_symbols), ("dynsym", binary.dynamic_symbols)):
        for sym in symbols:
            if sym.type != lief.ELF.Symbol.TYPE.FUNC or sym.shndx == 0 or not sym.value:
                continue
            name = sym.name
            if isinstance(name, bytes):  # LIEF's answer for a name that is not UTF-8
                name = name.decode("utf-8", "replace")
            if not in_code(sym.value) or not name:
                continue
            entry = by_address.setdefault(sym.value, {"names": [], "size": 0, "origin": origin})
            if name not in entry["names"]:
                entry["names"].append(name)
            entry["size"] = entry["size"] or sym.size
    for fn in binary.functions:  # includes one entry per .eh_frame FDE
        if not in_code(fn.address) or not fn.size:
            continue
        entry = by_address.get(fn.address)
        if entry is None:
            by_address[fn.address] = {"names": [f"fn_{fn.address:x}"], "size": fn.size,
                                      "origin": "eh_frame"}
        elif not entry["size"]:
            entry["size"] = fn.size
    return [Function(e["names"][0], address, e["size"], e["origin"], tuple(e["names"][1:]))
            for address, e in sorted(by_address.items())]
