"""Names as asked: a probe is reported under the name the user gave it.

samples/aliases.c has one function with three names (__sum_impl, sum, total),
entered 7 times; every command must report it under the name that was asked for,
count it once, and accept each name everywhere (-p, -r, globs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap

import pytest

from conftest import stat, urewrite

CALLS = 7  # samples/aliases.c without arguments
NAMES = ("__sum_impl", "sum", "total")


@pytest.fixture(scope="module")
def aliases(builder):
    built = builder.build("aliases", ["aliases.c"], ["-O2"])
    assert len({built.own_functions[n] for n in NAMES}) == 1  # three names, one address
    return built


def _rewrite(built, tmp_path, *args):
    out = tmp_path / "aliases.probed"
    proc = urewrite(built.path, *args, "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout), proc.stderr


def _probes_at(result: dict, address: int):
    return sorted({(p["name"], p["kind"]) for p in result["probes"]
                   if p["address"] == address or p["kind"] == "return"})


def _stat_hits(probed, tmp_path) -> dict:
    run = stat([probed], tmp_path)
    assert run.proc.returncode == 0 and run.proc.stdout == "sum=42\n"
    return {(p["name"], p["kind"]): p["hits"] for p in run.probes}


def test_list_shows_every_name_of_a_function(aliases):
    address = aliases.own_functions["sum"]
    rows = json.loads(urewrite("list", aliases.path, "--json").stdout)["functions"]
    [row] = [r for r in rows if r["address"] == address]
    assert sorted([row["name"], *row["aliases"]]) == sorted(NAMES)
    assert [r["aliases"] for r in rows if r["name"] == "twice"] == [[]]
    text = urewrite("list", aliases.path).stdout.splitlines()
    [line] = [line for line in text if line.startswith(f"{address:#018x}")]
    shown = " = ".join([row["name"], *row["aliases"]])
    assert f"  {shown}  ok, displaces" in line


@pytest.mark.parametrize("name", NAMES)
def test_each_name_reports_as_given_in_rewrite_stat_trace_and_region(aliases, tmp_path, name):
    probed, result, _ = _rewrite(aliases, tmp_path, "-p", name)
    address = aliases.own_functions["sum"]
    assert _probes_at(result, address) == [(name, "entry")]
    assert _stat_hits(probed, tmp_path) == {(name, "entry"): CALLS}
    events = tmp_path / "events.jsonl"
    proc = urewrite("trace", "--json", "-o", events, "--", probed)
    assert proc.returncode == 0, proc.stderr
    probes = [json.loads(line)["probe"] for line in events.read_text().splitlines()]
    assert probes == [name] * CALLS
    text = urewrite("trace", "--", probed).stdout
    assert text.count(f"aliases.probed:{name}\n") == CALLS


def test_entry_and_return_under_two_names(aliases, tmp_path):
    probed, result, _ = _rewrite(aliases, tmp_path, "-p", "total", "-r", "sum")
    assert _probes_at(result, aliases.own_functions["sum"]) == [("sum", "return"),
                                                                ("total", "entry")]
    run = stat([probed], tmp_path, latency=True)
    hits = {(p["name"], p["kind"]): p["hits"] for p in run.probes}
    assert hits == {("total", "entry"): CALLS, ("sum", "return"): CALLS}
    [measured] = [p for p in run.probes if "histogram" in p]
    assert measured["name"] == "sum" and sum(b["count"] for b in measured["histogram"]) == CALLS
    # the latency pair still makes one slice per call, named as its entry probe
    trace = tmp_path / "trace.json"
    assert urewrite("trace", "--format", "perfetto", "-o", trace, "--", probed).returncode == 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert sorted({(e["ph"], e["name"]) for e in events if e["ph"] in "BEi"}) == \
        [("B", "total"), ("E", "total")]
    assert sum(e["ph"] == "B" for e in events) == sum(e["ph"] == "E" for e in events) == CALLS


def test_two_aliases_named_make_one_probe_under_the_first(aliases, tmp_path):
    probed, result, stderr = _rewrite(aliases, tmp_path, "-p", "total", "-p", "sum",
                                      "-p", "__sum_impl", "-r", "sum", "-r", "total")
    assert _probes_at(result, aliases.own_functions["sum"]) == [("sum", "return"),
                                                                ("total", "entry")]
    assert _stat_hits(probed, tmp_path) == {("total", "entry"): CALLS,
                                            ("sum", "return"): CALLS}  # counted once
    quiet = urewrite(aliases.path, "-p", "total", "-p", "sum", "-o", tmp_path / "q.probed")
    assert "warning: sum is another name of total (one function at " \
           f"{aliases.own_functions['sum']:#x}): one probe, reported as total" in quiet.stderr


@pytest.mark.parametrize("args, expected", [
    (["-p", "*sum*"], [("sum", "entry")]),  # matches __sum_impl and sum: the public one
    (["-p", "t*"], [("total", "entry"), ("twice", "entry")]),
    (["-p", "__*"], [("__sum_impl", "entry")]),
    (["-p", "*", "-p", "total"], [("total", "entry")]),  # the exact name wins over the glob
    (["-p", "total", "-p", "*"], [("total", "entry")]),
    (["-r", "tot?l", "-p", "s[u]m"], [("sum", "entry"), ("total", "return")]),
])
def test_globs_report_the_name_they_matched(aliases, tmp_path, args, expected):
    probed, result, _ = _rewrite(aliases, tmp_path, *args)
    ours = {aliases.own_functions["sum"], aliases.own_functions["twice"]}
    names = sorted({(p["name"], p["kind"]) for p in result["probes"]
                    if p["kind"] == "return" or p["address"] in ours})
    if ("twice", "entry") not in expected:
        names = [n for n in names if n != ("twice", "entry") and n[0] in NAMES]
    assert names == expected
    hits = _stat_hits(probed, tmp_path)
    for key in expected:
        assert hits[key] == CALLS


def test_a_name_given_exactly_over_a_glob_makes_a_refusal_an_error(builder, tmp_path):
    """The exact name takes the glob's site, and with it the rule that refusing it is
    an error (edges.c: edge_one cannot be patched)."""
    edges = builder.build("edges", ["edges.c"], ["-O2", "-fcf-protection=none"], ["-pie"])
    glob = urewrite(edges.path, "-p", "edge_*", "-o", tmp_path / "a")
    assert glob.returncode == 0 and "not probing edge_one" in glob.stderr
    both = urewrite(edges.path, "-p", "edge_*", "-p", "edge_one", "-o", tmp_path / "b")
    assert both.returncode == 1 and "cannot probe edge_one" in both.stderr


LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
FREES = textwrap.dedent("""\
    #include <stdio.h>
    #include <stdlib.h>
    void *volatile kept; /* so that gcc keeps each malloc and free */
    int main(void) {
        for (int i = 0; i < 1000; i++) {
            kept = malloc(16 + i);
            free(kept);
        }
        puts("freed");
        return 0;
    }
    """)


@pytest.mark.skipif(not os.path.exists(LIBC) or not shutil.which("gcc"),
                    reason="needs Debian's x86_64 libc.so.6 and gcc")
def test_libc_free_is_reported_as_free(tmp_path):
    rows = json.loads(urewrite("list", LIBC, "--json").stdout)["functions"]
    [row] = [r for r in rows if "free" in [r["name"], *r["aliases"]]]
    others = [n for n in [row["name"], *row["aliases"]] if n != "free"]
    assert others, "libc's free has no alias here: nothing to test"
    libdir = tmp_path / "lib"
    libdir.mkdir()
    proc = urewrite(LIBC, "-p", "free", "-r", others[0], "-o", libdir / "libc.so.6", "--json")
    assert proc.returncode == 0, proc.stderr
    assert {(p["name"], p["kind"]) for p in json.loads(proc.stdout)["probes"]} \
        >= {("free", "entry"), (others[0], "return")}
    (tmp_path / "frees.c").write_text(FREES)
    subprocess.run(["gcc", "-O2", tmp_path / "frees.c", "-o", tmp_path / "frees"], check=True)
    run = stat([tmp_path / "frees"], tmp_path, env={"LD_LIBRARY_PATH": str(libdir)})
    assert run.proc.returncode == 0 and run.proc.stdout == "freed\n"
    hits = {(p["name"], p["kind"]): p["hits"] for p in run.probes}
    assert set(hits) == {("free", "entry"), (others[0], "return")}
    assert hits[("free", "entry")] == hits[(others[0], "return")] >= 1000


def test_list_text_keeps_its_columns_when_a_name_is_long(tmp_path):
    """A name longer than list's name column overflows its own row only: the column
    stays NAME_COLUMN wide (node has a function with 129 aliases, 33,000 characters:
    every row padded to that was 2.6 GB of text)."""
    from urewrite.listing import NAME_COLUMN

    long = "long_" + "x" * 150
    src = tmp_path / "long.c"
    src.write_text(textwrap.dedent(f"""\
        __attribute__((noinline)) int {long}(int x) {{ return x * 3 + (x >> 2); }}
        __attribute__((noinline)) int short_one(int x) {{ return x * 5 + (x >> 3); }}
        int main(int argc, char **argv) {{ (void)argv; return {long}(argc) + short_one(argc); }}
        """))
    exe = tmp_path / "long"
    subprocess.run(["gcc", "-O1", str(src), "-o", str(exe)], check=True)
    lines = urewrite("list", exe).stdout.splitlines()
    column = lines[0].index("ENTRY PROBE")
    assert column == len(f"{0:#018x} {0:>6}  ") + NAME_COLUMN + 2
    [short] = [line for line in lines if "  short_one  " in line]
    assert short[column:].startswith("ok, displaces"), short
    [long_row] = [line for line in lines if f"  {long}  " in line]
    assert f"  {long}  ok, displaces" in long_row
    assert max(map(len, lines)) < 400


def test_globs_and_exact_names_select_as_fnmatch_does(monkeypatch):
    """The name a glob picks among a function's names (a function with one name
    needs no second match), and names given exactly looked up, not matched: a build
    step may give 10,000."""
    from urewrite.rewriter import selectors
    from urewrite.rewriter.functions import Function
    from urewrite.rewriter.selectors import select
    from urewrite.trampolines.region import KIND_ENTRY, KIND_RETURN
    alone = Function("alone", 0x1000, 16, "symtab")
    named = Function("__sum_impl", 0x2000, 16, "symtab", ("sum", "_total"))
    sites = select(["*"], [alone, named], None, return_specs=["*um*"])
    assert [(s.name, s.kind, s.exact) for s in sites] == [
        ("alone", KIND_ENTRY, False), ("sum", KIND_RETURN, False), ("sum", KIND_ENTRY, False)]
    assert [s.name for s in select(["[a_]*"], [alone, named], None)] == ["alone", "_total"]
    monkeypatch.setattr(selectors, "matcher", None)
    sites = select(["alone", "sum"], [alone, named], None)
    assert [(s.name, s.exact) for s in sites] == [("alone", True), ("sum", True)]
