"""samples/edges.c: entries that are hard to relocate, entries that must be refused, and -p 0xADDR."""

from __future__ import annotations

import json
import os
import re

import pytest

from conftest import all_symbols, run, rewrite, stat, urewrite

CFLAGS = ["-O2", "-fcf-protection=none"]

# Patchable, and entered this many times per run (see the comment in edges.c).
EXPECTED = {
    "main": 1, "edge_rip_load": 3, "edge_rip_store": 4, "edge_jrcxz": 5, "edge_loop": 6,
    "edge_jcc": 7, "edge_call": 2, "edge_callee": 2, "edge_tiny": 8, "edge_after_one": 10,
    "edge_mid": 11, "edge_cb": 4,
    "edge_spin": 10,  # 2 calls; its loop branches back to the entry: 10 executions
    # too tight for the jump: a 2-byte hop to a landing nearby
    "edge_backloop": 3, "edge_indcall": 4, "edge_sum": 3,
    "edge_nosize": 2,  # no size: it extends to the next symbol
}
# How `list` patches the tight ones (alone, the padding near each holds its landing).
TACTIC = {"edge_backloop": "hop", "edge_indcall": "hop", "edge_sum": "hop"}
# Bytes each of those displaces, where the sample fixes it.
DISPLACED = {"edge_rip_load": 6, "edge_rip_store": 6, "edge_jrcxz": 5, "edge_loop": 6,
             "edge_jcc": 7, "edge_call": 6}


def refusal_reasons(sym):
    """Refused entries -> how the reason urewrite gives starts, from the sample's addresses
    (edge_one's punned jump fails for the bytes after it: patched themselves when
    edge_after_one is probed too, else they make the jump go below the file)."""
    xbegin = sym["edge_xbegin"]
    return {
        "edge_one": "jump: it is 1 bytes long, too short for a 5-byte jump, and the next "
                    "function follows without padding; hop: it is 1 bytes long, too short for "
                    "a 2-byte jump, and the next function follows without padding; pun: the "
                    "bytes after it ",
        # the same reason for every tactic: said once
        "edge_xbegin": f"cannot relocate 'xbegin {xbegin + 15:#x}' has an abort target relative "
                       f"to its address",
    }


class Edges:
    """The sample built one way, its symbols, its output, and (lazily) a '*' rewrite."""

    def __init__(self, built):
        self.path = built.path
        self.dir = built.dir
        self.sym = all_symbols(built.path)
        self.original = run([built.path])
        assert self.original.returncode == 0, self.original.stderr
        # the callee of edge_call's call sees a return address inside edge_call
        assert self.original.stdout.count("call: ra_ok=1 ra_offset=6\n") == 2
        self._probed = None

    @property
    def probed(self):
        """The sample rewritten with every function probed: (path, --json result)."""
        if self._probed is None:
            out = self.dir / "edges.probed"
            self._probed = (out, rewrite(self.path, out, "*"))
        return self._probed


_edges = {}


def _build_edges(builder, link):
    if link not in _edges:
        flags = CFLAGS + (["-fno-pie"] if link == "no-pie" else [])
        _edges[link] = Edges(builder.build("edges", ["edges.c"], flags, ["-" + link]))
    return _edges[link]


@pytest.fixture(params=["pie", "no-pie"])
def edges(request, builder):
    return _build_edges(builder, request.param)


@pytest.fixture
def pie_edges(builder):
    return _build_edges(builder, "pie")


def listing(path):
    proc = urewrite("list", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# -- what list says --------------------------------------------------------------------

def test_list_json(edges):
    data = listing(edges.path)
    assert data["file"] == str(edges.path)
    rows = {r["name"]: r for r in data["functions"]}
    for row in data["functions"]:
        assert {"name", "aliases", "address", "size", "sized_by", "origin", "patchable",
                "displaced", "tactic", "reason"} <= set(row)
        assert isinstance(row["aliases"], list)
        assert row["origin"] in ("symtab", "dynsym", "eh_frame")
        if row["patchable"]:
            assert row["reason"] is None
            assert row["displaced"] >= (5 if row["tactic"] == "jump" else 2)
        else:
            assert row["displaced"] is None and row["tactic"] is None and row["reason"]
    addresses = [r["address"] for r in data["functions"]]
    assert addresses == sorted(addresses)
    for name in EXPECTED:
        assert rows[name]["patchable"], (name, rows[name]["reason"])
        assert rows[name]["address"] == edges.sym[name]
    for name, displaced in DISPLACED.items():
        assert rows[name]["displaced"] == displaced, name
        assert rows[name]["tactic"] == "jump"
    for name, tactic in TACTIC.items():
        assert rows[name]["tactic"] == tactic, name
    # a 3-byte function borrows the alignment padding after it, up to the next function
    tiny = rows["edge_tiny"]
    assert tiny["size"] == 3
    assert 5 <= tiny["displaced"] <= edges.sym["edge_one"] - edges.sym["edge_tiny"]
    for name, reason in refusal_reasons(edges.sym).items():
        assert not rows[name]["patchable"], name
        assert rows[name]["reason"].startswith(reason)
    assert rows["edge_one"]["size"] == 1
    nosize = rows["edge_nosize"]
    assert nosize["sized_by"] == "next symbol"
    following = min(r["address"] for r in data["functions"] if r["address"] > nosize["address"])
    assert nosize["address"] + nosize["size"] == following


def test_list_patchable_only(pie_edges):
    proc = urewrite("list", str(pie_edges.path), "--json", "--patchable")
    assert proc.returncode == 0
    rows = json.loads(proc.stdout)["functions"]
    assert rows and all(r["patchable"] for r in rows)
    assert set(EXPECTED) <= {r["name"] for r in rows}
    assert not set(refusal_reasons(pie_edges.sym)) & {r["name"] for r in rows}


def test_list_table(pie_edges):
    proc = urewrite("list", str(pie_edges.path))
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["ADDRESS", "SIZE", "FUNCTION"] and "PROBE" in lines[0]
    by_name = {line.split()[2]: line for line in lines[1:]}
    assert f"{pie_edges.sym['edge_jrcxz']:#018x}" in by_name["edge_jrcxz"]
    assert "ok, displaces 5 bytes" in by_name["edge_jrcxz"]
    assert "no: cannot relocate 'xbegin" in by_name["edge_xbegin"]
    assert "patchable" in proc.stderr


# -- refusals ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["edge_one", "edge_xbegin"])
def test_refused_when_named_exactly(pie_edges, tmp_path, name):
    out = tmp_path / "out"
    proc = urewrite(str(pie_edges.path), "-p", name, "-o", str(out))
    assert proc.returncode == 1
    assert proc.stdout == ""
    reason = refusal_reasons(pie_edges.sym)[name]
    assert proc.stderr.startswith(f"urewrite: cannot probe {name}: {reason}")
    assert proc.stderr.count("\n") == 1
    assert not out.exists()
    assert os.listdir(tmp_path) == []


def test_refused_by_address_too(pie_edges, tmp_path):
    out = tmp_path / "out"
    proc = urewrite(str(pie_edges.path), "-p", hex(pie_edges.sym["edge_xbegin"]), "-o", str(out))
    assert proc.returncode == 1
    assert "cannot probe edge_xbegin: cannot relocate 'xbegin" in proc.stderr
    assert not out.exists()


def test_several_exact_refusals_are_counted(pie_edges, tmp_path):
    out = tmp_path / "out"
    proc = urewrite(str(pie_edges.path), "-p", "edge_one", "-p", "edge_xbegin", "-p", "edge_tiny",
                    "-o", str(out))
    assert proc.returncode == 1
    assert proc.stderr.startswith("urewrite: cannot probe edge_one: ")
    assert proc.stderr.endswith(" (and 1 more)\n")
    assert not out.exists()


def test_glob_refusals_are_warnings(pie_edges, tmp_path):
    out = tmp_path / "out"
    proc = urewrite(str(pie_edges.path), "-p", "edge_*", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    reasons = refusal_reasons(pie_edges.sym)
    for name, reason in reasons.items():
        assert f"urewrite: warning: not probing {name}: {reason}" in proc.stderr
    patchable = [n for n in EXPECTED if n.startswith("edge_")]
    last = proc.stderr.splitlines()[-1]
    assert re.fullmatch(rf"urewrite: wrote {re.escape(str(out))}: {len(patchable)} probes"
                        rf"( at {len(patchable)} sites)?, {len(reasons)} refused", last), last
    assert out.exists()


def test_keep_going_skips_exact_refusals(pie_edges, tmp_path):
    out = tmp_path / "out"
    result = rewrite(pie_edges.path, out, "edge_one", "edge_xbegin", "edge_tiny",
                     extra=["--keep-going"])
    assert [p["name"] for p in result["probes"]] == ["edge_tiny"]
    assert {r["name"] for r in result["refused"]} == {"edge_one", "edge_xbegin"}
    st = stat([out], tmp_path)
    assert st.proc.stdout == pie_edges.original.stdout
    assert st.hits("edge_tiny") == 8


def test_call_refused_under_cet_shadow_stack(builder):
    """A file marked shadow-stack compatible: a call cannot be emulated by push + jmp."""
    built = builder.build("edges", ["edges.c"], CFLAGS, ["-Wl,-z,shstk"], subdir="edges-shstk")
    assert "SHSTK" in run(["readelf", "-n", built.path]).stdout
    rows = {r["name"]: r for r in listing(built.path)["functions"]}
    assert not rows["edge_call"]["patchable"]
    assert ("cannot relocate 'call "
            f"{all_symbols(built.path)['edge_callee']:#x}' cannot be "
            "emulated under the CET shadow stack this file enables") in rows["edge_call"]["reason"]
    assert rows["edge_jrcxz"]["patchable"]


# -- relocated entries run correctly ---------------------------------------------------

def test_probed_edges_run_like_the_original(edges):
    out, result = edges.probed
    probed = {p["name"] for p in result["probes"]}
    assert set(EXPECTED) <= probed
    assert not set(refusal_reasons(edges.sym)) & probed
    proc = run([out])
    assert proc.returncode == 0
    assert proc.stdout == edges.original.stdout
    assert proc.stderr == edges.original.stderr


def test_probed_edges_count_exactly(edges, session_dir):
    out, _ = edges.probed
    st = stat([out], session_dir)
    assert st.proc.returncode == 0
    # the callee of the displaced call sees a return address inside the original edge_call
    assert st.proc.stdout == edges.original.stdout
    hits = st.by_address()
    assert {n: hits[edges.sym[n]] for n in EXPECTED} == EXPECTED


def test_edges_counts_equal_uprobe_oracle(edges, uprobes, session_dir):
    out, _ = edges.probed
    st = stat([out], session_dir)
    addresses = {n: edges.sym[n] for n in EXPECTED}
    oracle = uprobes.count(edges.path, addresses, lambda: run([edges.path]))
    hits = st.by_address()
    assert {n: hits[a] for n, a in addresses.items()} == oracle


# -- -p 0xADDR -------------------------------------------------------------------------------

def test_address_inside_a_function(pie_edges, tmp_path):
    body = pie_edges.sym["edge_mid_body"]
    offset = body - pie_edges.sym["edge_mid"]
    out = tmp_path / "mid"
    result = rewrite(pie_edges.path, out, hex(body))
    assert result["output"] == str(out)
    assert result["refused"] == []
    assert result["probes"] == [{"name": f"edge_mid+{offset:#x}", "kind": "address",
                                 "address": body, "displaced": 6, "tactic": "jump"}]
    st = stat([out], tmp_path)
    assert st.proc.stdout == pie_edges.original.stdout
    assert st.probes == [{"object": "mid", "name": f"edge_mid+{offset:#x}", "kind": "address",
                          "address": body, "hits": 11}]


def test_address_inside_a_function_matches_uprobe(pie_edges, uprobes, tmp_path):
    body = pie_edges.sym["edge_mid_body"]
    out = tmp_path / "mid"
    rewrite(pie_edges.path, out, hex(body))
    st = stat([out], tmp_path)
    oracle = uprobes.count(pie_edges.path, {"body": body}, lambda: run([pie_edges.path]))
    assert oracle == {"body": st.by_address()[body]} == {"body": 11}


def test_address_and_name_together(pie_edges, tmp_path):
    body = pie_edges.sym["edge_mid_body"]
    out = tmp_path / "both"
    result = rewrite(pie_edges.path, out, hex(body), "edge_mid", "0X%x" % pie_edges.sym["edge_jcc"])
    kinds = {p["name"]: p["kind"] for p in result["probes"]}
    assert kinds == {"edge_jcc": "entry", "edge_mid": "entry", "edge_mid+0x5": "address"}
    st = stat([out], tmp_path)
    assert st.hits("edge_mid") == st.hits("edge_mid+0x5") == 11
    assert st.hits("edge_jcc") == 7
    assert st.proc.stdout == pie_edges.original.stdout


def test_address_of_an_entry_is_an_entry_probe(pie_edges, tmp_path):
    result = rewrite(pie_edges.path, tmp_path / "e", hex(pie_edges.sym["edge_loop"]))
    assert [(p["name"], p["kind"]) for p in result["probes"]] == [("edge_loop", "entry")]


@pytest.mark.parametrize("where, message", [
    ("mid-instruction", "is not the start of an instruction in edge_mid"),
    ("data", "is not inside a known function"),
    ("zero", "is not inside a known function"),
    ("not-hex", "is not a hexadecimal address"),
])
def test_bad_addresses(pie_edges, tmp_path, where, message):
    spec = {"mid-instruction": hex(pie_edges.sym["edge_mid_body"] + 1),
            "data": hex(pie_edges.sym["edge_counter"]),
            "zero": "0x0",
            "not-hex": "0xedge"}[where]
    out = tmp_path / "out"
    proc = urewrite(str(pie_edges.path), "-p", spec, "-o", str(out))
    assert proc.returncode == 1
    assert proc.stderr.startswith("urewrite: ") and message in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not out.exists()


# -- loops that stay inside a displaced window: hits count executions, as uprobes do ------

def test_address_probe_at_a_loop_head_counts_iterations(pie_edges, tmp_path):
    """A branch from inside the window back to the probed address must pass the counter."""
    head = pie_edges.sym["edge_sum_loop"]
    out = tmp_path / "loop"
    rewrite(pie_edges.path, out, hex(head))
    st = stat([out], tmp_path)
    assert st.proc.stdout == pie_edges.original.stdout
    assert st.by_address()[head] == 5 + 10 + 20  # what a uprobe there counts


def test_entry_probe_with_a_loop_back_to_the_entry(pie_edges, tmp_path):
    """edge_spin's first instruction runs 10 times in 2 calls: hits count executions."""
    out = tmp_path / "spin"
    rewrite(pie_edges.path, out, "edge_spin")
    st = stat([out], tmp_path)
    assert st.proc.stdout == pie_edges.original.stdout
    assert st.hits("edge_spin") == 4 + 6  # what a uprobe at the entry counts


def test_loop_head_oracle(pie_edges, uprobes):
    """The expected values of the two tests above, from the kernel."""
    sym = pie_edges.sym
    oracle = uprobes.count(pie_edges.path, {"sum_loop": sym["edge_sum_loop"],
                                            "spin": sym["edge_spin"]},
                           lambda: run([pie_edges.path]))
    assert oracle == {"sum_loop": 35, "spin": 10}


def test_a_refused_return_probe_is_told_apart_from_the_entry(pie_edges, tmp_path):
    """With entries and returns, a function refused both ways gets two lines that say
    which probe each is about (they read the same before)."""
    proc = urewrite(str(pie_edges.path), "-p", "main", "-p", "edge_one", "-r", "edge_one",
                    "--keep-going", "-o", str(tmp_path / "out"))
    lines = [l for l in proc.stderr.splitlines() if "not probing" in l]
    assert [l.split(":")[2] for l in lines] == [" not probing edge_one",
                                                " not probing the return of edge_one"], lines
