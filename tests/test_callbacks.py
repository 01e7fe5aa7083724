"""C callbacks (`--call FILE.c:FUNCTION`): built into the probes at a rewrite, and
loaded with `urewrite run`, on x86_64 and on arm64 under qemu-aarch64.

samples/callbacks/values_hook.c keeps, over samples/programs/values.c's calls, the maps
of a bpftrace program (its comment) plus some of its own: the maps must be the ones the
evaluator gives for that program (programs/evaluate.py, held to bpftrace by
tests/test_program_run.py), exactly, with threads too; its safe reads of NULL are
counted, never a crash; its events and its probe's own area say what it saw. A callback
that would not run safely where a probe runs it is refused with one line, and no
output is written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cross
from conftest import GO_CACHE, run
from probe_programs import READS
from urewrite.programs import output as printer
from urewrite.programs.checks import check as check_program
from urewrite.programs.evaluate import Hit, State, run_block
from urewrite.programs.parser import parse

ROOT = Path(__file__).resolve().parent.parent
VALUES = ROOT / "samples" / "programs" / "values.c"
HOOK = ROOT / "samples" / "callbacks" / "values_hook.c"
WORDS = ("alpha", "beta", "gamma")
PROBES = ["-p", "work", "-r", "work", "-p", "named", "--args", "2"]
# values_hook.c's maps of work(), as a bpftrace program (its comment)
EQUIVALENT = ("uprobe:x:work { @by_b[arg1] = count(); @sum_a = sum(arg0); } "
              "uretprobe:x:work { @ret = hist((int64)retval); @low = min((int64)retval); "
              "@high = max((int64)retval); @mean = avg((int64)retval); "
              "@lin = lhist((int64)retval, 0, 3000, 500); }")


def urewrite(*args, env=None) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "urewrite", *args], env=env, timeout=300)


class Machine:
    """How to build and run values.c for one architecture."""

    def __init__(self, name: str):
        self.name = name

    def build(self, source: Path, out: Path, *flags) -> None:
        cc = "cc" if self.name == "x86_64" else cross.CC
        subprocess.run([cc, "-O2", "-pthread", *flags, str(source), "-o", str(out)],
                       check=True)

    def loaded(self, program: Path) -> list:
        """`run --call`'s files: the command's program natively; under qemu, --in."""
        return [] if self.name == "x86_64" else ["--in", str(program)]

    def command(self, program: Path, *args) -> list:
        if self.name == "x86_64":
            return [str(program), *map(str, args)]
        return cross.emulate(program) + [str(a) for a in args]


MACHINES = [pytest.param(Machine("x86_64"), id="x86_64"),
            pytest.param(Machine("arm64"), id="arm64", marks=cross.needs(cross.CC, cross.QEMU))]


@pytest.fixture(scope="module", params=MACHINES)
def built(request, tmp_path_factory):
    """(machine, values.c built, values.c rewritten with values_hook.c built in)."""
    machine = request.param
    work = tmp_path_factory.mktemp(f"callbacks-{machine.name}")
    plain, rewritten = work / "values", work / "values.probed"
    machine.build(VALUES, plain)
    done = urewrite(plain, *PROBES, "--call", f"{HOOK}:on_values", "-o", rewritten, "-q")
    assert done.returncode == 0, done.stderr
    return machine, plain, rewritten


def _expected(calls: int) -> dict:
    """The maps, as `--json` prints them (one object per map, by name), that the
    evaluator gives for EQUIVALENT over values.c's calls, and @letters."""
    checked = check_program(parse(EQUIVALENT))
    state = State(checked)
    blocks = {b.probes[0].kind: b for b in checked.program.blocks}
    for i in range(calls):
        run_block(state, blocks["uprobe"], Hit(blocks["uprobe"].probes[0], args=(i, i % 7)))
        run_block(state, blocks["uretprobe"], Hit(blocks["uretprobe"].probes[0],
                                                  retval=(3 * i - 500 * (i % 7)) % 2**64))
    maps = {name: json.loads(line) for line in printer.json_lines(list(state.maps.values()))
            for name in json.loads(line)["data"]}
    letters = {}
    for i in range(calls):
        key = f"{ord(WORDS[i % 3][0])},{i % 2}"
        letters[key] = letters.get(key, 0) + 1
    maps["@letters"] = {"type": "map", "data": {"@letters": letters}}
    maps["@unset"] = {"type": "map", "data": {"@unset": 0}}
    return maps


def _maps(stdout: str) -> dict:
    """`run --json`'s or `stat --json`'s maps, by name."""
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {name: line for line in lines if line.get("type") in ("map", "hist", "lhist", "stats")
            for name in line["data"]}


@pytest.mark.parametrize("threads", [1, 4])
def test_loaded_with_run_keeps_the_programs_maps_exactly(built, threads):
    machine, _, rewritten = built
    calls = 3000
    ran = urewrite("run", "--call", f"{HOOK}:on_values", *machine.loaded(rewritten), "--json", "--",
                   *machine.command(rewritten, calls, threads))
    assert ran.returncode == 0, ran.stderr
    assert _maps(ran.stdout) == _expected(calls)
    # every named() read NULL once: counted, and the process ran on
    assert f"{calls} memory reads found nothing to read" in ran.stderr


def test_built_in_runs_under_stat(built):
    """No tracer's program: the callback built into the probes runs, and stat prints
    its maps (from the maps file alone)."""
    machine, _, rewritten = built
    ran = urewrite("stat", "--json", "--", *machine.command(rewritten, 2000, 4))
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout.split("\n", 1)[1])  # (after the command's own line)
    maps = {}
    for line in report["programs"]:
        maps.update(_maps("\n".join(json.dumps(x) for x in line["maps"])))
    assert maps == _expected(2000)


def test_events_context_and_area(built):
    """The events a callback emits, as `run` prints them: named(word, i) for i < 3,
    with its probe's hit count from the area (one thread: in order) and a thread id."""
    machine, _, rewritten = built
    ran = urewrite("run", "--call", f"{HOOK}:on_values", *machine.loaded(rewritten), "--",
                   *machine.command(rewritten, 50))
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert [line for line in lines if re.fullmatch(r"\d+ \d+ \d+", line)] == \
        ["0 1 1", "1 2 1", "2 3 1"]


def test_only_the_arguments_it_reads_are_filled_in(built, tmp_path):
    """UREWRITE_ARGS(1): args[0] as the probe records it; args[1] (recorded too) is not
    filled in (a store a hit less), so its value is whatever the stack held: only that
    the callback runs with args[0] right is held here."""
    machine, _, rewritten = built
    source = tmp_path / "first.c"
    source.write_text('#include "urewrite.h"\nUREWRITE_MAP(a, UREWRITE_SUM, 0);\n'
                      'UREWRITE_MAP(b, UREWRITE_SUM, 0);\nUREWRITE_READS(UREWRITE_ARGS(1));\n'
                      'void f(struct urewrite_context *c) { if (c->kind != UREWRITE_KIND_ENTRY '
                      '|| c->name[0] != \'w\') return; urewrite_map_add(c, &a, 0, c->args[0]); '
                      'urewrite_map_add(c, &b, 0, c->args[1]); }\n')
    ran = urewrite("run", "--call", f"{source}:f", *machine.loaded(rewritten), "--json", "--",
                   *machine.command(rewritten, 100))
    assert ran.returncode == 0, ran.stderr
    maps = _maps(ran.stdout)
    assert maps["@a"] == {"type": "map", "data": {"@a": sum(range(100))}} and "@b" in maps


def test_the_rewrite_runs_as_the_original(built):
    machine, plain, rewritten = built
    expected = subprocess.run(machine.command(plain, 500, 3), capture_output=True, text=True)
    got = subprocess.run(machine.command(rewritten, 500, 3), capture_output=True, text=True)
    assert (got.returncode, got.stdout) == (expected.returncode, expected.stdout)


def test_a_rewrite_writes_the_same_bytes_each_time(built, tmp_path):
    _, plain, rewritten = built
    again = tmp_path / rewritten.name  # (the same name: the region's tag comes from it)
    done = urewrite(plain, *PROBES, "--call", f"{HOOK}:on_values", "-o", again, "-q")
    assert done.returncode == 0, done.stderr
    assert again.read_bytes() == rewritten.read_bytes()


REFUSED = {
    "writable global": ("static long calls;\nvoid f(struct urewrite_context *c) "
                        "{ calls += c->args[0]; }", "f", "writable data (.bss"),
    "library call": ("unsigned long strlen(const char *);\nvoid f(struct urewrite_context *c) "
                     "{ c->area[0] = strlen(c->name); }", "f", "calls strlen, which it cannot"),
    "big stack": ("void f(struct urewrite_context *c) { volatile char b[4000]; "
                  "b[c->args[0] % 4000] = 1; c->area[0] = b[c->args[1] % 4000]; }", "f",
                  "bytes of stack; a probe gives it 2048"),
    "variable stack": ("void f(struct urewrite_context *c) { volatile char b[c->args[0] % 64 + 1];"
                       " b[0] = 1; c->area[0] = b[0]; }", "f", "known only at run time"),
    "no such function": ("void f(struct urewrite_context *c) { c->area[0] = 1; }", "g",
                         "no function g in"),
    "compile error": ("void f(struct urewrite_context *c) { c->nothing = 1; }", "f",
                      "has no member named"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsafe_callbacks_are_refused_with_one_line(built, tmp_path, case):
    _, plain, _ = built
    body, function, reason = REFUSED[case]
    source = tmp_path / "hook.c"
    source.write_text('#include "urewrite.h"\n' + body + "\n")
    out = tmp_path / "out"
    done = urewrite(plain, "-p", "work", "--call", f"{source}:{function}", "-o", out)
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1 and reason in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_floating_point_code_is_refused(built, tmp_path):
    """An object file compiled without -mgeneral-regs-only that uses floating point: a
    probe saves no floating-point register, so its code is refused, by instruction."""
    machine, plain, _ = built
    source = tmp_path / "fp.c"
    source.write_text("struct c { unsigned long args[12]; };\n"
                      "void f(struct c *c) { c->args[1] = (unsigned long)(c->args[0] * 1.5); }\n")
    obj = tmp_path / "fp.o"
    cc = "cc" if machine.name == "x86_64" else cross.CC
    subprocess.run([cc, "-O2", "-fPIC", "-c", str(source), "-o", str(obj)], check=True)
    done = urewrite(plain, "-p", "work", "--call", f"{obj}:f", "-o", tmp_path / "out")
    assert done.returncode == 1 and "floating-point" in done.stderr, done.stderr
    assert "-mgeneral-regs-only" in done.stderr


def test_bad_specs(built, tmp_path):
    _, plain, rewritten = built
    for spec, reason in ((f"{HOOK}", "give FILE.c:FUNCTION"),
                         (f"{tmp_path}/none.c:f", "no file"),
                         (f"{HOOK}:on-values", "give FILE.c:FUNCTION")):
        done = urewrite(plain, "-p", "work", "--call", spec, "-o", tmp_path / "out")
        assert done.returncode == 1 and reason in done.stderr, done.stderr
    both = urewrite(plain, "-e", "uprobe:x:work { @ = count(); }", "--call", f"{HOOK}:on_values",
                    "-o", tmp_path / "out")
    assert both.returncode == 1 and "not both" in both.stderr
    run = urewrite("run", "--call", f"{HOOK}:on_values", "-e", "BEGIN { }", "--", rewritten)
    assert run.returncode == 2 and "--call" in run.stderr


GO = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK)
                            else None)


@pytest.mark.skipif(GO is None, reason="needs Go (a go on PATH or /usr/local/go/bin/go)")
def test_go_programs_are_refused_and_programs_not_built_in(tmp_path):
    """A Go program's probes would run a callback on a goroutine's stack, which leaves it
    too little room: refused; a program given with -e is not built in, and a note says so."""
    (tmp_path / "main.go").write_text("package main\nimport \"fmt\"\n//go:noinline\n"
                                      "func work(n int) int { return n * 3 }\n"
                                      "func main() { fmt.Println(work(2)) }\n")
    (tmp_path / "go.mod").write_text("module g\n\ngo 1.21\n")
    env = dict(os.environ, GOFLAGS="-mod=mod", GOCACHE=GO_CACHE)
    subprocess.run([GO, "build", "-o", "g", "."], cwd=tmp_path, check=True, env=env)
    called = urewrite(tmp_path / "g", "-p", "main.work", "--call", f"{HOOK}:on_values",
                      "-o", tmp_path / "out")
    assert called.returncode == 1 and "is a Go program" in called.stderr, called.stderr
    assert not (tmp_path / "out").exists()
    program = urewrite(tmp_path / "g", "-e", "uprobe:*:main.work { @ = count(); }",
                       "-o", tmp_path / "out")
    assert program.returncode == 0, program.stderr
    assert "the program is not built in (Go code runs no probe program yet)" in program.stderr


SIX = ROOT / "samples" / "callbacks" / "six.c"
CLOBBERS = ROOT / "samples" / "callbacks" / "clobbers.c"


@pytest.mark.parametrize("function", ["counts", "writes_r8_r9",
                                      "calls_one_that_writes_r10_r11"])
def test_registers_a_callback_writes_are_the_probed_codes_again(tmp_path, function):
    """A probe's direct entry saves r8 to r11 only where the callback's code names them
    (or a function it calls does): at the entry of a function whose fifth and sixth
    arguments are in r8 and r9, callbacks that write them, directly or in a callee, or
    as their compiler chose, leave the program's output its own."""
    if shutil.which("cc") is None:
        pytest.skip("cc is not installed")
    plain, rewritten = tmp_path / "six", tmp_path / "six.probed"
    subprocess.run(["cc", "-O2", str(SIX), "-o", str(plain)], check=True)
    expected = subprocess.run([str(plain), "3000"], capture_output=True, text=True).stdout
    done = urewrite(plain, "-p", "six", "-o", rewritten, "-q")
    assert done.returncode == 0, done.stderr
    ran = urewrite("run", "--call", f"{CLOBBERS}:{function}", "--", str(rewritten), "3000")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(expected) and "@hits: 3000" in ran.stdout, ran.stdout


def test_registers_written_follows_calls_and_jumps_and_gives_up_at_pointers():
    """Backend.registers_written over x86_64 code: what each instruction names, the
    writes Capstone leaves out (cmpxchg's rax, a system call's rcx and r11), through
    calls and both ways of a branch; None at a call or jump through a register."""
    import keystone
    from urewrite.arch.x86_64.backend import X86_64Backend
    backend = X86_64Backend()
    ks = keystone.Ks(keystone.KS_ARCH_X86, keystone.KS_MODE_64)

    def written(text):
        return backend.registers_written(bytes(ks.asm(text, 0)[0]), 0)

    assert written("ret") == frozenset()
    assert written("test edi, edi; je x; mov r8b, 1; x: ret") == {"rdi", "r8"}
    assert written("call f; ret; f: xor r9d, r9d; ret") == {"r9"}
    assert written("lock cmpxchg qword ptr [rsi], rdx; ret") == {"rax", "rsi", "rdx"}
    assert written("syscall; ret") == {"rax", "rcx", "r11"}
    assert written("mov r10w, 1; jmp x; mov r11, 1; x: ret") == {"r10"}
    assert written("call qword ptr [rdi + 8]; ret") is None
    assert written("jmp rax") is None
    assert {"r8", "r9", "r10", "r11"} <= written("int 0x80; ret")
    # stubs that jump to one function: the function read once, its answer kept
    code = bytes(ks.asm("mov eax, 1; jmp f; mov ecx, 2; jmp f; f: mov r9d, 3; ret", 0)[0])
    second = len(ks.asm("mov eax, 1; jmp f; f:", 0)[0])
    memo = {}
    assert backend.registers_written(code, 0, memo) == {"rax", "r9"}
    function = [start for start in memo if start not in (0,)]
    assert len(function) == 1 and memo[function[0]] == {"r9"}
    assert backend.registers_written(code, second, memo) == {"rcx", "r9"}


def test_arm64_context_read_follows_the_pointer_and_gives_up_where_it_goes_elsewhere():
    """Backend.context_read over arm64 code, as x86_64's (tests/test_built_in_calls.py):
    loads through x0 and its copies, by their sizes; None at an add, a writeback, an
    index, a narrower copy, a store of it, a blr. The shifts whose destination Capstone
    calls read and written are writes only."""
    import keystone
    from urewrite.arch.aarch64.backend import AArch64Backend
    backend = AArch64Backend()
    ks = keystone.Ks(keystone.KS_ARCH_ARM64, keystone.KS_MODE_LITTLE_ENDIAN)

    def read(text):
        return backend.context_read(bytes(ks.asm(text, 0)[0]), 0)

    assert read("ret") == frozenset()
    assert read("ldr x1, [x0, #120]; ret") == {120}
    assert read("ldrb w2, [x0, #215]; ret") == {208}
    assert read("ldr w1, [x0, #100]; ret") == {96}
    assert read("mov x19, x0; mov x0, #1; ldp x3, x4, [x19, #16]; ret") == {16, 24}
    assert read("bl f; ldr x1, [x0]; ret; f: ldr x2, [x0, #96]; ret") == {0, 96}
    assert read("cbz x1, l; ldr x2, [x0, #8]; ret; l: ldr x2, [x0, #16]; ret") == {8, 16}
    assert read("ldr x0, [x0, #120]; ldr x1, [x0, #8]; ret") == {120}
    assert read("lsl x0, x1, #5; ldr x2, [x0]; ret") == frozenset()
    for escapes in ("ldr x5, [x0, #8]!; ret", "str x0, [sp, #-16]!; ret", "ldr x1, [x0, x2]; ret",
                    "add x1, x0, #8; ret", "mov w1, w0; ret", "blr x2; ret", "br x3",
                    "movk x0, #1; ret"):
        assert read(escapes) is None, escapes


def test_the_context_holds_what_the_callback_reads(built, tmp_path):
    """A callback whose code the analysis reads through (Backend.context_read: its
    name, probe, kind, pid and area; no argument), on each machine: each field as the
    probe and the process give it, at work()'s entry and return and named()'s entry."""
    from urewrite.arch import backend_for
    machine, _, rewritten = built
    source = tmp_path / "reads.c"
    source.write_text(READS)
    from urewrite.trampolines import program_file as P
    built_callback = __import__("urewrite.programs.callback", fromlist=["build"]).build(
        f"{source}:f", backend_for(62 if machine.name == "x86_64" else 183))
    assert built_callback.uses == P.USES_PID | P.USES_MAPS | P.USES_PROBE | P.USES_AREA
    calls = 400
    ran = urewrite("run", "--call", f"{source}:f", *machine.loaded(rewritten), "--json", "--",
                   *machine.command(rewritten, calls))
    assert ran.returncode == 0, ran.stderr
    counts = _maps(ran.stdout)["@m"]["data"]["@m"]
    keys = {tuple(int(x) for x in key.split(",")): n for key, n in counts.items()}
    assert sum(keys.values()) == 3 * calls
    by = {}  # (name's first letter, pid right * 10 + entry) -> {probe + area parity: n}
    for (letter, probe, kind), n in keys.items():
        by.setdefault((chr(letter), kind), {})[probe] = n
    assert set(by) == {("w", 11), ("w", 10), ("n", 11)}
    numbers = set()
    for seen in by.values():  # its own number, its own area's hits by parity
        number = min(seen)
        assert seen == {number: calls // 2, number + 100: calls // 2} and number < 100
        numbers.add(number)
    assert len(numbers) == 3


SILENT = ('#include "urewrite.h"\n'
          'UREWRITE_MAP(hits, UREWRITE_COUNT, 1);\n'
          'UREWRITE_READS(UREWRITE_ARGS(1));\n'
          'void f(struct urewrite_context *c)\n'
          '{\n'
          '    uint64_t k = c->args[0] & 1;\n'
          '    urewrite_map_update(c, &hits, &k, 0);\n'
          '}\n')


def _entries(spec: str, rewritten: Path) -> tuple:
    """(the callback `spec` built for `rewritten`, its program file's direct entries
    by probe number: where each is, and what it calls)."""
    from urewrite.arch import backend_for
    from urewrite.programs import attach as A
    from urewrite.programs import callback as C
    t = A.target(str(rewritten))
    built_callback = C.build(spec, backend_for(t.machine))
    C.attach(built_callback, {"": t})
    program = A.built_program(t, built_callback, None,
                              lambda _, lowered, offsets: C.assemble(lowered, offsets),
                              built_callback.backend)
    return built_callback, {n: (program.entry_at[n], e.function) for n, e in
                            program.entries.items()}


def test_a_callback_that_reads_nothing_of_its_probe_is_called_directly(built, tmp_path):
    """A callback that reads neither its probe's number, kind and name nor its area:
    its stubs would fill in nothing, so every probe's direct entry calls the function
    itself (a call less a hit), and probes whose arguments lie alike (work()'s and
    named()'s entries: rdi; a return: rax) share one entry. One that reads them keeps a
    stub, so an entry, per probe. The maps exact either way; a callback that
    cannot emit events gets no event ring, and its tracer no reason to poll."""
    machine, _, rewritten = built
    silent, reads = tmp_path / "silent.c", tmp_path / "reads.c"
    silent.write_text(SILENT)
    reads.write_text(READS)
    callback, entries = _entries(f"{silent}:f", rewritten)
    functions = {function for _, function in entries.values()}
    assert len(entries) == 3 and len(functions) == 1 and entries[0] == entries[2]
    assert functions.pop() - callback.function > 0  # (from the program file's start)
    _, each_own = _entries(f"{reads}:f", rewritten)
    assert len({function for _, function in each_own.values()}) == 3
    calls = 301
    ran = urewrite("run", "--call", f"{silent}:f", *machine.loaded(rewritten), "--json", "--",
                   *machine.command(rewritten, calls))
    assert ran.returncode == 0, ran.stderr
    # work(i, ...) at entry: args[0] = i; at its return: 3i - 500(i % 7); named(word, i): the word
    counts = _maps(ran.stdout)["@hits"]["data"]["@hits"]
    assert sum(counts.values()) == 3 * calls
    assert counts["1"] >= calls // 2  # (odd i at work()'s entry, and its odd returns)
    from urewrite.trampolines.region import TRACE_ENV_VAR
    for spec, ring in ((f"{silent}:f", ""), (f"{HOOK}:on_values", "1")):
        shown = urewrite("run", "--call", spec, "--in", str(rewritten), "--", "sh", "-c",
                         f'echo "[${{{TRACE_ENV_VAR}:+1}}]"')
        assert shown.returncode == 0, shown.stderr
        assert f"[{ring}]" in shown.stdout.splitlines()
