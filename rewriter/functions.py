"""Finds the functions of an ELF file: symbols first, then a Go program's .gopclntab
and .eh_frame for what they miss.

A stripped executable still has an FDE per function in .eh_frame; those get the
name fn_<address>. PLT stubs have FDEs too but are not functions of the file.
A function whose symbol has no size and no FDE (_init, _fini, the crtstuff
functions, hand-written assembly) extends to the next thing that starts after
it: a symbol, an FDE, or the end of its section. The planner checks more before
it trusts such an extent with a return probe (it must end in a return or jump).
A Go program's functions (stripped, they are in .gopclntab alone) take their names
from it where no symbol names them, and where one does, its names are aliases
(gopclntab.py, go_names.py).
Both tables are read by our own readers (elf_symbols.py, eh_frame.py): LIEF's
import alone costs more than a one-probe rewrite. LIEF still reads an .eh_frame
whose pointer encodings ours does not know.
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple

import numpy as np

from urewrite.arch.base import value_class
from urewrite.rewriter import eh_frame, go_names, gopclntab
from urewrite.rewriter.elf_file import ElfFile
from urewrite.rewriter.elf_symbols import SHN_UNDEF, STT_FUNC
from urewrite.rewriter.elf_symbols import table as symbol_table


@value_class
class Function:
    name: str
    address: int
    size: int  # 0 when neither a symbol nor an FDE gives it
    origin: str  # "symtab", "dynsym", "gopclntab" or "eh_frame"
    aliases: tuple = ()
    # where the size comes from: "symbol", "eh_frame", "gopclntab" (its SP-delta
    # table's end), or "next symbol" / "next FDE" / "section end" for an
    # extent inferred up to what follows it
    sized_by: str = "symbol"

    @property
    def size_inferred(self) -> bool:
        return self.sized_by not in ("symbol", "eh_frame", "gopclntab")

    @property
    def end(self) -> int:
        return self.address + self.size

    @property
    def names(self) -> tuple:
        return (self.name,) + self.aliases


def containing(functions: List[Function], starts: List[int], address: int) -> Optional[Function]:
    """The function of `functions` (sorted by address, `starts` their addresses) that
    holds `address`; one of unknown size holds its first byte."""
    k = bisect.bisect_right(starts, address) - 1
    fn = functions[k] if k >= 0 else None
    return fn if fn is not None and fn.address <= address < max(fn.end, fn.address + 1) \
        else None


def discover(elf: ElfFile) -> List[Function]:
    """Functions sorted by address; symbols at one address merge into one function."""
    # (with arrays: a big file has 100,000s of function symbols, most of them twice,
    # and as many FDEs; nothing else can start before this)
    in_code = code_ranges(elf)
    table = symbol_table(elf)
    defined = (table.shndx != SHN_UNDEF) & (table.values != 0) & in_code(table.values)
    symbol_starts = np.unique(table.values[defined])  # (where something starts)
    picked = np.flatnonzero(defined & (table.types == STT_FUNC))
    names = table.names(picked)
    named = np.fromiter(map(bool, names), dtype=bool, count=len(names))
    picked, names = picked[named], [n for n in names if n]
    symbols = _Grouped(table.values[picked], table.sizes[picked])  # (in table order)
    origins = table.table_names(picked[symbols.order[symbols.first]])
    fde_starts, fde_sizes = _fde_arrays(elf)
    keep = (fde_sizes != 0) & in_code(fde_starts)
    fdes = _Grouped(fde_starts[keep], fde_sizes[keep])
    fde_marks = fdes.addresses
    # a symbol without a size takes the first FDE's at its address
    sizes = symbols.sizes.copy()
    at_fde = np.searchsorted(fde_marks, symbols.addresses)
    has_fde = np.zeros(len(sizes), dtype=bool)
    if len(fde_marks):
        at_fde = at_fde.clip(max=len(fde_marks) - 1)
        has_fde = fde_marks[at_fde] == symbols.addresses
    by_fde = has_fde & (sizes == 0)
    sizes[by_fde] = fdes.sizes[at_fde[by_fde]]
    # an FDE where no symbol is: a function of its own, named by its address
    alone = ~np.isin(fde_marks, symbols.addresses)

    # each function's columns: those of symbols, then those of FDEs alone
    addresses = np.concatenate((symbols.addresses, fde_marks[alone]))
    sizes = np.concatenate((sizes, fdes.sizes[alone]))
    unsized = np.flatnonzero(sizes == 0).tolist()
    sizes = sizes.tolist()
    alone_at = fde_marks[alone].tolist()
    primary = [names[i] for i in symbols.order[symbols.first].tolist()] + \
        [f"fn_{address:x}" for address in alone_at]
    origins += ["eh_frame"] * len(alone_at)
    more = [()] * len(addresses)
    for k, group in symbols.aliases(names).items():
        more[k] = tuple(group[1:])
    by = ["eh_frame" if b else "symbol" for b in by_fde.tolist()] + ["eh_frame"] * len(alone_at)
    listed = addresses.tolist()
    for k in unsized:  # (few: _init, crtstuff, hand-written code)
        sizes[k], by[k] = _extent(elf, listed[k], symbol_starts, fde_marks)
    found = [Function(primary[k], listed[k], sizes[k], origins[k], more[k], by[k])
             for k in np.argsort(addresses, kind="stable").tolist()]
    return _with_go_functions(elf, found, in_code)


def _with_go_functions(elf: ElfFile, found: List[Function], in_code) -> List[Function]:
    """`found` with the functions of the file's .gopclntab: their names as aliases of
    a symbol's function at their entry; a function of their own elsewhere (in place
    of an FDE's fn_<address>)."""
    go = gopclntab.table(elf)
    if go is None:
        return found
    keep = in_code(go.addresses)
    at = {fn.address: k for k, fn in enumerate(found)}
    own = set(go.names)  # (a form is no alias where it is another function's own name:
    # `runtime.newproc` and its wrapper `runtime.newproc.abi0`)

    def forms(name: str) -> tuple:
        return tuple(n for n in go_names.typed_names(name) if n not in own)

    added = []
    for address, size, name in zip(go.addresses[keep].tolist(), go.sizes[keep].tolist(),
                                   [n for n, k in zip(go.names, keep.tolist()) if k]):
        names = (name,) + forms(name)
        k = at.get(address)
        if k is None:
            added.append(Function(name, address, size, "gopclntab", names[1:], "gopclntab"))
            continue
        fn = found[k]
        if fn.origin == "eh_frame":
            found[k] = Function(name, address, fn.size or size, "gopclntab", names[1:],
                                fn.sized_by if fn.size else "gopclntab")
            continue
        # (a symbol's own name may have forms of its own: `.abi0` assembly functions)
        new = tuple(n for n in dict.fromkeys(names + forms(fn.name)) if n not in fn.names)
        if new or not fn.size:
            found[k] = Function(fn.name, address, fn.size or size, fn.origin,
                                fn.aliases + new, fn.sized_by if fn.size else "gopclntab")
    if added:
        found = sorted(found + added, key=lambda f: f.address)
    return found


class _Grouped:
    """Entries (address, size), in table order, grouped by address: `addresses` (sorted,
    each once), `sizes` (of each, the first that is not 0, else 0); `order`, the
    entries in address order (table order within one), and `first`, where each
    address's run of them starts in `order`."""

    def __init__(self, addresses: np.ndarray, sizes: np.ndarray):
        self.order = np.argsort(addresses, kind="stable")
        ordered = addresses[self.order]
        starts = np.ones(len(ordered), dtype=bool)
        starts[1:] = ordered[1:] != ordered[:-1]
        self.first = np.flatnonzero(starts)
        self.addresses = ordered[self.first]
        in_order = sizes[self.order]
        n = len(in_order)
        if not n:
            self.sizes = in_order
            return
        sized = np.minimum.reduceat(np.where(in_order != 0, np.arange(n), n), self.first)
        self.sizes = np.where(sized < n, in_order[np.minimum(sized, n - 1)], 0)

    def aliases(self, names: list) -> Dict[int, list]:
        """For each address with more than one name: its entries' names, each once, in
        table order (`names`: of the entries, in table order)."""
        runs = np.diff(np.append(self.first, len(self.order)))
        order = self.order.tolist()
        found = {}
        for k, start, run in zip(np.flatnonzero(runs > 1).tolist(),
                                 self.first[runs > 1].tolist(), runs[runs > 1].tolist()):
            # (most: a name in both tables, an exported function)
            if run == 2 and names[order[start]] == names[order[start + 1]]:
                continue
            group = list(dict.fromkeys(names[i] for i in order[start:start + run]))
            if len(group) > 1:
                found[k] = group
        return found


def _extent(elf: ElfFile, address: int, symbol_starts: np.ndarray,
            fde_starts: np.ndarray) -> tuple:
    """(size, sized_by) of a function without a size: up to the next symbol or FDE
    start, or the end of the section, whichever comes first."""
    end, why = elf.section_at(address).end, "section end"
    following = [(int(starts[k]), what) for starts, what in
                 ((symbol_starts, "next symbol"), (fde_starts, "next FDE"))
                 for k in [int(np.searchsorted(starts, address, side="right"))]
                 if k < len(starts)]
    if following:
        # (a symbol's start and an FDE's at one address: the symbol names it)
        start, what = min(following, key=lambda f: f[0])
        if start < end:
            end, why = start, what
    return end - address, why


def code_ranges(elf: ElfFile):
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


def _fde_arrays(elf: ElfFile) -> tuple:
    """(start addresses, sizes) of the FDEs, in file order, as int64 arrays (a start or
    size of 2**63 or more as -1 or 0: no function's)."""
    fdes = _fde_ranges(elf)
    return (np.array([a if a < 1 << 63 else -1 for a, _ in fdes], dtype=np.int64),
            np.array([s if s < 1 << 63 else 0 for _, s in fdes], dtype=np.int64))


def _fde_ranges_by_lief(elf: ElfFile) -> List[Tuple[int, int]]:
    import lief  # 0.3 s to import: only for the rare file our reader does not know
    lief.logging.disable()
    binary = lief.parse(elf.path)
    if binary is None:
        from urewrite.errors import UrewriteError
        raise UrewriteError(f"{elf.path}: corrupt ELF (LIEF could not parse it)")
    return [(fn.address, fn.size) for fn in binary.functions]
