"""Finds code addresses that a file takes: stores as data, or computes in code.

A patch window must not hold an address that anything may jump to after its
first byte. Direct branches are decoded by the planner; what remains are
addresses *taken*, which reach a jump later (a function pointer, sa_restorer,
a jump table of absolute addresses):
- computed by PC-relative code (the backend's byte scan);
- relocation addends (RELA) and relocated words (RELR) in PIE files and
  shared objects;
- plain constants in position-dependent executables, which need no relocation:
  8-byte words in data, and 4-byte immediates anywhere in code;
- in a Go program, the places its runtime resumes code at (go_runtime.py).
All scans over-approximate: a match may be a coincidence, never a miss. A match
in code says where its bytes are (`source`), so that the planner can check it
against the instruction holding them; matches in data are real data and count.

The file is scanned once, with numpy over the raw bytes, into small tables of the
values that could be code addresses (within the executable segments); each
question then looks its addresses up in them. A 100 MB program takes about a
second, whatever the number of probes, and the scans may run on a thread of their
own (scan_ahead) while the caller finds the functions.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set

import numpy as np

from urewrite.rewriter import go_runtime
from urewrite.rewriter.arrays import unique
from urewrite.rewriter.elf_file import ET_EXEC, PF_X, SHT_NOBITS, ElfFile

SHT_RELA, SHT_RELR = 4, 19
SHF_ALLOC = 2

BRANCH, IMMEDIATE, RELOCATION, CONSTANT = "branch", "immediate", "relocation", "constant"
RUNTIME = "runtime"  # a language runtime's own landing place; `section` says which and why


class _QuickSwitches:
    """Python's switch interval lowered while any scan thread runs: the first to start
    keeps the process's own, the last to end puts it back. (Each thread kept the
    interval it found: one that started while another ran kept the lowered one, and
    put it back last.)"""

    def __init__(self):
        self._lock = threading.Lock()
        self._running = 0
        self._kept = 0.0

    def enter(self, interval: float) -> None:
        with self._lock:
            if not self._running:
                self._kept = sys.getswitchinterval()
                sys.setswitchinterval(min(self._kept, interval))
            self._running += 1

    def leave(self) -> None:
        with self._lock:
            self._running -= 1
            if not self._running:
                sys.setswitchinterval(self._kept)


_quick_switches = _QuickSwitches()


@dataclass(frozen=True)
class Match:
    """Bytes that may name `target`: in code at `source` (BRANCH, IMMEDIATE), or data."""
    kind: str
    section: str
    source: Optional[int] = None  # where the matching bytes are, for matches in code

    def describe(self) -> str:
        at = f" at {self.source:#x}" if self.source is not None else ""
        return {BRANCH: f"a branch or address computation{at} in {self.section}",
                IMMEDIATE: f"an immediate{at} in {self.section}",
                RELOCATION: f"a relocation in {self.section}",
                CONSTANT: f"a constant in {self.section}",
                RUNTIME: self.section}[self.kind]


@dataclass
class _Table:
    """Values found by one scan of one section, sorted, with where each was found."""
    kind: str
    section: str
    values: np.ndarray  # int64, sorted
    sources: Optional[np.ndarray]  # int64, parallel to values; None for data

    @classmethod
    def of(cls, kind: str, section: str, values, sources=None) -> "_Table":
        order = np.argsort(values, kind="stable") if sources is None else \
            np.lexsort((sources, values))  # by value, then where it was found
        return cls(kind, section, values[order], None if sources is None else sources[order])

    def lookup(self, wanted: np.ndarray):
        """(value, source) pairs whose value is in `wanted` (sorted, unique), in table
        order: a binary search per wanted address, so few addresses cost little."""
        first = self.values.searchsorted(wanted, side="left")
        last = self.values.searchsorted(wanted, side="right")
        present = last > first
        first, last = first[present], last[present]
        if self.sources is None:  # data: once per value
            return [(v, None) for v in self.values[first].tolist()]
        counts = last - first
        # the indices first[k] .. last[k] - 1 of every present address, in order
        index = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        return list(zip(self.values[index].tolist(), self.sources[index].tolist()))


class TakenIndex:
    """Every value of the file that may be a taken code address, scanned once."""

    def __init__(self, elf: ElfFile, backend):
        self.elf = elf
        self.backend = backend
        # executable segments, not sections: a window may borrow the gap after a section
        self._ranges = sorted((s.vaddr, s.vaddr + s.memsz) for s in elf.loads
                              if s.flags & PF_X) or \
            sorted((s.addr, s.end) for s in elf.executable_sections() if s.size)
        self._data_tables: Optional[List[_Table]] = None
        self._code_tables: Optional[List[_Table]] = None
        self._branches: Optional[_Table] = None  # every branch in code, by target
        self._every: Optional[np.ndarray] = None  # every table's values, sorted (find)
        self._tables_with_values: List[_Table] = []  # (with _every)
        self._scanning: Optional[threading.Thread] = None  # scan_ahead()

    # -- the scans ahead -----------------------------------------------------------
    SWITCH_INTERVAL = 0.0005  # s: while the scans run beside Python work

    def scan_ahead(self) -> None:
        """Make the scans (and the far-branch table) on a thread of their own while the
        caller goes on: numpy releases the GIL while it goes over the bytes, so they
        take the other core, beside function discovery. The thread needs the GIL back between numpy's calls:
        Python hands it over every 5 ms by default, which left the scans waiting half
        the time; every 0.5 ms while they run. Each question waits for them (wait());
        so must a fork (a child has no thread: it would make the missing scans
        itself). A scan that fails leaves its table unmade: the question that needs
        it meets the error again, in the caller's thread."""
        if self._scanning is not None:
            return

        def scan() -> None:
            _quick_switches.enter(self.SWITCH_INTERVAL)
            try:
                self.every_value()
                self._branch_table()
            except BaseException:  # (asked again where it can be reported)
                pass
            finally:
                _quick_switches.leave()

        self._scanning = threading.Thread(target=scan, name="urewrite scans", daemon=True)
        self._scanning.start()

    def wait(self) -> None:
        """Wait for the scans scan_ahead() started, if any."""
        scanning = self._scanning
        if scanning is not None and scanning is not threading.current_thread():
            scanning.join()
            self._scanning = None
            _give_back_freed_memory()

    # -- questions -------------------------------------------------------------
    def find(self, wanted: Iterable[int]) -> Dict[int, List[Match]]:
        """Each address of `wanted` that the file may take, with every match naming it:
        matches in data first (they need no checking), then those in code."""
        found: Dict[int, List[Match]] = {}
        wanted = unique(wanted if isinstance(wanted, np.ndarray)
                        else np.fromiter(wanted, dtype=np.int64))
        # (most questions name no taken address: one search among every value answers
        # them, where each table would take its own, 100,000s of times)
        every = self.every_value()
        if len(wanted) and len(every):
            wanted = wanted[every[np.minimum(every.searchsorted(wanted), len(every) - 1)]
                            == wanted]
        if not len(wanted) or not len(every):
            return found
        for table in self._tables_with_values:
            for value, source in table.lookup(wanted):
                found.setdefault(value, []).append(Match(table.kind, table.section, source))
        return found

    def branch_sources(self, targets: Iterable[int]) -> Dict[int, List[int]]:
        """target -> where the code may branch to it or compute it (the byte scan), for
        the given targets (asked once per function, with its instructions' addresses):
        a binary search in one table of every code scan's branches, sorted by target."""
        table = self._branch_table()
        wanted = targets if isinstance(targets, np.ndarray) else \
            np.fromiter(targets, dtype=np.int64)
        first = table.values.searchsorted(wanted, side="left")
        last = table.values.searchsorted(wanted, side="right")
        present = last > first
        return {t: table.sources[a:b].tolist() for t, a, b in
                zip(wanted[present].tolist(), first[present].tolist(), last[present].tolist())}

    def _branch_table(self) -> _Table:
        """Every code scan's branches in one table, sorted by target."""
        self.wait()
        if self._branches is None:
            tables = [t for t in self.code_tables() if t.kind == BRANCH]
            self._branches = _Table.of(BRANCH, "", np.concatenate(
                [t.values for t in tables] or [np.zeros(0, np.int64)]), np.concatenate(
                [t.sources for t in tables] or [np.zeros(0, np.int64)]))
        return self._branches

    # -- the scans, each once ----------------------------------------------------
    def every_value(self) -> np.ndarray:
        """The values of every table, in one sorted array."""
        self.wait()
        if self._every is None:
            self._tables_with_values = [t for t in self.data_tables() + self.code_tables()
                                        if len(t.values)]
            self._every = np.sort(np.concatenate(
                [t.values.astype(np.int64, copy=False) for t in self._tables_with_values]
                + [np.zeros(0, np.int64)]))
        return self._every

    def _in_code(self, values: np.ndarray) -> np.ndarray:
        """A mask of the values that lie in some executable segment."""
        keep = np.zeros(len(values), dtype=bool)
        narrow = values.dtype == np.uint32  # (numpy will not compare it with 2**32)
        for start, end in self._ranges:
            if narrow and start >> 32:
                continue
            keep |= (values >= start) if narrow and end >> 32 else \
                (values >= start) & (values < end)
        return keep

    def data_tables(self) -> List[_Table]:
        self.wait()
        if self._data_tables is None:
            elf, tables = self.elf, []
            for section in elf.sections:
                if section.type == SHT_RELA:
                    values = _rela_addends(_contents(elf, section))
                elif section.type == SHT_RELR:
                    values = _relr_values(elf, _contents(elf, section))
                else:
                    continue
                tables.append(_Table.of(RELOCATION, section.name,
                                        values[self._in_code(values)]))
            if elf.type == ET_EXEC:
                for section in elf.sections:
                    if section.type == SHT_NOBITS or not section.flags & SHF_ALLOC:
                        continue
                    data = _contents(elf, section)
                    words = np.frombuffer(data[:len(data) // 8 * 8], dtype="<u8").view(np.int64)
                    tables.append(_Table.of(CONSTANT, section.name,
                                            unique(words[self._in_code(words)])))
            for why, addresses in go_runtime.landings(elf):
                tables.append(_Table.of(RUNTIME, why, unique(addresses)))
            self._data_tables = tables
        return self._data_tables

    def code_tables(self) -> List[_Table]:
        self.wait()
        if self._code_tables is None:
            elf, tables = self.elf, []
            for section in elf.executable_sections():
                code = _contents(elf, section)
                sources, targets = self.backend.code_reference_table(code, section.addr)
                keep = self._in_code(targets)
                tables.append(_Table.of(BRANCH, section.name, targets[keep], sources[keep]))
                if elf.type == ET_EXEC:
                    offsets, values = self._immediates(code)
                    tables.append(_Table.of(IMMEDIATE, section.name, values,
                                            section.addr + offsets))
            self._code_tables = tables
        return self._code_tables

    def _immediates(self, code: bytes):
        """(offset, value) of every 4-byte little-endian word of `code`, at any offset,
        whose value lies in code: what `mov edi, imm32` holds when it passes a function
        pointer in a position-dependent executable. Four aligned views of the bytes,
        one per starting offset modulo 4, cover every offset."""
        offsets, values = [], []
        for shift in range(4):
            usable = (len(code) - shift) // 4 * 4
            if usable <= 0:
                continue
            words = np.frombuffer(code, dtype="<u4", count=usable // 4, offset=shift)
            at = np.flatnonzero(self._in_code(words))
            offsets.append(shift + 4 * at)
            values.append(words[at].astype(np.int64))
        if not offsets:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(offsets), np.concatenate(values)


def _contents(elf: ElfFile, section) -> bytes:
    return elf.data[section.offset:section.offset + section.size]


def _rela_addends(data: bytes) -> np.ndarray:
    entries = np.frombuffer(data[:len(data) // 24 * 24], dtype="<i8").reshape(-1, 3)
    return np.ascontiguousarray(entries[:, 2])


def _relr_values(elf: ElfFile, data: bytes) -> np.ndarray:
    """The words that RELR entries relocate (their stored values are the targets)."""
    values: Set[int] = set()
    base = 0
    for entry in np.frombuffer(data[:len(data) // 8 * 8], dtype="<u8").tolist():
        if entry & 1 == 0:
            places = [entry]
            base = entry + 8
        else:
            places = [base + 8 * i for i in range(63) if entry >> (i + 1) & 1]
            base += 8 * 63
        for place in places:
            offset = elf.offset_of(place, 8)
            if offset is not None:
                values.add(int.from_bytes(elf.data[offset:offset + 8], "little"))
    return np.array([v for v in values if v < 1 << 63], dtype=np.int64)


def _give_back_freed_memory() -> None:
    """Return to the system what the scans' thread freed: glibc gives a thread an
    arena of its own and keeps what is freed there, tens of MB on a big file. Where there is no glibc, nothing to do."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass
