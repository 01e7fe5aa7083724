"""Patch tactics for tight sites (samples/tactics.c): each site forces one tactic; the
rewritten program runs as the original, counts every call, and matches kernel uprobes."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import Uprobes, check, run, rewrite, stat, uprobes_unavailable, urewrite

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "tactics.c"
CFLAGS = ["-fcf-protection=none"]
LINKS = ["-pie", "-no-pie", "-static"]
CALLS = {"tac_hop": 3, "tac_cond": 10, "tac_evict": 8, "tac_leave": 5, "tac_fill1": 2,
         "tac_fill2": 1, "tac_last": 6}
# alone (as `list` plans each), the tactic each entry and return needs
ENTRY_TACTIC = {"tac_hop": "hop", "tac_evict": "evict", "tac_last": ("hop", "evict")}
RETURN_TACTIC = {"tac_leave": "evict", "tac_last": ("hop", "evict")}


def _listing(path) -> dict:
    proc = urewrite("list", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    return {r["name"]: r for r in json.loads(proc.stdout)["functions"]}


def _section(path, name):
    """(start, end) of a section, from readelf."""
    out = check(["readelf", "-SW", str(path)]).stdout
    m = re.search(rf"\s{re.escape(name)}\s+\w+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", out)
    return int(m.group(1), 16), int(m.group(1), 16) + int(m.group(2), 16)


@pytest.fixture(params=[(level, link) for level in ("-O0", "-O2", "-O3") for link in LINKS],
                ids=lambda p: f"{p[0][1:]}-{p[1][1:]}")
def tactics(request, builder):
    level, link = request.param
    built = builder.build("tactics", ["tactics.c"], [level] + CFLAGS, [link])
    built.static = link == "-static"
    return built


def test_the_sample_forces_each_tactic(tactics):
    rows = _listing(tactics.path)
    # the layout the sample is written for
    assert rows["tac_evict"]["address"] == rows["tac_fill1"]["address"] + rows["tac_fill1"]["size"]
    assert rows["tac_fill2"]["address"] == rows["tac_leave"]["address"] + rows["tac_leave"]["size"]
    last = rows["tac_last"]
    if not tactics.static:  # (static, the C library's code follows)
        text_end = _section(tactics.path, ".text")[1]
        assert last["address"] + last["size"] == text_end < _section(tactics.path, ".fini")[0]
        # the lone `ret` at the end of .text borrows a byte of the gap before .fini
        assert last["displaced"] == 2
    for name, tactic in ENTRY_TACTIC.items():
        assert rows[name]["patchable"], (name, rows[name]["reason"])
        if name == "tac_last" and tactics.static:
            continue  # padding follows it there: the plain jump fits
        assert rows[name]["tactic"] in (tactic if isinstance(tactic, tuple) else (tactic,)), name
        assert 2 <= rows[name]["displaced"] < 5
    for name, tactic in RETURN_TACTIC.items():
        if name == "tac_last" and tactics.static:
            continue
        ret = rows[name]["return"]
        assert ret["mechanism"] == "exit sites", (name, ret)
        assert set(ret["tactics"]) <= set(tactic if isinstance(tactic, tuple) else (tactic,))
    # a conditional tail call is an exit, counted when taken
    assert rows["tac_cond"]["return"]["exits"] == 2


def test_in_a_shared_object(builder, tmp_path):
    """The same sites in a library, called by a program."""
    lib = builder.build("tactics", ["tactics.c"], ["-O2", "-fPIC", "-DTACTICS_LIBRARY"] + CFLAGS,
                        shared=True, subdir="tactics-lib", output_name="libtactics.so")
    main = tmp_path / "main.c"
    main.write_text(open(SAMPLE).read().split("#ifndef TACTICS_LIBRARY")[1]
                    .replace("#endif", "").replace("int main", '#include <stdio.h>\n'
                             '#include <stdlib.h>\nint tac_hop(int); int tac_cond(int); '
                             'int tac_evict(int); int tac_leave(int); int tac_fill1(int); '
                             'int tac_fill2(int); void tac_last(void);\nint main'))
    exe, probed_dir = tmp_path / "main", tmp_path / "probed"
    check(["gcc", "-O2", str(main), "-L", str(lib.dir), "-ltactics", "-o", str(exe)])
    probed_dir.mkdir()
    result = rewrite(lib.path, probed_dir / "libtactics.so", "tac_*", extra=["-r", "tac_*"])
    assert not result["refused"]
    assert {p["tactic"] for p in result["probes"]} >= {"jump", "evict"}
    original = run([exe, "2"], env={"LD_LIBRARY_PATH": str(lib.dir)})
    assert original.returncode == 0
    st = stat([exe, "2"], tmp_path, env={"LD_LIBRARY_PATH": str(probed_dir)})
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout)
    hits = {(p["name"], p["kind"]): p["hits"] for p in st.probes}
    for name, n in _expected_counts(2).items():
        assert hits[(name, "entry")] == hits[(name, "return")] == n, name


def _expected_counts(rounds: int) -> dict:
    return {name: n * rounds for name, n in CALLS.items()}


def test_every_function_probed_runs_and_counts(tactics, tmp_path):
    out = tmp_path / "tactics.probed"
    result = rewrite(tactics.path, out, "*", extra=["-r", "*"])
    # each probe lists its tactic; the counts are per patched window
    assert set(result["tactics"]) == {"jump", "hop", "evict", "pun"}
    assert result["tactics"]["evict"] >= 1 and result["tactics"]["jump"] >= 1
    assert {p["tactic"] for p in result["probes"] if p["name"] == "tac_evict"} == {"evict"}
    refused = {r["name"] for r in result["refused"]}
    assert not refused & set(CALLS), result["refused"]
    original = run([tactics.path, "3"])
    st = stat([out, "3"], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout)
    hits = {(p["name"], p["kind"]): p["hits"] for p in st.probes}
    for name, n in _expected_counts(3).items():
        assert hits[(name, "entry")] == n, name
        assert hits[(name, "return")] == n, name
    # disarmed, it runs as the original too
    assert run([out, "3"]).stdout == original.stdout


def test_counts_equal_uprobes(builder, uprobes, tmp_path):
    built = builder.build("tactics", ["tactics.c"], ["-O2"] + CFLAGS, ["-pie"])
    out = tmp_path / "tactics.probed"
    rewrite(built.path, out, "tac_*")
    st = stat([out, "2"], tmp_path)
    addresses = {name: built.own_functions[name] for name in CALLS}
    oracle = uprobes.count(built.path, addresses, lambda: run([built.path, "2"]))
    hits = st.by_address()
    assert {n: hits[a] for n, a in addresses.items()} == oracle == _expected_counts(2)


# A 1-byte function followed at once by the next one, whose first bytes say where a
# punned jump at the first would go: `mov eax, IMM` is b8 and IMM's 4 bytes, so the jump's
# displacement is 0x??0000b8 with ?? the third byte of IMM (0x20: 512 MiB on, above the
# new code; 0x80: 2 GiB back, below the file: then `two` itself moves away, its jump's
# bytes chosen for the punned one; unless it starts with endbr64, which cannot move).
PUN_SAMPLE = r"""
__asm__(".text\n.p2align 4\n"
        ".globl one\n.type one,@function\none: ret\n.size one,1\n"
        ".globl two\n.type two,@function\ntwo: %s mov $0x%s, %%eax\n add %%edi, %%eax\n ret\n"
        ".size two, .-two\n");
void one(void);
int two(int);
#ifndef PUN_LIBRARY
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1;
    long sum = 0;
    for (int i = 0; i < n; i++) { one(); sum += two(i); }
    printf("%%d %%ld\n", n, sum);
    return 0;
}
#endif
"""
ABOVE, BELOW = "200000", "800000"


@pytest.fixture
def uprobes_or_none():
    """The kernel's uprobes to compare with where they can be used, else None."""
    return None if uprobes_unavailable() else Uprobes()


def _pun_sample(tmp_path, immediate: str, flags=("-O2",), name="one", endbr=False):
    source = tmp_path / f"{name}.c"
    source.write_text(PUN_SAMPLE % ("endbr64\\n" if endbr else "", immediate))
    exe = tmp_path / name
    check(["gcc", *flags, str(source), "-o", str(exe)])
    return exe


def test_a_refusal_names_each_tactic_tried(tmp_path):
    """No tactic fits: the punned jump would go below the file, and what follows is a
    landing pad (endbr64), which cannot move."""
    exe = _pun_sample(tmp_path, BELOW, endbr=True)
    proc = urewrite(str(exe), "-p", "one", "-o", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert proc.stderr.startswith("urewrite: cannot probe one: jump: it is 1 bytes long, "
                                  "too short for a 5-byte jump, and ")
    assert "; hop: it is 1 bytes long, too short for a 2-byte jump, and the next function " \
           "follows without padding; pun: the bytes after it make the jump go below the " \
           "new code" in proc.stderr
    assert proc.stderr.endswith("; and the instructions after it cannot move\n")
    assert proc.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


FLAGS = [("-O0", "-pie"), ("-O2", "-pie"), ("-O2", "-no-pie"), ("-O2", "-static"),
         ("-O3", "-no-pie", "-fcf-protection")]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "".join(f))
@pytest.mark.parametrize("immediate", [ABOVE, BELOW], ids=["kept", "successor-moved"])
def test_a_punned_jump(flags, immediate, uprobes_or_none, tmp_path):
    """`one` is probed at entry and return through a jump that ends in `two`'s bytes,
    kept, or, where those go below the file, in the bytes of a jump that moves `two`
    away; stubs lie where they say, in segments of their own."""
    exe = _pun_sample(tmp_path, immediate, flags)
    out = tmp_path / "one.probed"
    result = rewrite(exe, out, "one", extra=["-r", "one"])
    assert sorted((p["name"], p["kind"], p["tactic"]) for p in result["probes"]) == \
        [("one", "entry", "pun"), ("one", "return", "pun")]
    assert result["tactics"]["pun"] == 1  # one window for both
    one = int(check(["nm", str(exe)]).stdout.split(" T one")[0].split()[-1], 16)
    loads = [int(line.split()[2], 16) for line in
             check(["readelf", "-lW", str(out)]).stdout.splitlines()
             if line.split()[:1] == ["LOAD"]]
    patched, original_bytes = out.read_bytes(), exe.read_bytes()
    offset = original_bytes.index(bytes.fromhex("c3b8000000")[:2] + bytes(2)
                                  + bytes.fromhex(immediate[:2]))
    if immediate == ABOVE:
        stub = one + 5 + 0x200000B8
        assert loads[-1] == stub & -0x1000
        assert patched[offset:offset + 5] == bytes.fromhex("e9b8000020")  # `two` kept
    else:  # `two`'s first 5 bytes: its own jump, e9 and the bytes the punned one ends in
        assert patched[offset] == 0xE9 and patched[offset + 1] == 0xE9
        site_stub = one + 5 + int.from_bytes(patched[offset + 1:offset + 5], "little")
        two_stub = one + 6 + int.from_bytes(patched[offset + 2:offset + 6], "little")
        assert {site_stub & -0x1000, two_stub & -0x1000} <= set(loads)
    original = run([exe, "7"])
    assert run([out, "7"]).stdout == original.stdout  # disarmed
    st = stat([out, "7"], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout)
    hits = {(p["name"], p["kind"]): p["hits"] for p in st.probes}
    assert hits == {("one", "entry"): 7, ("one", "return"): 7}  # (two's sum is printed)
    if uprobes_or_none:
        assert uprobes_or_none.count(exe, {"one": one}, lambda: run([exe, "7"])) == {"one": 7}


@pytest.mark.parametrize("immediate", [ABOVE, BELOW], ids=["kept", "successor-moved"])
def test_a_punned_jump_in_a_shared_object(immediate, tmp_path):
    source = tmp_path / "libone.c"
    source.write_text(PUN_SAMPLE % ("", immediate))
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    check(["gcc", "-O2", "-fPIC", "-shared", "-DPUN_LIBRARY", str(source), "-o",
           str(tmp_path / "libone.so")])
    main = tmp_path / "main.c"
    main.write_text("#include <stdio.h>\nvoid one(void); int two(int);\n"
                    "int main(void) { long s = 0; for (int i = 0; i < 9; i++) { one(); "
                    "s += two(i); } printf(\"%ld\\n\", s); return 0; }\n")
    exe = tmp_path / "main"
    check(["gcc", "-O2", str(main), "-L", str(tmp_path), "-lone", "-o", str(exe)])
    result = rewrite(tmp_path / "libone.so", lib_dir / "libone.so", "one")
    assert [p["tactic"] for p in result["probes"]] == ["pun"]
    original = run([exe], env={"LD_LIBRARY_PATH": str(tmp_path)})
    st = stat([exe], tmp_path, env={"LD_LIBRARY_PATH": str(lib_dir)})
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout)
    assert [(p["name"], p["hits"]) for p in st.probes] == [("one", 9)]


# -- the cases of real files that had no tactic but the plain jump ---------------------------

LIBSTDCXX = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"
RETHROW_CC = r"""
#include <cstdio>
#include <stdexcept>
int main() {
    int caught = 0;
    for (int i = 0; i < 10; i++) {
        try {
            try {
                throw std::runtime_error("x");
            } catch (...) {
                if (i % 2) throw;  /* 5 rethrows */
            }
        } catch (...) {
            caught++;
        }
    }
    std::printf("caught %d\n", caught);
    return 0;
}
"""


@pytest.mark.skipif(not os.path.exists(LIBSTDCXX), reason=f"needs {LIBSTDCXX}")
def test_every_libstdcxx_usdt_site(tmp_path):
    """Debian's libstdc++ `rethrow` site is a 1-byte nop, then a 2-byte jmp, between two
    branch targets: only a hop fits there."""
    source, exe, libdir = tmp_path / "rethrow.cc", tmp_path / "rethrow", tmp_path / "lib"
    source.write_text(RETHROW_CC)
    check(["g++", "-O2", str(source), "-o", str(exe)])
    libdir.mkdir()
    result = rewrite(LIBSTDCXX, libdir / "libstdc++.so.6", "usdt:libstdcxx:*")
    assert result["refused"] == []
    tactics = {p["name"]: p["tactic"] for p in result["probes"]}
    assert set(tactics) == {"libstdcxx:throw", "libstdcxx:rethrow", "libstdcxx:catch"}
    assert tactics["libstdcxx:rethrow"] == "hop"
    st = stat([exe], tmp_path, env={"LD_LIBRARY_PATH": str(libdir)})
    assert (st.proc.returncode, st.proc.stdout) == (0, "caught 5\n")
    assert {p["name"]: p["hits"] for p in st.probes} == {
        "libstdcxx:throw": 10, "libstdcxx:rethrow": 5, "libstdcxx:catch": 15}


RECURSION_CC = r"""
#include <cstdio>
static int returned;
__attribute__((noinline)) int down(int n) {
    if (n == 0)
        throw n;
    if (n % 7 == 0)
        return n;            /* an early return: a jump to the `leave` */
    int r = down(n - 1) + 1;
    returned++;
    return r;
}
int main() {
    int caught = 0, sum = 0;
    for (int i = 1; i <= 30; i++) {
        try { sum += down(i); } catch (int) { caught++; }
    }
    std::printf("sum %d caught %d\nreturns %d\n", sum, caught, returned);
    return 0;
}
"""


@pytest.mark.parametrize("level", ["-O0", "-O0 -no-pie"])
def test_cxx_recursion_that_throws_gets_return_probes(tmp_path, level):
    """At -O0 the exit is `leave; ret` with a branch to the `leave`, and a file that
    throws cannot redirect return addresses: the exit takes a hop."""
    source, exe, out = tmp_path / "rec.cc", tmp_path / "rec", tmp_path / "rec.probed"
    source.write_text(RECURSION_CC)
    check(["g++", *level.split(), str(source), "-o", str(exe)])
    original = run([exe])
    returns = int(original.stdout.split("returns ")[1])
    early = sum(1 for i in range(1, 31) if i >= 7)  # calls that reach a multiple of 7
    plain_only = urewrite(str(exe), "-r", "_Z4downi", "--tactics", "jump", "-o", str(out))
    assert plain_only.returncode == 1 and "a branch lands at" in plain_only.stderr
    result = rewrite(exe, out, "_Z4downi", extra=["-r", "_Z4downi"])
    assert result["refused"] == []
    assert {p["tactic"] for p in result["probes"] if p["kind"] == "return"} & {"hop", "evict"}
    st = stat([out], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout)
    hits = {p["kind"]: p["hits"] for p in st.probes}
    assert hits["return"] == returns + early  # the early returns return too


def test_list_summary_counts_what_list_shows(tactics, tmp_path):
    listed = urewrite("list", str(tactics.path), "--json")
    rows = dict(enumerate(json.loads(listed.stdout)["functions"]))  # names may repeat
    not_elf = tmp_path / "notes.txt"
    not_elf.write_text("not a program\n")
    proc = urewrite("list", "--summary", "--json", str(tactics.path), str(not_elf))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == f"urewrite: warning: skipped {not_elf}: {not_elf}: not an ELF file\n"
    report = json.loads(proc.stdout)
    [row] = report["files"]
    assert row["functions"] == len(rows)
    assert row["entry"] == sum(r["patchable"] for r in rows.values())
    assert row["return"] == sum(r["return"]["mechanism"] is not None for r in rows.values())
    entry_tactics = [r["tactic"] for r in rows.values() if r["patchable"]]
    exit_tactics = [t for r in rows.values() for t, n in r["return"]["tactics"].items()
                    for _ in range(n)]
    assert row["tactics"] == {t: (entry_tactics + exit_tactics).count(t)
                              for t in ("jump", "hop", "evict", "pun")}
    assert row["tactics"]["evict"] >= 2 and row["tactics"]["hop"] >= 1
    assert report["total"]["files"] == 1 and report["skipped"] == [
        {"file": str(not_elf), "reason": f"{not_elf}: not an ELF file"}]
    text = urewrite("list", "--summary", str(tactics.path)).stdout.splitlines()
    assert text[0].split() == ["FILE", "FUNCTIONS", "ENTRY", "RETURN", "USDT", "JUMP", "HOP",
                               "EVICT", "PUN"]
    assert text[-1].split()[0] == "TOTAL" and text[-1].split()[1] == str(len(rows))


def test_list_summary_of_nothing_readable_is_an_error(tmp_path):
    not_elf = tmp_path / "notes.txt"
    not_elf.write_text("not a program\n")
    proc = urewrite("list", "--summary", str(not_elf))
    assert proc.returncode == 1
    assert proc.stderr == f"urewrite: {not_elf}: not an ELF file\n"


def test_stubs_stay_within_the_program_headers_an_executable_may_have(tmp_path):
    """100 one-byte functions whose punned jumps go to 100 different pages: an executable's
    program headers must fit in one page for older kernels (73 of them; without the cap
    there were 115), so past that cap the stubs go to
    pages already taken, the functions after the sites moved away (their jumps' bytes
    chosen so), and the program still starts."""
    count = 100
    asm = "".join(
        f'".globl f{n}\\n.type f{n},@function\\nf{n}: ret\\n.size f{n},1\\n'
        f'.globl g{n}\\n.type g{n},@function\\ng{n}: mov ${0x200000 + n * 0x100:#x}, %eax\\n'
        f' ret\\n.size g{n},6\\n"\n' for n in range(count))
    decls = "".join(f"void f{n}(void); int g{n}(void);\n" for n in range(count))
    calls = "".join(f"f{n}(); s += g{n}();\n" for n in range(count))
    (tmp_path / "many.c").write_text(
        f'__asm__(".text\\n"\n{asm});\n{decls}#include <stdio.h>\n'
        f"int main(void) {{ long s = 0;\n{calls}printf(\"%ld\\n\", s); return 0; }}\n")
    exe, out = tmp_path / "many", tmp_path / "many.probed"
    check(["gcc", "-O2", str(tmp_path / "many.c"), "-o", str(exe)])
    result = rewrite(exe, out, "f[0-9]*", extra=["--keep-going"])
    punned = [p["name"] for p in result["probes"] if p["tactic"] == "pun"]
    phnum = int(re.search(r"There are (\d+) program headers",
                          check(["readelf", "-lW", str(out)]).stdout).group(1))
    assert len(punned) == count and phnum <= 4096 // 56
    assert phnum == 4096 // 56  # (as many as fit: 58 pages of stubs, 42 sites sharing them)
    original = run([exe])
    st = stat([out], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout)
    assert {p["name"]: p["hits"] for p in st.probes} == {name: 1 for name in punned}
