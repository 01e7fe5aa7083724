"""Probe programs' direct entries (arch/*/direct_entry.py): a hit calls the probe's
code from the counting path, reading the arguments where the site's registers and
memory are. Held to what the sample computes itself, over every operand form its
USDT notes give (registers of each width, constants, stack memory, a global, a
thread-local), at a probe whose sites' arguments differ (one site's take the trace
path), in PIE, non-PIE and static builds; built in and loaded by `urewrite run`;
across fork; and on arm64 under qemu, over every form test_aarch64_trace's sample
gives there."""

from __future__ import annotations

import os
import platform
import re
import shutil
import struct
import subprocess

import pytest

from conftest import urewrite
from probe_programs import maps_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "samples", "programs", "operands.c")
CALLS = 1000

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="the samples run natively on x86_64 (arm64's under qemu from there)")

PROGRAM = ("usdt:{path}:ops:widths {{ @c = sum(arg0); @s = sum(arg1); @k = sum(arg2); "
           "@u = sum(arg3); @d = sum(arg4); }} "
           "usdt:{path}:ops:places {{ @g = sum(arg0); @t = sum(arg1); @fortytwo = sum(arg2); }} "
           "usdt:{path}:ops:reads {{ @rg = sum(arg0); @rt = sum(arg1); }} "
           "usdt:{path}:ops:twice {{ @twice = sum(arg0); }} "
           "usdt:{path}:ops:twice /arg0 == 5/ {{ @fives = count(); }} "
           "usdt:{path}:ops:widths /arg2 < -5/ {{ @neg = count(); }}")
BUILDS = {"O0": ["-O0"], "O2": ["-O2"], "O2-no-pie": ["-O2", "-no-pie", "-fno-pie"],
          "O2-static": ["-O2", "-static"]}


def _expected(printed: str) -> dict:
    """The maps the program should print: the sample's own sums (as bpftrace prints a
    sum: its 64 bits unsigned), and the counts its loop makes."""
    maps = {}
    for line in printed.splitlines():
        name, value = line.split(": ")
        maps[name] = str(int(value) % 2**64)
    maps["@fortytwo"] = str(42 * CALLS)
    maps["@fives"] = str(len([i for i in range(CALLS) if i % 3 == 0 or i == 5]))
    # arg2 < -5 compares as bpftrace 0.17 does here: unsigned (-i for i = 0 is 0)
    maps["@neg"] = str(len([i for i in range(CALLS) if (-i) % 2**64 < 2**64 - 5]))
    return maps


def _maps(text: str) -> dict:
    return dict(line.split(": ") for line in text.splitlines() if line.startswith("@"))


@pytest.fixture(scope="module", params=sorted(BUILDS))
def built(request, tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    if not os.path.exists("/usr/include/x86_64-linux-gnu/sys/sdt.h") and \
            not os.path.exists("/usr/include/sys/sdt.h"):
        pytest.skip("sys/sdt.h is not installed (systemtap-sdt-dev)")
    work = tmp_path_factory.mktemp(request.param)
    plain = work / "ops"
    proc = subprocess.run(["gcc", *BUILDS[request.param], SAMPLE, "-o", str(plain)],
                          capture_output=True, text=True)
    if proc.returncode != 0 and "-static" in BUILDS[request.param]:
        pytest.skip(f"no static libc: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr
    rewritten = work / "ops.probed"
    program = PROGRAM.format(path=rewritten)
    proc = urewrite(str(plain), "-e", program, "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    printed = subprocess.run([str(plain), str(CALLS)], capture_output=True, text=True,
                             check=True).stdout
    return rewritten, program, printed


def test_the_notes_give_the_forms_the_test_is_for(built):
    """(So that the test below reads what it says: each build's notes.)"""
    rewritten, _, _ = built
    notes = subprocess.run(["readelf", "-n", str(rewritten)], capture_output=True,
                           text=True).stdout
    arguments = re.findall(r"Arguments: (.*)", notes)
    assert any("$5" in a for a in arguments)  # twice's constant site
    assert any("@%" in a for a in arguments)  # a register
    forms = " ".join(arguments)
    assert "(%rbp)" in forms or "(%rip)" in forms or "%fs:" in forms  # memory


def test_loaded_by_run_every_operand_form_reads_as_the_sample_computes(built):
    rewritten, program, printed = built
    ran = urewrite("run", "-e", program, "--", str(rewritten), str(CALLS))
    assert ran.returncode == 0, ran.stderr
    assert _maps(maps_of(ran.stdout)) == _expected(printed)


def test_built_in_every_operand_form_reads_as_the_sample_computes(built):
    rewritten, _, printed = built
    proc = urewrite("stat", "--", str(rewritten), str(CALLS))
    assert proc.returncode == 0, proc.stderr
    program_part = proc.stdout.split("the program built into the probes:", 1)[1]
    assert _maps(program_part) == _expected(printed)


def _program_file(text: str, rewritten, directory) -> tuple:
    """(the program file `urewrite run -e TEXT` writes for `rewritten`, its targets)."""
    from urewrite.programs import attach, checks, parser
    from urewrite.program_run import _backend_of, _program_code
    checked = checks.check(parser.parse(text))
    targets = {}
    attach.attach(targets, checked.program.blocks, [str(rewritten)])
    lowered = attach.lower(checked, targets)
    directory.mkdir()
    attach.write_files(str(directory), targets, lowered, _program_code, _backend_of)
    return next(directory.glob("*.program")).read_bytes(), targets


def test_the_program_file_has_a_direct_entry_for_each_probe_with_code(built, tmp_path):
    """x86_64 program files carry the direct table; a probe with no code has none."""
    from urewrite.trampolines import program_file as P
    rewritten, _, _ = built
    data, targets = _program_file(f"usdt:{rewritten}:ops:reads {{ @rg = sum(arg0); }}",
                                  rewritten, tmp_path / "d")
    header = P.HEADER.unpack_from(data)
    count, direct_at = header[1], header[P.DIRECT_AT // 8]
    assert direct_at == P.HEADER.size + 8 * count
    direct = struct.unpack_from(f"<{count}Q", data, direct_at)
    names = [t.probes for t in targets.values()][0]
    reads = [n for n, (name, _, _) in enumerate(names) if name.endswith("ops:reads")]
    assert reads and all(direct[n] for n in reads)
    assert not any(direct[n] for n in range(count) if n not in reads)
    assert all(direct_at + direct[n] >= header[3] for n in reads)  # into the code


@pytest.mark.parametrize("inlined", [True, False])
def test_a_programs_entry_holds_its_code_in_line(built, tmp_path, monkeypatch, inlined):
    """x86_64: a program's direct entry runs its probe's code in line (no call of the
    function, no `ret` back from it); the function stays where the program's table
    says, for the runtime's trace path. Past attach.INLINED entries, the entries call
    it. (What the code computes either way: the tests above, on the same entries.)"""
    import capstone
    from urewrite.programs import attach
    from urewrite.trampolines import program_file as P
    if not inlined:
        monkeypatch.setattr(attach, "INLINED", 0)
    rewritten, _, _ = built
    data, _ = _program_file(f"usdt:{rewritten}:ops:reads {{ @rg = sum(arg0); "
                            "@n[arg1 % 3] = count(); }", rewritten, tmp_path / "d")
    header = P.HEADER.unpack_from(data)
    count, table_at, code_at, direct_at = header[1], header[2], header[3], header[P.DIRECT_AT // 8]
    table = struct.unpack_from(f"<{count}Q", data, table_at)
    direct = struct.unpack_from(f"<{count}Q", data, direct_at)
    (probe,) = [n for n in range(count) if direct[n]]
    function, entry = code_at + table[probe] - 1, direct_at + direct[probe]
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    calls = []
    for insn in md.disasm(data[entry:entry + 4096], entry):
        if insn.mnemonic == "ret":
            break
        if insn.mnemonic == "call":
            calls.append(int(insn.op_str, 16))
    assert (function in calls) != inlined
    assert "lock inc" in " ".join(f"{i.mnemonic} {i.op_str}"  # (its function's, still)
                                  for i in md.disasm(data[function:function + 400], function))


def test_commands_get_the_users_environment(tmp_path):
    """urewrite quiets numpy's threads for itself (OPENBLAS_NUM_THREADS), not for the
    command it runs."""
    script = tmp_path / "env.sh"
    script.write_text("#!/bin/sh\necho \"blas=${OPENBLAS_NUM_THREADS-unset}\"\n")
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    proc = urewrite("stat", "--", str(script), env=env)
    assert proc.returncode == 0 and "blas=unset" in proc.stdout, proc.stdout + proc.stderr
    proc = urewrite("stat", "--", str(script), env=dict(env, OPENBLAS_NUM_THREADS="3"))
    assert "blas=3" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("link", ["pie", "static"])
def test_a_forked_child_runs_the_program_into_maps_of_its_own(tmp_path, link):
    """A child's first hit sets its probes up again (its state page is cleared at
    fork): its own maps and direct table, added up with its parent's; the parent's
    pointers are never used in the child. Arguments and pids, per process."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    plain = tmp_path / "forks"
    proc = subprocess.run(["gcc", "-O2", f"-{link}", os.path.join(ROOT, "samples", "forks.c"),
                           "-o", str(plain)], capture_output=True, text=True)
    if proc.returncode != 0 and link == "static":
        pytest.skip(f"no static libc: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr
    rewritten = tmp_path / "forks.probed"
    program = (f"uprobe:{rewritten}:tick {{ @n = count(); @sum = sum(arg0); @pids[pid] = count(); }} "
               f"uprobe:{rewritten}:child_only {{ @child = count(); }} "
               f"uprobe:{rewritten}:parent_only /arg0 == arg0/ {{ @parent = count(); }}")
    proc = urewrite(str(plain), "-e", program, "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    ran = urewrite("run", "-e", program, "--", str(rewritten))
    assert ran.returncode == 0, ran.stderr
    maps = _maps(maps_of(ran.stdout))
    assert (maps["@n"], maps["@sum"], maps["@child"], maps["@parent"]) == \
        ("21", str(3 + 21 + 55), "1", "2")
    pids = sorted(int(v) for k, v in maps.items() if k.startswith("@pids["))
    assert pids == [7, 14]  # the child's 7; the parent's 3 before the fork and 11 after


ARM64_PROBES = {"consts": 4, "globals": 3, "pointer": 3, "indexed": 2, "narrow": 3,
                "truncated": 6, "views": 6, "regreg": 4}


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_arm64_every_operand_form_reads_as_the_program_printed_it(tmp_path, opt):
    """arm64's direct entries under qemu-aarch64: test_aarch64_trace's FORMS_C (every
    operand form GCC emits for sdt.h there, and hand-written ones: narrow views of a
    wide register, register plus register, xzr), each argument summed by a program,
    against what the sample printed at each probe."""
    import test_aarch64_trace as T
    from cross import CC, QEMU, emulate, missing
    if missing(CC, QEMU) or T.SDT_H is None:
        pytest.skip("needs the arm64 cross compiler, qemu-aarch64 and sys/sdt.h")
    (tmp_path / "include" / "sys").mkdir(parents=True)
    for header in ("sdt.h", "sdt-config.h"):
        if (T.SDT_H.parent / header).is_file():
            shutil.copy(T.SDT_H.parent / header, tmp_path / "include" / "sys" / header)
    (tmp_path / "forms.c").write_text(T.FORMS_C)
    plain, rewritten = tmp_path / "forms", tmp_path / "forms.probed"
    subprocess.run([CC, opt, "-isystem", str(tmp_path / "include"), str(tmp_path / "forms.c"),
                    "-o", str(plain)], check=True)
    program = " ".join(f"usdt:{rewritten}:t:{name} {{ "
                       + " ".join(f"@{name}{j} = sum(arg{j});" for j in range(count)) + " }"
                       for name, count in ARM64_PROBES.items())
    proc = urewrite(str(plain), "-e", program, "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    ran = urewrite("run", "-e", program, "--", *emulate(rewritten))
    assert ran.returncode == 0, ran.stderr
    printed, maps = ran.stdout.split("\n\n\n", 1)
    expected = {}
    for line in printed.splitlines():
        if line.startswith("fire ") and line.split()[1] in ARM64_PROBES:
            name, *values = line.split()[1:]
            for j, value in enumerate(values):
                key = f"@{name}{j}"
                expected[key] = (int(expected.get(key, 0)) + int(value)) % 2**64
    assert _maps(maps) == {k: str(v) for k, v in expected.items()}


@pytest.mark.parametrize("machine", ["x86_64", "arm64"])
def test_leading_predicates_of_every_comparison(tmp_path, machine):
    """A predicate on an argument and a constant, decided before the entry saves
    anything (a false one returns there: it must never be false where the function's
    own would be true): each comparison against the counts the calls make (values.c
    calls work(i, i % 7) for i < N); arm64's under qemu."""
    from cross import CC, QEMU, emulate, missing
    compiler, run = ("gcc", lambda path: [str(path)]) if machine == "x86_64" else (CC, emulate)
    if missing(compiler) or machine == "arm64" and missing(QEMU):
        pytest.skip(f"needs {compiler} (and qemu-aarch64 for arm64)")
    plain = tmp_path / "values"
    subprocess.run([compiler, "-O2", os.path.join(ROOT, "samples", "programs", "values.c"), "-o",
                    str(plain)], check=True)
    rewritten = tmp_path / "values.probed"
    tests = {"eq": ("==", lambda r: r == 3), "ne": ("!=", lambda r: r != 3),
             "lt": ("<", lambda r: r < 3), "gt": (">", lambda r: r > 3),
             "le": ("<=", lambda r: r <= 3), "ge": (">=", lambda r: r >= 3)}
    proc = urewrite(str(plain), "-p", "work", "--args", "2", "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    for name, (op, holds) in tests.items():  # (a program each: one probe's blocks make
        # one function, whose predicate is the first block's only)
        program = f"uprobe:{rewritten}:work /arg1 {op} 3/ {{ @{name} = count(); }}"
        ran = urewrite("run", "-e", program, "--", *run(rewritten), str(CALLS))
        assert ran.returncode == 0, ran.stderr
        assert _maps(maps_of(ran.stdout)) == \
            {f"@{name}": str(sum(1 for i in range(CALLS) if holds(i % 7)))}, op


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_words_a_tracer_changes_are_read_once(machine):
    """The binding's maps word and the region word, which a tracer stores while the
    process runs (a re-arm by another run: its own maps; a disarm: 1 for the region),
    are each loaded once by an entry and used as checked: loaded again after the
    check, a re-arm would run this code with another run's maps (writing past them),
    a disarm would read the region at 1 (arm64's CI found that one as a crash)."""
    from urewrite.trampolines.program_file import USES_COMM, USES_NSECS, USES_TID, DirectEntry
    if machine == "x86_64":
        from urewrite.arch.x86_64 import arguments, direct_entry
        maps, region = r"\[rsi \+ 8\]", rf"\[rsi - {direct_entry.DIRECT}\]"
    else:
        from urewrite.arch.aarch64 import arguments, direct_entry
        maps, region = r"\[x16, #8\]", r"\[x16, #-64\]"
    for reads, predicate in ((0, None), (3, None), (2, (1, 5, "eq", False))):
        entry = DirectEntry(0x100, tuple(arguments.abi_arguments(reads)), reads,
                            USES_NSECS | USES_TID | USES_COMM, predicate)
        text = "\n".join(direct_entry._entry("d0", entry, -64))
        assert len(re.findall(maps, text)) == 1, text
        assert len(re.findall(region, text)) == 1, text


def test_the_binding_shares_the_region_words_line():
    """x86_64: the binding's five words lie in the state memory's first cache line, with
    the region word every hit's check reads (a program's hit finds them there), clear
    of the tracing byte before them and of the Go set-up's words after."""
    from urewrite.arch.x86_64 import direct_entry, runtime, trampoline
    binding = range(direct_entry.DIRECT, direct_entry.DIRECT + 5 * 8)
    assert binding.start >= trampoline.TRACING + 8 and binding.stop <= 64
    assert runtime.ASIDE_BUSY >= 64 and runtime.ASIDE_SP >= 64


PLACED = os.path.join(ROOT, "samples", "programs", "placed.c")
NEAR = 1 << 20  # how far below its object a program's code lies when there is room


def _placed(printed: str) -> tuple:
    """(the executable's lowest address, [(start, end) of each program mapping])."""
    words = [line.split() for line in printed.splitlines()]
    self = next(int(w[1], 16) for w in words if w and w[0] == "self")
    return self, [(int(w[1], 16), int(w[2], 16)) for w in words if w and w[0] == "program"]


@pytest.mark.parametrize("machine,link", [("x86_64", "-pie"), ("x86_64", "-no-pie"),
                                          ("x86_64", "-static"), ("aarch64", "-pie")])
def test_a_programs_code_is_mapped_just_below_its_object(tmp_path, machine, link):
    """The runtime maps a loaded program's code just below the object it probes: a
    branch to code terabytes away (an executable's mmap area) costs about 1 ns more a
    hit on AMD Zen 4. As far below as the program's pages and one more, as
    /proc/self/maps shows it (qemu's own for arm64)."""
    from cross import CC, QEMU, emulate, missing
    compiler = "gcc" if machine == "x86_64" else CC
    if missing(compiler, *([QEMU] if machine == "aarch64" else [])):
        pytest.skip(f"needs {compiler}" + (" and qemu-aarch64" if machine == "aarch64" else ""))
    plain, rewritten = tmp_path / "placed", tmp_path / "placed.probed"
    flags = [link] + (["-fno-pie"] if link == "-no-pie" else [])
    proc = subprocess.run([compiler, "-O2", *flags, PLACED, "-o", str(plain)],
                          capture_output=True, text=True)
    if proc.returncode != 0 and link == "-static":
        pytest.skip(f"no static libc: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr
    program = f"uprobe:{rewritten}:target {{ @n = count(); @odd = sum(arg0 % 2); }}"
    proc = urewrite(str(plain), "-p", "target", "--args", "1", "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    command = emulate(rewritten) if machine == "aarch64" else [str(rewritten)]
    ran = urewrite("run", "-e", program, "--", *command, "1000")
    assert ran.returncode == 0, ran.stderr
    printed, maps = ran.stdout.split("\n\n\n", 1)
    assert _maps(maps) == {"@n": "1000", "@odd": "500"}
    self, programs = _placed(printed)
    assert len(programs) == 1, printed
    start, end = programs[0]
    assert end <= self and self - start <= NEAR, printed


SIX = os.path.join(ROOT, "samples", "callbacks", "six.c")


@pytest.mark.parametrize("program", [
    "uprobe:{path}:six {{ @[arg0 % 7] = count(); @c = count(); }}",
    "uprobe:{path}:six {{ @s[tid] = nsecs; @k[arg1 % 5, arg0 % 3] = sum(arg2); }} "
    "uretprobe:{path}:six /@s[tid]/ {{ @r = hist(retval); delete(@s[tid]); }}",
    "uprobe:{path}:six {{ @m[comm, arg0 % 2] = count(); @d = sum(arg0 % 1000); }}"])
def test_a_programs_entry_leaves_the_probed_code_its_registers(tmp_path, program):
    """A direct entry saves r8 to r11 only where the program's code touches them (its
    map lookups work in r13 to r15, kept there; the runtime's thread id and name
    routines are called with r8 to r11 kept around them), and for a program's code
    keeps neither rbp nor the stack's alignment: at the entry and return of a
    function whose fifth and sixth arguments are in r8 and r9, the program's output
    is the original's, and its maps count every call."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    plain, rewritten = tmp_path / "six", tmp_path / "six.probed"
    subprocess.run(["gcc", "-O2", SIX, "-o", str(plain)], check=True)
    expected = subprocess.run([str(plain), "3000"], capture_output=True, text=True).stdout
    text = program.format(path=rewritten)
    proc = urewrite(str(plain), "-e", text, "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    ran = urewrite("run", "-e", text, "--", str(rewritten), "3000")
    assert ran.returncode == 0, ran.stderr
    printed, maps = ran.stdout.split("\n\n\n", 1)
    assert printed + "\n" == expected
    counted = _maps(maps)
    if "@c" in counted:
        assert counted["@c"] == "3000" and sum(int(v) for k, v in counted.items()
                                               if k.startswith("@[")) == 3000
    if "@d" in counted:
        assert counted["@d"] == str(sum(i % 1000 for i in range(3000)))
    if "@r" in maps:
        assert "@s[" not in maps  # (every start deleted at its return)


VALUES = os.path.join(ROOT, "samples", "programs", "values.c")
# a probe's whole code adding to one map entry whose place is known when compiled, and
# code that does more (a second map): (program, the maps it gives for N calls)
QUICK = {"keyed": ("uprobe:{path}:work,uprobe:{path}:named {{ @[probe] = count(); }}",
                   lambda n: {"work": n, "named": n}),
         "keyless": ("uprobe:{path}:work {{ @n = count(); }} "
                     "uprobe:{path}:named {{ @s = sum(5); }}",
                     lambda n: {"@n": n, "@s": 5 * n}),
         "more": ("uprobe:{path}:work,uprobe:{path}:named {{ @[probe] = count(); @t = count(); }}",
                  lambda n: {"work": n, "named": n, "@t": 2 * n})}


@pytest.mark.parametrize("kind", sorted(QUICK))
def test_an_add_to_an_entry_known_when_compiled_saves_nothing_first(tmp_path, kind):
    """x86_64: where a probe's whole code adds to one map entry whose place is known
    when compiled (`@[probe] = count()`, `@n = count()`, `@s = sum(5)`), its direct entry
    does the add before it saves a register or makes a context; the first hit, which
    makes the entry, runs the function. Code that does more saves first. Exact maps
    under 4 threads either way."""
    import capstone
    from urewrite.trampolines import program_file as P
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    plain, rewritten = tmp_path / "values", tmp_path / "values.probed"
    subprocess.run(["gcc", "-O2", "-pthread", VALUES, "-o", str(plain)], check=True)
    proc = urewrite(str(plain), "-p", "work", "-p", "named", "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    text, expected = QUICK[kind]
    text = text.format(path=rewritten)
    data, _ = _program_file(text, rewritten, tmp_path / "d")
    header = P.HEADER.unpack_from(data)
    count, direct_at = header[1], header[P.DIRECT_AT // 8]
    direct = struct.unpack_from(f"<{count}Q", data, direct_at)
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    entries = [direct_at + d for d in direct if d]
    assert len(entries) == 2
    for entry in entries:
        first = next(i for i in md.disasm(data[entry:entry + 4096], entry)
                     if i.mnemonic in ("push", "ret") or i.mnemonic.startswith("lock"))
        assert (first.mnemonic.startswith("lock")) == (kind != "more"), (kind, first)
    ran = urewrite("run", "-e", text, "--", str(rewritten), "100000", "4")
    assert ran.returncode == 0, ran.stderr
    found = {}
    for name, value in _maps(maps_of(ran.stdout)).items():
        found[name.rsplit(":", 1)[-1].rstrip("]") if name.startswith("@[") else name] = int(value)
    assert found == expected(100000)
