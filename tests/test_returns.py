"""Return probes (x86_64): exact counts where frames return, none where they do not."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import run

from urewrite.rewriter.elf_file import ElfFile

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "samples")
LEVELS = ["-O0", "-O2", "-O3", "-O2 -no-pie", "-O2 -static", "-O2 -fcf-protection=full",
          "-O0 -fcf-protection=full", "-O3 -fcf-protection=none"]
PROBED = ["depth", "work", "maybe_jump", "nested", "tail", "callee"]
# At -O0 an early return jumps to the `leave` just before `ret`, and the next
# function follows without padding: no 5-byte window around that `ret` is safe.
# A 2-byte hop over `leave; ret` is, with its landing in padding or in the bytes an
# evicted neighbour frees: these exits are patched, and nothing is redirected.
REDIRECTED = {level: set() for level in LEVELS}
HOPPED = {level: {"depth", "tail"} if level.startswith("-O0") else set() for level in LEVELS}

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")


def urewrite(*args):
    return run([sys.executable, "-m", "urewrite", *args])


def stat(command, latency=True):
    out = urewrite("stat", "--json", *["--latency"] * latency, "--", *command)
    start = out.stdout.index('{\n  "exit_code"')  # the report follows the program's output
    return out.returncode, out.stdout[:start], json.loads(out.stdout[start:])


def expected_returns(program_output: str) -> dict:
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^returns (\w+) (\d+)$", program_output, re.M)}


@pytest.fixture(scope="module", params=LEVELS)
def returns(request, tmp_path_factory):
    work = tmp_path_factory.mktemp("returns")
    plain, probed = work / "returns", work / "returns.probed"
    subprocess.run(["gcc", *request.param.split(), "-pthread",
                    os.path.join(SAMPLES, "returns.c"), "-o", plain], check=True)
    args = [a for name in PROBED for a in ("-r", name)] + ["-p", "depth", "-p", "work",
                                                           "-p", "maybe_jump"]
    out = urewrite(plain, *args, "--keep-going", "--json", "-o", probed)
    assert out.returncode == 0, out.stderr
    refused = {r["name"] for r in json.loads(out.stdout)["refused"]}
    listed = json.loads(urewrite("list", "--json", plain).stdout)["functions"]
    mechanism = {f["name"]: f["return"]["mechanism"] for f in listed if f["name"] in PROBED}
    hopped = {f["name"] for f in listed if f["name"] in PROBED
              and set(f["return"]["tactics"]) & {"hop", "evict"}}
    assert HOPPED[request.param] <= hopped
    if ElfFile.open(str(plain)).shadow_stack:
        assert refused == REDIRECTED[request.param]
        assert all(mechanism[name] is None for name in refused)
    else:
        assert refused == set()
        assert {n for n, m in mechanism.items() if m == "redirection"} == REDIRECTED[request.param]
    return plain, probed, refused


@pytest.mark.parametrize("case", ["recursion", "threads", "longjmp", "signal", "tail"])
def test_returns_are_counted_exactly(returns, case):
    plain, probed, refused = returns
    original = subprocess.run([plain, case], capture_output=True, text=True)
    code, program, report = stat([probed, case])
    assert (code, program) == (original.returncode, original.stdout)
    hits = {(p["name"], p["kind"]): p["hits"] for p in report["probes"]}
    for name, count in expected_returns(original.stdout).items():
        if name not in refused:
            assert hits[(name, "return")] == count, name
    samples = {p["name"]: sum(b["count"] for b in p["histogram"])
               for p in report["probes"] if "histogram" in p}
    # Latency is measured for every call, a thread's first included (it claims its
    # row on the way), for at most LATENCY_DEPTH open calls a thread.
    if case == "recursion" and "depth" not in refused:  # every entry has its return
        assert hits[("depth", "entry")] == hits[("depth", "return")] == 10001
        assert samples["depth"] == 126  # the outermost open calls
    if case == "threads":
        assert hits[("work", "entry")] == hits[("work", "return")] == 1000000
        assert samples["work"] == 1000000
    if case == "longjmp":  # frames left by longjmp give no sample, the others one each
        assert samples["maybe_jump"] == hits[("maybe_jump", "return")] == 75


def test_disarmed_behaviour_is_unchanged(returns):
    plain, probed, _ = returns
    for case in ("recursion", "longjmp", "signal", "tail"):
        a = subprocess.run([plain, case], capture_output=True, text=True)
        b = subprocess.run([probed, case], capture_output=True, text=True)
        assert (a.returncode, a.stdout) == (b.returncode, b.stdout)


def test_latency_histogram_report(returns):
    _, probed, _ = returns
    out = urewrite("stat", "--latency", "--", probed, "threads")
    assert "returns.probed: work: latency from entry to return" in out.stdout
    bars = [l for l in out.stdout.splitlines() if re.match(r"\s+\d+ -> \d+\s+: \d+", l)]
    assert sum(int(l.split(":")[1].split()[0]) for l in bars) == 1000000


def test_calls_are_timed_only_when_asked(returns):
    """Without --latency (or UREWRITE_LATENCY=1 in the command's environment) the same
    counts and no histogram; UREWRITE_LATENCY=0 asks for none."""
    plain, probed, refused = returns
    timed = stat([probed, "longjmp"])[2]
    for env in ({}, {"UREWRITE_LATENCY": "0"}, {"UREWRITE_LATENCY": ""}):
        proc = run([sys.executable, "-m", "urewrite", "stat", "--json", "--", probed,
                    "longjmp"], env=env)
        report = json.loads(proc.stdout[proc.stdout.index('{\n  "exit_code"'):])
        assert [p["hits"] for p in report["probes"]] == [p["hits"] for p in timed["probes"]]
        assert not any("histogram" in p for p in report["probes"]), env
        assert report["latency_missed"] == 0 and report["calls_timed"] is False
        assert "latency" not in proc.stderr
    proc = run([sys.executable, "-m", "urewrite", "stat", "--json", "--", probed, "longjmp"],
               env={"UREWRITE_LATENCY": "1"})
    report = json.loads(proc.stdout[proc.stdout.index('{\n  "exit_code"'):])
    def samples(r):
        return [sum(b["count"] for b in p["histogram"]) if "histogram" in p else None
                for p in r["probes"]]
    assert samples(report) == samples(timed) and "maybe_jump" not in refused
    assert report["calls_timed"] is timed["calls_timed"] is True


def test_return_events_carry_the_return_value(returns):
    _, probed, _ = returns
    out = urewrite("trace", "--json", "--", probed, "tail")
    events = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    values = [e["args"][0] for e in events if e["probe"] == "callee" and e["kind"] == "return"]
    assert values == [2 * x for x in range(29)]
    # tail(i) for i in -20..29 returns -1, or callee(i - 1) by a tail call: an exit at
    # the tail call's jump does not know that value yet and records none, never a wrong one
    returned = [e["args"] for e in events if e["probe"] == "tail" and e["kind"] == "return"]
    assert len(returned) == 50
    for i, args in zip(range(-20, 30), returned):  # (an int: the low 32 bits of rax/x0)
        expected = (-1 if i <= 0 else 2 * (i - 1)) & 0xFFFFFFFF
        assert args in ([expected], []) or args[0] & 0xFFFFFFFF == expected, (i, args)
    assert all(args for i, args in zip(range(-20, 30), returned) if i <= 0)


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++")
@pytest.mark.parametrize("level", ["-O0", "-O2"])
def test_cxx_exceptions_pass_through_probed_frames(tmp_path, level):
    plain, probed = tmp_path / "cxx", tmp_path / "cxx.probed"
    subprocess.run(["g++", level, os.path.join(SAMPLES, "returns_cxx.cc"), "-o", plain],
                   check=True)
    out = urewrite(plain, "-r", "_Z6middlei", "-r", "_Z7throweri", "-p", "_Z7throweri",
                   "-o", probed)
    assert out.returncode == 0, out.stderr
    original = subprocess.run([plain], capture_output=True, text=True)
    code, program, report = stat([probed])
    assert (code, program) == (0, original.stdout)
    hits = {(p["name"], p["kind"]): p["hits"] for p in report["probes"]}
    expected = expected_returns(original.stdout)
    assert hits[("_Z6middlei", "return")] == expected["middle"] == 80
    assert hits[("_Z7throweri", "return")] == expected["thrower"]
    assert hits[("_Z7throweri", "entry")] == 100


def test_a_function_that_never_returns_reports_no_return(tmp_path):
    plain = tmp_path / "noreturn"
    subprocess.run(["gcc", "-O2", os.path.join(SAMPLES, "noreturn.c"), "-o", plain], check=True)
    out = urewrite(plain, "-r", "die", "-p", "die", "-o", tmp_path / "out")
    assert out.returncode == 0, out.stderr
    listed = urewrite("list", plain).stdout
    assert re.search(r" die +ok.*; return: never returns: reports 0$", listed, re.M), listed
    for args, code, output in (([], 0, "alive\n"), (["x"], 4, "dying 4\n")):
        original = subprocess.run([plain, *args], capture_output=True, text=True)
        assert (original.returncode, original.stdout) == (code, output)
        code, program, report = stat([tmp_path / "out", *args])
        assert (code, program) == (original.returncode, original.stdout)
        hits = {(p["name"], p["kind"]): p["hits"] for p in report["probes"]}
        assert hits == {("die", "entry"): len(args), ("die", "return"): 0}


@pytest.mark.parametrize("level", ["-O0", "-O2"])
def test_a_function_that_does_not_decode_whole_has_no_return_probe(tmp_path, level):
    # past the byte that decodes as nothing, its exits are unseen: a return probe
    # patched at the exits before it would miss returns, so it is refused
    plain = tmp_path / "undecodable"
    subprocess.run(["gcc", level, os.path.join(SAMPLES, "undecodable.c"), "-o", plain],
                   check=True)
    listed = json.loads(urewrite("list", "--json", plain).stdout)
    row = next(f for f in listed["functions"] if f["name"] == "hidden_exits")
    assert row["patchable"] and row["return"]["mechanism"] != "exit sites", row
    assert "does not decode past" in (row["return"]["reason"] or ""), row
    # the entry is probed as usual, and counts every call
    out = urewrite(plain, "-p", "hidden_exits", "-o", tmp_path / "out")
    assert out.returncode == 0, out.stderr
    code, program, report = stat([tmp_path / "out"])
    assert (code, program) == (0, "54\n")
    assert {(p["name"], p["kind"]): p["hits"] for p in report["probes"]} == \
        {("hidden_exits", "entry"): 8}


LIBRARY = r"""
__attribute__((noipa)) int lib_twice(int x) { return 2 * x; }
__attribute__((noipa)) int lib_sum(int n) { int s = 0; for (int i = 0; i < n; i++) s += lib_twice(i); return s; }
"""
PROGRAM = r"""
#include <stdio.h>
int lib_sum(int);
int main(void) { long t = 0; for (int i = 0; i < 50; i++) t += lib_sum(i % 7); printf("%ld\n", t); return 0; }
"""


def test_return_probes_in_a_shared_object(tmp_path):
    (tmp_path / "lib.c").write_text(LIBRARY)
    (tmp_path / "main.c").write_text(PROGRAM)
    probed_dir = tmp_path / "probed"
    probed_dir.mkdir()
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", tmp_path / "lib.c", "-o",
                    tmp_path / "libret.so"], check=True)
    subprocess.run(["gcc", "-O2", tmp_path / "main.c", "-L", tmp_path, "-lret", "-o",
                    tmp_path / "main"], check=True)
    out = urewrite(tmp_path / "libret.so", "-r", "lib_*", "-p", "lib_sum",
                   "-o", probed_dir / "libret.so")
    assert out.returncode == 0, out.stderr
    original = subprocess.run([tmp_path / "main"], capture_output=True, text=True,
                              env=dict(os.environ, LD_LIBRARY_PATH=str(tmp_path)))
    env = dict(os.environ, LD_LIBRARY_PATH=str(probed_dir))
    out = subprocess.run([sys.executable, "-m", "urewrite", "stat", "--json", "--latency", "--",
                          tmp_path / "main"], capture_output=True, text=True, env=env)
    start = out.stdout.index('{\n  "exit_code"')
    assert out.stdout[:start] == original.stdout
    report = json.loads(out.stdout[start:])
    hits = {(p["name"], p["kind"]): p["hits"] for p in report["probes"]}
    calls = sum(i % 7 for i in range(50))
    assert hits == {("lib_sum", "entry"): 50, ("lib_sum", "return"): 50,
                    ("lib_twice", "return"): calls}
    lib_sum = next(p for p in report["probes"] if p["name"] == "lib_sum" and p["kind"] == "return")
    assert sum(b["count"] for b in lib_sum["histogram"]) == 50  # the first call too


@pytest.mark.parametrize("level", ["-O2", "-O2 -no-pie"])
def test_windows_keep_clear_of_bytes_the_decoders_read_differently(tmp_path, level):
    # a ud1 that iced-x86 (the sweep) reads as 5 bytes and Capstone (what displaces) as
    # 3: no window may hold it, in list as in the rewrite; windows that end before it do
    plain = tmp_path / "disagree"
    subprocess.run(["gcc", *level.split(), os.path.join(SAMPLES, "decoders_disagree.c"),
                    "-o", plain], check=True)
    listed = {f["name"]: f for f in json.loads(urewrite("list", "--json", plain).stdout)
              ["functions"]}
    elf = ElfFile.open(str(plain))
    ud1 = bytes.fromhex("670fb94016")
    starts = {}
    for name in ("ud1_after_ret", "ud1_tight"):
        row = listed[name]
        code = elf.read(row["address"], row["size"])
        starts[name] = row["address"] + code.index(ud1)
        assert row["patchable"] and row["return"]["mechanism"] == "exit sites", row
        # a plain jump at ud1_tight's entry would have to cover part of the ud1
        if name == "ud1_tight":
            assert row["tactic"] != "jump", row
    out = urewrite(plain, "-p", "ud1_*", "-r", "ud1_*", "-o", tmp_path / "out")
    assert out.returncode == 0, out.stderr
    rewritten = ElfFile.open(str(tmp_path / "out"))
    for name, at in starts.items():
        assert rewritten.read(at, len(ud1)) == ud1, name  # not patched over
    code, program, report = stat([tmp_path / "out"])
    assert (code, program) == (0, "36\n")
    assert {(p["name"], p["kind"]): p["hits"] for p in report["probes"]} == \
        {(name, kind): 6 for name in starts for kind in ("entry", "return")}


def test_histograms_beyond_what_a_region_holds_are_left_out_with_a_warning(tmp_path,
                                                                         monkeypatch):
    """A probe's kind field names at most 65,535 histograms (node has 78,000 functions):
    the functions past that count their entries and returns without one, and the
    rewrite says so (it failed with a traceback). Here with room for one."""
    from urewrite.rewriter import pipeline
    from urewrite.trampolines import region
    plain, probed = tmp_path / "returns", tmp_path / "returns.probed"
    subprocess.run(["gcc", "-O2", "-pthread", os.path.join(SAMPLES, "returns.c"), "-o", plain],
                   check=True)
    monkeypatch.setattr(region, "MAX_HISTOGRAMS", 1)
    result = pipeline.rewrite(str(plain), str(probed), ["tail", "callee"],
                              return_specs=["tail", "callee"])
    assert any("latency histograms for the first 1 functions" in w and "1 more" in w
               for w in result.warnings), result.warnings
    original = subprocess.run([plain, "tail"], capture_output=True, text=True)
    code, program, report = stat([probed, "tail"])
    assert (code, program) == (original.returncode, original.stdout)
    hits = {(p["name"], p["kind"]): p for p in report["probes"]}
    with_histogram = [name for name in ("tail", "callee") if hits[(name, "return")].get("histogram")]
    assert len(with_histogram) == 1
    assert [hits[(name, kind)]["hits"] for name in ("tail", "callee")
            for kind in ("entry", "return")] == [50, 50, 29, 29]
