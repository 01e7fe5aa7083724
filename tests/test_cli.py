"""The rewrite command line: output names, messages, --json, -q, and agreement with `list`."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from conftest import all_symbols, check, rewrite, run, stat, urewrite
from variants import COUNTS_EXPECTED


@pytest.fixture(scope="module")
def counts(builder):
    return builder.build("counts", ["counts.c"], ["-O2"], [], subdir="cli-counts")


@pytest.fixture
def prog(counts, tmp_path):
    copy = tmp_path / "prog"
    shutil.copy(counts.path, copy)
    return copy


def test_default_output_name_and_summary(prog, tmp_path):
    proc = urewrite(str(prog), "-p", "fib", "-p", "square")
    assert proc.returncode == 0
    assert proc.stdout == ""
    assert re.fullmatch(rf"urewrite: wrote {re.escape(str(prog))}\.probed: 2 probes( at 2 sites)?\n",
                        proc.stderr), proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["prog", "prog.probed"]
    assert os.access(f"{prog}.probed", os.X_OK)


def test_explicit_rewrite_subcommand(prog, tmp_path):
    out = tmp_path / "out"
    proc = urewrite("rewrite", str(prog), "-p", "fib", "-o", str(out), "-q")
    assert proc.returncode == 0
    assert proc.stdout == proc.stderr == ""
    assert run([out]).returncode == 3


def test_json_result(prog, counts, tmp_path):
    out = tmp_path / "out"
    proc = urewrite(str(prog), "-p", "fib", "-p", "is_*", "--json", "-o", str(out))
    assert proc.returncode == 0
    assert proc.stderr == ""
    data = json.loads(proc.stdout)
    assert {"output", "probes", "refused"} <= set(data)
    assert data["output"] == str(out)
    assert data["refused"] == []
    syms = counts.own_functions
    for p in data["probes"]:
        assert {"name", "kind", "address", "displaced"} <= set(p)
        assert p["kind"] == "entry" and p["address"] == syms[p["name"]]
    assert {p["name"] for p in data["probes"]} == {"fib", "is_even", "is_odd"}
    assert [p["address"] for p in data["probes"]] == sorted(p["address"] for p in data["probes"])
    assert all(isinstance(p["displaced"], int) and p["displaced"] >= 5 for p in data["probes"])


def test_each_site_once(prog, tmp_path):
    out = tmp_path / "out"
    data = rewrite(prog, out, "fib", "fib", "fi*", hex(all_symbols(prog)["fib"]))
    assert [p["name"] for p in data["probes"]] == ["fib"]
    st = stat([out], tmp_path)
    assert st.hits("fib") == COUNTS_EXPECTED["fib"]


def test_list_agrees_with_a_rewrite_of_everything(prog, tmp_path):
    listed = json.loads(urewrite("list", str(prog), "--json").stdout)["functions"]
    data = rewrite(prog, tmp_path / "out", "*")
    assert {(r["name"], r["address"], r["displaced"]) for r in listed if r["patchable"]} == \
        {(p["name"], p["address"], p["displaced"]) for p in data["probes"]}
    assert {(r["name"], r["address"], r["reason"]) for r in listed if not r["patchable"]} == \
        {(r["name"], r["address"], r["reason"]) for r in data["refused"]}


def test_version():
    proc = urewrite("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("urewrite")


def test_console_script_matches_module(prog):
    exe = shutil.which("urewrite")
    if exe is None:
        pytest.skip("the urewrite console script is not on PATH")
    a = run([exe, "list", str(prog), "--json"])
    b = urewrite("list", str(prog), "--json")
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout


def test_stripped_program(prog, counts, tmp_path):
    """Without a symbol table, functions come from .eh_frame as fn_<address>."""
    stripped = tmp_path / "stripped"
    check(["strip", "-o", str(stripped), str(prog)])
    listed = json.loads(urewrite("list", str(stripped), "--json").stdout)["functions"]
    by_address = {r["address"]: r for r in listed}
    syms = counts.own_functions
    for name in ("fib", "square", "classify"):
        row = by_address[syms[name]]
        assert row["name"] == f"fn_{syms[name]:x}" and row["origin"] == "eh_frame"
        assert row["patchable"], row["reason"]
    out = tmp_path / "stripped.probed"
    rewrite(stripped, out, "fn_*")
    original = run([prog])
    disarmed = run([out])
    assert (disarmed.returncode, disarmed.stdout) == (3, original.stdout)
    st = stat([out], tmp_path)
    assert st.proc.stdout == original.stdout
    hits = st.by_address()
    expected = {n: c for n, c in COUNTS_EXPECTED.items() if n != "main"}
    assert {n: hits[syms[n]] for n in expected} == expected
    exact = rewrite(stripped, tmp_path / "one", f"fn_{syms['fib']:x}")
    assert [p["address"] for p in exact["probes"]] == [syms["fib"]]


def test_rows_are_encoded_as_json_dumps_does():
    from urewrite.listing import row_encoder as _row_encoder
    encode = _row_encoder()
    rows = [{"name": "caf\u00e9 \"q\" \\ \n", "aliases": ["a", "\u4e2d"], "address": 2**63 - 1,
             "size": 0, "split_off": False, "patchable": True, "displaced": None,
             "ratio": 0.1, "tactics": {"jump": 2}}, {}, {"nested": [[], {}]}]
    for row in rows:
        assert encode(row) == json.dumps(row)
    with pytest.raises(TypeError):
        encode({"x": object()})
