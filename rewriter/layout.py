"""Chooses where the new segments go: after everything, so nothing original moves.

    file:   [original file ...][padding][program headers | region template | runtime | trampolines]
    memory: ... original segments ... | code (RX) | state (zero-filled, RW, no file bytes) |
            ... | stubs of punned jumps (RX pages, where their jumps go)

The code segment is file-backed and holds the new program header table. Its
address minus its file offset equals that of the first loadable segment, as for
a file straight out of the linker: kernels older than 5.18 compute AT_PHDR as
(first segment address - first segment offset + e_phoff), and static glibc
finds the headers through __ehdr_start + e_phoff the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from urewrite.errors import UrewriteError
from urewrite.rewriter.elf_file import PHDR, ElfFile

PAGE = 0x1000  # the smallest page size; files may ask for more (arm64 links for 64 KiB)
MAX_PADDING = 64 << 20  # refuse layouts that would bloat the file more than this
# room below punned jumps' stubs for the new code and state: far more than any code
# segment needs (segment.size_bound), so that stubs can be chosen before it is built
STUB_ROOM, STUB_ROOM_PER_SITE = 64 << 20, 4 << 10


def align_up(value: int, to: int) -> int:
    return (value + to - 1) & -to


@dataclass(frozen=True)
class Placement:
    code_vaddr: int
    code_offset: int
    state_vaddr: int
    state_size: int
    phdr_count: int
    align: int  # of the new segments: the largest p_align of the original ones
    lowest: int = 0  # the lowest address of the original's segments (page-aligned)

    @property
    def phdr_size(self) -> int:
        return self.phdr_count * PHDR.size

    @property
    def state_offset(self) -> int:
        # no file bytes, but p_offset must agree with p_vaddr modulo the page size
        return self.code_offset + (self.state_vaddr - self.code_vaddr)


def _code_start(elf: ElfFile) -> Tuple[int, int, int]:
    """(address of the new code, its p_align, address minus file offset)."""
    loads = elf.loads
    # Loaders round each segment to its p_align (64 KiB on arm64): keep ours as
    # far apart, so that rounding the last original segment never covers them.
    align = max([PAGE] + [s.align for s in loads if s.align & (s.align - 1) == 0])
    first = min(loads, key=lambda s: s.vaddr)
    delta = first.vaddr - first.offset
    top = max(s.vaddr + s.memsz for s in loads)
    code_vaddr = align_up(top, align)
    return max(code_vaddr, align_up(len(elf.data) + delta, align)), align, delta


def stub_floor(elf: ElfFile, sites: int) -> int:
    """The lowest address a punned jump's stub may take, for a rewrite of `sites` sites."""
    code_vaddr, _, _ = _code_start(elf)
    return align_up(code_vaddr + STUB_ROOM + STUB_ROOM_PER_SITE * sites, 1 << 20)


# Linux kernels have refused an executable whose program headers take more than a page
# (ELF_MIN_ALIGN in load_elf_phdrs; this machine's 6.18 takes more, older ones may not)
MAX_PHDRS = 4096 // PHDR.size
MAX_LIBRARY_STUB_PAGES = 512  # a shared object's (the dynamic loader has no such limit)


def stub_page_cap(elf: ElfFile) -> int:
    """How many pages punned jumps' stubs may take: each may be a program header of its
    own, after the original ones and the two new segments."""
    if elf.is_executable:
        return max(0, MAX_PHDRS - elf.phnum - 2)
    return MAX_LIBRARY_STUB_PAGES


def room_below(elf: ElfFile, stubs_from: int, state_size: int) -> int:
    """The most code that fits with its state below `stubs_from`."""
    code_vaddr, align, _ = _code_start(elf)
    return stubs_from - code_vaddr - align_up(state_size, PAGE) - align


def stub_pages(stubs: List[Tuple[int, bytes]]) -> List[Tuple[int, bytes]]:
    """(address, bytes) of each run of whole pages that holds stubs (address, code):
    one loadable segment each."""
    pages = {}
    for address, code in stubs:
        for at, byte in enumerate(code, address):
            page = pages.setdefault(at & -PAGE, bytearray(PAGE))
            page[at % PAGE] = byte
    runs: List[Tuple[int, bytearray]] = []
    for page in sorted(pages):
        if runs and runs[-1][0] + len(runs[-1][1]) == page:
            runs[-1][1].extend(pages[page])
        else:
            runs.append((page, bytearray(pages[page])))
    return [(address, bytes(code)) for address, code in runs]


def place(elf: ElfFile, code_size: int, state_size: int, new_segments: int = 2,
          stubs_from: int = 0) -> Placement:
    """Where the code (of `code_size` bytes) and the state memory go; below `stubs_from`,
    where punned jumps' stubs are (0: none)."""
    code_vaddr, align, delta = _code_start(elf)
    first = min(elf.loads, key=lambda s: s.vaddr)
    top = max(s.vaddr + s.memsz for s in elf.loads)
    code_offset = code_vaddr - delta
    if code_offset - len(elf.data) > MAX_PADDING:
        raise UrewriteError(
            f"{elf.path}: placing new code after a {(top - first.vaddr) >> 20} MiB memory image "
            f"would pad the output by {(code_offset - len(elf.data)) >> 20} MiB; not supported")
    state_vaddr = align_up(code_vaddr + max(code_size, 1), align)
    if stubs_from and state_vaddr + align_up(state_size, PAGE) > stubs_from:
        raise UrewriteError(f"{elf.path}: the new code ({code_size} bytes) reaches the stubs of "
                            f"punned jumps at {stubs_from:#x}; rewrite with --tactics "
                            f"jump,hop,evict")
    return Placement(code_vaddr, code_offset, state_vaddr, align_up(state_size, PAGE),
                     elf.phnum + new_segments, align, first.vaddr & -PAGE)
