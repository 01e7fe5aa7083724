"""Chooses where the new segments go: after everything, so nothing original moves.

    file:   [original file ...][padding][program headers | region template | runtime | trampolines]
    memory: ... original segments ... | code (RX) | state (zero-filled, RW, no file bytes) |

The code segment is file-backed and holds the new program header table. Its
address minus its file offset equals that of the first loadable segment, as for
a file straight out of the linker: kernels older than 5.18 compute AT_PHDR as
(first segment address - first segment offset + e_phoff), and static glibc
finds the headers through __ehdr_start + e_phoff the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from urewrite.errors import UrewriteError
from urewrite.rewriter.elf_file import PHDR, ElfFile

PAGE = 0x1000  # the smallest page size; files may ask for more (arm64 links for 64 KiB)
MAX_PADDING = 64 << 20  # refuse layouts that would bloat the file more than this


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

    @property
    def phdr_size(self) -> int:
        return self.phdr_count * PHDR.size

    @property
    def state_offset(self) -> int:
        # no file bytes, but p_offset must agree with p_vaddr modulo the page size
        return self.code_offset + (self.state_vaddr - self.code_vaddr)


def place(elf: ElfFile, code_size: int, state_size: int, new_segments: int = 2) -> Placement:
    """Where the code (of `code_size` bytes) and the state memory go."""
    loads = elf.loads
    # Loaders round each segment to its p_align (64 KiB on arm64): keep ours as
    # far apart, so that rounding the last original segment never covers them.
    align = max([PAGE] + [s.align for s in loads if s.align & (s.align - 1) == 0])
    first = min(loads, key=lambda s: s.vaddr)
    delta = first.vaddr - first.offset
    top = max(s.vaddr + s.memsz for s in loads)
    code_vaddr = align_up(top, align)
    code_vaddr = max(code_vaddr, align_up(len(elf.data) + delta, align))
    code_offset = code_vaddr - delta
    if code_offset - len(elf.data) > MAX_PADDING:
        raise UrewriteError(
            f"{elf.path}: placing new code after a {(top - first.vaddr) >> 20} MiB memory image "
            f"would pad the output by {(code_offset - len(elf.data)) >> 20} MiB; not supported")
    state_vaddr = align_up(code_vaddr + max(code_size, 1), align)
    return Placement(code_vaddr, code_offset, state_vaddr, align_up(state_size, PAGE),
                     elf.phnum + new_segments, align)
