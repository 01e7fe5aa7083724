"""Our symbol-table and .eh_frame readers against independent readers: readelf and LIEF.

The rewrite path reads both tables itself (LIEF's import costs more than a
one-probe rewrite), so these check it on real files of both architectures:
C and C++ (personality and LSDA in the CIE), PIE, non-PIE, static, stripped,
shared, and the system's own libraries.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cross
from urewrite.rewriter import eh_frame, elf_symbols, functions
from urewrite.rewriter.elf_file import ElfFile

C_SOURCE = """
#include <stdio.h>
static int counter;
__attribute__((constructor)) static void setup(void) { counter = 1; }
__attribute__((noinline)) int twice(int x) { return 2 * x + counter; }
int main(int argc, char **argv) { printf("%d\\n", twice(argc)); return 0; }
"""
CXX_SOURCE = """
#include <cstdio>
#include <stdexcept>
__attribute__((noinline)) int risky(int x) { if (x > 5) throw std::runtime_error("big"); return x; }
int main(int argc, char **) {
    try { return risky(argc); } catch (const std::exception &e) { std::puts(e.what()); }
    return 1;
}
"""
VARIANTS = {  # name: (compiler, source, flags)
    "c-pie": ("gcc", C_SOURCE, ["-O2"]),
    "c-nopie": ("gcc", C_SOURCE, ["-O2", "-no-pie"]),
    "c-static": ("gcc", C_SOURCE, ["-O2", "-static"]),
    "c-stripped": ("gcc", C_SOURCE, ["-O2", "-s"]),
    "c-shared": ("gcc", C_SOURCE, ["-O2", "-shared", "-fPIC"]),
    "cxx": ("g++", CXX_SOURCE, ["-O2"]),
    "arm64-c": (cross.CC, C_SOURCE, ["-O2"]),
    "arm64-cxx-stripped": (cross.CXX, CXX_SOURCE, ["-O2", "-s"]),
}
SYSTEM_FILES = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
                "/usr/aarch64-linux-gnu/lib/libc.so.6"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("elf-tables")
    out = {}
    for name, (compiler, source, flags) in VARIANTS.items():
        if shutil.which(compiler) is None:
            continue
        src = root / (name + (".cc" if "++" in compiler else ".c"))
        src.write_text(source)
        binary = root / name
        subprocess.run([compiler, *flags, str(src), "-o", str(binary)], check=True)
        out[name] = binary
    return out


def _files(built):
    return list(built.values()) + [Path(p) for p in SYSTEM_FILES if Path(p).exists()]


def _readelf_fdes(path: Path):
    text = subprocess.run(["readelf", "--debug-dump=frames", str(path)], capture_output=True,
                          text=True).stdout  # (exits 1 when it misses debug links)
    section, out = None, []
    for line in text.splitlines():
        if line.startswith("Contents of the "):
            section = line.split()[3]
        m = re.search(r"FDE cie=\S+ pc=([0-9a-f]+)\.\.([0-9a-f]+)", line)
        if m and section == ".eh_frame":
            out.append((int(m[1], 16), int(m[2], 16) - int(m[1], 16)))
    return out


def test_fde_ranges_match_readelf(built):
    for path in _files(built):
        fdes = eh_frame.fde_ranges(ElfFile.open(str(path)))
        assert fdes, path
        assert fdes == _readelf_fdes(path), path


def _readelf_entry_frames(path: Path) -> dict:
    """FDE start -> (CFA text, return-address text) of readelf's first row for it."""
    text = subprocess.run(["readelf", "--debug-dump=frames-interp", str(path)],
                          capture_output=True, text=True).stdout
    section, out, lines = None, {}, text.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("Contents of the "):
            section = line.split()[3]
        m = re.search(r"FDE cie=\S+ pc=([0-9a-f]+)\.\.", line)
        if m and section == ".eh_frame" and k + 2 < len(lines):
            columns, row = lines[k + 1].split(), lines[k + 2].split()
            if row and row[0] == m[1] and "ra" in columns:
                out[int(m[1], 16)] = (row[1], row[columns.index("ra")])
    return out


def _as_readelf(frame, names) -> tuple:
    """Our Frame in readelf's words (`u`: no rule or undefined; `c-8`: saved at CFA-8)."""
    cfa = f"{names[frame.cfa_register]}{frame.cfa_offset:+d}"
    kind = frame.return_address[0]
    ra = "u" if kind in ("same", "undefined") else f"c{frame.return_address[1]:+d}"
    return cfa, ra


def test_entry_frames_match_readelf(built):
    """The frame at each FDE's first address, as readelf's interpreter sees it: what
    tells a function entered by a call from a part split off into another's frame."""
    names = {7: "rsp", 6: "rbp", 31: "sp", 29: "x29"}
    checked = 0
    for path in _files(built):
        ours = eh_frame.entry_frames(ElfFile.open(str(path)))
        theirs = _readelf_entry_frames(path)
        assert theirs, path
        for start, row in theirs.items():
            if ours.get(start) is not None and ours[start].cfa_register in names:
                assert _as_readelf(ours[start], names) == row, (path, hex(start))
                checked += 1
        assert sum(f is not None for f in ours.values()) >= 0.99 * len(theirs), path
    assert checked > 1000


def test_symbols_match_lief(built):
    lief = pytest.importorskip("lief")
    lief.logging.disable()
    for path in _files(built):
        binary = lief.parse(str(path))
        theirs = [(s.name, int(s.type), s.shndx, s.value, s.size)
                  for table in (binary.symtab_symbols, binary.dynamic_symbols)
                  for s in list(table)[1:]]  # LIEF keeps each table's null symbol
        ours = [(s.name, s.type, s.shndx, s.value, s.size)
                for s in elf_symbols.symbols(ElfFile.open(str(path)))]
        assert ours == theirs, path
        # the names read many at once, as discover() reads them
        table = elf_symbols.table(ElfFile.open(str(path)))
        assert table.names(np.arange(len(table))) == [name for name, *_ in theirs], path


def test_discover_finds_stripped_functions_by_their_fdes(built):
    for name in ("c-stripped", "arm64-cxx-stripped"):
        if name not in built:
            continue
        found = functions.discover(ElfFile.open(str(built[name])))
        assert found and all(f.origin == "eh_frame" and f.size for f in found)
        assert all(f.name == f"fn_{f.address:x}" for f in found)


def test_discover_merges_symbols_and_fdes(built):
    found = {f.name: f for f in functions.discover(ElfFile.open(str(built["c-pie"])))}
    assert found["twice"].size and found["twice"].origin == "symtab"
    assert "setup" in found and "main" in found
    assert not any(n.startswith("fn_") for n in found)  # every FDE has its symbol here


def _discover_one_by_one(elf: ElfFile) -> list:
    """What discover() finds, written as its rules say, symbol by symbol and FDE by FDE
    (discover() does it with arrays): symbols at one address merge (names each once in
    table order, the first size that is not 0); an FDE sizes a symbol without a size,
    or is a function of its own; a function still without a size extends to the next
    symbol or FDE start (a symbol first), or its section's end."""
    in_code = functions.code_ranges(elf)
    table = elf_symbols.table(elf)
    by_address, marks = {}, {}
    for i in range(len(table)):
        value = int(table.values[i])
        if table.shndx[i] == elf_symbols.SHN_UNDEF or not value or \
                not in_code(np.array([value]))[0]:
            continue
        marks[value] = "next symbol"
        name = table.name(i)
        if table.types[i] != elf_symbols.STT_FUNC or not name:
            continue
        entry = by_address.setdefault(value, [[], 0, table.table_name(i), "symbol"])
        if name not in entry[0]:
            entry[0].append(name)
        entry[1] = entry[1] or int(table.sizes[i])
    for address, size in eh_frame.fde_ranges(elf):
        if not size or address >= 1 << 63 or not in_code(np.array([address]))[0]:
            continue
        marks.setdefault(address, "next FDE")
        entry = by_address.setdefault(address, [[f"fn_{address:x}"], size, "eh_frame", "eh_frame"])
        if not entry[1]:
            entry[1], entry[3] = size, "eh_frame"
    starts = sorted(marks)
    for address, entry in by_address.items():
        if not entry[1]:
            end, why = elf.section_at(address).end, "section end"
            later = [s for s in starts if s > address]
            if later and later[0] < end:
                end, why = later[0], marks[later[0]]
            entry[1], entry[3] = end - address, why
    return [functions.Function(e[0][0], a, e[1], e[2], tuple(e[0][1:]), e[3])
            for a, e in sorted(by_address.items())]


@pytest.mark.parametrize("path", ["/usr/bin/python3.11", "/lib/x86_64-linux-gnu/libc.so.6",
                                  "/usr/lib/x86_64-linux-gnu/libGL.so.1",
                                  "/usr/lib/x86_64-linux-gnu/libasan.so.8",
                                  "/usr/aarch64-linux-gnu/lib/libc.so.6"])
def test_discover_follows_its_rules_on_system_files(path):
    """Symbols in both tables (aliases, sizes from either), functions sized by the next
    symbol (libGL's dispatch stubs) or their section's end (_init), arm64 too."""
    if not Path(path).exists():
        pytest.skip(f"needs Debian's {path}")
    found = functions.discover(ElfFile.open(path))
    assert found == _discover_one_by_one(ElfFile.open(path))
    assert len(found) > 100


def test_discover_follows_its_rules_on_built_files(built):
    kinds = set()
    for path in _files(built):
        found = functions.discover(ElfFile.open(str(path)))
        assert found == _discover_one_by_one(ElfFile.open(str(path))), path
        kinds |= {f.sized_by for f in found}
        kinds |= {"alias" for f in found if f.aliases}
    assert {"symbol", "eh_frame", "section end"} <= kinds


def test_symbols_at_one_address_take_the_first_size_and_each_name_once():
    grouped = functions._Grouped(np.array([0x50, 0x30, 0x50, 0x50, 0x60]),
                                 np.array([0, 7, 4, 9, 0]))
    assert grouped.addresses.tolist() == [0x30, 0x50, 0x60]
    assert grouped.sizes.tolist() == [7, 4, 0]  # (the first that is not 0, in table order)
    names = ["f", "g", "f_alias", "f", "h"]
    assert grouped.aliases(names) == {1: ["f", "f_alias"]}
    assert functions._Grouped(np.array([0x50, 0x50]), np.array([3, 3])).aliases(["f", "f"]) == {}


def test_lief_reads_an_eh_frame_we_do_not(built, monkeypatch):
    """An unknown pointer encoding hands the whole .eh_frame to LIEF, with the same result."""
    pytest.importorskip("lief")
    elf = ElfFile.open(str(built["c-stripped"]))
    expected = functions.discover(elf)

    def unsupported(_elf):
        raise eh_frame.UnsupportedEncoding("test")
    monkeypatch.setattr(eh_frame, "fde_ranges", unsupported)
    via_lief = functions.discover(elf)
    # LIEF loses an FDE at a constructor's address (its .init_array entry, size 0, wins)
    tors = _init_fini_entries(elf)
    assert [f for f in expected if f.address not in tors] == via_lief


def _init_fini_entries(elf: ElfFile) -> set:
    out = set()
    for name in (".init_array", ".fini_array"):
        sec = elf.section_named(name)
        if sec is not None:
            out |= {v for (v,) in struct.iter_unpack("<Q", elf.data[sec.offset:sec.offset + sec.size])}
    return out


# -- the walker on hand-made bytes ------------------------------------------------

def _entry(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def _cie(augmentation: bytes, data: bytes = b"", version: int = 1) -> bytes:
    body = struct.pack("<IB", 0, version) + augmentation + b"\0" + b"\x01\x78\x10"
    if augmentation.startswith(b"z"):
        body += bytes([len(data)]) + data
    return _entry(body)


def _fde(at: int, cie_at: int, pointers: bytes) -> bytes:
    return _entry(struct.pack("<I", at + 4 - cie_at) + pointers + b"\0")


def test_walker_pc_relative_and_absolute():
    cie = _cie(b"zR", b"\x1b")  # pcrel | sdata4
    fde = _fde(len(cie), 0, struct.pack("<ii", -0x100, 0x20))
    abs_cie = _cie(b"")  # no 'z': absolute 8-byte pointers
    at = len(cie) + len(fde)
    abs_fde = _fde(at + len(abs_cie), at, struct.pack("<QQ", 0x401000, 0x30))
    data = cie + fde + abs_cie + abs_fde + b"\0\0\0\0"
    base = 0x2000
    field = base + len(cie) + 8  # where the FDE's initial location is stored
    assert eh_frame._Walker(data, base).fdes() == [(field - 0x100, 0x20), (0x401000, 0x30)]


def test_walker_entry_frames_read_inline_and_in_full():
    """The frame at each FDE's start: its CIE's where nothing but nops comes before the
    first advance (read inline once the CIE's is known), else the FDE's own rules."""
    # CIE zR (pcrel|sdata4): CFA = rsp+8, return address (r16) at CFA-8
    cie = _entry(struct.pack("<IB", 0, 1) + b"zR\0" + b"\x01\x78\x10" + b"\x01\x1b"
                 + b"\x0c\x07\x08" + b"\x90\x01")
    bodies = [b"\0\0\0",  # nops only: the CIE's frame
              b"\0\x0e\x10\0",  # a nop, then CFA offset 16 before any advance
              b"\x41\x0e\x10",  # an advance first: the CIE's
              b"",  # no instruction
              b"\0\0\x0e\x18"]  # nops, then CFA offset 24
    data, starts = cie, []
    for k, body in enumerate(bodies * 2):  # (twice: the second time, the CIE's known)
        at = len(data)
        fde = _entry(struct.pack("<I", at + 4) + struct.pack("<ii", 0x1000 * (k + 1), 0x10)
                     + b"\0" + body)
        starts.append(at + 8 + 0x1000 * (k + 1))
        data += fde
    walker = eh_frame._Walker(data + b"\0" * 4, 0, frames=True)
    assert [start for start, _ in walker.fdes()] == starts
    cfa_offsets = [8, 16, 8, 8, 24] * 2
    assert [walker.frames[s].cfa_offset for s in starts] == cfa_offsets
    assert all(walker.frames[s].cfa_register == 7 for s in starts)
    assert all(walker.frames[s].return_address == ("offset", -8) for s in starts)


def test_walker_skips_personality_and_lsda():
    # zPLR: personality indirect|pcrel|sdata4, LSDA pcrel|sdata4, FDEs pcrel|sdata4
    cie = _cie(b"zPLR", b"\x9b" + struct.pack("<i", 0x40) + b"\x1b\x1b")
    fde = _entry(struct.pack("<I", len(cie) + 4) + struct.pack("<ii", 0x10, 8) + b"\x04" + b"\0" * 4)
    assert eh_frame._Walker(cie + fde, 0).fdes() == [(len(cie) + 8 + 0x10, 8)]


def test_walker_reads_an_lsda_and_goes_on_past_a_64_bit_length():
    """The walk reads the usual entry inline, and hands the others to the general
    loop: an FDE with an LSDA to read, an entry with a 64-bit length, and what follows."""
    cie = _cie(b"zPLR", b"\x9b" + struct.pack("<i", 0x40) + b"\x1b\x1b")
    fde = _entry(struct.pack("<I", len(cie) + 4) + struct.pack("<ii", 0x10, 8) + b"\x04"
                 + struct.pack("<i", 0x40))
    at = len(cie) + len(fde)
    body = struct.pack("<I", at + 12) + struct.pack("<ii", 0x20, 12) + b"\x00"
    long_fde = struct.pack("<IQ", 0xFFFFFFFF, len(body)) + body
    at_last = at + len(long_fde)
    last = _entry(struct.pack("<I", at_last + 4) + struct.pack("<ii", 0x30, 16) + b"\x00")
    data = cie + fde + long_fde + last + b"\0\0\0\0"
    base = 0x1000
    ranges = [(base + len(cie) + 8 + 0x10, 8), (base + at + 16 + 0x20, 12),
              (base + at_last + 8 + 0x30, 16)]
    assert eh_frame._Walker(data, base).fdes() == ranges
    walker = eh_frame._Walker(data, base, lsdas=True)
    assert walker.fdes() == ranges
    lsda = base + len(cie) + 17 + 0x40  # (the pointer's field follows the length byte)
    assert walker.lsdas == [(*ranges[0], lsda), (*ranges[1], None), (*ranges[2], None)]


def test_walker_unknown_encoding_is_reported():
    cie = _cie(b"zR", b"\x3b")  # datarel
    fde = _fde(len(cie), 0, struct.pack("<ii", 0, 4))
    with pytest.raises(eh_frame.UnsupportedEncoding):
        eh_frame._Walker(cie + fde, 0).fdes()


def test_walker_stops_at_truncation_with_what_it_read():
    cie = _cie(b"zR", b"\x1b")
    fde = _fde(len(cie), 0, struct.pack("<ii", 0, 4))
    data = cie + fde + cie[:6]  # a last entry cut short
    assert len(eh_frame._Walker(data, 0).fdes()) == 1
    orphan = _fde(len(cie) + len(fde), len(cie), struct.pack("<ii", 0, 4))  # its "CIE" is an FDE
    assert len(eh_frame._Walker(cie + fde + orphan + fde, 0).fdes()) == 1


def test_rewrite_does_not_import_lief(built, tmp_path):
    """The one-probe rewrite path must not pay LIEF's import."""
    code = ("import sys\nfrom urewrite.commands import main\n"
            "try:\n    main(sys.argv[1:], prog_name='urewrite')\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print(' '.join(m for m in ('lief', 'click') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code, str(built["c-pie"]), "-p", "twice", "-q",
                          "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["click"]


def _section_at_by_walk(elf: ElfFile, vaddr: int):
    return next((s for s in elf.sections if s.addr and s.addr <= vaddr < s.end
                 and s.type != 8), None)  # (8: SHT_NOBITS)


def _patched(path: Path, out: Path, *writes) -> ElfFile:
    """The ELF file at `path` with `writes` ((offset, struct format, values...)) done,
    written to `out` and read: cases no linker makes, through the reader's front door."""
    data = bytearray(path.read_bytes())
    for offset, fmt, *values in writes:
        struct.pack_into(fmt, data, offset, *values)
    out.write_bytes(bytes(data))
    return ElfFile.open(str(out))


def test_section_at_is_the_first_section_holding_the_address(built, tmp_path):
    """ElfFile.section_at() finds sections by bisection where they do not overlap: the
    section a walk in order finds, at each section's edges and inside, on every file;
    and where two overlap, the first of them, as the walk."""
    for path in _files(built):
        elf = ElfFile.open(str(path))
        edges = {v for s in elf.sections for v in (s.addr - 1, s.addr, s.addr + 1,
                                                   s.addr + s.size // 2, s.end - 1, s.end)}
        for vaddr in sorted(edges | {0, 1 << 40}):
            assert elf.section_at(vaddr) is _section_at_by_walk(elf, vaddr), (path, vaddr)
    path = _files(built)[0]
    elf = ElfFile.open(str(path))
    text = elf.section_named(".text")
    # section 1 made a section over .text (and before it in the table)
    at = elf.shoff + 64  # (Elf64_Shdr: type at 4, addr at 16, size at 32)
    elf = _patched(path, tmp_path / "wider", (at + 4, "<I", 1),
                   (at + 16, "<QQQ", text.addr - 16, elf.sections[1].offset, text.size + 32))
    wider = elf.sections[1]
    for vaddr in (text.addr - 16, text.addr, text.end - 1, text.end + 15):
        assert elf.section_at(vaddr) is wider


def test_offset_of_is_the_first_load_holding_the_bytes(built, tmp_path):
    """ElfFile.offset_of() tries the segment of its last answer first: the offset of the
    first loaded segment holding all the bytes asked, as a walk in order gives, for
    addresses and sizes at every segment's edges, in any order; where two loads
    overlap, the first of them each time."""
    def walk(elf, vaddr, size):
        return next((s.offset + vaddr - s.vaddr for s in elf.loads
                     if s.vaddr <= vaddr and vaddr + size <= s.vaddr + s.filesz), None)

    rng = __import__("random").Random(3)
    for path in _files(built):
        elf = ElfFile.open(str(path))
        asked = [(v, size) for s in elf.loads
                 for v in (s.vaddr - 1, s.vaddr, s.vaddr + s.filesz // 2,
                           s.vaddr + s.filesz - 1, s.vaddr + s.filesz)
                 for size in (1, 2, 64)]
        rng.shuffle(asked)
        for vaddr, size in asked + asked:
            assert elf.offset_of(vaddr, size) == walk(elf, vaddr, size), (path, vaddr, size)
    path = _files(built)[0]
    elf = ElfFile.open(str(path))
    first = elf.loads[0]
    half = first.filesz // 2
    # the last program header made a load over the second half of the first one
    last = elf.phnum - 1
    assert elf.segments[last].type != 1  # (PT_LOAD: the others come first)
    elf = _patched(path, tmp_path / "over", (elf.phoff + 56 * last, "<IIQQQQQ", 1, 4, 0,
                                             first.vaddr + half, first.vaddr + half,
                                             first.filesz, first.memsz))
    assert elf.loads[0] == first and elf.loads[-1].vaddr == first.vaddr + half
    for vaddr in (first.vaddr + first.filesz + 8, first.vaddr + first.filesz - 8):
        assert elf.offset_of(vaddr) == walk(elf, vaddr, 1)  # (over's alone, then both's)
    assert elf.offset_of(first.vaddr + first.filesz - 8) == first.offset + first.filesz - 8
