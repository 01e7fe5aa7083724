"""The conservative scans for taken addresses, checked against the instruction that holds
each match: in a position-dependent program, 4 bytes of code that equal an address inside
a window refuse it only when an instruction really carries that address (an immediate or
a displacement starting there) or really branches to it; a coincidence (a RIP-relative
displacement, bytes straddling two instructions) no longer does. Code in no known function
stays conservative."""

import json
import os
import re
import shutil
import sys
import threading

import pytest

from conftest import all_symbols, check, rewrite, run, stat
from urewrite.arch.aarch64.backend import AArch64Backend
from urewrite.arch.x86_64.backend import X86_64Backend

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")

# Every target has the same 5-byte window: `xor %eax,%eax` (2 bytes), then at +2 its inner
# label, `add $3,%eax` (3 bytes), `ret`. real_* are entered at +2 by the enter_* functions,
# through an address that an instruction carries (imm32, imm64, disp32) or a far jump;
# nothing enters coin_* there, but bytes equal to coin_*+2 lie in `decoy` (never run) and,
# for coin_c, in bytes that no symbol or FDE claims.
SOURCE = r"""
#include <stdio.h>
int real_a(void), real_b(void), real_c(void), real_d(void);
int enter_a(void), enter_b(void), enter_c(void), enter_d(void);
int coin_a(void), coin_b(void), coin_c(void), coin_d(void);
#define TARGET(f) ".globl " #f "\n.type " #f ",@function\n" #f ":\n" \
    "    xor %eax, %eax\n" #f "_inner:\n    add $3, %eax\n    ret\n.size " #f ", .-" #f "\n" \
    ".skip 8, 0xcc\n"
#define FUNCTION(f, body) ".globl " #f "\n.type " #f ",@function\n" #f ":\n" body \
    ".size " #f ", .-" #f "\n.skip 8, 0xcc\n"
__asm__(
    ".text\n"
    TARGET(real_a) TARGET(real_b) TARGET(real_c) TARGET(real_d)
    TARGET(coin_a) TARGET(coin_b) TARGET(coin_c) TARGET(coin_d)
    FUNCTION(enter_a, "    mov $real_a_inner, %ecx\n    mov $5, %eax\n    jmp *%rcx\n")
    FUNCTION(enter_b, "    movabs $real_b_inner, %rcx\n    mov $5, %eax\n    jmp *%rcx\n")
    FUNCTION(enter_c, "    lea real_c_inner, %rcx\n    mov $5, %eax\n    jmp *%rcx\n")
    ".skip 300, 0xcc\n"  /* out of rel8 reach: only the byte scan sees enter_d's jump */
    FUNCTION(enter_d, "    mov $5, %eax\n    jmp.d32 real_d_inner\n")
    /* (what follows a straddling match decodes as whatever the address makes of it:
       each comes last in its function, after the code the linear sweep must reach) */
    FUNCTION(decoy,
             "    .byte 0x8b, 0x05\n    .long coin_a+2\n"   /* mov eax, [rip + coin_a+2] */
             "    int3\n"
             "    .byte 0x48, 0x89, 0xe9\n"               /* mov rcx, rbp: e9 ... */
             "    .long coin_d+2 - (. + 4)\n")            /* ... and 4 bytes: 'jmp coin_d+2' */
    FUNCTION(decoy_b, "    .byte 0xb0\n    .long coin_b+2\n") /* mov al, imm8: 1 of 4 bytes */
    /* no symbol, no FDE: */
    "    .byte 0x8b, 0x05\n    .long coin_c+2\n    .skip 8, 0xcc\n");
int main(int argc, char **argv) {
    int n = 3 + (argc > 5), sum = 0;
    (void)argv;
    for (int i = 0; i < n; i++)
        sum += 1000 * (real_a() + real_b() + real_c() + real_d())
             + 100 * (enter_a() + enter_b() + enter_c() + enter_d())
             + coin_a() + coin_b() + coin_c() + coin_d();
    printf("%d\n", sum);
    return 0;
}
"""
OUTPUT = "45636\n"  # 3 * (1000*12 + 100*32 + 12)
RUNS = 3


def _build(tmp_path, link):
    (tmp_path / "scans.c").write_text(SOURCE)
    binary = tmp_path / f"scans-{link}"
    check(["gcc", "-O2", "-fno-pie", f"-{link}", tmp_path / "scans.c", "-o", binary])
    return binary


@pytest.mark.parametrize("link", ["no-pie", "static"])
def test_real_references_refuse_and_coincidences_do_not(tmp_path, link):
    binary = _build(tmp_path, link)
    sym = all_symbols(binary)
    assert run([binary]).stdout == OUTPUT
    out = tmp_path / "scans.probed"
    # the plain jump only: a 2-byte hop would not cover entry+2, where each reference aims
    result = rewrite(binary, out, "*", extra=["--tactics", "jump"])
    refused = {r["name"]: r["reason"] for r in result["refused"]}

    def inner(f):
        return f"may lead to {sym[f] + 2:#x}, inside the displaced bytes"

    # real references, each found where it is
    assert refused["real_a"] == f"an immediate at {sym['enter_a'] + 1:#x} in .text {inner('real_a')}"
    assert inner("real_b") in refused["real_b"]  # (an 8-aligned imm64 is also a constant)
    assert refused["real_c"] == f"an immediate at {sym['enter_c'] + 4:#x} in .text {inner('real_c')}"
    assert refused["real_d"] == (f"a branch or address computation at {sym['enter_d'] + 5:#x} "
                                 f"in .text {inner('real_d')}")
    # bytes no known function holds count as real
    assert re.fullmatch(r"an immediate at 0x[0-9a-f]+ in \.text " + inner("coin_c"),
                        refused["coin_c"]), refused["coin_c"]
    # coincidences: a RIP-relative displacement, an imm8 and the next bytes, a ModRM byte
    # 0xe9 and the next bytes
    probed = {p["name"]: p for p in result["probes"]}
    for f in ("coin_a", "coin_b", "coin_d"):
        assert f not in refused and probed[f]["displaced"] == 5, f

    report = stat([out], tmp_path)
    assert (report.proc.returncode, report.proc.stdout) == (0, OUTPUT)
    for f in ("coin_a", "coin_b", "coin_d", "enter_a", "enter_b", "enter_c", "enter_d"):
        assert report.hits(f) == RUNS, f
    assert report.hits("main") == 1


def test_x86_64_holds_constant_reads_the_field_at_the_offset():
    backend = X86_64Backend()
    address = 0x401136
    imm = address.to_bytes(4, "little")

    def holds(code: bytes, offset: int) -> bool:
        insn = backend.decode(code, 0x1000, detail=True)[0]
        return backend.holds_constant(insn, offset, address)

    assert holds(b"\xbf" + imm, 1)                       # mov edi, imm32
    assert holds(b"\x48\xb9" + imm + bytes(4), 2)        # movabs rcx, imm64
    assert not holds(b"\x48\xb9" + imm + b"\1\0\0\0", 2)  # ... whose value is another
    assert holds(b"\xc7\x44\x24\x08" + imm, 4)           # mov dword [rsp+8], imm32
    assert holds(b"\x48\x8d\x0c\x25" + imm, 4)           # lea rcx, [disp32]
    assert not holds(b"\x8b\x05" + imm, 2)               # mov eax, [rip + disp32]
    assert not holds(b"\xe8" + imm, 1)                   # call rel32: relative
    assert not holds(b"\xb8" + imm, 2)                   # not where the field starts
    assert not holds(b"\xb0" + imm, 1)                   # mov al, imm8: one byte only
    # undecided without detail
    assert backend.holds_constant(backend.decode(b"\xb0\x36", 0x1000)[0], 1, address)


def test_aarch64_holds_constant_stays_conservative():
    backend = AArch64Backend()
    insn = backend.decode((0xD503201F).to_bytes(4, "little"), 0x1000)[0]  # nop
    assert backend.holds_constant(insn, 0, 0x1F2003D5)


# A RIP-relative lea into another function's tail, from a function out of rel8 reach:
# the return probe of `shared` must not patch its exits (its `ret` returns for `other`).
SHARED_SOURCE = r"""
#include <stdio.h>
int other(int), shared(int);
__asm__(
    ".text\n"
    ".globl other\n.type other,@function\nother:\n"
    "    mov $3, %eax\n    lea tail(%rip), %rcx\n    jmp *%rcx\n.size other, .-other\n"
    ".skip 300, 0xcc\n"
    ".globl shared\n.type shared,@function\nshared:\n"
    "    mov $2, %eax\n    nop\n    nop\n    nop\n    nop\n    nop\n"
    "tail:\n    add %edi, %eax\n    .fill 30, 1, 0x90\n"  /* no exit window reaches back to tail */
    "    ret\n.size shared, .-shared\n");
int main(void) {
    printf("%d %d\n", other(10), shared(10));
    return 0;
}
"""


def test_an_address_computed_into_a_tail_keeps_its_exits_unpatched(tmp_path):
    (tmp_path / "shared.c").write_text(SHARED_SOURCE)
    binary = tmp_path / "shared"
    check(["gcc", "-O2", tmp_path / "shared.c", "-o", binary])
    sym = all_symbols(binary)
    listed = {f["name"]: f["return"] for f in
              json.loads(check([sys.executable, "-m", "urewrite", "list", "--json", binary])
                         .stdout)["functions"]}
    assert (f"other code branches into it (at {sym['tail']:#x}, from {sym['other'] + 5:#x})"
            in listed["shared"]["reason"])
    # its indirect jump leaves it for `shared`'s tail: an exit, checked where it goes
    assert (listed["other"]["mechanism"], listed["other"]["checked"]) == ("exit sites", 1)


# -- the scans made ahead, on a thread ------------------------------------------------

def _tables(index) -> list:
    return [(t.kind, t.section, t.values.tolist(), None if t.sources is None else
             t.sources.tolist()) for t in index.data_tables() + index.code_tables()]


@pytest.mark.parametrize("path", ["/lib/x86_64-linux-gnu/libc.so.6", "static"])
def test_scans_made_ahead_are_the_scans_made_when_asked(tmp_path, path, monkeypatch):
    """scan_ahead() makes the very tables a question makes, once: a question asked
    while the thread scans waits for it rather than scanning again."""
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.rewriter.taken_addresses import TakenIndex
    if path == "static":
        path = _build(tmp_path, "static")  # (position-dependent: the immediates' scan too)
    elif not os.path.exists(path):
        pytest.skip(f"{path} is missing")
    elf = ElfFile.open(str(path))
    expected = TakenIndex(elf, X86_64Backend())
    wanted = expected.every_value()[::97][:300]
    scanned = []
    backend = X86_64Backend()
    scan = backend.code_reference_table
    monkeypatch.setattr(backend, "code_reference_table",
                        lambda code, base: scanned.append(base) or scan(code, base))
    ahead = TakenIndex(elf, backend)
    ahead.scan_ahead()
    assert ahead.find(wanted) == expected.find(wanted)  # (asked at once: it waits)
    assert _tables(ahead) == _tables(expected)
    assert ahead.every_value().tolist() == expected.every_value().tolist()
    assert ahead.branch_sources(wanted.tolist()) == expected.branch_sources(wanted.tolist())
    assert sorted(scanned) == sorted(s.addr for s in elf.executable_sections())


def _no_scans_running() -> None:
    """Wait for scans other tests left on their threads (a rewrite that never asked for
    them): while any runs, the switch interval is lowered."""
    for thread in threading.enumerate():
        if thread.name == "urewrite scans":
            thread.join()


def test_a_scan_that_fails_ahead_fails_where_it_is_asked(monkeypatch, capsys):
    """The thread prints no traceback: the question that needs the scan meets the error."""
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.rewriter.taken_addresses import TakenIndex
    backend = X86_64Backend()
    uncaught = []  # (what would print a thread's traceback)
    monkeypatch.setattr(threading, "excepthook", uncaught.append)

    def broken(code, base):
        raise ValueError("no scan today")
    monkeypatch.setattr(backend, "code_reference_table", broken)
    index = TakenIndex(ElfFile.open(sys.executable), backend)
    _no_scans_running()
    index.scan_ahead()
    with pytest.raises(ValueError, match="no scan today"):
        index.find([0x1000])
    assert capsys.readouterr().err == "" and not uncaught
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_scans_that_overlap_put_the_switch_interval_back():
    """Two files' scans on threads at once (one starts while the other runs): once both
    end, Python's switch interval is the process's own again, not the lowered one."""
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.rewriter.taken_addresses import TakenIndex
    _no_scans_running()
    own = sys.getswitchinterval()
    release = threading.Event()

    def scans_held_until_released():
        """An index whose scans, on their thread, wait in their first code table: the
        event is set once they are there."""
        backend, there = X86_64Backend(), threading.Event()
        table = backend.code_reference_table

        def held(code, base):
            there.set()
            release.wait(10)
            return table(code, base)
        backend.code_reference_table = held
        index = TakenIndex(ElfFile.open(sys.executable), backend)
        index.scan_ahead()
        assert there.wait(10)
        return index

    first = scans_held_until_released()
    assert sys.getswitchinterval() < own  # (lowered while they run)
    second = scans_held_until_released()  # (started while the first runs)
    release.set()
    first.wait()
    second.wait()
    assert sys.getswitchinterval() == pytest.approx(own)
