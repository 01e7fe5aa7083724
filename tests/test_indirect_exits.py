"""Return probes at indirect jumps that may stay in their function or leave it
(samples/indirect_exits.c): each such jump is an exit checked where it goes, counted
only when it leaves (docs/design.md, "Return probes"). Built with gcc at -O0/-O2/-O3,
PIE, non-PIE and static, with and without -fcf-protection (`notrack jmp`), and for
arm64 (run under qemu-aarch64); every function probed at entry and return; the
program runs as the original and every count is the one the program keeps itself
(and, on x86_64, the one kernel uprobes and uretprobes see)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import cross
from cross import CC, QEMU, emulator
from conftest import check, run, rewrite, stat, urewrite

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "indirect_exits.c"
FUNCTIONS = ("ie_interp", "ie_via", "ie_mixed", "ie_again", "ie_cold", "ie_offsets", "ie_leaf")
# their indirect jumps: some stay, some leave (-O0 makes no tail call)
CHECKED = {"-O0": ("ie_interp", "ie_mixed"),
           "-O2": ("ie_interp", "ie_via", "ie_mixed", "ie_again", "ie_cold"),
           "-O3": ("ie_interp", "ie_via", "ie_mixed", "ie_again", "ie_cold"),
           "-O1": ("ie_mixed", "ie_cold"), "-Os": ("ie_mixed", "ie_cold")}
# (-O1 and -Os put ie_offsets's labels right after its `ret`s: a window over a `ret` and
# what follows would cover them)
VARIANTS = [("x86_64", o, l, c) for o in ("-O0", "-O2", "-O3") for l in ("-pie", "-no-pie", "-static")
            for c in ("-fcf-protection=none", "-fcf-protection")] + \
    [("x86_64", o, l, "-fcf-protection=none") for o in ("-O1", "-Os") for l in ("-pie", "-no-pie")] + \
    [("aarch64", o, l, "") for o in ("-O0", "-O2", "-O3") for l in ("-pie", "-static")]


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda v: "".join(v).replace("-", "_"))
def built(request, tmp_path_factory):
    arch, opt, link, cet = request.param
    cc = "gcc" if arch == "x86_64" else CC
    absent = cross.missing(cc, *([QEMU] if arch == "aarch64" else []))
    if absent:
        pytest.skip(f"needs {', '.join(absent)}")
    path = tmp_path_factory.mktemp("indirect") / "indirect_exits"
    check([cc, opt, link] + ([cet] if cet else []) + [str(SAMPLE), "-o", str(path)])
    prefix = emulator() if arch == "aarch64" else []
    return path, opt, prefix


def _listing(path) -> dict:
    proc = urewrite("list", "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    return {r["name"]: r["return"] for r in json.loads(proc.stdout)["functions"]}


def _printed(output: str) -> dict:
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^returns (\w+) (\d+)$", output, re.M)}


def test_indirect_jumps_are_checked_exits(built):
    path, opt, _ = built
    listed = _listing(path)
    for name in CHECKED[opt]:
        assert listed[name]["mechanism"] == "exit sites", (name, listed[name])
        assert listed[name]["checked"] >= 1, (name, listed[name])
    assert listed["ie_leaf"]["checked"] == 0


def test_every_function_probed_runs_and_counts_exactly(built, tmp_path):
    path, opt, prefix = built
    out = tmp_path / "indirect_exits.probed"
    result = rewrite(path, out, "*", extra=["-r", "*"])
    assert not {r["name"] for r in result["refused"]} & set(FUNCTIONS), result["refused"]
    original = run(prefix + [str(path), "3"])
    assert original.returncode == 0, original.stderr
    expected = _printed(original.stdout)
    assert set(expected) == set(FUNCTIONS)
    assert run(prefix + [str(out), "3"]).stdout == original.stdout  # disarmed
    st = stat(prefix + [out, "3"], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout), st.proc.stderr
    hits = {(p["name"], p["kind"]): p["hits"] for p in st.probes}
    for name, n in expected.items():
        assert hits[(name, "entry")] == hits[(name, "return")] == n, name


def test_tail_calls_through_pointers_return_no_value(tmp_path):
    """At a checked exit the callee has not run yet: its return event carries no
    value, as at a direct tail call; a call that stays returns its value."""
    path = tmp_path / "ie"
    check(["gcc", "-O2", str(SAMPLE), "-o", str(path)])
    out = tmp_path / "ie.probed"
    rewrite(path, out, "ie_leaf", extra=["-r", "ie_via", "-r", "ie_leaf"])
    proc = urewrite("trace", "--json", "--", str(out))
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    returns = [(e["probe"], e["args"]) for e in events if e["kind"] == "return"]
    via = [args for name, args in returns if name == "ie_via"]
    assert len(via) == 5 and all(args == [] for args in via)
    assert all(len(args) == 1 for name, args in returns if name == "ie_leaf")


def test_counts_equal_kernel_uprobes(builder, uprobes, tmp_path):
    built = builder.build("indirect_exits", ["indirect_exits.c"], ["-O2"], ["-pie"])
    out = tmp_path / "ie.probed"
    rewrite(built.path, out, "ie_*", extra=["-r", "ie_*"])
    st = stat([out, "2"], tmp_path)
    assert st.proc.returncode == 0, st.proc.stderr
    entries = {name: built.own_functions[name] for name in FUNCTIONS}
    returns = {name + " return": address for name, address in entries.items()}
    oracle = uprobes.count(built.path, entries, lambda: run([built.path, "2"]), returns=returns)
    hits = {(p["name"], p["kind"]): p["hits"] for p in st.probes}
    ours = {name: hits[(name, "entry")] for name in FUNCTIONS}
    ours.update({name + " return": hits[(name, "return")] for name in FUNCTIONS})
    assert ours == oracle
    assert ours["ie_again"] == 10  # each level of its tail call to itself, 5 per round


CXX = r"""
#include <cstdio>
#include <stdexcept>
static volatile int sink;
__attribute__((noinline)) int check(int i) {
    if (i % 5 == 0)
        throw std::runtime_error("bad");
    return i + sink;
}
static int (*volatile pointer)(int) = check;
/* an indirect tail call: its exit is counted at the jump, before check throws */
__attribute__((noinline)) int via(int x) { return pointer(x); }
int main() {
    int caught = 0;
    long sum = 0;
    for (int i = 0; i < 20; i++)
        try { sum += via(i); } catch (const std::exception &) { caught++; }
    std::printf("%d %ld\n", caught, sum);
}
"""


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++")
def test_in_a_file_that_throws(tmp_path):
    """Where an exception may pass, return addresses cannot be redirected: before,
    such a function's return probe was refused."""
    (tmp_path / "x.cc").write_text(CXX)
    plain, probed = tmp_path / "x", tmp_path / "x.probed"
    check(["g++", "-O2", str(tmp_path / "x.cc"), "-o", str(plain)])
    assert _listing(plain)["_Z3viai"]["mechanism"] == "exit sites"
    rewrite(plain, probed, "*", extra=["-r", "*"])
    original = run([plain])
    st = stat([probed], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout) == (0, "4 160\n")
    hits = {(p["name"], p["kind"]): p["hits"] for p in st.probes}  # (a glob: demangled)
    assert hits[("via(int)", "entry")] == hits[("via(int)", "return")] == 20
    assert hits[("check(int)", "return")] == 16  # 4 throw


STACK_JUMP = r"""
#include <stdio.h>
int stays(int), leaves(int), helper(int);
__asm__(".text\n"
        /* jumps through a slot on the stack to its own label: it stays */
        ".globl stays\n.type stays,@function\nstays:\n"
        "    lea 1f(%rip), %rax\n    push %rax\n    mov %edi, %eax\n    add $3, %eax\n"
        "    jmp *(%rsp)\n    int3\n"
        "1:  pop %rcx\n    ret\n.size stays, .-stays\n"
        /* jumps through a slot 8 bytes up the stack to another function: it leaves */
        ".globl leaves\n.type leaves,@function\nleaves:\n"
        "    lea helper(%rip), %rax\n    push %rax\n    push %rax\n    pop %rcx\n"
        "    cmp $-1, %edi\n    je 2f\n    pop %rcx\n    jmp *-8(%rsp)\n"
        "2:  pop %rcx\n    xor %eax, %eax\n    ret\n.size leaves, .-leaves\n");
__attribute__((noinline)) int helper(int x) { return 2 * x; }
int main(void) {
    long s = 0;
    for (int i = 0; i < 50; i++) s += stays(i) + leaves(i);
    printf("%ld\n", s);
    return 0;
}
"""


@pytest.mark.parametrize("link", ["-pie", "-no-pie"])
def test_jumps_through_the_stack(link, tmp_path):
    """The target of `jmp *disp(%rsp)` is read where the jump reads it, though the
    trampoline has moved rsp: a wrong read would count the jump that stays, or miss the
    one that leaves."""
    (tmp_path / "s.c").write_text(STACK_JUMP)
    plain, probed = tmp_path / "s", tmp_path / "s.probed"
    check(["gcc", "-O2", link, str(tmp_path / "s.c"), "-o", str(plain)])
    listed = _listing(plain)
    assert listed["stays"]["checked"] == listed["leaves"]["checked"] == 1
    rewrite(plain, probed, "stays", extra=["-r", "stays", "-r", "leaves", "-r", "helper"])
    original = run([plain])
    st = stat([probed], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout) == (0, "3825\n")
    hits = {(p["name"], p["kind"]): p["hits"] for p in st.probes}
    assert hits == {("stays", "entry"): 50, ("stays", "return"): 50,
                    ("leaves", "return"): 50, ("helper", "return"): 50}


CONDITIONAL_A64 = r"""
#include <stdio.h>
long cexit(long), other(long);
__asm__(".text\n"
        ".globl cexit\n.type cexit,%function\ncexit:\n"
        "    mov x1, x0\n"  /* (the entry probe's own instruction) */
        "    cbz x1, other\n"
        "    tbnz x0, #3, other\n"
        "    cmp x0, #5\n    b.eq other\n"
        "    add x0, x0, #100\n    ret\n.size cexit, .-cexit\n");
__attribute__((noinline)) long other(long x) { return x * 2 + 1; }
int main(void) {
    long s = 0;
    for (long i = 0; i < 20; i++) s += cexit(i);
    printf("%ld\n", s);
    return 0;
}
"""


@cross.needs(CC, QEMU)
@pytest.mark.parametrize("link", ["-pie", "-static"])
def test_arm64_conditional_tail_calls_are_exits(link, tmp_path):
    """`cbz`, `tbnz` and `b.eq` to another function leave when taken: each is an exit
    counted on its taken edge (as x86_64's `jcc` tail calls are)."""
    (tmp_path / "c.c").write_text(CONDITIONAL_A64)
    plain, probed = tmp_path / "c", tmp_path / "c.probed"
    check([CC, "-O2", link, str(tmp_path / "c.c"), "-o", str(plain)])
    listed = _listing(plain)
    assert (listed["cexit"]["mechanism"], listed["cexit"]["exits"]) == ("exit sites", 4)
    rewrite(plain, probed, "cexit", extra=["-r", "cexit", "-r", "other"])
    prefix = emulator()
    original = run(prefix + [str(plain)])
    st = stat(prefix + [probed], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout) == (0, "1297\n")
    hits = {(p["name"], p["kind"]): p["hits"] for p in st.probes}
    # other: for 0, 5 and 8..15 (bit 3)
    assert hits == {("cexit", "entry"): 20, ("cexit", "return"): 20, ("other", "return"): 10}
