"""C++ and Rust functions named as people type them: demangled, without a Rust hash.

samples/names/app.cc (namespaces, a class, a template, overloads, a lambda, an
operator) is built with g++ at -O0 and -O2 (and for arm64, run under qemu, where
the cross compiler is installed); samples/names/rtrial.rs (modules, trait impls,
generics, closures, caught panics, threads) with rustc, optimised and not, with
Rust's legacy mangling and with v0. Each build is listed (the demangled names
shown), and rewritten twice: by demangled names and globs, and by the mangled
names of the same functions. Both run as the original, and count exactly the
calls the test knows the program makes, under the names that were typed.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Dict, List

import pytest

import cross
from conftest import SAMPLES, check, function_symbols, run, stat, urewrite

ROUNDS = 25  # the samples' argument: rounds of calls


# -- building ------------------------------------------------------------------------

def _rustc() -> str:
    found = shutil.which("rustc") or str(Path.home() / ".cargo/bin/rustc")
    return found if Path(found).exists() else ""


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> Dict[str, Path]:
    """Built on first use: kind -> the program."""
    root = tmp_path_factory.mktemp("names")
    made: Dict[str, Path] = {}

    def build(kind: str) -> Path:
        if kind not in made:
            out = root / kind
            if kind.startswith("cxx"):
                compiler = cross.CXX if kind.endswith("arm64") else "g++"
                if not shutil.which(compiler):
                    pytest.skip(f"needs {compiler}")
                opt = kind.split("-")[1]
                check([compiler, f"-{opt}", str(SAMPLES / "names/app.cc"), "-o", str(out)])
            else:
                rustc = _rustc()
                if not rustc:
                    pytest.skip("needs rustc")
                _, profile, mangling = kind.split("-")
                flags = ["-O"] if profile == "release" else ["-g"]
                # (legacy is stable Rust's default; naming it needs -Z unstable-options)
                flags += ["-C", "symbol-mangling-version=v0"] if mangling == "v0" else []
                check([rustc, "--edition", "2021", *flags,
                       str(SAMPLES / "names/rtrial.rs"), "-o", str(out)])
                legacy = any(n.startswith("_ZN6rtrial") for n in function_symbols(out))
                if legacy != (mangling == "legacy"):
                    pytest.skip(f"this rustc does not mangle {mangling} by default")
            made[kind] = out
        return made[kind]
    return build


def _command(kind: str, program: Path) -> List[str]:
    if not kind.endswith("arm64"):
        return [str(program), str(ROUNDS)]
    if cross.missing(cross.QEMU):
        pytest.skip("needs qemu-aarch64")
    return cross.emulate(program) + [str(ROUNDS)]


def _listed(program: Path) -> List[dict]:
    proc = urewrite("list", program, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["functions"]


def _rewrite(program: Path, out: Path, *args: str) -> dict:
    proc = urewrite(program, *args, "-o", out, "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def _counts(kind: str, probed: Path, tmp_path: Path, original: str) -> Dict[tuple, int]:
    """(name, kind, address) -> hits of a run of the rewritten program, which must
    print what the original printed."""
    run_ = stat(_command(kind, probed), tmp_path)
    assert run_.proc.returncode == 0, run_.proc.stderr
    assert run_.proc.stdout == original
    return {(p["name"], p["kind"], p["address"]): p["hits"] for p in run_.probes}


def _by_address(counts: Dict[tuple, int]) -> Dict[tuple, int]:
    return {(kind, address): hits for (_, kind, address), hits in counts.items()}


# -- C++ ------------------------------------------------------------------------------

# the sample's functions called once a round: mangled name -> its display name
CXX = {
    "_ZN3app1fEi": "app::f(int)",
    "_ZN3app1fEd": "app::f(double)",
    "_ZN3app1fEPKc": "app::f(char const*)",
    "_ZN3app5parseEPKc": "app::parse(char const*)",
    "_ZN3app3Srv6handleEi": "app::Srv::handle(int)",
    "_ZN3app5twiceIiEET_S1_": "app::twice<int>(int)",
    "_ZN3app5twiceIdEET_S1_": "app::twice<double>(double)",
    "_ZN3app4eachEiPFiiE": "app::each(int, int (*)(int))",
}
# by what the user types: the functions each name selects (all overloads, instances)
CXX_TYPED = {
    "app::f": ["_ZN3app1fEi", "_ZN3app1fEd", "_ZN3app1fEPKc"],
    "app::parse": ["_ZN3app5parseEPKc"],
    "app::Srv::handle(int)": ["_ZN3app3Srv6handleEi"],
    "app::twice": ["_ZN3app5twiceIiEET_S1_", "_ZN3app5twiceIdEET_S1_"],
    "int app::twice<int>(int)": ["_ZN3app5twiceIiEET_S1_"],
}
CXX_KINDS = ["cxx-O0", "cxx-O2", "cxx-O2-arm64"]


@pytest.mark.parametrize("kind", CXX_KINDS)
def test_cxx_list_shows_demangled_names(builds, kind):
    program = builds(kind)
    rows = {r["name"]: r for r in _listed(program)}
    for mangled, display in CXX.items():
        assert rows[mangled]["demangled"] == [display], mangled
    operator = [r for r in rows.values()
                if r["name"].startswith("_ZNK3app5PointplERKS0_")]
    assert [r["demangled"] for r in operator] == [
        ["app::Point::operator+(app::Point const&) const"
         + (" [clone .isra.0]" if r["name"].endswith(".isra.0") else "")] for r in operator]
    assert rows["main"]["demangled"] == []  # (a C name: none)
    text = urewrite("list", program).stdout
    assert re.search(r"  app::parse\(char const\*\) = _ZN3app5parseEPKc  +ok", text), text


@pytest.mark.parametrize("kind", CXX_KINDS)
def test_cxx_probed_by_demangled_names_counts_as_by_mangled_ones(builds, kind, tmp_path):
    program = builds(kind)
    original = run(_command(kind, program)).stdout
    assert original.startswith("total ")
    symbols = function_symbols(program)
    typed_args = [a for name in CXX_TYPED for a in ("-p", name)] + \
        ["-r", "app::f(int)", "-r", "app::twice<double>"]
    by_name = _rewrite(program, tmp_path / "by_name", *typed_args)
    chosen = sorted({m for ms in CXX_TYPED.values() for m in ms})
    by_mangled = [a for m in chosen for a in ("-p", m)] + \
        ["-r", "_ZN3app1fEi", "-r", "_ZN3app5twiceIdEET_S1_"]
    _rewrite(program, tmp_path / "by_mangled", *by_mangled)
    # reported under the name typed: each overload and instance under the name that chose it
    expected_probes = sorted([(typed, "entry", symbols[m]) for typed, ms in CXX_TYPED.items()
                              for m in ms if typed != "int app::twice<int>(int)"]
                             + [("app::f(int)", "return", 0), ("app::twice<double>", "return", 0)])
    # (a return probe's sites are its function's exits)
    got = sorted({(p["name"], p["kind"], p["address"] if p["kind"] == "entry" else 0)
                  for p in by_name["probes"]})
    assert got == expected_probes
    assert "int app::twice<int>(int) is another name of app::twice" in \
        urewrite(program, *typed_args, "-o", tmp_path / "again").stderr
    named = _counts(kind, tmp_path / "by_name", tmp_path, original)
    mangled = _counts(kind, tmp_path / "by_mangled", tmp_path, original)
    assert _by_address(named) == _by_address(mangled)
    for (name, probe_kind, address), hits in named.items():
        assert hits == ROUNDS, (name, probe_kind)
    assert len(named) == len(expected_probes)
    if kind.endswith("arm64"):
        return
    events = tmp_path / "events.jsonl"
    proc = urewrite("trace", "--json", "-o", events, "--", tmp_path / "by_name", str(ROUNDS))
    assert proc.returncode == 0, proc.stderr
    traced: Dict[tuple, int] = {}
    for line in events.read_text().splitlines():
        event = json.loads(line)
        key = (event["probe"], event["kind"])
        traced[key] = traced.get(key, 0) + 1
    assert traced == {(name, probe_kind): ROUNDS * sum(1 for n, k, _ in named
                                                       if (n, k) == (name, probe_kind))
                      for name, probe_kind, _ in named}


@pytest.mark.parametrize("kind", ["cxx-O0", "cxx-O2"])
def test_cxx_globs_report_display_names_and_exclude_by_them(builds, kind, tmp_path):
    program = builds(kind)
    original = run(_command(kind, program)).stdout
    symbols = function_symbols(program)
    result = _rewrite(program, tmp_path / "glob", "-p", "app::*", "-r", "*::f(*)",
                      "--exclude", "app::twice", "--exclude", "*::operator+*")
    got = sorted((p["name"], p["kind"]) for p in result["probes"])
    shown = [display for m, display in CXX.items() if "twice" not in m]
    assert got == sorted([(d, "entry") for d in shown]
                         + [(d, "return") for d in shown if d.startswith("app::f(")])
    counts = _counts(kind, tmp_path / "glob", tmp_path, original)
    assert {name for name, _, _ in counts} == set(shown)
    assert all(hits == ROUNDS for hits in counts.values())
    # the lambda (called 3 times a round through its function pointer, _FUN) and the
    # operator (at -O2 a clone of it, which its name says)
    result = _rewrite(program, tmp_path / "lambda", "-p", "main::{lambda(int)#1}::_FUN",
                      "-p", "*::Point::operator+*")
    operator = "app::Point::operator+(app::Point const&) const" + \
        (" [clone .isra.0]" if kind == "cxx-O2" else "")
    assert sorted(p["name"] for p in result["probes"]) == [operator, "main::{lambda(int)#1}::_FUN"]
    counts = _counts(kind, tmp_path / "lambda", tmp_path, original)
    assert {name: hits for (name, _, _), hits in counts.items()} == {
        "main::{lambda(int)#1}::_FUN": 3 * ROUNDS, operator: ROUNDS}
    # the mangled names stay: a glob over them reports them as they are
    mangled = _rewrite(program, tmp_path / "mangled", "-p", "_ZN3app1f*")
    assert sorted((p["name"], p["address"]) for p in mangled["probes"]) == \
        sorted((m, symbols[m]) for m in ("_ZN3app1fEi", "_ZN3app1fEd", "_ZN3app1fEPKc"))


def test_cxx_names_refused_with_close_matches(builds):
    program = builds("cxx-O2")
    proc = urewrite(program, "-p", "app::prase", "-o", "/dev/null")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "no function named 'app::prase' (close matches: app::parse" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- Rust -----------------------------------------------------------------------------

RUST_KINDS = ["rust-release-legacy", "rust-debug-legacy", "rust-release-v0"]
RECT = "<rtrial::shapes::Rect as rtrial::shapes::Shape>::area"
CIRCLE = "<rtrial::shapes::Circle as rtrial::shapes::Shape>::area"


def _rust_expected(original: str) -> Dict[tuple, int]:
    """(name typed, kind) -> hits, from what the program does (and prints)."""
    caught = sum(1 for i in range(ROUNDS) if i % 7 == 3)
    assert original.endswith(f" caught {caught} work {5 * ROUNDS}\n"), original
    return {("rtrial::compute::work", "entry"): 5 * ROUNDS,  # main's loop and 4 threads
            (RECT, "entry"): ROUNDS, (CIRCLE, "entry"): ROUNDS,
            ("rtrial::compute::checked", "entry"): ROUNDS,
            ("rtrial::compute::checked", "return"): ROUNDS - caught,  # a panic returns not
            ("rtrial::compute::largest", "entry"): 2 * ROUNDS}  # two instances


def _rust_mangled(program: Path, path: str) -> List[str]:
    """The symbols of a Rust function by its path (e.g. 'compute..work' for legacy,
    'compute7work' for v0)."""
    names = function_symbols(program)
    legacy = re.compile(r"_ZN6rtrial" + path + r"17h[0-9a-f]{16}E$")
    v0 = re.compile(r"_R.*6rtrial" + path + r"$")
    return [n for n in names if legacy.match(n) or (v0.match(n) and n.startswith("_R"))]


@pytest.mark.parametrize("kind", RUST_KINDS)
def test_rust_list_shows_names_without_hash(builds, kind):
    program = builds(kind)
    rows = _listed(program)
    shown = [d for r in rows for d in r["demangled"]]
    for name in ("rtrial::compute::work", "rtrial::compute::checked", RECT, CIRCLE):
        assert name in shown, name
    assert not [d for d in shown if re.search(r"::h[0-9a-f]{16}$", d)]
    largest = [d for d in shown if d.startswith("rtrial::compute::largest")]
    assert sorted(largest) == (["rtrial::compute::largest"] * 2 if "legacy" in kind else
                               ["rtrial::compute::largest::<u32>",
                                "rtrial::compute::largest::<u64>"])


@pytest.mark.parametrize("kind", RUST_KINDS)
def test_rust_probed_by_demangled_names_counts_as_by_mangled_ones(builds, kind, tmp_path):
    program = builds(kind)
    original = run(_command(kind, program)).stdout
    expected = _rust_expected(original)
    typed = _rewrite(program, tmp_path / "by_name",
                     "-p", "rtrial::compute::work", "-p", RECT, "-p", CIRCLE,
                     "-p", "rtrial::compute::checked", "-r", "rtrial::compute::checked",
                     "-p", "rtrial::compute::largest")
    assert {(p["name"], p["kind"]) for p in typed["probes"]} == set(expected)
    named = _counts(kind, tmp_path / "by_name", tmp_path, original)
    totals: Dict[tuple, int] = {}
    for (name, probe_kind, _), hits in named.items():
        totals[(name, probe_kind)] = totals.get((name, probe_kind), 0) + hits
    assert totals == expected
    legacy = "legacy" in kind
    paths = {"work": "7compute4work", "checked": "7compute7checked",
             "largest": "7compute7largest"}
    mangled = {k: _rust_mangled(program, p) for k, p in paths.items()}
    for k in ("work", "checked"):
        assert len(mangled[k]) == 1, mangled
    if legacy:
        assert len(mangled["largest"]) == 2
    else:  # v0: an instance's symbol names its generic argument after the path
        mangled["largest"] = [n for n in function_symbols(program)
                              if n.startswith("_RINv") and "6rtrial7compute7largest" in n]
    areas = [n for n in function_symbols(program) if re.search(
        r"(Rect|Circle)(\$u20\$as\$u20\$rtrial\.\.shapes\.\.Shape\$GT\$4area"
        r"|NtB[0-9a-z]*_5Shape4area)", n)]
    assert len(areas) == 2, areas
    args = ["-p", mangled["work"][0], "-p", mangled["checked"][0], "-r", mangled["checked"][0]]
    args += [a for n in mangled["largest"] + areas for a in ("-p", n)]
    _rewrite(program, tmp_path / "by_mangled", *args)
    by_mangled = _counts(kind, tmp_path / "by_mangled", tmp_path, original)
    assert _by_address(named) == _by_address(by_mangled)
    if legacy:  # with its hash, a name selects one instance
        symbol = mangled["largest"][1]
        hashed = "rtrial::compute::largest::" + re.search(r"17(h[0-9a-f]{16})E$", symbol)[1]
        one = _rewrite(program, tmp_path / "one", "-p", hashed)
        assert [(p["name"], p["address"]) for p in one["probes"]] == \
            [(hashed, function_symbols(program)[symbol])]


@pytest.mark.parametrize("kind", ["rust-release-legacy", "rust-release-v0"])
def test_rust_globs_report_display_names(builds, kind, tmp_path):
    program = builds(kind)
    original = run(_command(kind, program)).stdout
    result = _rewrite(program, tmp_path / "glob", "-p", "rtrial::compute::*",
                      "-p", "<rtrial::shapes::* as *>::area", "--exclude", "*::apply*",
                      "--keep-going")
    names = {p["name"] for p in result["probes"]}
    assert {"rtrial::compute::work", "rtrial::compute::checked", RECT, CIRCLE} <= names
    assert not [n for n in names if "apply" in n or n.startswith("_")]
    counts = _counts(kind, tmp_path / "glob", tmp_path, original)
    assert sum(h for (n, _, _), h in counts.items() if n == "rtrial::compute::work") == \
        5 * ROUNDS
