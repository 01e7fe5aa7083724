"""Reads the symbol tables (.symtab, then .dynsym) of an ElfFile.

Our own reader rather than LIEF's: importing LIEF costs about 0.3 s, more than
the rest of a one-probe rewrite (docs/benchmarks.md, section 4). A table is read
as one numpy array (a 100 MB program has 200,000 symbols); a name is decoded only
when asked for. A malformed table or name is cut short, never an exception:
symbols only add knowledge.
"""

from __future__ import annotations

from typing import Dict, Iterator, NamedTuple

import numpy as np

from urewrite.rewriter.elf_file import ElfFile

SHT_SYMTAB, SHT_DYNSYM = 2, 11
STT_FUNC, STT_TLS = 2, 6
SHN_UNDEF = 0
# Elf64_Sym: name, info, other, shndx, value, size
SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                ("value", "<u8"), ("size", "<u8")])


class Symbol(NamedTuple):  # a tuple: a large file has 100,000s of symbols
    name: str
    type: int  # STT_*
    shndx: int
    value: int
    size: int
    table: str  # "symtab" or "dynsym"


class SymbolTable:
    """Every symbol of .symtab, then of .dynsym, in table order (index 0 of each left
    out), as parallel arrays."""

    def __init__(self, elf: ElfFile):
        parts, self._strings, tables, self._table_names = [], [], [], []
        for kind, table in ((SHT_SYMTAB, "symtab"), (SHT_DYNSYM, "dynsym")):
            for sec in elf.sections:
                if sec.type != kind or sec.link >= len(elf.sections):
                    continue
                count = max(min(sec.size, len(elf.data) - sec.offset) // SYM.itemsize - 1, 0)
                entries = np.frombuffer(elf.data, dtype=SYM, count=count,
                                        offset=sec.offset + SYM.itemsize) if count else \
                    np.zeros(0, SYM)
                strings = elf.sections[sec.link]
                parts.append(entries)
                self._strings.append((strings.offset, min(strings.offset + strings.size,
                                                          len(elf.data))))
                tables.append(np.full(count, len(tables), dtype=np.int32))
                self._table_names.append(table)
        self._data = elf.data
        entries = np.concatenate(parts) if parts else np.zeros(0, SYM)
        self.values = entries["value"].astype(np.int64)
        self.sizes = entries["size"].astype(np.int64)
        self.types = entries["info"] & 0xF
        self.binds = entries["info"] >> 4  # STB_LOCAL 0, STB_GLOBAL 1, STB_WEAK 2
        self.shndx = entries["shndx"]
        self._name_at = entries["name"]
        self._table = np.concatenate(tables) if tables else np.zeros(0, np.int32)

    def __len__(self) -> int:
        return len(self.values)

    def name(self, i: int) -> str:
        start, end = self._strings[self._table[i]]
        start += int(self._name_at[i])
        if start >= end:
            return ""
        stop = self._data.find(b"\0", start, end)
        return self._data[start:stop if stop >= 0 else end].decode("utf-8", "replace")

    def names(self, indices: np.ndarray) -> list:
        """name(i) of each of `indices`: the same, without numpy's cost per item (a big file
        has 100,000s)."""
        data, strings, names = self._data, self._strings, []
        for t, at in zip(self._table[indices].tolist(), self._name_at[indices].tolist()):
            start, end = strings[t]
            start += at
            if start >= end:
                names.append("")
                continue
            stop = data.find(b"\0", start, end)
            names.append(data[start:stop if stop >= 0 else end].decode("utf-8", "replace"))
        return names

    def table_names(self, indices: np.ndarray) -> list:
        """table_name(i) of each of `indices`."""
        return [self._table_names[t] for t in self._table[indices].tolist()]

    def values_of(self, names) -> Dict[str, int]:
        """name -> value of the first defined symbol of each name found: a byte search of
        the string tables, then of the entries naming what it found (names may share the
        tail of a longer string), without decoding every name."""
        found: Dict[str, int] = {}
        for t, (start, end) in enumerate(self._strings):
            in_table = self._table == t
            for name in names:
                needle = name.encode() + b"\0"
                at = self._data.find(needle, start, end)
                while at >= 0 and name not in found:
                    hits = np.flatnonzero(in_table & (self._name_at == at - start)
                                          & (self.values != 0))
                    if len(hits):
                        found[name] = int(self.values[hits[0]])
                    at = self._data.find(needle, at + 1, end)
        return found

    def named(self, name: str) -> np.ndarray:
        """Indices of the symbols called `name`, defined or not, in table order: a byte
        search of the string tables, as values_of() does."""
        hits = []
        needle = name.encode() + b"\0"
        for t, (start, end) in enumerate(self._strings):
            at = self._data.find(needle, start, end)
            while at >= 0:
                # (a name may be the tail of a longer string: only an entry pointing
                # at its first byte names it)
                hits.append(np.flatnonzero((self._table == t) & (self._name_at == at - start)))
                at = self._data.find(needle, at + 1, end)
        return np.unique(np.concatenate(hits)) if hits else np.zeros(0, np.int64)

    def table_name(self, i: int) -> str:
        return self._table_names[self._table[i]]

    def symbol(self, i: int) -> Symbol:
        return Symbol(self.name(i), int(self.types[i]), int(self.shndx[i]), int(self.values[i]),
                      int(self.sizes[i]), self.table_name(i))


def table(elf: ElfFile) -> SymbolTable:
    """The file's symbols, read once per ElfFile."""
    cached = getattr(elf, "_symbol_table", None)
    if cached is None:
        cached = elf._symbol_table = SymbolTable(elf)
    return cached


def symbols(elf: ElfFile) -> Iterator[Symbol]:
    """Every symbol of .symtab, then of .dynsym, in table order (index 0 left out)."""
    t = table(elf)
    return (t.symbol(i) for i in range(len(t)))
