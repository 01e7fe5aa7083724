"""Programs and C callbacks built into a rewrite, called by the trampoline itself
(arch/x86_64/built_in_call.py): no direct table, no entry between. Held to the
unprobed program's output (registers and flags given back: r8 and r9 carry arguments at
six()'s entry, the flags a compare's result at below+3) and to exact maps; a callback's
context filled in with what its code may read (Backend.context_read), which the
analysis's unit test holds to x86_64 code of each kind it meets."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

import pytest

from conftest import run
from probe_programs import READS
from urewrite.arch.base import BuiltInCall
from urewrite.arch.x86_64 import built_in_call, trampoline
from urewrite.trampolines import program_file as P
from urewrite.trampolines.program_file import DirectEntry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIX = os.path.join(ROOT, "samples", "callbacks", "six.c")
FLAGGED = os.path.join(ROOT, "samples", "programs", "flagged.c")
CLOBBERS = os.path.join(ROOT, "samples", "callbacks", "clobbers.c")
OPERANDS = os.path.join(ROOT, "samples", "programs", "operands.c")
CALLS = 3000

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("gcc") is None,
                                reason="x86_64 code, built with gcc, run natively")


def urewrite(*args) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "urewrite", *map(str, args)], timeout=300)


def _build(source: str, out) -> str:
    subprocess.run(["gcc", "-O2", source, "-o", str(out)], check=True)
    return subprocess.run([str(out), str(CALLS)], capture_output=True, text=True,
                          check=True).stdout


def _stat(rewritten) -> tuple:
    """(the command's output, the built-in program's maps) under `urewrite stat`."""
    ran = urewrite("stat", "--", rewritten, CALLS)
    assert ran.returncode == 0, ran.stderr
    own, rest = ran.stdout.split("OBJECT", 1)
    maps = rest.split("the program built into the probes:", 1)[1]
    return own, dict(line.split(": ") for line in maps.splitlines() if line.startswith("@"))


def _below_plus_3(plain) -> str:
    """below+3's address: after its compare, where setb reads the flags."""
    symbols = subprocess.run(["nm", str(plain)], capture_output=True, text=True).stdout
    start = next(int(line.split()[0], 16) for line in symbols.splitlines()
                 if line.endswith(" below"))
    return f"{start + 3:#x}"


@pytest.mark.parametrize("function", ["counts", "writes_r8_r9", "calls_one_that_writes_r10_r11"])
def test_a_built_in_callback_leaves_the_registers(tmp_path, function):
    plain, rewritten = tmp_path / "six", tmp_path / "six.probed"
    expected = _build(SIX, plain)
    done = urewrite(plain, "-p", "six", "--call", f"{CLOBBERS}:{function}", "-o", rewritten, "-q")
    assert done.returncode == 0, done.stderr
    own, maps = _stat(rewritten)
    assert own == expected and maps == {"@hits": str(CALLS)}


def test_a_built_in_program_reads_the_arguments_and_leaves_the_registers(tmp_path):
    """arg0 in rdi (kept in its register), arg2 in rdx (in the counting code's slot),
    arg5 in r9, which its code does not touch but the program's own lookups may."""
    plain, rewritten = tmp_path / "six", tmp_path / "six.probed"
    expected = _build(SIX, plain)
    program = "uprobe:*:six { @[arg0 % 7] = count(); @c = sum(arg2); @f = sum(arg5); }"
    done = urewrite(plain, "-e", program, "-o", rewritten, "-q")
    assert done.returncode == 0, done.stderr
    own, maps = _stat(rewritten)
    assert own == expected
    assert maps == {"@c": str(sum(i + 2 for i in range(CALLS))),
                    "@f": str(sum(i * 29 + 5 for i in range(CALLS))),
                    **{f"@[{k}]": str(len(range(k, CALLS, 7))) for k in range(7)}}


@pytest.mark.parametrize("what", ["program", "callback"])
def test_where_the_flags_are_live_they_are_given_back(tmp_path, what):
    plain, rewritten = tmp_path / "flagged", tmp_path / "flagged.probed"
    expected = _build(FLAGGED, plain)
    at = _below_plus_3(plain)
    how = ["-e", f"uprobe:*:{at} {{ @[arg0 % 3] = count(); @b = sum(arg1); }}"] \
        if what == "program" else ["-p", at, "--args", "2", "--call", f"{CLOBBERS}:counts"]
    done = urewrite(plain, *how, "-o", rewritten, "-q")
    assert done.returncode == 0, done.stderr
    own, maps = _stat(rewritten)
    assert own == expected
    assert maps == ({"@hits": str(CALLS)} if what == "callback" else
                    {"@b": str(sum(i % 5 for i in range(CALLS))),
                     **{f"@[{k}]": str(sum(1 for i in range(CALLS) if i % 7 % 3 == k))
                        for k in range(3)}})


def test_the_latency_idiom_built_in_with_the_thread_and_its_name(tmp_path):
    """`@s[tid] = nsecs` at six()'s entry, its latency at the return, and maps keyed
    by the thread's id and name: the trampoline reads the clock, the thread's id and
    name with the entries' own code. Every call timed and every start deleted, the
    thread's id the process's own, its name the program's."""
    plain, rewritten = tmp_path / "six", tmp_path / "six.probed"
    expected = _build(SIX, plain)
    program = ("uprobe:*:six { @s[tid] = nsecs; @c[comm] = count(); @t[tid] = count(); } "
               "uretprobe:*:six /@s[tid]/ { @n = count(); @h = hist(nsecs - @s[tid]); "
               "delete(@s[tid]); }")
    done = urewrite(plain, "-e", program, "-o", rewritten, "-q")
    assert done.returncode == 0, done.stderr
    ran = urewrite("stat", "--", rewritten, CALLS)
    assert ran.returncode == 0, ran.stderr
    own, rest = ran.stdout.split("OBJECT", 1)
    maps = rest.split("the program built into the probes:", 1)[1]
    assert own == expected
    lines = [line for line in maps.splitlines() if line.startswith("@")]
    assert "@c[six.probed]: 3000".replace("3000", str(CALLS)) in lines, maps
    assert f"@n: {CALLS}" in lines and not any(line.startswith("@s[") for line in lines), maps
    tids = [line for line in lines if line.startswith("@t[")]
    assert len(tids) == 1 and tids[0].endswith(f"]: {CALLS}"), maps
    buckets = [int(line.split("|")[0].split()[-1]) for line in maps.splitlines()
               if line.startswith("[") and "|" in line]
    assert sum(buckets) == CALLS, maps


VALUES = os.path.join(ROOT, "samples", "programs", "values.c")


def test_leading_predicates_of_every_comparison_built_in(tmp_path):
    """A built-in program's leading predicate, checked by the trampoline (a false one
    runs nothing): each comparison, and constants past 32 bits, against the counts
    values.c's calls make (work(i, i % 7) for i < N)."""
    plain = tmp_path / "values"
    subprocess.run(["gcc", "-O2", VALUES, "-o", str(plain)], check=True)
    tests = {"eq": ("arg1 == 3", lambda i: i % 7 == 3), "ne": ("arg1 != 3", lambda i: i % 7 != 3),
             "lt": ("arg1 < 3", lambda i: i % 7 < 3), "gt": ("arg1 > 3", lambda i: i % 7 > 3),
             "le": ("arg1 <= 3", lambda i: i % 7 <= 3), "ge": ("arg1 >= 3", lambda i: i % 7 >= 3),
             "wide": ("arg0 < 0x100000000", lambda i: True),
             "never": ("arg0 == 0xffffffffff", lambda i: False),
             # (arguments are unsigned, as bpftrace's: -1 is the highest)
             "negative": ("arg1 < -1", lambda i: True)}
    for name, (test, holds) in tests.items():
        rewritten = tmp_path / f"values.{name}"
        program = f"uprobe:*:work /{test}/ {{ @{name} = count(); @s = sum(arg1); }}"
        done = urewrite(plain, "-e", program, "-o", rewritten, "-q")
        assert done.returncode == 0, done.stderr
        _, maps = _stat(rewritten)
        chosen = [i for i in range(CALLS) if holds(i)]
        assert maps == ({f"@{name}": str(len(chosen)), "@s": str(sum(i % 7 for i in chosen))}
                        if chosen else {f"@{name}": "0"}), name


def test_usdt_arguments_in_part_of_a_register_built_in(tmp_path):
    """USDT operands of each width and signedness (operands.c's widths() at -O2:
    -1@%dl 2@%cx -4@%r8d 4@%eax -8@%rdi with gcc 12), read and extended by the
    trampoline itself, in the sums and in a leading predicate (on %cx, whose register's
    upper bits an `imul` to cx leaves as they were)."""
    if not os.path.exists("/usr/include/x86_64-linux-gnu/sys/sdt.h"):
        pytest.skip("sys/sdt.h is not installed (systemtap-sdt-dev)")
    plain, rewritten = tmp_path / "ops", tmp_path / "ops.probed"
    subprocess.run(["gcc", "-O2", OPERANDS, "-o", str(plain)], check=True)
    notes = subprocess.run(["readelf", "-n", str(plain)], capture_output=True, text=True).stdout
    widths = notes.split("Name: widths", 1)[1].split("Arguments: ", 1)[1].split("\n", 1)[0]
    assert all("@%" in a for a in widths.split()), widths  # (registers, as the test needs)
    program = ("usdt:*:ops:widths /arg1 > 1000/ { @c = sum(arg0); @s = sum(arg1); "
               "@k = sum(arg2); @u = sum(arg3); @d = sum(arg4); }")
    done = urewrite(plain, "-e", program, "-o", rewritten, "-q")
    assert done.returncode == 0, done.stderr
    first = rewritten.read_bytes()
    # the same bytes where the output is there already: the notes that place the USDT
    # arguments are read from the input (they were once read from the output path: no
    # file there the first time, so no direct entry and no call by the trampoline)
    done = urewrite(plain, "-e", program, "-o", rewritten, "-q")
    assert done.returncode == 0, done.stderr
    assert rewritten.read_bytes() == first
    _, maps = _stat(rewritten)
    chosen = [i for i in range(CALLS) if i * 300 % 2**16 > 1000]
    assert maps == {"@c": str(sum((i - 100 + 128) % 256 - 128 for i in chosen) % 2**64),
                    "@s": str(sum(i * 300 % 2**16 for i in chosen)),
                    "@k": str(sum(-i for i in chosen) % 2**64),
                    "@u": str(sum((4_000_000_000 - i) % 2**32 for i in chosen)),
                    "@d": str(sum(CALLS - i for i in chosen))}


def test_the_context_holds_what_the_callback_reads(tmp_path):
    """A callback that reads its probe's name, number and kind, its pid and its area
    (and no argument), its context pointer in a register of its compiler's choice:
    the analysis finds those words (the rest is not filled in), and each holds what the
    probe and the process give it."""
    from urewrite.arch.x86_64.backend import X86_64Backend
    from urewrite.programs import callback
    plain, rewritten = tmp_path / "six", tmp_path / "six.probed"
    expected = _build(SIX, plain)
    source = tmp_path / "reads.c"
    source.write_text(READS)
    built = callback.build(f"{source}:f", X86_64Backend())
    assert built.uses == P.USES_PID | P.USES_MAPS | P.USES_PROBE | P.USES_AREA
    assert built.read == 0
    done = urewrite(plain, "-p", "six", "--call", f"{source}:f", "-o", rewritten, "-q")
    assert done.returncode == 0, done.stderr
    own, maps = _stat(rewritten)
    assert own == expected
    half = str(CALLS // 2)
    assert maps == {f"@m[{ord('s')}, 0, 11]": half, f"@m[{ord('s')}, 100, 11]": half}


def _entry(**fields) -> DirectEntry:
    return DirectEntry(**{"function": 0, "expected": (), "reads": 0, "uses": P.USES_MAPS,
                          **fields})


def test_the_trampoline_calls_only_what_it_can_fill_in():
    """What a trampoline does itself (built_in_call.takes), and that its code then calls
    the probe's function directly, on the counting path."""
    from urewrite.arch.x86_64.backend import X86_64Backend
    specs = X86_64Backend().abi_arguments(2)
    blob = __import__("urewrite.trampolines.arguments", fromlist=["encode"]).encode(specs)
    assert built_in_call.takes(_entry(), b"")
    assert built_in_call.takes(_entry(expected=tuple(specs), reads=2), blob)
    assert not built_in_call.takes(_entry(expected=tuple(specs), reads=2), b"")  # other sites'
    assert built_in_call.takes(_entry(predicate=(0, 5, "eq", False)), b"")
    assert not built_in_call.takes(_entry(predicate=(0, 2, "lt", True, "f64")), b"")  # a float's
    for uses in (P.USES_NSECS, P.USES_TID, P.USES_COMM):  # (read by the entries' own code)
        assert built_in_call.takes(_entry(uses=uses), b"")
    from urewrite.trampolines.arguments import MEMORY, REGISTER, ArgSpec, encode
    in_memory = ArgSpec(MEMORY, 8, False, base=X86_64Backend().abi_arguments(1)[0].base)
    assert not built_in_call.takes(_entry(expected=(in_memory,), reads=1), encode((in_memory,)))
    base = specs[0].base
    for size, signed, shift in ((4, True, 0), (4, False, 0), (2, False, 0), (1, True, 0),
                                (1, False, 8)):  # (USDT's -4@%edi ... 1@%ah)
        part = ArgSpec(REGISTER, size, signed, base=base, shift=shift)
        assert built_in_call.takes(_entry(expected=(part,), reads=1), encode((part,)))
    odd = ArgSpec(REGISTER, 4, False, base=base, shift=8)  # (no such x86 operand)
    assert not built_in_call.takes(_entry(expected=(odd,), reads=1), encode((odd,)))
    refs = trampoline.RuntimeRefs(0x10000, 64, 0x2000, 0x2100, 0x2200, 0x2300, 0x2400)
    call = BuiltInCall(_entry(), 0, 0x9000)
    hot, _ = trampoline.counting_template(0, refs, False, 1, False, 0, False, (b"",), False,
                                          False, call)
    assert ("built_in",) == tuple(name for *_, name in hot.outside if name == "built_in")
    plain, _ = trampoline.counting_template(0, refs, False, 1, False, 0, False, (b"",), False)
    assert not any(name == "built_in" for *_, name in plain.outside)


def test_context_read_follows_the_pointer_and_gives_up_where_it_goes_elsewhere():
    """Backend.context_read over x86_64 code: the words loaded through rdi and the
    registers it is copied into, through calls and both ways of a branch, none through
    a register once written; None where one is read otherwise (pushed, an lea, an
    index, a string instruction, a narrower copy), written in part, or control goes
    through a register."""
    import keystone
    from urewrite.arch.x86_64.backend import X86_64Backend
    backend = X86_64Backend()
    ks = keystone.Ks(keystone.KS_ARCH_X86, keystone.KS_MODE_64)

    def read(text):
        return backend.context_read(bytes(ks.asm(text, 0)[0]), 0)

    assert read("ret") == frozenset()
    assert read("mov rax, qword ptr [rdi + 120]; ret") == {120}
    assert read("mov eax, dword ptr [rdi + 100]; ret") == {96}
    assert read("movzx eax, byte ptr [rdi + 215]; ret") == {208}
    assert read("mov rax, qword ptr [rdi + 4]; ret") == {0, 8}  # (straddles two words)
    assert read("test esi, esi; je x; mov rax, qword ptr [rdi + 8]; ret; "
                "x: mov rax, qword ptr [rdi + 16]; ret") == {8, 16}
    assert read("call f; mov rax, qword ptr [rdi]; ret; f: mov rcx, qword ptr [rdi + 96]; ret") \
        == {0, 96}
    assert read("mov rdi, qword ptr [rdi + 120]; mov rax, qword ptr [rdi + 8]; ret") == {120}
    assert read("mov edi, 1; mov rax, qword ptr [rdi + 8]; ret") == frozenset()
    assert read("add qword ptr [rdi + 216], 1; ret") == {216}
    assert read("mov rbx, rdi; mov edi, 1; mov rax, qword ptr [rbx + 96]; ret") == {96}
    assert read("mov rbx, rdi; call f; mov rax, qword ptr [rbx + 8]; ret; "
                "f: mov rdi, qword ptr [rdi + 120]; ret") == {8, 120}
    assert read("mov rbx, rdi; mov rbx, 0; mov rax, qword ptr [rbx + 8]; ret") == frozenset()
    for escapes in ("mov ebx, edi; ret", "mov rbx, rdi; push rbx; ret",
                    "mov rbx, rdi; mov bl, 1; ret", "push rdi; ret", "lea rax, [rdi + 8]; ret",
                    "mov rax, qword ptr [rsi + rdi * 8]; ret", "mov rax, qword ptr [rdi + rsi]; ret",
                    "rep stosb byte ptr [rdi], al; ret", "add rdi, 8; ret", "mov esi, edi; ret",
                    "jmp rax", "call qword ptr [rip + 8]; ret", "cmp rdi, 0; ret"):
        assert read(escapes) is None, escapes
