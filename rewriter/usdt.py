"""Finds USDT probe sites: the notes that <sys/sdt.h> leaves in .note.stapsdt.

Each note names one site: its address (pc), the link-time address of
.stapsdt.base (to undo prelinking), an optional semaphore, the provider, the
name and the argument string. Read from the section bytes: LIEF 1.0 does not
give every note of such files back.

A note is legal input however odd: a site whose note cannot be used as it is
(its strings cut short, its semaphore outside the writable memory, an argument
form that cannot be read) is still listed, and refused with the reason
(`problems`), never guessed at.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from urewrite.rewriter import elf_symbols
from urewrite.rewriter.elf_file import PT_LOAD, PT_TLS, ElfFile

NT_STAPSDT = 3
PF_W = 2
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class UsdtSite:
    provider: str
    name: str
    pc: int
    semaphore: int  # 0 when the probe has none
    arguments: str  # as written by sdt.h, e.g. "-4@%edi 8@-16(%rbp)"
    problem: Optional[str] = None  # why the note cannot be used as it is

    @property
    def probe(self) -> str:
        return f"{self.provider}:{self.name}"


def discover(elf: ElfFile) -> List[UsdtSite]:
    """Every site of .note.stapsdt, in note order: readelf -n's."""
    base_section = elf.section_named(".stapsdt.base")
    sites = []
    for owner, kind, desc in elf.notes():
        if owner != b"stapsdt" or kind != NT_STAPSDT:
            continue
        if len(desc) < 24:  # no addresses: nothing to list it at
            continue
        pc, base, semaphore = struct.unpack_from("<QQQ", desc)
        strings = desc[24:].split(b"\0")
        problem = None
        if len(strings) < 4:  # provider, name, arguments, each ended by a NUL
            problem = "its note is cut short (the strings lack their terminators)"
            strings += [b""] * 3
        provider, name, arguments = (s.decode(errors="replace") for s in strings[:3])
        if not provider or not name:
            problem = problem or "its note names no provider or no probe"
        if base_section is not None and base:
            # prelink moved the file: move the addresses with .stapsdt.base
            shift = base_section.addr - base
            pc = (pc + shift) & _MASK
            semaphore = (semaphore + shift) & _MASK if semaphore else 0
        sites.append(UsdtSite(provider, name, pc, semaphore, arguments, problem))
    return sites


class Symbols:
    """What an operand names, for the argument parsers: a symbol's link-time address,
    a thread-local one's offset from the thread pointer. A name the symbol tables do
    not define once is refused, with the reason (ValueError), never guessed."""

    def __init__(self, elf: ElfFile):
        self.elf = elf
        self._found: Dict[str, Tuple] = {}

    def _definition(self, name: str) -> Tuple[int, bool]:
        """(value, thread-local) of the one definition of `name`."""
        if name not in self._found:
            self._found[name] = self._look_up(name)
        found = self._found[name]
        if isinstance(found, str):
            raise ValueError(found)
        return found

    def _look_up(self, name: str):
        table = elf_symbols.table(self.elf)
        defined = {}
        for i in table.named(name).tolist():
            if table.shndx[i] == elf_symbols.SHN_UNDEF:
                continue
            tls = int(table.types[i]) == elf_symbols.STT_TLS
            defined[(int(table.values[i]) & _MASK, tls)] = int(table.binds[i])
        if not defined:
            stripped = not any(s.type == elf_symbols.SHT_SYMTAB for s in self.elf.sections)
            return f"symbol {name} is not in the file's symbol tables" + \
                (" (no .symtab: stripped)" if stripped else "")
        if len(defined) > 1:
            return (f"symbol {name} has {len(defined)} definitions (static variables of "
                    f"several files?): which one is meant is not known")
        return next(iter(defined))

    def address(self, name: str) -> int:
        value, tls = self._definition(name)
        if tls:
            raise ValueError(f"symbol {name} is thread-local, named without its segment")
        return value

    def thread_offset(self, name: str) -> int:
        """x86_64's name@tpoff: the variable's offset from the thread pointer, in an
        executable (TLS variant II: its block ends at the thread pointer)."""
        value, tls = self._definition(name)
        if not tls:
            raise ValueError(f"symbol {name}@tpoff is not thread-local")
        if not self.elf.is_executable:
            raise ValueError(f"{name}@tpoff in a shared object (only an executable's "
                             f"offsets are known before it runs)")
        segment = next((s for s in self.elf.segments if s.type == PT_TLS), None)
        if segment is None:
            raise ValueError(f"{name}@tpoff in a file without a TLS segment")
        align = max(segment.align, 1)
        if align & (align - 1) or segment.memsz >= 1 << 40 or value >= 1 << 40:
            raise ValueError(f"{name}@tpoff: the TLS segment is malformed")
        block = (segment.memsz + align - 1) & -align
        return value - block


def refusals(sites: list, parse: Callable[[str], list], elf: ElfFile,
             notes: List[UsdtSite]) -> List[Tuple[object, str]]:
    """(site, why it cannot be probed as its note says) of each USDT site of `sites`
    (selectors' Sites) that cannot: its note's own problem (of `notes`, discover()'s),
    a semaphore outside the file's writable memory, or an argument that `parse` (the
    backend's: ValueError when it cannot read one) refuses."""
    out = []
    parsed: Dict[str, Optional[str]] = {}
    problems = {(u.pc, u.probe): u.problem for u in notes if u.problem}
    writable = [(s.vaddr, s.vaddr + s.memsz) for s in elf.segments
                if s.type == PT_LOAD and s.flags & PF_W]
    for site in sites:
        why = problems.get((site.address, site.name))
        if why is None and site.semaphore and not any(
                start <= site.semaphore and site.semaphore + 2 <= end
                for start, end in writable):
            why = f"its semaphore {site.semaphore:#x} is not in the file's writable memory"
        if why is None:
            if site.arguments not in parsed:
                parsed[site.arguments] = _parse_problem(parse, site.arguments)
            why = parsed[site.arguments]
        if why is not None:
            out.append((site, why))
    return out


def _parse_problem(parse: Callable[[str], list], arguments: str) -> Optional[str]:
    try:
        parse(arguments)
    except ValueError as e:
        # one line of printable text, whatever the note holds
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(str(e).split()))
    return None
