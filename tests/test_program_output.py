"""Probe programs print their maps as bpftrace does: held to bpftrace itself where it
runs here (kernel uprobes on the same workload, its text and its JSON), and to
output bpftrace 0.17 printed, kept below, where it does not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from probe_programs import ties_sorted
from conftest import kernel_tracing_alone, uprobes_unavailable
from urewrite.programs import output
from urewrite.programs.checks import check
from urewrite.programs.evaluate import Hit, State, run_block
from urewrite.programs.output import MapData, hist_bucket, lhist_bucket
from urewrite.programs.parser import parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "samples", "programs", "values.c")
CALLS = 1000

PROGRAM = """
uprobe:{path}:work {{
    @c[arg1] = count(); @two[arg1, arg1 % 2] = count();
    @h = hist(arg0 - 300); @hk[arg1 % 2] = hist(arg0 * 1000003);
    @l = lhist(arg0, 100, 600, 100); @lk[arg1 % 2] = lhist(arg0, 0, 1000, 500);
    @s[arg1] = sum(arg0); @a = avg(arg0); @ak[arg1 % 2] = avg(arg0);
    @mi = min(arg0 - 500); @ma = max(arg0); @st = stats(arg0); @stk[arg1 % 3] = stats(arg0);
    @v = arg0; @z[arg1] = 5; @ = count();
}}
uretprobe:{path}:work /(int64)retval < 0/ {{ @r = hist(retval); @neg = min(retval); }}
uprobe:{path}:work /arg0 - 500 > 100/ {{
    @wrapped = count(); $x = arg0 / 7 + arg0 % 5 - (arg0 << 2 >> 3); @calc = sum($x);
    if (arg1 > 3) {{ @big++ }} else if (arg1 == 0) {{ @zero += 2 }} else {{ @small = max(arg1 * 2) }}
    @t[arg0 & 1 ? 10 : 20] = count(); @c8 = sum((int8)arg0); @neg8[(int8)(arg0 * 3) < 0] = count();
    @tern = (arg1 < 100 ? -1 : arg0); @ternu = (arg1 > 100 ? arg0 : -1);
    @terns = sum(-(arg1 < 100 ? 5 : arg0));
}}
"""


def _from_bpftrace_json(line: dict, kinds) -> MapData:
    """bpftrace's JSON for one map, as the MapData our printer takes."""
    (name, body), = line["data"].items()
    info = kinds[name[1:]]
    data = MapData(name[1:], info.kind, lhist=info.lhist)
    entries = body if info.keys else {"": body}
    for key_text, value in entries.items():
        key = tuple(int(k) if t == "int" else k
                    for k, t in zip(key_text.split(","), info.keys)) if info.keys else ()
        if info.kind == "avg":
            value = (1, value)
        elif info.kind == "stats":
            value = (value["count"], value["total"])
        elif info.kind in ("hist", "lhist"):
            buckets = [0] * (output.HIST_BUCKETS if info.kind == "hist"
                             else (info.lhist[1] - info.lhist[0]) // info.lhist[2] + 2)
            for bucket in value:
                low = bucket.get("min")
                if info.kind == "hist":
                    index = 0 if low is None else hist_bucket(low)
                else:
                    index = 0 if low is None else lhist_bucket(low, *info.lhist)
                buckets[index] = bucket["count"]
            value = buckets
        data.entries[key] = value
    return data


@pytest.fixture(scope="module")
def values(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    out = str(tmp_path_factory.mktemp("programs") / "values")
    subprocess.run(["gcc", "-O2", SAMPLE, "-o", out], check=True)
    return out


@pytest.fixture(scope="module")
def bpftrace_run(values):
    """bpftrace's text and JSON output of PROGRAM over `values 1000`, with kernel uprobes."""
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace is not installed")
    why = uprobes_unavailable()
    if why:
        pytest.skip(f"bpftrace needs kernel uprobes: {why}")
    program = PROGRAM.format(path=values)
    runs = {}
    with kernel_tracing_alone():
        for form in ("text", "json"):
            proc = subprocess.run(["bpftrace", "-f", form, "-e", program, "-c", f"{values} {CALLS}"],
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr
            runs[form] = proc.stdout
    theirs_json = [json.loads(line) for line in runs["json"].splitlines() if line.startswith("{")]
    # what bpftrace prints after the program's own output: its maps
    return program, runs["text"].split("\n\n\n", 1)[1], \
        [line for line in theirs_json if line["type"] in ("map", "hist", "stats")]


def test_maps_print_as_bpftrace_prints_them(bpftrace_run):
    program, theirs_text, theirs_json = bpftrace_run
    kinds = check(parse(program)).maps
    maps = [_from_bpftrace_json(line, kinds) for line in theirs_json]
    assert {m.name for m in maps} == set(kinds)
    assert ties_sorted(output.text(maps)) == ties_sorted(theirs_text)
    assert [json.loads(line) for line in output.json_lines(maps)] == theirs_json


def test_programs_mean_what_they_mean_in_bpftrace(bpftrace_run):
    """The reference evaluator, given the hits the workload makes, builds the maps bpftrace
    built from kernel uprobes: the same arithmetic, signedness, filters and aggregations."""
    program, theirs_text, _ = bpftrace_run
    checked = check(parse(program))
    state = State(checked)
    entries = [b for b in checked.program.blocks if b.probes[0].kind == "uprobe"]
    exits = [b for b in checked.program.blocks if b.probes[0].kind == "uretprobe"]
    for i in range(CALLS):
        for block in entries:
            run_block(state, block, Hit(block.probes[0], "work", args=(i, i % 7)))
        result = i * 3 - (i % 7) * 500
        for block in exits:
            run_block(state, block, Hit(block.probes[0], "work", retval=result & ((1 << 64) - 1)))
    assert ties_sorted(output.text(list(state.maps.values()))) == ties_sorted(theirs_text)


RANDOM_CALLS = 300


def _printed_maps(stdout: str) -> list:
    """The map lines a run printed (the command's own output, a number, left out), in
    order of their text: entries of equal value come in an order of bpftrace's own."""
    return sorted(line for line in stdout.splitlines() if line.strip() and
                  not line.startswith("Attaching") and not line.lstrip("-").isdigit())


def test_random_programs_print_as_bpftrace_prints_them(values, tmp_path):
    """Random integer programs (probe_programs.ComparableProgram: every operator, width
    and sign, casts of casts, ?:, && and ||, variables, maps read back, keyed
    aggregations, if/else) under bpftrace with kernel uprobes on values.c and under
    `urewrite run` on its rewrite: the same maps. (What bpftrace 0.17 does differently
    on purpose or by its own bugs, docs/programs.md lists, is left out of them.) A
    program bpftrace cannot load (its verifier) is not compared."""
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace is not installed")
    why = uprobes_unavailable()
    if why:
        pytest.skip(f"bpftrace needs kernel uprobes: {why}")
    from conftest import urewrite
    from probe_programs import ComparableProgram
    rewritten = tmp_path / "values.probed"
    compared = 0
    for seed in range(12):
        text = ComparableProgram(seed).program()
        ours = text.replace("./v:", f"{rewritten}:")
        proc = urewrite(values, "-e", ours, "-o", str(rewritten), "-q")
        assert proc.returncode == 0, proc.stderr
        ran = urewrite("run", "-e", ours, "--", str(rewritten), str(RANDOM_CALLS))
        assert ran.returncode == 0, ran.stderr
        with kernel_tracing_alone():
            theirs = subprocess.run(["bpftrace", "-e", text.replace("./v:", f"{values}:"),
                                     "-c", f"{values} {RANDOM_CALLS}"], capture_output=True,
                                    text=True, timeout=120)
        if theirs.returncode != 0 and "Error loading program" in theirs.stderr:
            continue
        assert theirs.returncode == 0, theirs.stderr
        assert _printed_maps(ran.stdout) == _printed_maps(theirs.stdout), text
        compared += 1
    assert compared >= 8


# -- without bpftrace: what it printed for the same maps ------------------------------

def test_histograms_as_bpftrace_draws_them():
    h = MapData("h", "hist")
    buckets = [0] * output.HIST_BUCKETS
    for value in [-5] * 300 + [0, 1, 2, 3] + list(range(4, 700)):
        buckets[hist_bucket(value)] += 1
    h.entries[()] = buckets
    l = MapData("l", "lhist", lhist=(100, 600, 100))
    lb = [0] * 7
    for value in range(1000):
        lb[lhist_bucket(value, 100, 600, 100)] += 1
    l.entries[()] = lb
    big = MapData("big", "hist")
    bb = [0] * output.HIST_BUCKETS
    for value in (3 << 20, 1 << 30, (1 << 30) + 5, 1 << 40):
        bb[hist_bucket(value)] += 1
    big.entries[("k",)] = bb
    assert output.text([h, l, big]) == """\
@big[k]: 
[2M, 4M)               1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |
[4M, 8M)               0 |                                                    |
[8M, 16M)              0 |                                                    |
[16M, 32M)             0 |                                                    |
[32M, 64M)             0 |                                                    |
[64M, 128M)            0 |                                                    |
[128M, 256M)           0 |                                                    |
[256M, 512M)           0 |                                                    |
[512M, 1G)             0 |                                                    |
[1G, 2G)               2 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[2G, 4G)               0 |                                                    |
[4G, 8G)               0 |                                                    |
[8G, 16G)              0 |                                                    |
[16G, 32G)             0 |                                                    |
[32G, 64G)             0 |                                                    |
[64G, 128G)            0 |                                                    |
[128G, 256G)           0 |                                                    |
[256G, 512G)           0 |                                                    |
[512G, 1T)             0 |                                                    |
[1T, 2T)               1 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |

@h: 
(..., 0)             300 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[0]                    1 |                                                    |
[1]                    1 |                                                    |
[2, 4)                 2 |                                                    |
[4, 8)                 4 |                                                    |
[8, 16)                8 |@                                                   |
[16, 32)              16 |@@                                                  |
[32, 64)              32 |@@@@@                                               |
[64, 128)             64 |@@@@@@@@@@@                                         |
[128, 256)           128 |@@@@@@@@@@@@@@@@@@@@@@                              |
[256, 512)           256 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@        |
[512, 1K)            188 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@                    |

@l: 
(..., 100)           100 |@@@@@@@@@@@@@                                       |
[100, 200)           100 |@@@@@@@@@@@@@                                       |
[200, 300)           100 |@@@@@@@@@@@@@                                       |
[300, 400)           100 |@@@@@@@@@@@@@                                       |
[400, 500)           100 |@@@@@@@@@@@@@                                       |
[500, 600)           100 |@@@@@@@@@@@@@                                       |
[600, ...)           400 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

"""


def test_scalars_averages_and_stats_as_bpftrace_prints_them():
    c = MapData("c", "count", {(6,): 142, (2,): 143, (0,): 143})
    a = MapData("ak", "avg", {(0,): (2, 998), (1,): (2, 1001)})
    negative = MapData("n", "avg", {(): (2, -7)})  # rounds toward zero, as C divides
    st = MapData("sk", "stats", {(0,): (428, 213500), (2,): (286, 143143), (1,): (286, 142857)})
    plain = MapData("", "count", {(): 10})
    words = MapData("w", "sum", {("", 0): 249500, ("beta", 1): 2})
    assert output.text([c, a, negative, st, plain, words]) == """\
@: 10
@ak[0]: 499
@ak[1]: 500

@c[6]: 142
@c[0]: 143
@c[2]: 143
@n: -3

@sk[0]: count 428, average 498, total 213500
@sk[1]: count 286, average 499, total 142857
@sk[2]: count 286, average 500, total 143143

@w[beta, 1]: 2
@w[, 0]: 249500
"""
    assert [json.loads(line) for line in output.json_lines([plain, st, words])] == [
        {"type": "map", "data": {"@": 10}},
        {"type": "stats", "data": {"@sk": {"0": {"count": 428, "average": 498, "total": 213500},
                                           "1": {"count": 286, "average": 499, "total": 142857},
                                           "2": {"count": 286, "average": 500, "total": 143143}}}},
        {"type": "map", "data": {"@w": {"beta,1": 2, ",0": 249500}}},
    ]


def test_printf_integer_widths_as_bpftrace_prints_them():
    """printf()'s integer conversions print the width their length says, as C's and
    bpftrace 0.17's (what it printed for this value, each conversion alone)."""
    from urewrite.programs.evaluate import printf_text
    value = (4294967298 + 65536 * 7 + 300 - 2000000000000) % 2**64
    printed = {"zd": "-1995704573650", "jd": "-1995704573650", "td": "-1995704573650",
               "hd": "-7890", "hhd": "46", "lu": "18446742078004977966", "X": "56BCE12E",
               "llx": "fffffe2f56bce12e", "hu": "57646", "c": ".", "p": "0xfffffe2f56bce12e",
               "o": "12657160456", "lld": "-1995704573650", "5d": "1455218990",
               "-8x": "56bce12e"}
    for conversion, text in printed.items():
        assert printf_text(f"[%{conversion}]", [value]) == f"[{text}]", conversion


def test_maps_that_hold_nothing_as_bpftrace_prints_them():
    """Maps no hit wrote (or whose entries were deleted or cleared), as bpftrace 0.17
    printed them at exit (`if (arg0 > 100000) { @x = 1; @c = count(); ... }` on
    values.c; the same after clear()): a count() without keys is 0, every other map an
    empty line (an avg()'s and a stats()'s two), and in -f json only the count."""
    maps = [MapData("a", "avg", keyed=False), MapData("c", "count", keyed=False),
            MapData("h", "hist", keyed=False), MapData("k", "value", keyed=True),
            MapData("kc", "count", keyed=True), MapData("s", "sum", keyed=False),
            MapData("x", "value", keyed=False)]
    assert output.text(maps) == "\n\n@c: 0\n\n\n\n\n\n"
    assert [json.loads(line) for line in output.json_lines(maps)] == \
        [{"type": "map", "data": {"@c": 0}}]


def test_print_with_top_and_div_as_bpftrace_prints_it():
    """print(@m, top, div) (checked against bpftrace end to end in test_program_run):
    the largest `top` entries (0: all), values divided toward zero by `div` (0: as 1);
    a histogram's counts divided but its bars and buckets as they were; an lhist()'s
    and a stats()'s left whole; an empty avg() or stats() map prints two blank lines."""
    s = MapData("s", "sum", {(0,): 71500, (1,): -71550, (2,): 71600})
    h = MapData("h", "hist", {(0,): [0, 0, 0, 9] + [0] * 62, (1,): [0, 0, 0, 99, 14] + [0] * 61})
    st = MapData("st", "stats", {(0,): (4, 8), (1,): (2, 2)})
    empty = MapData("e", "avg", {})
    assert output.text([s], 2, 10) == "@s[0]: 7150\n@s[2]: 7160\n"
    assert output.text([s], 0, 0) == output.text([s]) and output.text([s], 9) == output.text([s])
    assert output.text([s], 1, 3) == "@s[2]: 23866\n" and "@s[1]: -23850" in output.text([s], 0, 3)
    assert output.text([h], 1, 10) == f"""\
@h[1]: 
[2, 4)                 9 |{'@' * 52}|
[4, 8)                 1 |{'@' * 7:<52}|

"""
    assert output.text([st], 1, 10) == output.text([st])
    assert output.text([empty]) == "\n\n"
    checked = check(parse('uprobe:a:f { @m = count(); print(@m, 2, 10); print(@m, 3); }'))
    assert checked is not None
    with pytest.raises(Exception, match="top and div are integers written as numbers"):
        check(parse('uprobe:a:f { @m = count(); $t = 2; print(@m, $t); }'))
