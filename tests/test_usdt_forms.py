"""USDT argument forms: `urewrite trace` records, for every operand form a compiler
writes, the value the program passed (samples/usdt_forms.c prints them).

Built with gcc at -O0 and -O2 as PIE, -O2 as non-PIE (absolute addresses), -O2 static
(thread-locals before and after libc), and for arm64 with aarch64-linux-gnu-gcc at
-O0/-O2, run under qemu-aarch64. The forms met: registers of every width, stack
slots, base + index * scale + displacement, RIP-relative globals with offsets into
a struct and an array (`8+stats(%rip)`, `stats+12(%rip)`), constants cut to their
size, `%fs` thread-locals read from two threads, high-byte registers, 12 arguments;
arm64's `[sp, 16]`, `[x0]`, `[x1, x2]`, `[x1, x2, lsl 3]`, w and x registers. The
probe whose argument is a double is refused in one line that quotes it; the others
are not held back. Also: `list` shows every site with its arguments or its reason;
an exactly named probe that cannot be read is an error, a glob's a warning; two
adjacent sites (two 1-byte nops in a row) are both listed, counted and traced.

The record holds 64 bits per argument (docs/region.md): an unsigned 8-byte value
above 2^63 is recorded as the signed 64-bit value of the same bits.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
from pathlib import Path
from typing import Dict, List

import pytest

import cross
from conftest import check, urewrite

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "samples" / "usdt_forms.c"
ROUNDS = 3
SDT_H = next((Path(p) for p in ("/usr/include/sys/sdt.h",
                                "/usr/include/x86_64-linux-gnu/sys/sdt.h") if Path(p).is_file()),
             None)
X86_BUILDS = {"O0": ["-O0"], "O2": ["-O2"], "O2-nopie": ["-O2", "-fno-pie", "-no-pie"],
              "O2-static": ["-O2", "-static"]}
ARM_BUILDS = {"arm-O0": ["-O0"], "arm-O2": ["-O2"]}
# probes each build fires (the rest by hand, per architecture)
COMMON = {"registers", "globals", "indexed", "tls", "constants", "locals", "twelve"}

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or SDT_H is None,
    reason="needs gcc and <sys/sdt.h> (Debian: systemtap-sdt-dev)")


def _as_record(value: int) -> int:
    """A value as an event record holds it: 64 bits, read as signed."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def fired(stdout: str) -> Dict[str, List[List[int]]]:
    seen: Dict[str, List[List[int]]] = {}
    for line in stdout.splitlines():
        if line.startswith("fire "):
            name, *args = line.split()[1:]
            seen.setdefault(name, []).append([_as_record(int(a)) for a in args])
    return seen


def steady(stdout: str) -> str:
    """The output less the thread pointer, which differs from run to run."""
    return re.sub(r"(?m)^(fire symbols \S+ \S+ \S+) \d+", r"\1 TP", stdout)


def recorded(events_file: Path) -> Dict[str, List[List[int]]]:
    out: Dict[str, List[List[int]]] = {}
    for line in events_file.read_text().splitlines():
        e = json.loads(line)
        assert e["kind"] == "usdt"
        out.setdefault(e["probe"].split(":", 1)[1], []).append(e["args"])
    return out


def _arm():
    """(compiler, command prefix to run a program) for arm64, or None with a reason."""
    if cross.missing(cross.CC, cross.QEMU):
        return None, "needs aarch64-linux-gnu-gcc and qemu-aarch64"
    if not cross.SYSROOT:
        return None, "cannot find the AArch64 libraries for qemu -L"
    return (cross.CC, cross.emulator()), ""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (plain, probed, command prefix, rewrite's stderr, the original's stdout)."""
    root = tmp_path_factory.mktemp("usdt_forms")
    (root / "include" / "sys").mkdir(parents=True)
    for header in ("sdt.h", "sdt-config.h"):  # (the cross compiler may not see the host's)
        shutil.copy(SDT_H.parent / header, root / "include" / "sys" / header)
    arm, _ = _arm()
    jobs = [(name, "gcc", flags, []) for name, flags in X86_BUILDS.items()]
    if arm:
        jobs += [(name, arm[0], flags, arm[1]) for name, flags in ARM_BUILDS.items()]

    def build(job):
        name, cc, flags, prefix = job
        plain, probed = root / name, root / f"{name}.probed"
        check([cc, *flags, "-pthread", "-isystem", root / "include", SOURCE, "-o", plain])
        out = urewrite(plain, "-p", "usdt:forms:*", "-o", probed)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        original = check([*prefix, plain, ROUNDS]).stdout
        return name, (plain, probed, prefix, out.stderr, original)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(build, jobs))


def _get(built, name):
    if name not in built:
        pytest.skip(_arm()[1])
    return built[name]


@pytest.mark.parametrize("name", [*X86_BUILDS, *ARM_BUILDS])
def test_trace_records_what_the_program_passed(built, name, tmp_path):
    plain, probed, prefix, rewrite_stderr, original = _get(built, name)
    events = tmp_path / "events.jsonl"
    out = urewrite("trace", "--json", "-o", events, "--", *prefix, probed, ROUNDS)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert steady(out.stdout) == steady(original)  # armed, the program does what it did
    expected = fired(out.stdout)
    by_hand = {"high", "symbols"} | ({"absolute"} if name == "O2-nopie" else set()) \
        if not name.startswith("arm") else {"views"}
    assert set(expected) == COMMON | by_hand
    assert recorded(events) == expected
    # the main thread's three rounds, then each worker's own thread-locals
    assert [args[0] for args in expected["tls"]][-2:] == [1000, 1001]
    # the double: refused in one line quoting it, a warning (a glob named it)
    warnings = [line for line in rewrite_stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and re.fullmatch(
        r"urewrite: warning: not probing forms:floating: argument 1 '8f@[^']+' cannot be "
        r"read: a floating-point value \(trace records integers\)", warnings[0]), warnings


def _readelf_sites(path) -> List[tuple]:
    """(name, address, arguments) of each USDT note, as readelf -n prints them."""
    text = check(["readelf", "-n", path]).stdout
    return [(m.group(1), int(m.group(2), 16), m.group(3).strip()) for m in re.finditer(
        r"Name: (\S+)\n\s+Location: (0x[0-9a-f]+),.*\n\s+Arguments:(.*)", text)]


@pytest.mark.parametrize("name", ["O2", "arm-O2"])
def test_list_shows_every_site_with_its_arguments_or_its_reason(built, name):
    plain = _get(built, name)[0]
    out = urewrite("list", "--json", plain)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["usdt"]
    assert sorted((r["name"], r["address"], r["arguments"]) for r in rows) \
        == sorted(_readelf_sites(plain))
    for r in rows:
        if r["name"] == "floating":
            assert not r["patchable"] and r["reason"].startswith(
                f"argument 1 '{r['arguments']}' cannot be read: a floating-point value")
        else:
            assert r["patchable"], r
    text = urewrite("list", plain)
    assert re.search(r"forms:floating .* no: argument 1 '8f@\S+' cannot be read", text.stdout)


def test_an_unreadable_probe_named_exactly_is_an_error(built, tmp_path):
    plain = _get(built, "O2")[0]
    out = urewrite(plain, "-p", "usdt:forms:floating", "-p", "usdt:forms:tls",
                   "-o", tmp_path / "out")
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("urewrite: cannot probe forms:floating: argument 1 '8f@%rax' "
                                 "cannot be read: a floating-point value")
    assert not (tmp_path / "out").exists()
    kept = urewrite(plain, "-p", "usdt:forms:floating", "-p", "usdt:forms:tls", "--keep-going",
                    "-o", tmp_path / "out")
    assert kept.returncode == 0, kept.stderr
    assert "urewrite: warning: not probing forms:floating: argument 1 '8f@%rax'" in kept.stderr
    assert "1 probes at 1 sites, 1 refused" in kept.stderr
    alone = urewrite(plain, "-p", "usdt:forms:floating", "--keep-going", "-o", tmp_path / "o2")
    assert alone.returncode == 1 and alone.stderr.count("\n") == 1
    assert "no patchable site: forms:floating: argument 1 '8f@%rax'" in alone.stderr


ADJACENT_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 5;
    for (int i = 0; i < n; i++) {
        DTRACE_PROBE1(adj, first, i);
        DTRACE_PROBE1(adj, second, i);
        DTRACE_PROBE(adj, third);
    }
    printf("done %d\n", n);
    return 0;
}
"""


def test_adjacent_sites_are_all_listed_counted_and_traced(tmp_path):
    """Three probes in a row: three 1-byte nops, one window (libjvm's
    hotspot_jni:GetVersion__entry and __return are two such)."""
    (tmp_path / "adjacent.c").write_text(ADJACENT_C)
    plain, probed = tmp_path / "adjacent", tmp_path / "adjacent.probed"
    check(["gcc", "-O2", tmp_path / "adjacent.c", "-o", plain])
    sites = _readelf_sites(plain)
    assert [s[1] - sites[0][1] for s in sites] == [0, 1, 2]  # adjacent
    listed = json.loads(urewrite("list", "--json", plain).stdout)["usdt"]
    assert [(r["name"], r["address"], r["patchable"]) for r in listed] \
        == [(name, address, True) for name, address, _ in sites]
    summary = json.loads(urewrite("list", "--summary", "--json", plain).stdout)
    counts = summary["files"][0] if "files" in summary else summary
    assert (counts["usdt_sites"], counts["usdt"]) == (3, 3), summary
    out = urewrite(plain, "-p", "usdt:adj:*", "-o", probed)
    assert out.returncode == 0, out.stderr
    report = tmp_path / "stat.json"
    assert urewrite("stat", "--json", "-o", report, "--", probed, 7).returncode == 0
    hits = {p["name"]: p["hits"] for p in json.loads(report.read_text())["probes"]}
    assert hits == {"adj:first": 7, "adj:second": 7, "adj:third": 7}
    events = tmp_path / "events.jsonl"
    assert urewrite("trace", "--json", "-o", events, "--", probed, 3).returncode == 0
    assert [(json.loads(l)["probe"], json.loads(l)["args"]) for l in
            events.read_text().splitlines()] == \
        [e for i in range(3) for e in (("adj:first", [i]), ("adj:second", [i]), ("adj:third", []))]


class _Symbols:
    """A symbol table for the parser: stats at 0x4000, a thread-local at offset -0x30."""

    def address(self, name):
        if name != "stats":
            raise ValueError(f"symbol {name} is not in the file's symbol tables")
        return 0x4000

    def thread_offset(self, name):
        if name != "tls":
            raise ValueError(f"symbol {name} is not in the file's symbol tables")
        return -0x30


def test_x86_operand_forms_are_read_or_refused_with_a_reason():
    """The forms libbpf's usdt.c and sdt.h say compilers write, and the ones around them."""
    from urewrite.arch.x86_64 import arguments as X
    from urewrite.trampolines.arguments import (CONSTANT, LINKED_MEMORY, MEMORY, REGISTER,
                                                THREAD_MEMORY, ArgSpec, encode)
    S = X.SLOT
    read = {
        "4@$5": ArgSpec(CONSTANT, 4, False, value=5),
        "1@$-56": ArgSpec(CONSTANT, 1, False, value=200),
        "-2@$0xffff": ArgSpec(CONSTANT, 2, True, value=-1),
        "8@$18446744073709551615": ArgSpec(CONSTANT, 8, False, value=-1),
        "-8@%rax": ArgSpec(REGISTER, 8, True, base=S["rax"]),
        "-4@%r9d": ArgSpec(REGISTER, 4, True, base=S["r9"]),
        "2@%r10w": ArgSpec(REGISTER, 2, False, base=S["r10"]),
        "1@%r11b": ArgSpec(REGISTER, 1, False, base=S["r11"]),
        "1@%sil": ArgSpec(REGISTER, 1, False, base=S["rsi"]),
        "-1@%ah": ArgSpec(REGISTER, 1, True, base=S["rax"], shift=8),
        "8@%eax": ArgSpec(REGISTER, 4, False, base=S["rax"]),  # the register's width governs
        "-4@-20(%rbp)": ArgSpec(MEMORY, 4, True, base=S["rbp"], value=-20),
        "8@(%rsp)": ArgSpec(MEMORY, 8, False, base=S["rsp"]),
        "-8@16(%rdx,%rcx,8)": ArgSpec(MEMORY, 8, True, base=S["rdx"], index=S["rcx"], scale=8,
                                      value=16),
        "-8@0(%rbp,%rbx,8)": ArgSpec(MEMORY, 8, True, base=S["rbp"], index=S["rbx"], scale=8),
        "4@8(,%rax,4)": ArgSpec(MEMORY, 4, False, index=S["rax"], scale=4, value=8),
        "4@(%rax,%rdx)": ArgSpec(MEMORY, 4, False, base=S["rax"], index=S["rdx"]),
        "-4@stats(%rip)": ArgSpec(LINKED_MEMORY, 4, True, value=0x4000),
        "-4@stats+8(%rip)": ArgSpec(LINKED_MEMORY, 4, True, value=0x4008),
        "-4@stats-8(%rip)": ArgSpec(LINKED_MEMORY, 4, True, value=0x3FF8),
        "-4@40+stats(%rip)": ArgSpec(LINKED_MEMORY, 4, True, value=0x4028),
        "-4@stats+48-8(%rip)": ArgSpec(LINKED_MEMORY, 4, True, value=0x4028),
        "-4@stats+8": ArgSpec(LINKED_MEMORY, 4, True, value=0x4008),
        "-8@stats(,%rcx,8)": ArgSpec(LINKED_MEMORY, 8, True, index=S["rcx"], scale=8,
                                     value=0x4000),
        "-4@%fs:tls@tpoff": ArgSpec(THREAD_MEMORY, 4, True, value=-0x30),
        "-8@%fs:16+tls@tpoff": ArgSpec(THREAD_MEMORY, 8, True, value=-0x20),
        "-8@%fs:tls@tpoff(,%rdi,8)": ArgSpec(THREAD_MEMORY, 8, True, index=S["rdi"], scale=8,
                                            value=-0x30),
        "-4@%fs:(%rax)": ArgSpec(THREAD_MEMORY, 4, True, base=S["rax"]),
        "8@%fs:0x28": ArgSpec(THREAD_MEMORY, 8, False, value=0x28),
        "4@%ds:8(%rax)": ArgSpec(MEMORY, 4, False, base=S["rax"], value=8),
    }
    for text, spec in read.items():
        assert X.sdt_arguments(text, _Symbols()) == [spec], text
        encode([spec])  # (packs)
    assert X.sdt_arguments("", None) == []
    assert len(X.sdt_arguments(" ".join(read), _Symbols())) == len(read)
    refused = {
        "8f@%xmm0": "a floating-point value", "8@%xmm0": "floating-point or vector register",
        "8@%gs:0x28": "the %gs segment", "8@$stats": "an address or expression as a constant",
        "8@(%eax)": "only 64-bit addresses", "8@16(%rip)": "RIP-relative without a symbol",
        "8@nosuch(%rip)": "symbol nosuch is not in", "8@stats@GOTPCREL(%rip)": "@gotpcrel",
        "8@tls@tpoff": "@tpoff outside the %fs segment", "8@%fs:stats": "without @tpoff",
        "8@a+b(%rip)": "names two symbols", "8@-stats(%rip)": "subtracts a symbol",
        "8@(%rax,%rsp)": "%rsp cannot be an index", "8@(%rax,%rbx,3)": "scale 3",
        "8@%rip": "instruction pointer", "8@%foo": "%foo is not a general register",
        "16@%rax": "size 16", "0@%rax": "size 0", "8@": "has no operand",
        "@%rax": "is not SIZE@OPERAND", "8@$99999999999999999999999": "does not fit in 64 bits",
        "8@99999999999999999999999(%rax)": "does not fit in 64 bits",
        "8@(%rip,%rax)": "RIP-relative with an index", "8@()": "is not (BASE,INDEX,SCALE)",
    }
    for text, reason in refused.items():
        with pytest.raises(ValueError, match=re.escape(reason)) as e:
            X.sdt_arguments(f"-4@%eax {text}", _Symbols())
        assert str(e.value).startswith(f"argument 2 '{text}'"), str(e.value)
