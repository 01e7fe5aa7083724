"""Probe programs, the language: what parses and checks, what is refused and where,
and `urewrite IN -e PROGRAM`, which rewrites a file with the probes a program names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import urewrite
from urewrite.programs.checks import check
from urewrite.programs.parser import ProgramError, parse
from urewrite.programs.probes import rewrite_specs
from urewrite.programs.syntax import Assign, Binary, Cast, Dereference, If, Map

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "samples", "programs", "values.c")

# bpftrace's user-space one-liners and bcc's user-space tools' questions, as users type them
ONE_LINERS = [
    'uprobe:/bin/bash:readline { @[comm] = count(); }',
    'uretprobe:/bin/bash:readline { printf("read a line: %d\\n", retval); }',
    'uprobe:./app:processCommand /arg0 != 0/ { @[str(arg1)] = count(); }',
    'uprobe:./app:call { @s[tid] = nsecs; } '
    'uretprobe:./app:call /@s[tid]/ { @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }',
    'usdt:./app:query { @q[str(arg0, 32)] = count(); @bytes = sum(arg1); }',
    'usdt:./postgres:postgresql:query__start { @[pid] = count() } END { printf("done\\n"); }',
    'uprobe:*:malloc { @sizes = hist(arg0); @total = sum(arg0); @big = lhist(arg0, 0, 4096, 512); }',
    'u:./app:f, ur:./app:f { @[probe, func] = count(); }',
    'uprobe:./app:parse+0x10, uprobe:./app:0x401136 { @hits++; }',
    'uprobe:./app:"app::Srv::handle" { @x = avg(arg1); @y = min(arg1); @z = max(arg1); @st = stats(arg1) }',
    'uprobe:./app:cpp:app::parse { $len = arg1 * 2 + 1; @l = lhist($len, 0, 100, 10); }',
    'uprobe:./app:f { if (arg0 > 10) { @big++ } else if (arg0 == 0) { @zero++ } else { @small++ } }',
    'uprobe:./app:f /(arg0 / 2) > 1 && arg1 != 3 || !arg2/ { @[arg0 % 4, arg1 & 0xff] = count() }',
    'uprobe:./app:f { @v[tid] = *(uint32 *)(arg0 + 8); @w = (int8)arg1 < 0 ? -1 : 1; }',
    '// a comment\nBEGIN { printf("tracing\\n"); } /* another */ uprobe:./app:f { @ = count(); exit(); }',
]


@pytest.mark.parametrize("text", ONE_LINERS)
def test_one_liners_parse_and_check(text):
    program = parse(text)
    check(program)
    assert program.blocks


def test_what_the_parts_are():
    program = parse('uprobe:./a:f+16, uretprobe:"./my app":ns::g, usdt:/x/lib.so:prov:name, '
                    'usdt:lib:bare /(arg0 / 2)/ { @m[arg0] += 2; if (!arg1) { $v = *(int16 *)arg1 } }')
    block, = program.blocks
    a, b, c, d = block.probes
    assert (a.kind, a.path, a.function, a.offset) == ("uprobe", "./a", "f", 16)
    assert (b.kind, b.path, b.function) == ("uretprobe", "./my app", "ns::g")
    assert (c.kind, c.path, c.provider, c.name) == ("usdt", "/x/lib.so", "prov", "name")
    assert (d.provider, d.name) == ("*", "bare")
    # the first slash after the probes opens the filter; a top-level one closes it
    assert isinstance(block.predicate, Binary) and block.predicate.operator == "/"
    assign, branch = block.body
    assert isinstance(assign, Assign) and assign.operator == "+" and isinstance(assign.target, Map)
    assert isinstance(branch, If)
    read = branch.then[0].value
    assert isinstance(read, Dereference) and isinstance(read.operand, Cast)
    assert (read.operand.type, read.operand.pointer) == ("int16", 1)
    # C's precedence
    expr = parse("BEGIN { $x = 1 + 2 * 3 << 1 == 14 }").blocks[0].body[0].value
    assert expr.operator == "==" and expr.left.operator == "<<" and expr.left.left.operator == "+"


REFUSED = [
    ("kprobe:do_sys_open { }", "1:1", "unknown probe type 'kprobe'"),
    ("uprobe:./a { }", "1:1", "a uprobe probe is uprobe:PATH:FUNCTION"),
    ("uretprobe:./a:f+4 { }", "1:1", "an offset takes an entry probe"),
    ("uprobe:./a:f { @a = count(); @a = hist(1) }", "1:30", "@a is a count() map elsewhere, a hist() map here"),
    ("uprobe:./a:f { @a[1] = count(); }\nuprobe:./a:g { @a = count() }", "2:16", "@a has 1 key(s)"),
    ("uprobe:./a:f { @a[1] = count(); @a[\"x\"] = count() }", "1:33", "key 1 is a int elsewhere, a string here"),
    ('uprobe:./a:f { printf("%d %s\\n", 1) }', "1:16", "the format has 2 conversion(s) for 1 value(s)"),
    ('uprobe:./a:f { printf("%s\\n", 1) }', "1:31", "%s is given an int"),
    ("uprobe:./a:f { @x = retval }", "1:21", "retval exists in uretprobe blocks only"),
    ("uretprobe:./a:f { @x = arg0 }", "1:24", "arg0 exists in uprobe and usdt blocks only"),
    ("uprobe:./a:f { @x = arg9 }", "1:21", "unknown builtin 'arg9' (urewrite reads arg0 to arg7, farg0"),
    # floating point (docs/programs.md): compared, converted, printed, never computed with
    ("uprobe:./a:f { @x = farg0 + 1 }", "1:27", "'+': floating-point values are compared"),
    ("uprobe:./a:f /farg0/ { }", "1:15", "a filter must be an integer, not a double"),
    ("uprobe:./a:f { @x = farg0 < arg0 }", "1:29", "compares a floating-point value with an integer"),
    ("uprobe:./a:f { @x = (float)farg0 < farg1 }", "1:34", "compares a float with a double"),
    ('uprobe:./a:f { printf("%d", farg0) }', "1:29", "%d is given a double (convert it"),
    ('uprobe:./a:f { printf("%f", arg0) }', "1:29", "%f is given an int"),
    ("uretprobe:./a:f { @x = farg0 }", "1:24", "farg0 exists in uprobe blocks only"),
    ("usdt:./a:p:n { @x = farg1 }", "1:21", "farg1 exists in uprobe blocks only"),
    ("uprobe:./a:f { @x = fretval }", "1:21", "fretval exists in uretprobe blocks only"),
    ("uprobe:./a:f { @x = (float)arg0 }", "1:21", "(float) says that a register holds a float"),
    ("uprobe:./a:f { $d = farg0; @x = (float)$d }", "1:33", "(float) says that a register"),
    ("uprobe:./a:f { @x = (double)arg0 }", "1:21", "(double) takes a double, not an int"),
    ("uprobe:./a:f { @x = -farg0 }", "1:22", "'-'s operand must be an integer, not a double"),
    ("uprobe:./a:f { $x = farg0; $x += 1 }", "1:34", "$x +=: floating-point values are compared"),
    ("uprobe:./a:f { @x = arg0 * 1.5 }", "1:26", "'*': floating-point values are compared"),
    ("uprobe:./a:f { @x = 1.5.2 }", "1:21", "not a number: 1.5."),
    # a plain value is of one type (a string's is copied from where the value points)
    ('uprobe:./a:f { @x = "a"; @x = 1 }', "1:26", "@x holds a string elsewhere, an int here"),
    ("uprobe:./a:f { @x = farg0; @x = (float)farg0 }", "1:28", "@x holds a double elsewhere, a float"),
    ("uprobe:./a:f { @x = arg0; }\nuprobe:./a:g { @x = farg0 }", "2:16", "@x holds an int elsewhere"),
    ('uprobe:./a:f { $x = 1 + "a" }', "1:23", "'+' takes numbers"),
    ("uprobe:./a:f { @ = count() ", "1:28", "expected ';' or '}'"),
    ("uprobe:./a:f { count() }", "1:16", "count() must be assigned to a map"),
    ("uprobe:./a:f { $x = count() }", "1:21", "count() goes into a map, not $x"),
    ("uprobe:./a:f { @x = $y }", "1:21", "$y is used before it is assigned"),
    ("uprobe:./a:f { @x = @nowhere }", "1:21", "@nowhere is read, and no probe assigns it"),
    ("uprobe:./a:f { @h = hist(1); @x = @h }", "1:35", "@h is a hist(), which is printed, not read"),
    ("uprobe:./a:f { @l = lhist(arg0, 0, arg1, 1) }", "1:36", "lhist()'s min, max and step are numbers"),
    ("uprobe:./a:f { @l = lhist(arg0, 10, 0, 1) }", "1:21", "needs min < max"),
    ("uprobe:./a:f { @x = *(arg0) }", "1:21", "a pointer read names its type"),
    ("uprobe:./a:f { @x = nope(1) }", "1:21", "unknown function nope()"),
    ("uprobe:./a:f { delete(@m) }", "1:23", "delete(@m): no probe assigns @m"),
    ('uprobe:./a:f { @x = "abc }', "1:21", "a string that does not end"),
    ("uprobe:./a:f { @x = 12ab }", "1:21", "not a number: 12a"),
    ("uprobe:./a:f { 3 = 4 }", "1:18", "only a $variable or an @map can be assigned to"),
    ("", None, "no probe"),
    ("uprobe:./a:f { } /* open", "1:18", "a comment that does not end"),
]


@pytest.mark.parametrize("text,where,message", REFUSED)
def test_refusals_point_at_the_text(text, where, message):
    with pytest.raises(ProgramError) as caught:
        check(parse(text))
    shown = str(caught.value)
    assert message in shown
    assert "\n" not in shown
    if where:
        assert shown.startswith(f"program:{where}: "), shown


def test_specs_for_a_file():
    program = parse('uprobe:./build/app.probed:f, uprobe:app:g+8, uprobe:*:0x1234 { @ = count() } '
                    'uretprobe:/elsewhere/app:f { @r = count() } usdt:./app:p:n, usdt:app:m { @u = count() } '
                    'uprobe:./libother.so:h { @o = count() } BEGIN { }')
    specs = rewrite_specs(program, ["app", "build/app.probed"])
    assert specs.entries == ["f", "g+0x8", "0x1234", "usdt:p:n", "usdt:*:m"]
    assert specs.returns == ["f"]
    assert specs.elsewhere == ["uprobe:./libother.so:h"]
    with pytest.raises(ProgramError, match=r"names no probe in other \(it names ./app, app\)"):
        rewrite_specs(parse("uprobe:./app:f, usdt:app:p:n { @ = count() }"), ["other"])


# -- urewrite IN -e PROGRAM -------------------------------------------------------------

@pytest.fixture(scope="module")
def values(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    out = tmp_path_factory.mktemp("programs") / "values"
    subprocess.run(["gcc", "-O2", SAMPLE, "-o", str(out)], check=True)
    return out


def _second_instruction(binary, function):
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(binary)],
                          capture_output=True, text=True, check=True).stdout
    body = dump.split(f"<{function}>:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    first, second = (int(line.split(":")[0], 16) for line in body[:2])
    return second - first


def test_rewrite_with_the_probes_a_program_names(values, tmp_path):
    offset = _second_instruction(values, "work")
    out = tmp_path / "values.probed"
    program = (f"uprobe:./values.probed:work /arg0 > 1/ {{ @[arg1] = count(); }}\n"
               f"uretprobe:values:work {{ @r = hist(retval); }}\n"
               f"uprobe:*:work+{offset}, uprobe:{values}:named {{ @n = count(); }}\n"
               f"usdt:./libother.so:p:n {{ @u = count(); }}")
    proc = urewrite(str(values), "-e", program, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "leaving out the probes of other files: usdt:./libother.so:p:n" in proc.stderr
    report = tmp_path / "report.json"
    stat = urewrite("stat", "--json", "-o", str(report), "--", str(out), "1000")
    assert stat.returncode == 0, stat.stderr
    hits = {(p["name"], p["kind"]): p["hits"] for p in json.loads(report.read_text())["probes"]}
    assert hits == {("work", "entry"): 1000, ("work", "return"): 1000,
                    (f"work+{offset:#x}", "address"): 1000, ("named", "entry"): 1000}


def test_a_bad_program_writes_nothing(values, tmp_path):
    out = tmp_path / "never"
    for args, message in (
            (["-e", "uprobe:values:work { @ = cnt() }"], "program:1:26: unknown function cnt()"),
            (["-e", "uprobe:./zz:work { @ = count() }"], "names no probe in values (it names ./zz)"),
            (["-f", str(tmp_path / "missing.bt")], "cannot read the program"),
            (["-e", "uprobe:values:nosuch { @ = count() }"], "no function named 'nosuch'")):
        proc = urewrite(str(values), *args, "-o", str(out))
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
    script = tmp_path / "prog.bt"
    script.write_text("uprobe:values:work { @ = count(); }\n")
    proc = urewrite(str(values), "-f", str(script), "-o", str(out), "-q")
    assert proc.returncode == 0 and out.exists()


def test_a_program_reads_only_the_arguments_the_file_records(values, tmp_path):
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.trampolines.region import template_probe_arguments, template_probes
    out = tmp_path / "values.one"
    proc = urewrite(str(values), "-p", "work", "-r", "work", "-p", "named", "--args", "1",
                    "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    elf = ElfFile.open(str(out))
    section = elf.section_named(".urewrite.rodata")
    template = elf.data[section.offset:section.offset + section.size]
    carried = {(name, kind): n for (name, kind, _), n in
               zip(template_probes(template), template_probe_arguments(template))}
    assert carried == {("work", 1): 1, ("work", 2): 1, ("named", 1): 1}  # (a return: its value)
    # arg1 would read 0 where the program expects the call's: refused, with the rewrite
    proc = urewrite("run", "-e", f"uprobe:{out}:work {{ @[arg1] = count(); }}", "--", str(out), "70")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"{out} records 1 argument at work, the program reads arg1: rewrite the original " \
           "with --args 2" in proc.stderr
    proc = urewrite("run", "-e", f"uprobe:{out}:work {{ @[arg0 % 2] = count(); }} "
                    f"uretprobe:{out}:work /(int64)retval < 0/ {{ @negative = count(); }}", "--",
                    str(out), "70")
    assert proc.returncode == 0, proc.stderr
    # work(i, i % 7) = 3i - 500 (i % 7): negative for 60 of the 70 calls (bpftrace: the same)
    assert "@[0]: 35\n@[1]: 35\n" in proc.stdout and "@negative: 60\n" in proc.stdout, proc.stdout


def test_a_file_of_an_earlier_rewrite_is_refused_not_silently_left_out(values, tmp_path):
    """A probe table that does not say what its probes carry is an earlier urewrite's,
    whose runtime maps no program of this one: run says so instead of counting 0."""
    import struct
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.trampolines import region
    out = tmp_path / "values.earlier"
    assert urewrite(str(values), "-p", "work", "-o", str(out), "-q").returncode == 0
    section = ElfFile.open(str(out)).section_named(".urewrite.rodata")
    data = bytearray(out.read_bytes())
    template = section.offset
    count, = struct.unpack_from("<I", data, template + region.OFF_PROBE_COUNT)
    probes, = struct.unpack_from("<Q", data, template + region.OFF_PROBES)
    for i in range(count):  # (as an earlier rewrite wrote them: bits 8-15 clear)
        at = template + probes + i * region.PROBE_ENTRY_SIZE + 8
        kind, = struct.unpack_from("<I", data, at)
        struct.pack_into("<I", data, at, kind & ~(0xFF << region.ARGUMENTS_SHIFT))
    out.write_bytes(bytes(data))
    proc = urewrite("run", "-e", f"uprobe:{out}:work {{ @ = count(); }}", "--", str(out), "5")
    assert proc.returncode == 1 and "was rewritten by an earlier urewrite" in proc.stderr, \
        proc.stderr


def test_a_runtime_of_an_older_program_format_is_refused(values, tmp_path):
    """A runtime that maps program files of another magic (its context shorter: a
    callback's stub would write past it) runs none of this tracer's: refused, in one
    line. (The file's runtime made to look for URWPROG2, as the one before did.)"""
    from urewrite.trampolines import program_file
    out = tmp_path / "values.older"
    assert urewrite(str(values), "-p", "work", "-o", str(out), "-q").returncode == 0
    data = out.read_bytes()
    ours = program_file.MAGIC.to_bytes(8, "little")
    assert data.count(ours) == 1  # (the runtime's own constant)
    out.write_bytes(data.replace(ours, b"URWPROG2"))
    proc = urewrite("run", "-e", f"uprobe:{out}:work {{ @ = count(); }}", "--", str(out), "5")
    assert proc.returncode == 1 and "was rewritten by an earlier urewrite" in proc.stderr, \
        proc.stderr


BUILT_IN = ("uprobe:values:work /arg0 > 10/ {{ @c[arg1] = count(); @h = hist(arg0); }} "
            "uretprobe:values:work {{ @r = sum((int64)retval); @big[retval > {limit}] = count(); }}")


def test_a_program_built_in_runs_whenever_the_probes_are_armed(values, tmp_path):
    """`urewrite IN -e PROGRAM` builds the program into the probes: under `stat` (and
    in processes of a --dir directory) it runs, and stat shows its maps, the ones
    `urewrite run` gathers with the same program."""
    program = BUILT_IN.format(limit=1000)
    out = tmp_path / "values"
    proc = urewrite(str(values), "-e", program, "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "again").mkdir()  # (reproducible: the same bytes each time, under one name)
    again = tmp_path / "again" / "values"
    assert urewrite(str(values), "-e", program, "-o", str(again), "-q").returncode == 0
    assert again.read_bytes() == out.read_bytes()
    report = tmp_path / "report.json"
    stat = urewrite("stat", "--json", "-o", str(report), "--", str(out), "300")
    assert stat.returncode == 0, stat.stderr
    (built_in,) = json.loads(report.read_text())["programs"]
    ran = urewrite("run", "--json", "-e", program, "--", str(out), "300")
    assert ran.returncode == 0, ran.stderr
    loaded = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    assert built_in == {"maps": loaded, "dropped": 0, "faults": 0}
    assert {"type": "map", "data": {"@r": sum(3 * i - 500 * (i % 7) for i in range(300))}} \
        in loaded
    interval = urewrite("stat", "--interval", "0.2", "--", str(out), "300")
    assert interval.returncode == 0, interval.stderr
    assert f"@r: {sum(3 * i - 500 * (i % 7) for i in range(300))}\n" in interval.stdout
    # two processes of a directory: their maps added up
    directory = tmp_path / "dir"
    directory.mkdir()
    for _ in range(2):
        subprocess.run([str(out), "300"], check=True, capture_output=True,
                       env=dict(os.environ, UREWRITE_DIR=str(directory)))
    watched = urewrite("stat", "--dir", str(directory), "--duration", "0.1")
    assert watched.returncode == 0, watched.stderr
    assert "the program built into the probes:" in watched.stdout
    assert f"@r: {2 * sum(3 * i - 500 * (i % 7) for i in range(300))}\n" in watched.stdout


def test_a_program_that_prints_is_not_built_in(values, tmp_path):
    out = tmp_path / "values"
    proc = urewrite(str(values), "-e", 'uprobe:values:work { printf("%d\\n", arg0); }',
                    "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "the program is not built in (it has printf(), exit(), print(), clear() or " \
        "zero(): a tracer's work): load it with urewrite run" \
        in proc.stderr
    stat = urewrite("stat", "--json", "-o", str(tmp_path / "r.json"), "--", str(out), "3")
    assert stat.returncode == 0 and "programs" not in json.loads((tmp_path / "r.json").read_text())
