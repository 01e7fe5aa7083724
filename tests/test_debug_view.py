"""What debuggers and profilers see of the new code (rewriter/debug_sections.py).

A fault in an instruction a window moved, under gdb and in a core dump, gives the
original's backtrace but for its first frame, which names the function as
`FUNCTION.urewrite` (gdb prints `FUNCTION[urewrite]`): samples/faults.c at several
optimisation levels and link modes, with unwind tables in .eh_frame or only in
.debug_frame; on arm64 under qemu-aarch64's gdb stub, return address signing on and
off; a Go program in test_go_programs. The unwind rows the output gives each
moved instruction are the original's at its original address, both read by binutils'
readelf (x86_64 and arm64), and on arm64 whether the return address is signed, read by
our reader. Symbols name every trampoline and the runtime's routines; the input's
symbols and .debug_frame (compressed or not) stay.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

import cross
from conftest import SAMPLES, check, run, running, urewrite
from urewrite.rewriter import pipeline, unwind_rows
from urewrite.rewriter.elf_file import ElfFile

GDB = shutil.which("gdb")
needs_gdb = pytest.mark.skipif(GDB is None, reason="needs gdb (Debian: apt-get install gdb)")
FAULTS = SAMPLES / "faults.c"
LINKS = {"pie": ["-fPIE", "-pie"], "no-pie": ["-fno-pie", "-no-pie"], "static": ["-static"]}
# (optimisation and unwind tables, link): the last has its rows only in .debug_frame
VARIANTS = [("-O2", "pie"), ("-O1", "no-pie"), ("-O3", "static"),
            ("-O2 -g -fno-asynchronous-unwind-tables", "pie")]


def build(folder: Path, flags: str, link: str, cc: str = "gcc", source: Path = FAULTS) -> Path:
    out = folder / f"{source.stem}{flags.replace(' ', '')}-{link}"
    check([cc, *flags.split(), *LINKS[link], "-o", out, source])
    return out


def probed(program: Path, *specs: str) -> Path:
    out = program.with_name(program.name + ".probed")
    proc = urewrite(program, *specs, "--keep-going", "-q", "-o", out)
    assert proc.returncode == 0, proc.stderr
    return out


_FRAME = re.compile(r"^#(\d+)\s+(?:(0x[0-9a-f]+) in )?(\S+)", re.M)


def frames(gdb_output: str) -> list:
    """(pc or None, function) of each frame of the (last) backtrace; gdb's
    FUNCTION[urewrite] read back as the symbol's name. (Loading a core, gdb shows its
    frame #0 before the backtrace.)"""
    found = _FRAME.findall(gdb_output)
    last = max(k for k, (n, _, _) in enumerate(found) if n == "0")
    return [(pc, re.sub(r"\[urewrite\]$", ".urewrite", name)) for _, pc, name in found[last:]]


def backtrace(program: Path, *args: str, core: Path = None, env=None) -> list:
    """The backtrace gdb prints where `program args` faults; with `core`, gdb also writes
    a core file there."""
    save = ["-ex", f"generate-core-file {core}"] if core else []
    proc = run([GDB, "-q", "-batch", "-nx", "-ex", "run", "-ex", "bt", *save,
                "--args", program, *args], env=env)
    assert "SIGSEGV" in proc.stdout, proc.stdout + proc.stderr
    return frames(proc.stdout)


@needs_gdb
@pytest.mark.parametrize("flags,link", VARIANTS, ids=[f"{f.split()[0]}-{l}" + (
    "-debug_frame" if "asynchronous" in f else "") for f, l in VARIANTS])
def test_a_fault_in_a_moved_instruction_unwinds_as_in_the_original(tmp_path, flags, link):
    program = build(tmp_path, flags, link)
    out = probed(program, "-p", "deref", "-p", "outer", "-r", "outer", "-p", "main")
    want = backtrace(program, "null")
    assert [name for _, name in want[:3]] == ["deref", "outer", "main"], want
    for env in (None, {"UREWRITE_DIR": str(tmp_path / "counts")}):  # disarmed, armed
        core = tmp_path / "core"
        got = backtrace(out, "null", core=core, env=env)
        assert got[0][1] == "deref.urewrite", got
        assert got[1:] == want[1:], got  # the callers, their return addresses
        proc = check([GDB, "-q", "-batch", "-nx", "-ex", "bt", out, core])
        assert frames(proc.stdout) == got, proc.stdout  # the core dump reads the same
        core.unlink()


def interp_rows(readelf: str, path: Path) -> list:
    """(start, end, [(location, {column: rule})]) of every FDE, as readelf works them out
    (frames-interp, .eh_frame and .debug_frame); unspecified rules ("u") left out."""
    text = check([readelf, "--debug-dump=frames-interp", path]).stdout
    fdes, current, columns = [], None, None
    for line in text.splitlines():
        fde = re.search(r"FDE cie=\w+ pc=([0-9a-f]+)\.\.([0-9a-f]+)", line)
        if fde:
            current = (int(fde.group(1), 16), int(fde.group(2), 16), [])
            fdes.append(current)
            columns = None
        elif "CIE" in line or "ZERO terminator" in line or line.startswith("Contents of"):
            current = None
        elif current is not None and line.strip().startswith("LOC"):
            columns = line.split()[1:]
        elif current is not None and columns:
            row = re.match(r"^([0-9a-f]{8,16}) (.*)$", line)
            if row:
                rules = dict(zip(columns, row.group(2).split()))
                current[2].append((int(row.group(1), 16),
                                   {c: r for c, r in rules.items() if r != "u"}))
    return fdes


def row_at(fdes: list, address: int):
    for start, end, rows in fdes:
        if start <= address < end and rows:
            return [rules for at, rules in rows if at <= address][-1]
    return None


# (a static executable: .eh_frame without .eh_frame_hdr; libc's functions too)
ROW_VARIANTS = [("gcc", "-O2", FAULTS, "pie"), ("gcc", "-O2", FAULTS, "static"),
                ("g++", "-O2", SAMPLES / "landing_pads.cc", "pie"),
                ("g++", "-O0", SAMPLES / "landing_pads.cc", "no-pie"),
                (cross.CC, "-O2 -mbranch-protection=standard", FAULTS, "pie"),
                (cross.CXX, "-O2 -mbranch-protection=standard", SAMPLES / "landing_pads.cc",
                 "pie")]


@pytest.mark.parametrize("cc,flags,source,link", ROW_VARIANTS,
                         ids=[f"{c}{f.split()[0]}-{s.name}-{l}" for c, f, s, l in ROW_VARIANTS])
def test_each_moved_instruction_has_its_originals_unwind_row(tmp_path, cc, flags, source, link):
    arm = cc.startswith(cross.CROSS)
    if cross.missing(cc, *([cross.READELF] if arm else ["readelf"])):
        pytest.skip(f"needs {cc} and its readelf")
    readelf = cross.READELF if arm else "readelf"
    program = build(tmp_path, flags, link, cc, source)
    out = tmp_path / "out"
    result = pipeline.rewrite(str(program), str(out), ["*"], return_specs=["*"],
                              keep_going=True)
    moved = [(t, o) for span in result.spans for t, o, _ in span.moved]
    before, after = interp_rows(readelf, program), interp_rows(readelf, out)
    checked = 0
    for t, o in moved:
        want = row_at(before, o)
        if want is not None:
            assert row_at(after, t) == want, (hex(t), hex(o))
            checked += 1
    assert checked >= 5, (checked, len(moved))  # (each with a row in the input: compared)
    # what readelf does not show: arm64's return address signing, by our reader
    ours = unwind_rows.rows_at(ElfFile.open(str(out)), [t for t, _ in moved])
    theirs = unwind_rows.rows_at(ElfFile.open(str(program)), [o for _, o in moved])
    assert all(ours[t] == theirs[o] for t, o in moved if o in theirs)
    if arm and "landing_pads" in source.name:  # (functions that save x30: signed there)
        assert any(theirs[o].return_address_signed for _, o in moved if o in theirs)
    # the input's own rows are all still there (its .debug_frame extended, not replaced)
    for start, end, rows in before:
        assert (start, end, rows) in after


def symbols(path: Path) -> dict:
    """name -> (address, size) of every symbol of the symbol table (readelf -sW)."""
    out = {}
    text = check(["readelf", "-sW", path]).stdout
    section = text.split("Symbol table '.symtab'")[-1] if ".symtab" in text else ""
    for line in section.splitlines():
        parts = line.split()
        if len(parts) >= 8 and re.fullmatch(r"\d+:", parts[0]) and int(parts[1], 16):
            out[parts[7]] = (int(parts[1], 16), int(parts[2], 0))
    return out


@pytest.mark.parametrize("strip", [False, True], ids=["symbols", "stripped"])
def test_symbols_name_the_trampolines_and_keep_the_inputs(tmp_path, strip):
    program = build(tmp_path, "-O2 -gz=zlib -g -fno-asynchronous-unwind-tables", "pie")
    if strip:
        check(["strip", program])
    out = probed(program, "-p", "*", "-r", "*")
    before, after = symbols(program), symbols(out)
    assert all(after.get(name) == at for name, at in before.items())  # kept as they were
    added = {name: at for name, at in after.items() if name not in before}
    names = {name for name in added if name.endswith(".urewrite")}
    if not strip:
        assert {"deref.urewrite", "outer.urewrite", "main.urewrite"} <= names
    assert names and all(added[name][1] > 0 for name in names)
    assert {"urewrite.trace_event", "urewrite.slow_hit", "urewrite.lazy_init"} <= set(added)
    text = check(["readelf", "-SW", out]).stdout
    assert text.count(" .symtab ") == 1 and text.count(" .debug_frame ") == 1
    rows, own = interp_rows("readelf", out), interp_rows("readelf", program)
    assert len(own) >= (1 if strip else 4)  # (deref, outer, main: in .debug_frame, compressed)
    assert all(fde in rows for fde in own)  # inflated and kept
    # (nm reads the table through libbfd: a second reader)
    nm = check(["nm", out]).stdout
    assert re.search(r"^[0-9a-f]+ t urewrite\.trace_event$", nm, re.M)


def test_a_built_in_callback_is_named(tmp_path):
    """perf and gdb name a callback built into the probes (its program file) too."""
    program = build(tmp_path, "-O2", "pie")
    callback = tmp_path / "cb.c"
    callback.write_text('#include "urewrite.h"\nUREWRITE_READS(UREWRITE_ARGS(0));\n'
                        'void hit(struct urewrite_context *ctx) { (void)ctx; }\n')
    out = tmp_path / "out"
    proc = urewrite(program, "-p", "deref", "--call", f"{callback}:hit", "-o", out)
    assert proc.returncode == 0, proc.stderr
    named = symbols(out)
    start, size = named["urewrite.built_in_program"]
    assert size > 0 and start % 4096 == 0  # (where the program file goes: page-aligned)


GDB_MULTIARCH = shutil.which("gdb-multiarch")


def _listening(port: int) -> bool:
    """Whether a TCP socket listens on `port` (qemu's gdb stub, before gdb connects:
    a probe connection would take the stub's one client)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                if any(line.split()[1].endswith(f":{port:04X}") and line.split()[3] == "0A"
                       for line in list(f)[1:]):
                    return True
        except OSError:
            pass
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def arm64_backtrace(program: Path, *args: str) -> list:
    """The backtrace gdb-multiarch prints where `program args`, run by qemu-aarch64's
    gdb stub, faults; return addresses with their pointer authentication code cleared
    (qemu's gdb stub does not say where it is, so gdb keeps it). Up to three tries, each
    on a port found free then, and the fault must show in one of them: this failed once
    with two workers and never again in eight runs (output not kept); another test
    taking the port before qemu binds it is one way that can happen."""
    for _ in range(3):
        port = _free_port()
        with running(cross.emulator() + ["-g", str(port), str(program), *args],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
            deadline = time.monotonic() + 30
            while not _listening(port) and time.monotonic() < deadline:
                time.sleep(0.05)
            proc = run([GDB_MULTIARCH, "-q", "-batch", "-nx", "-ex",
                        f"set sysroot {cross.SYSROOT}", "-ex", f"target remote :{port}",
                        "-ex", "continue", "-ex", "bt", program])
        if "SIGSEGV" in proc.stdout:
            break
    assert "SIGSEGV" in proc.stdout, proc.stdout + proc.stderr
    return [(pc and hex(int(pc, 16) & 0xFFFFFFFFFFFF), name) for pc, name in frames(proc.stdout)]


@pytest.mark.skipif(GDB_MULTIARCH is None, reason="needs gdb-multiarch (Debian: apt-get "
                                                  "install gdb-multiarch)")
@cross.needs()
@pytest.mark.parametrize("flags", ["-O2", "-O2 -mbranch-protection=standard"],
                         ids=["plain", "pac-bti"])
def test_arm64_a_fault_in_a_moved_instruction_unwinds_as_in_the_original(tmp_path, flags):
    cross.require_sysroot()
    program = build(tmp_path, flags, "pie", cross.CC)
    out = probed(program, "-p", "deref", "-p", "outer", "-r", "outer", "-p", "main")
    want, got = arm64_backtrace(program, "null"), arm64_backtrace(out, "null")
    assert [name for _, name in want[:2]] == ["deref", "outer"], want
    assert got[0][1] == "deref.urewrite" and got[1:] == want[1:], (want, got)
