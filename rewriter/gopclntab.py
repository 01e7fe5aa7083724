"""Reads the functions of a Go program from its .gopclntab: names, extents and the
few fields the runtime uses to resume code at computed places.

Every Go program keeps the table (its runtime needs it for tracebacks, stack
copying and the GC), stripped or not. Layouts by magic number:
- Go 1.16/1.17 (0xfffffffa): functab entries are (entry, funcoff) pointer pairs;
- Go 1.18/1.19 (0xfffffff0) and Go 1.20 on (0xfffffff1): (entryoff, funcoff)
  uint32 pairs, entries relative to the module's text start.
The text start is read from runtime.firstmoduledata (the first word pointing at
the header, found in the data or in a relocation's addend), else from the
header's own field (filled in before Go 1.26), else from the ELF entry point
(_rt0_*, named in the table). The header is found through its section, or
without section headers by a search for its first 8 bytes.

A function's extent is where its SP-delta table ends; where that table gives none,
up to the next one's entry, less the padding the linker puts between functions
(int3 on x86_64, zero words on arm64). Anything
malformed gives no table, never an exception: the table only adds knowledge.
"""

from __future__ import annotations

import struct
from typing import List, Optional

import numpy as np

from urewrite.rewriter.elf_file import ET_EXEC, PF_X, ElfFile

MAGIC_116, MAGIC_118, MAGIC_120 = 0xFFFFFFFA, 0xFFFFFFF0, 0xFFFFFFF1
_MAGICS = (MAGIC_120, MAGIC_118, MAGIC_116)
SHT_RELA = 4
DT_RELA, DT_RELASZ = 7, 8
EM_X86_64, EM_AARCH64 = 62, 183
# moduledata: pcHeader, five slices (funcnametab ... pclntable), ftab (a slice),
# findfunctab, minpc, maxpc, then text
_MODULEDATA_TEXT = 8 + 5 * 24 + 24 + 8 + 8 + 8
_MODULEDATA_MINPC = _MODULEDATA_TEXT - 16


class GoTable:
    """The functions of one .gopclntab, sorted by entry: `addresses`, `sizes` (int64
    arrays), `names` (str), `deferreturn` (each one's offset of its call to
    runtime.deferreturn from its entry, 0 for none), `flags` (funcFlag bits:
    FUNC_FLAG_ASM), `frame_sizes` (_func.args: the bytes of its stack-passed arguments
    and results, ARGS_SIZE_UNKNOWN where not told), and `quantum` (the minimum
    instruction size, which the runtime adds to an entry to make a return address)."""

    def __init__(self, addresses: np.ndarray, sizes: np.ndarray, names: List[str],
                 deferreturn: np.ndarray, quantum: int, magic: int, flags: np.ndarray,
                 frame_sizes: np.ndarray):
        self.addresses = addresses
        self.sizes = sizes
        self.names = names
        self.deferreturn = deferreturn
        self.flags = flags
        self.frame_sizes = frame_sizes
        self.quantum = quantum
        self.magic = magic
        self._by_name = None

    def __len__(self) -> int:
        return len(self.addresses)

    def index_at(self, address: int) -> Optional[int]:
        """The index of the function whose entry is `address`, or None."""
        k = int(np.searchsorted(self.addresses, address))
        return k if k < len(self.addresses) and self.addresses[k] == address else None

    def address_of(self, name: str) -> Optional[int]:
        if self._by_name is None:
            self._by_name = {n: a for n, a in zip(self.names, self.addresses.tolist())}
        return self._by_name.get(name)


def table(elf: ElfFile) -> Optional[GoTable]:
    """The file's Go functions, read once per ElfFile; None when it has no table."""
    if not hasattr(elf, "_go_table"):
        try:
            elf._go_table = _read(elf)
        except (struct.error, ValueError, IndexError, OverflowError, UnicodeDecodeError):
            elf._go_table = None
    return elf._go_table


def _read(elf: ElfFile) -> Optional[GoTable]:
    if elf.machine not in (EM_X86_64, EM_AARCH64):
        return None
    for offset in _header_candidates(elf):
        found = _parse(elf, offset)
        if found is not None:
            return found
    return None


def _header_candidates(elf: ElfFile):
    """File offsets where a header may start: the section's, else each match of a
    header's first bytes (magic, two zero pads, quantum, pointer size 8)."""
    section = elf.section_named(".gopclntab")
    if section is not None and section.size:
        yield section.offset
        return
    if elf.sections:  # (Go's linkers always name it: a file with sections is no Go program)
        return
    data = elf.data
    quantum = 1 if elf.machine == EM_X86_64 else 4
    for magic in _MAGICS:
        needle = struct.pack("<IBBBB", magic, 0, 0, quantum, 8)
        at = data.find(needle)
        while at >= 0:
            if at % 8 == 0:
                yield at
            at = data.find(needle, at + 1)


def _parse(elf: ElfFile, start: int) -> Optional[GoTable]:
    data = elf.data
    magic, pad1, pad2, quantum, ptr_size = struct.unpack_from("<IBBBB", data, start)
    if magic not in _MAGICS or pad1 or pad2 or ptr_size != 8 or quantum not in (1, 2, 4):
        return None
    nfunc = struct.unpack_from("<q", data, start + 8)[0]
    if not 0 < nfunc < 1 << 24:
        return None
    if magic == MAGIC_116:
        names_at, pctab_at, pcln_at = struct.unpack_from("<Q16xQQ", data, start + 24)
        header_text = 0
    else:
        header_text, names_at, pctab_at, pcln_at = struct.unpack_from("<QQ16xQQ", data,
                                                                      start + 24)
    names_at += start
    pctab_at += start
    pcln_at += start
    if magic == MAGIC_116:
        ftab = np.frombuffer(data, dtype="<u8", count=2 * (nfunc + 1), offset=pcln_at)
        entries = ftab[0::2].astype(np.int64)
        funcoffs = ftab[1::2].astype(np.int64)
        name_field, args_field, defer_field, pcsp_field, id_field = 8, 12, 16, 20, 40
    else:
        ftab = np.frombuffer(data, dtype="<u4", count=2 * (nfunc + 1), offset=pcln_at)
        funcoffs = ftab[1::2].astype(np.int64)
        text = _text_start(elf, start, header_text, ftab[0:-1:2], funcoffs, pcln_at, names_at)
        if text is None:
            return None
        entries = text + ftab[0::2].astype(np.int64)
        name_field, args_field, defer_field, pcsp_field = 4, 8, 12, 16
        id_field = 40 if magic == MAGIC_120 else 36  # (1.20 added startLine before it)
    if (np.diff(entries) < 0).any():
        return None
    funcs = pcln_at + funcoffs[:-1]
    if len(funcs) and (funcs.min() < 0 or funcs.max() + pcsp_field + 4 > len(data)):
        return None
    raw = np.frombuffer(data, dtype=np.uint8)
    name_offsets = _words(raw, funcs + name_field).view(np.int32).astype(np.int64)
    deferreturn = _words(raw, funcs + defer_field).astype(np.int64)
    if magic == MAGIC_116 and (entries[:-1] != _words(raw, funcs, 8).astype(np.int64)).any():
        return None  # (each _func repeats its entry: a check that this is a table)
    names = _names(data, names_at, name_offsets)
    if names is None:
        return None
    kinds = _words(raw, funcs + id_field)  # funcID, flag, ...: bytes of one word
    flags = (kinds >> 8 & 0xFF).astype(np.int64)
    _name_abi0_twins(names, kinds & 0xFF, flags, np.diff(entries))
    frame_sizes = _words(raw, funcs + args_field).view(np.int32).astype(np.int64)
    addresses = entries[:-1]
    # exact from the SP-delta tables; up to the next entry less padding where there is
    # none (the padding trimmed off may end a function: an int3 after a call that
    # never returns)
    spans = np.diff(entries)
    sizes = _code_sizes(raw, pctab_at, _words(raw, funcs + pcsp_field).astype(np.int64),
                        quantum)
    unknown = np.arange(len(spans)) if sizes is None else \
        np.flatnonzero((sizes <= 0) | (sizes > spans))
    if sizes is None:
        sizes = spans.copy()
    if len(unknown):
        sizes[unknown] = _sizes(elf, entries[unknown], spans[unknown], quantum)
    return GoTable(addresses, sizes, names, deferreturn, quantum, magic, flags, frame_sizes)


FUNC_FLAG_ASM = 4  # (Go 1.18 on: the 1.16/1.17 tables may not set it)
ARGS_SIZE_UNKNOWN = -0x80000000  # _func.args of a function whose frame is not told


def _name_abi0_twins(names: List[str], ids: np.ndarray, flags: np.ndarray,
                     spans: np.ndarray) -> None:
    """Give `.abi0` to the ABI0 one of two functions the table names alike, as the
    symbol table names it: a function written in assembly (beside the wrapper that
    Go code calls), else the wrapper (a special funcID) that assembly calls, else
    the shorter one."""
    seen = {}
    twins = []
    for k, name in enumerate(names):
        other = seen.setdefault(name, k)
        if other != k:
            twins.append((other, k))
    ids, flags, spans = ids.tolist(), flags.tolist(), spans.tolist()
    for a, b in twins:
        asm = [k for k in (a, b) if flags[k] & FUNC_FLAG_ASM]
        special = [k for k in (a, b) if ids[k]]
        abi0 = asm[0] if len(asm) == 1 else special[0] if len(special) == 1 else \
            min((a, b), key=lambda k: spans[k])
        if not names[abi0].endswith(".abi0"):
            names[abi0] += ".abi0"


def _code_sizes(raw: np.ndarray, pctab_at: int, tables: np.ndarray,
                quantum: int) -> Optional[np.ndarray]:
    """Each function's code size, where its SP-delta table (pcsp) covers it, else 0:
    the sum of the table's PC steps. A table is pairs of varints (value delta, PC
    delta in quanta), ended by a 0 byte where a value delta would start (after the
    first pair). Read for all functions at once, a pair per round. None if a table
    runs off the bytes."""
    sizes = np.zeros(len(tables), dtype=np.int64)
    pos = pctab_at + tables
    live = np.flatnonzero(tables > 0)
    first = True
    rounds = 0
    while len(live):
        rounds += 1
        if len(live) < _FEW:  # (the long tables of a few big functions: one at a time)
            for k in live.tolist():
                step = _table_steps(raw, int(pos[k]), first)
                if step is None:
                    return None
                sizes[k] += step * quantum
            break
        at = pos[live]
        if at.max() >= len(raw):
            return None
        if not first:
            going = raw[at] != 0
            live, at = live[going], at[going]
            if not len(live):
                break
        first = False
        _, at = _read_varint(raw, at)  # (the SP delta: not needed)
        if at is None:
            return None
        step, at = _read_varint(raw, at)
        if at is None:
            return None
        sizes[live] += step * quantum
        pos[live] = at
    return sizes


_FEW = 32


def _table_steps(raw: np.ndarray, at: int, first: bool) -> Optional[int]:
    """The sum of the PC deltas of one table's pairs from `at` on."""
    data, total = raw, 0
    while True:
        if at >= len(data):
            return None
        if data[at] == 0 and not first:
            return total
        first = False
        for want in (False, True):
            value, shift = 0, 0
            while True:
                if at >= len(data) or shift > 28:
                    return None
                byte = int(data[at])
                at += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            if want:
                total += value


def _read_varint(raw: np.ndarray, at: np.ndarray) -> tuple:
    """(values, positions after them) of the unsigned varints at `at`."""
    at = at.copy()
    values = np.zeros(len(at), dtype=np.int64)
    rest = np.arange(len(at))
    for shift in range(0, 35, 7):
        if not len(rest):
            return values, at
        if at[rest].max() >= len(raw):
            return values, None
        byte = raw[at[rest]].astype(np.int64)
        values[rest] |= (byte & 0x7F) << shift
        at[rest] += 1
        rest = rest[byte & 0x80 != 0]
    return (values, at) if not len(rest) else (values, None)


def _words(raw: np.ndarray, at: np.ndarray, width: int = 4) -> np.ndarray:
    """The little-endian words of `width` bytes at each offset of `at`."""
    picked = raw[at[:, None] + np.arange(width)]
    return picked.copy().view("<u4" if width == 4 else "<u8").ravel()


def _names(data: bytes, names_at: int, offsets: np.ndarray) -> Optional[List[str]]:
    """The function names: nul-terminated strings at `offsets` into the name table.
    The table is split once; a name that starts inside another (none, as Go writes
    it) is read on its own."""
    if not len(offsets):
        return []
    if offsets.min() < 0:
        return None
    end = names_at + int(offsets.max())
    stop = data.find(b"\0", end)
    if stop < 0:
        return None
    parts = data[names_at:stop].split(b"\0")
    starts = np.zeros(len(parts), dtype=np.int64)
    np.cumsum([len(p) + 1 for p in parts[:-1]], out=starts[1:])
    k = np.searchsorted(starts, offsets)
    k = np.minimum(k, len(parts) - 1)
    exact = starts[k] == offsets
    texts = [p.decode("utf-8", "replace") for p in parts]
    names = []
    for i, hit, at in zip(k.tolist(), exact.tolist(), offsets.tolist()):
        if hit:
            names.append(texts[i])
        else:
            name_end = data.find(b"\0", names_at + at)
            names.append(data[names_at + at:name_end].decode("utf-8", "replace"))
    return names


def _text_start(elf: ElfFile, start: int, header_text: int, entryoffs: np.ndarray,
                funcoffs: np.ndarray, pcln_at: int, names_at: int) -> Optional[int]:
    """The module's text start (Go 1.18 on: entries are offsets from it)."""
    header_address = _address_of_offset(elf, start)
    if header_address is not None:
        text = _moduledata_text(elf, header_address, int(entryoffs[0]) if len(entryoffs) else 0)
        if text is not None:
            return text
    if header_text and _in_code(elf, header_text):
        return header_text
    # the entry point of a program linked by Go itself is _rt0_<arch>_<os>
    data = elf.data
    for k in range(len(entryoffs)):
        name_at = names_at + struct.unpack_from("<i", data, pcln_at + int(funcoffs[k]) + 4)[0]
        if data.startswith(b"_rt0_", name_at):
            name = data[name_at:data.find(b"\0", name_at)]
            if name.endswith(b"_linux"):
                return elf.entry - int(entryoffs[k])
    return None


def _moduledata_text(elf: ElfFile, header_address: int, first_entryoff: int) -> Optional[int]:
    """moduledata.text, where moduledata is the first word naming the header: in the
    data itself, or (a position-independent file) in a relocation's addend. Checked
    against moduledata.minpc, the first function's entry."""
    for place in _words_naming(elf, header_address):
        text = _word_at(elf, place + _MODULEDATA_TEXT)
        minpc = _word_at(elf, place + _MODULEDATA_MINPC)
        if text and minpc == text + first_entryoff and _in_code(elf, text):
            return text
    return None


def _words_naming(elf: ElfFile, value: int):
    """Addresses of 8-byte aligned words that hold `value`, in the file or as the
    addend of a relocation that fills them."""
    for seg in elf.loads:
        if seg.flags & PF_X or not seg.filesz:
            continue
        if seg.offset % 8:
            continue
        chunk = np.frombuffer(elf.data, dtype="<u8", count=seg.filesz // 8, offset=seg.offset)
        for k in np.flatnonzero(chunk == np.uint64(value)).tolist()[:8]:
            yield seg.vaddr + 8 * k
    for rela in _rela_tables(elf):
        for k in np.flatnonzero(rela[:, 2] == np.uint64(value)).tolist()[:8]:
            yield int(rela[k, 0])


def _rela_tables(elf: ElfFile) -> List[np.ndarray]:
    """The RELA relocations (offset, info, addend rows): of the sections, or without
    section headers, of the dynamic table's DT_RELA."""
    spans = [(s.offset, s.size) for s in elf.sections if s.type == SHT_RELA]
    if not elf.sections:
        address, size = elf.dynamic_value(DT_RELA), elf.dynamic_value(DT_RELASZ)
        offset = elf.offset_of(address, size) if address and size else None
        if offset is not None:
            spans.append((offset, size))
    return [np.frombuffer(elf.data, dtype="<u8", count=size // 24 * 3,
                          offset=offset).reshape(-1, 3) for offset, size in spans]


def _word_at(elf: ElfFile, address: int) -> Optional[int]:
    """The 8-byte word at `address`, or the addend of the relocation that fills it."""
    relocated = _relocated(elf).get(address)
    if relocated is not None:
        return relocated
    offset = elf.offset_of(address, 8)
    return None if offset is None else struct.unpack_from("<Q", elf.data, offset)[0]


def _relocated(elf: ElfFile) -> dict:
    """place -> addend of the RELA relocations of a position-independent file (only
    where the moduledata check asks; empty for a position-dependent one)."""
    cached = getattr(elf, "_go_relocated", None)
    if cached is None:
        cached = {}
        if elf.type != ET_EXEC:
            for rela in _rela_tables(elf):
                cached.update(zip(rela[:, 0].tolist(), rela[:, 2].tolist()))
        elf._go_relocated = cached
    return cached


def _address_of_offset(elf: ElfFile, offset: int) -> Optional[int]:
    for seg in elf.loads:
        if seg.offset <= offset < seg.offset + seg.filesz:
            return seg.vaddr + offset - seg.offset
    return None


def _in_code(elf: ElfFile, address: int) -> bool:
    return any(s.flags & PF_X and s.vaddr <= address < s.vaddr + s.memsz for s in elf.loads)


def _sizes(elf: ElfFile, entries: np.ndarray, sizes: np.ndarray, quantum: int) -> np.ndarray:
    """The extents of functions at `entries` that span `sizes` bytes up to the next
    one, less the linker's padding before it (int3 bytes on x86_64; zero words on
    arm64), looked at in the last _PAD_LOOK units of each at once."""
    if not len(sizes):
        return sizes
    unit = 1 if quantum == 1 else 4
    offsets = _file_offsets(elf, entries, sizes)
    held = (offsets >= 0) & (sizes > 0)
    ends = np.where(held, offsets + sizes, 0)
    back = np.arange(_PAD_LOOK, 0, -1, dtype=np.int64) * unit  # (last unit last)
    at = ends[:, None] - back
    inside = at >= np.where(held, offsets, 0)[:, None]
    raw = np.frombuffer(elf.data, dtype=np.uint8)
    np.maximum(at, 0, out=at)
    np.minimum(at, len(raw) - unit, out=at)
    if unit == 1:
        pad = raw[at] == 0xCC
    else:
        pad = (raw[at] | raw[at + 1] | raw[at + 2] | raw[at + 3]) == 0
    pad &= inside
    # the run of padding that ends each function: the units after its last non-padding one
    last_code = np.where(~pad, np.arange(_PAD_LOOK), -1).max(axis=1)
    trimmed = sizes - (_PAD_LOOK - 1 - last_code) * unit
    # (a marker, such as go:textfipsstart, is padding alone: one byte of it, as its
    # symbol says)
    return np.where(held, np.maximum(trimmed, 1), sizes)


# padding is at most the function alignment (32 bytes on x86_64, 16 on arm64)
_PAD_LOOK = 64


def _file_offsets(elf: ElfFile, addresses: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The file offset of each function's bytes, or -1 where the file does not hold
    them all."""
    offsets = np.full(len(addresses), -1, dtype=np.int64)
    for seg in elf.loads:
        inside = (addresses >= seg.vaddr) & (addresses + sizes <= seg.vaddr + seg.filesz) \
            & (offsets < 0)
        offsets[inside] = addresses[inside] - seg.vaddr + seg.offset
    return offsets
