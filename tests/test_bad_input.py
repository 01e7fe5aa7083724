"""Bad input: one `urewrite: ...` line on stderr, exit 1, no traceback, no output, input intact."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path

import pytest

from conftest import check, run, urewrite


@pytest.fixture(scope="module")
def good(builder):
    """A well-formed PIE executable (counts.c at -O2)."""
    return builder.build("counts", ["counts.c"], ["-O2"], [], subdir="bad-input-base").path


def _patched(data: bytes, fmt: str, offset: int, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def _ident(data: bytes, index: int, value: int) -> bytes:
    out = bytearray(data)
    out[index] = value
    return bytes(out)


# name -> (how to make the file from a good ELF's bytes, what the message must say)
BAD_FILES = {
    "empty": (lambda d: b"", "not an ELF file"),
    "text": (lambda d: b"#!/bin/sh\necho hello\n", "not an ELF file"),
    "truncated-header": (lambda d: d[:40], "truncated ELF header"),
    "truncated-program-headers": (lambda d: d[:80], "program headers lie past the end"),
    "truncated-half": (lambda d: d[:len(d) // 2], "lies past the end of the file"),
    "truncated-section-headers": (lambda d: d[:struct.unpack_from("<Q", d, 40)[0] + 100],
                                  "section headers lie past the end of the file"),
    "section-headers-far-away": (lambda d: _patched(d, "<Q", 40, 1 << 40),
                                 "section headers lie past the end of the file"),
    "bad-phentsize": (lambda d: _patched(d, "<H", 54, 32), "bad program header table"),
    "no-program-headers": (lambda d: _patched(d, "<H", 56, 0), "bad program header table"),
    "bad-shstrndx": (lambda d: _patched(d, "<H", 62, 0xfff0), "bad section name table index"),
    "machine-arm": (lambda d: _patched(d, "<H", 18, 40), "unsupported machine arm"),
    "machine-riscv": (lambda d: _patched(d, "<H", 18, 243), "unsupported machine riscv"),
    "machine-unknown": (lambda d: _patched(d, "<H", 18, 4242), "unsupported machine"),
    "elf32": (lambda d: _ident(d, 4, 1), "32-bit ELF files are not supported"),
    "big-endian": (lambda d: _ident(d, 5, 2), "big-endian ELF files are not supported"),
    "relocatable": (lambda d: _patched(d, "<H", 16, 1), "not an executable or shared object"),
    "core": (lambda d: _patched(d, "<H", 16, 4), "not an executable or shared object"),
}


def assert_clean_failure(proc, directory, before, expected_message, outputs=()):
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("urewrite: "), proc.stderr
    assert proc.stderr.endswith("\n") and proc.stderr.count("\n") == 1, proc.stderr
    assert expected_message in proc.stderr
    for out in outputs:
        assert not os.path.exists(out), out
    assert sorted(os.listdir(directory)) == before  # no output, no temporary file


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("name", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["rewrite", "list"])
def test_bad_file(good, tmp_path, name, command):
    make, message = BAD_FILES[name]
    bad = tmp_path / name
    bad.write_bytes(make(good.read_bytes()))
    digest = _digest(bad)
    before = sorted(os.listdir(tmp_path))
    out = tmp_path / "out"
    if command == "rewrite":
        proc = urewrite(str(bad), "-p", "main", "-o", str(out))
    else:
        proc = urewrite("list", str(bad), "--json")
    assert_clean_failure(proc, tmp_path, before, message, [out, str(bad) + ".probed"])
    assert f"urewrite: {bad}: " in proc.stderr  # names the file
    assert _digest(bad) == digest


def test_real_32bit_elf(tmp_path):
    """A real i386 executable, where gcc can make one."""
    src = tmp_path / "m32.c"
    src.write_text("int main(void) { return 0; }\n")
    exe = tmp_path / "m32"
    proc = __import__("subprocess").run(["gcc", "-m32", str(src), "-o", str(exe)],
                                        capture_output=True)
    if proc.returncode != 0:
        pytest.skip("gcc cannot build 32-bit programs here (no multilib)")
    os.unlink(src)
    before = sorted(os.listdir(tmp_path))
    proc = urewrite(str(exe), "-p", "main", "-o", str(tmp_path / "out"))
    assert_clean_failure(proc, tmp_path, before, "32-bit ELF files are not supported")


def test_missing_file(tmp_path):
    proc = urewrite(str(tmp_path / "nothing"), "-p", "main", "-o", str(tmp_path / "out"))
    assert_clean_failure(proc, tmp_path, [], "No such file or directory")


def test_unreadable_file(good, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    copy = tmp_path / "copy"
    shutil.copy(good, copy)
    os.chmod(copy, 0)
    proc = urewrite(str(copy), "-p", "main", "-o", str(tmp_path / "out"))
    assert_clean_failure(proc, tmp_path, ["copy"], "Permission denied")


def _copy(good, tmp_path):
    copy = tmp_path / "prog"
    shutil.copy(good, copy)
    return copy


def test_no_such_symbol_lists_close_matches(good, tmp_path):
    prog = _copy(good, tmp_path)
    proc = urewrite(str(prog), "-p", "fibb", "-o", str(tmp_path / "out"))
    assert_clean_failure(proc, tmp_path, ["prog"], "no function named 'fibb'")
    assert "close matches: fib" in proc.stderr


def test_no_such_symbol_without_close_matches(good, tmp_path):
    prog = _copy(good, tmp_path)
    proc = urewrite(str(prog), "-p", "zzqqxx_nothing", "-o", str(tmp_path / "out"))
    assert_clean_failure(proc, tmp_path, ["prog"], "no function named 'zzqqxx_nothing'")
    assert "close matches" not in proc.stderr


def test_one_bad_name_among_good_ones(good, tmp_path):
    prog = _copy(good, tmp_path)
    proc = urewrite(str(prog), "-p", "fib", "-p", "squar", "-o", str(tmp_path / "out"))
    assert_clean_failure(proc, tmp_path, ["prog"], "no function named 'squar'")
    assert "square" in proc.stderr


def test_glob_matching_nothing(good, tmp_path):
    prog = _copy(good, tmp_path)
    proc = urewrite(str(prog), "-p", "zz_*", "-o", str(tmp_path / "out"))
    assert_clean_failure(proc, tmp_path, ["prog"], "no function matches 'zz_*'")


def test_no_patchable_site(builder, tmp_path):
    edges = builder.build("edges", ["edges.c"], ["-O2", "-fcf-protection=none"], ["-pie"])
    prog = tmp_path / "edges"
    shutil.copy(edges.path, prog)
    # globs: refusals are warnings, but nothing at all is left to probe
    proc = urewrite(str(prog), "-p", "edge_on[e]", "-p", "edge_x*", "-o", str(tmp_path / "out"))
    assert_clean_failure(proc, tmp_path, ["edges"], "no patchable site")
    assert "edge_one" in proc.stderr


@pytest.mark.parametrize("how", ["same", "dot-dot", "hard-link", "symlink"])
def test_output_equal_to_input(good, tmp_path, how):
    prog = _copy(good, tmp_path)
    (tmp_path / "sub").mkdir()
    digest = _digest(prog)
    if how == "same":
        out = str(prog)
    elif how == "dot-dot":
        out = str(tmp_path / "sub" / ".." / "prog")
    elif how == "hard-link":
        out = str(tmp_path / "link")
        os.link(prog, out)
    else:
        out = str(tmp_path / "sym")
        os.symlink(prog, out)
    before = sorted(os.listdir(tmp_path))
    proc = urewrite(str(prog), "-p", "main", "-o", out)
    assert_clean_failure(proc, tmp_path, before, "the output must not be the input file")
    assert _digest(prog) == digest
    assert os.listdir(tmp_path / "sub") == []


def test_usage_errors_exit_2(good, tmp_path):
    proc = urewrite(str(good), "-o", str(tmp_path / "out"))  # no -p
    assert proc.returncode == 2
    assert "give at least one probe with -p" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


# -- corruptions that currently escape as tracebacks ------------------------------------------

def _sections(data: bytes):
    """name -> (offset, size) of each section."""
    return {name: (offset, size) for name, (_, offset, size) in _section_headers(data).items()}


def _program_header(data: bytes, p_type: int) -> int:
    """File offset of the first program header of type `p_type`."""
    phoff = struct.unpack_from("<Q", data, 32)[0]
    for k in range(struct.unpack_from("<H", data, 56)[0]):
        if struct.unpack_from("<I", data, phoff + k * 56)[0] == p_type:
            return phoff + k * 56
    raise AssertionError(f"no program header of type {p_type}")


def _dynamic_entry(data: bytes, tag: int) -> int:
    """File offset of the first .dynamic entry with `tag`."""
    offset, size = _sections(data)[".dynamic"]
    for at in range(offset, offset + size, 16):
        if struct.unpack_from("<q", data, at)[0] == tag:
            return at
    raise AssertionError(f"no dynamic entry {tag}")


def _dynamic_past_end(d: bytes) -> bytes:
    return _patched(d, "<Q", _program_header(d, 2) + 8, 1 << 36)  # PT_DYNAMIC p_offset


def _init_out_of_reach(d: bytes) -> bytes:
    return _patched(d, "<Q", _dynamic_entry(d, 12) + 8, 0xB300001000)  # DT_INIT value


def _non_utf8_name(d: bytes) -> bytes:
    offset, size = _sections(d)[".strtab"]
    at = d.index(b"\0square\0", offset, offset + size) + 2
    return _ident(d, at, 0xFF)  # "s\xffuare"


@pytest.mark.parametrize("make, args", [
    pytest.param(_dynamic_past_end, ["-p", "main"], id="dynamic-segment-past-end"),
    pytest.param(_init_out_of_reach, ["-p", "main"], id="dt-init-out-of-reach"),
    pytest.param(_non_utf8_name, ["-p", "*"], id="non-utf8-symbol-glob"),
    pytest.param(_non_utf8_name, ["list"], id="non-utf8-symbol-list"),
    pytest.param(_non_utf8_name, ["list", "--json"], id="non-utf8-symbol-list-json"),
])
def test_corruption_gives_a_message_not_a_traceback(good, tmp_path, make, args):
    bad = tmp_path / "bad"
    bad.write_bytes(make(good.read_bytes()))
    out = tmp_path / "out"
    if args[0] == "list":
        proc = urewrite("list", str(bad), *args[1:])
    else:
        proc = urewrite(str(bad), *args, "-o", str(out))
    assert "Traceback" not in proc.stderr, proc.stderr.strip().splitlines()[-1]
    assert proc.returncode in (0, 1)
    if proc.returncode == 1:
        assert proc.stderr.startswith("urewrite: ") and proc.stderr.count("\n") == 1
        assert not out.exists()


def test_shared_object_without_dt_init(builder, tmp_path):
    lib = builder.build("libnoinit.so", ["libdemo.c"], ["-O2", "-fPIC"], ["-nostartfiles"],
                        shared=True, subdir="bad-input-noinit")
    assert "(INIT)" not in run(["readelf", "-dW", lib.path]).stdout
    prog = tmp_path / "libnoinit.so"
    shutil.copy(lib.path, prog)
    proc = urewrite(str(prog), "-p", "demo_fib", "-o", str(tmp_path / "out.so"))
    assert_clean_failure(proc, tmp_path, ["libnoinit.so"], "without DT_INIT")


@pytest.mark.parametrize("args", [[".", "-p", "main"], ["rewrite", ".", "-p", "main"],
                                  [".", "-p", "main", "-o", "out"], ["list", "."],
                                  ["list", "--json", "."], ["list", "--summary", "."]])
def test_directory_as_input(tmp_path, args):
    """A directory is bad input like any other: one line, exit 1 (not a usage error)."""
    proc = urewrite(*args, cwd=tmp_path)
    assert_clean_failure(proc, tmp_path, [], "urewrite: .: is a directory")


# -- USDT notes, symbol tables and unwind tables, malformed but legal ------------------------------
#
# A note, a symbol or an FDE may hold anything: each reaches its parser, and what cannot be
# used is a refused probe (a warning for a glob, an error for a name) or one line of error,
# never a traceback. The commands run in one Python process (DRIVER) to keep this quick.

DRIVER = r"""
import contextlib, io, json, sys, traceback
from urewrite.commands import main
results = []
for argv in json.load(open(sys.argv[1])):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv, prog_name="urewrite", standalone_mode=False)
            code = 0
        except SystemExit as e:
            code = e.code or 0
        except Exception as e:
            code = getattr(e, "exit_code", None)
            if code is None:  # not one of click's own: a traceback
                code, err = "traceback", io.StringIO(traceback.format_exc())
            else:
                err.write(f"urewrite: {e}\n")
    results.append({"argv": argv, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
json.dump(results, open(sys.argv[2], "w"))
"""

SDT_C = r"""
#include <stdio.h>
#include <sys/sdt.h>
int counter;
__attribute__((noinline)) int work(int i) {
    DTRACE_PROBE2(fz, a, i, counter);
    DTRACE_PROBE2(fz, b, i, counter);
    DTRACE_PROBE2(fz, c, i, counter);
    DTRACE_PROBE2(fz, d, i, counter);
    counter += i;
    return counter;
}
int main(int argc, char **argv) {
    for (int i = 0; i < 3; i++)
        work(i + argc);
    printf("%d\n", counter);
    return 0;
}
"""


def _commands(jobs: list, tmp_path) -> list:
    """Each argv of `jobs` run by the command line in one process: their results."""
    jobs_file, results_file = tmp_path / "jobs.json", tmp_path / "results.json"
    jobs_file.write_text(json.dumps([[str(a) for a in argv] for argv in jobs]))
    proc = run([sys.executable, "-c", DRIVER, jobs_file, results_file], timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(results_file.read_text())


def _assert_no_traceback(result):
    argv, code, stderr = result["argv"], result["code"], result["stderr"]
    assert code != "traceback", f"{' '.join(argv)}:\n{stderr}"
    assert code in (0, 1), (argv, code, stderr)
    assert "Traceback" not in stderr, (argv, stderr)
    if code == 1:
        assert stderr.startswith("urewrite: ") and stderr.count("\n") == 1, (argv, stderr)


def _note(owner: bytes, kind: int, desc: bytes) -> bytes:
    name = owner + b"\0"
    out = struct.pack("<III", len(name), len(desc), kind) + name + bytes(-len(name) % 4) + desc
    return out + bytes(-len(out) % 4)


def _stapsdt(pc: int, base: int, semaphore: int, strings: bytes) -> bytes:
    return _note(b"stapsdt", 3, struct.pack("<QQQ", pc, base, semaphore) + strings)


def _section_headers(data: bytes) -> dict:
    """name -> (address, offset, size) of each section."""
    shoff = struct.unpack_from("<Q", data, 40)[0]
    shnum, shstrndx = struct.unpack_from("<HH", data, 60)
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * 64) for i in range(shnum)]
    names_at = raw[shstrndx][4]
    out = {}
    for r in raw:
        end = data.index(b"\0", names_at + r[0])
        out[data[names_at + r[0]:end].decode()] = (r[3], r[4], r[5])
    return out


def _with_notes(data: bytes, notes: bytes) -> bytes:
    """`data` with its .note.stapsdt holding `notes`, then a note of another owner as
    filler (the section keeps its size)."""
    _, offset, size = _section_headers(data)[".note.stapsdt"]
    rest = size - len(notes)
    assert rest >= 16, "the notes do not fit"
    filler = struct.pack("<III", 4, rest - 16, 99) + b"pad\0" + bytes(rest - 16)
    return data[:offset] + notes + filler + data[offset + size:]


@pytest.fixture(scope="module")
def sdt_program(tmp_path_factory):
    if not any(os.path.exists(p) for p in ("/usr/include/sys/sdt.h",
                                           "/usr/include/x86_64-linux-gnu/sys/sdt.h")):
        pytest.skip("needs <sys/sdt.h> (Debian: systemtap-sdt-dev)")
    work = tmp_path_factory.mktemp("bad-notes")
    (work / "sdt.c").write_text(SDT_C)
    check(["gcc", "-O2", work / "sdt.c", "-o", work / "sdt"])
    data = (work / "sdt").read_bytes()
    sections = _section_headers(data)
    text = check(["readelf", "-n", work / "sdt"]).stdout
    pcs = [int(x, 16) for x in re.findall(r"Location: (0x[0-9a-f]+)", text)]
    return work, data, sections, pcs


# name -> (the notes, given (pcs, .stapsdt.base, sections); what list's reason says, or
# None when the site may be probed)
ODD_NOTES = {
    "empty-arguments": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\0\0"), None),
    "garbage": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\0garbage !!\0"),
                "argument 1 'garbage' cannot be read"),
    "unknown-register": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\0-4@%eax 8@%foo\0"),
                         "argument 2 '8@%foo' cannot be read: %foo is not a general register"),
    "huge-size": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\099999999999999999999@%rax\0"),
                  "cannot be read: size"),
    "bad-size": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\x003@%eax\0"),
                 "argument 1 '3@%eax' cannot be read: size 3 is not 1, 2, 4 or 8"),
    "huge-constant": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\08@$99999999999999999999999\0"),
                      "does not fit in 64 bits"),
    "huge-displacement": (lambda p, b, s: _stapsdt(p[0], b, 0,
                                                   b"fz\0a\08@99999999999999999999999(%rax)\0"),
                          "does not fit in 64 bits"),
    "huge-number-of-digits": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\08@$" + b"9" * 200
                                                       + b"\0"), "cannot be read"),
    "no-operand": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\08@\0"), "has no operand"),
    "no-size": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\0@%rax\0"), "is not SIZE@OPERAND"),
    "unclosed": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\08@-8(%rbp\0"), "cannot be read"),
    "float": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\08f@%xmm0\0"), "floating-point"),
    "gs-segment": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\08@%gs:0x28\0"), "%gs segment"),
    "no-such-symbol": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\0-4@nosuch+8(%rip)\0"),
                       "symbol nosuch is not in the file's symbol tables"),
    "no-such-thread-local": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\0-4@%fs:nosuch@tpoff\0"),
                             "symbol nosuch is not in the file's symbol tables"),
    "not-thread-local": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\0-4@%fs:counter@tpoff\0"),
                         "counter@tpoff is not thread-local"),
    "relocation": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\08@counter@GOTPCREL(%rip)\0"),
                   "relocation @gotpcrel is not followed"),
    "control-characters": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\08@%rax\n-4@\x01\x1b[2J\0"),
                           "argument 2 '-4@\\x01\\x1b[2J' cannot be read"),
    "not-utf8": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\08@\xff\xfe%rax\0"),
                 "cannot be read"),
    "thirteen-arguments": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\0" + b" ".join(
        [b"-4@%eax"] * 13) + b"\0"), None),
    "strings-unterminated": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\08@%rax"),
                             "its note is cut short"),
    "no-probe-name": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0"), "its note is cut short"),
    "empty-names": (lambda p, b, s: _stapsdt(p[0], b, 0, b"\0\0\0"),
                    "its note names no provider or no probe"),
    "descriptor-too-short": (lambda p, b, s: _note(b"stapsdt", 3, struct.pack("<QQ", p[0], b)),
                             "no site"),
    "name-size-huge": (lambda p, b, s: struct.pack("<III", 0xFFFFFFFF, 24, 3) + b"stapsdt\0",
                       "no site"),
    "descriptor-size-huge": (lambda p, b, s: struct.pack("<III", 8, 0xFFFFFFF0, 3) + b"stapsdt\0",
                             "no site"),
    "pc-zero": (lambda p, b, s: _stapsdt(0, b, 0, b"fz\0a\08@%rax\0"), "no function"),
    "pc-far": (lambda p, b, s: _stapsdt(0xFFFFFFFFFFFF0000, b, 0, b"fz\0a\08@%rax\0"),
               "no function"),
    "pc-in-data": (lambda p, b, s: _stapsdt(s[".data"][0], b, 0, b"fz\0a\08@%rax\0"),
                   "no function"),
    "pc-inside-an-instruction": (lambda p, b, s: _stapsdt(p[-1] + 3, b, 0, b"fz\0a\08@%rax\0"),
                                 "is not the start of an instruction"),
    "semaphore-read-only": (lambda p, b, s: _stapsdt(p[0], b, s[".rodata"][0], b"fz\0a\08@%rax\0"),
                            "is not in the file's writable memory"),
    "semaphore-far": (lambda p, b, s: _stapsdt(p[0], b, 0xFFFFFFFFFFFFFFF0, b"fz\0a\08@%rax\0"),
                      "is not in the file's writable memory"),
    "prelink-base-wraps": (lambda p, b, s: _stapsdt(p[0], 0xFFFFFFFFFFFFFF00, 0,
                                                    b"fz\0a\08@%rax\0"), "no function"),
    "one-site-of-two-unreadable": (lambda p, b, s: _stapsdt(p[0], b, 0, b"fz\0a\08@%rax\0")
                                   + _stapsdt(p[1], b, 0, b"fz\0a\08@%foo\0"),
                                   "cannot be read: %foo is not a general register"),
}


@pytest.fixture(scope="module")
def odd_notes(sdt_program, tmp_path_factory):
    """case -> its file and the results of list --json, list, a glob and an exact name."""
    _, data, sections, pcs = sdt_program
    work = tmp_path_factory.mktemp("odd-notes")
    base = sections[".stapsdt.base"][0]
    jobs, files = [], {}
    for name, (make, _) in ODD_NOTES.items():
        path = work / name
        path.write_bytes(_with_notes(data, make(pcs, base, sections)))
        files[name] = path
        jobs += [["list", "--json", path], ["list", path],
                 [path, "-p", "usdt:*:*", "-o", work / f"{name}.glob"],
                 [path, "-p", "usdt:fz:a", "-o", work / f"{name}.exact"],
                 [path, "-p", "usdt:*:*", "--keep-going", "-o", work / f"{name}.kept"]]
    results = _commands(jobs, work)
    return {name: (files[name], results[5 * k:5 * k + 5]) for k, name in enumerate(ODD_NOTES)}


@pytest.mark.parametrize("case", sorted(ODD_NOTES))
def test_odd_usdt_notes_refuse_a_probe_or_fail_in_one_line(odd_notes, case):
    path, results = odd_notes[case]
    reason = ODD_NOTES[case][1]
    for result in results:
        _assert_no_traceback(result)
    listed, text, glob, exact, kept = results
    assert listed["code"] == 0 and text["code"] == 0
    rows = json.loads(listed["stdout"])["usdt"]
    if reason == "no site":  # a note that gives no address: nothing to list, nothing to probe
        assert rows == [] and "has no USDT probes" in glob["stderr"]
        return
    assert rows, listed
    table = text["stdout"].split("PROBE  ARGUMENTS\n", 1)[1]
    assert len(table.splitlines()) == len(rows)  # one row per site, whatever the note holds
    if reason is None:
        assert all(r["patchable"] for r in rows) and glob["code"] == 0 == exact["code"]
        return
    assert all(not r["patchable"] for r in rows)  # every site of the probe
    assert any(reason in r["reason"] for r in rows), (reason, rows)
    assert exact["code"] == 1 and re.match(  # (a note without names is not "fz:a")
        r"urewrite: (cannot probe fz:a: |no patchable site: fz:a: |no USDT probe matches)",
        exact["stderr"]), exact
    assert glob["code"] == 1 and "no patchable site" in glob["stderr"]  # the file's only probe


def test_an_unreadable_probe_does_not_hold_back_the_others(sdt_program, tmp_path):
    work, data, sections, pcs = sdt_program
    base = sections[".stapsdt.base"][0]
    notes = _stapsdt(pcs[0], base, 0, b"fz\0a\0-4@%eax\0") + \
        _stapsdt(pcs[1], base, 0, b"fz\0b\08f@%xmm0\0") + \
        _stapsdt(pcs[2], base, 0, b"fz\0c\0-4@counter(%rip)\0")
    bad = tmp_path / "three"
    bad.write_bytes(_with_notes(data, notes))
    bad.chmod(0o755)
    out = urewrite(str(bad), "-p", "usdt:fz:*", "-o", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "urewrite: warning: not probing fz:b: argument 1 '8f@%xmm0' cannot be read: a "
        "floating-point value (trace records integers)",
        f"urewrite: wrote {tmp_path / 'out'}: 2 probes at 2 sites, 1 refused"]
    assert run([tmp_path / "out"]).stdout == run([bad]).stdout


# random damage: (section, how many damaged copies)
DAMAGED = [(".note.stapsdt", 40), (".symtab", 15), (".strtab", 15), (".eh_frame", 30)]


def _damaged(data: bytes, section: tuple, rng) -> bytes:
    _, offset, size = section
    out = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 4, 16])):
        at = offset + rng.randrange(size)
        if rng.random() < 0.6:
            out[at] = rng.choice([rng.randrange(256), 0, 0xFF, 0x7F, 0x80])
        elif at + 4 <= offset + size:
            struct.pack_into("<I", out, at, rng.choice([0, 0xFFFFFFFF, 0x7FFFFFFF,
                                                         rng.randrange(1 << 32)]))
    return bytes(out)


def test_damaged_notes_symbols_and_unwind_tables_never_give_a_traceback(sdt_program, tmp_path):
    import random
    rng = random.Random(37)
    _, data, sections, _ = sdt_program
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    pads = tmp_path / "landing_pads"
    check(["g++", "-O2", Path(__file__).resolve().parent.parent / "samples" / "landing_pads.cc",
           "-o", pads])
    pads_data = pads.read_bytes()
    pads_sections = _section_headers(pads_data)
    jobs = []
    for name, count in DAMAGED + [(".gcc_except_table", 30)]:
        source, where, probes = (pads_data, pads_sections, ["-p", "*"]) \
            if name == ".gcc_except_table" else (data, sections, ["-p", "usdt:*:*", "-p", "work"])
        for k in range(count):
            path = tmp_path / f"{name.strip('.')}-{k}"
            path.write_bytes(_damaged(source, where[name], rng))
            jobs += [["list", "--json", path],
                     [path, *probes, "--keep-going", "-o", f"{path}.out"]]
    for result in _commands(jobs, tmp_path):
        _assert_no_traceback(result)
