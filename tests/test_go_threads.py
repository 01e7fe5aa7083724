"""Go programs: exact counts when goroutines run on several threads.

Go points each thread's fs at its own data, whose first word is 0, so fs:[0]
(the TLS ABI's self pointer, the thread identity of C programs) tells no thread
apart; on arm64 pure Go never sets tpidr_el0, and its threads inherit the
start hook's stand-in. samples/go/workers.go calls a //go:noinline function
from goroutines on several threads (GOMAXPROCS >= 4) and prints its own count;
rewritten with `-p main.work -r main.work`, `stat` must report exactly that
count for the entry and the return, built static and PIE (x86_64) and static
for arm64 (under qemu-aarch64). work yields now and then mid-call
(runtime.Gosched), so a call may return on another thread than it entered on:
its latency pair is kept by goroutine (r14, x28), and every call gives a sample.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path

import pytest

import cross
from conftest import GO_CACHE, SAMPLES, check, rewrite, run, stat
from urewrite.trampolines.region import GO_CALLS, read_regions

GO = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK)
                            else None)
pytestmark = pytest.mark.skipif(GO is None, reason="needs a Go toolchain (go not found; "
                                "Debian: apt-get install golang)")
QEMU = shutil.which(cross.QEMU)  # (static Go programs need no -L)
GOROUTINES, EACH = 16, 5000
HWCAP2_FSGSBASE = 2
AT_HWCAP2 = 26


def _go_build(source: Path, out: Path, *flags: str, goarch: str = "amd64") -> Path:
    """Builds one Go file offline: its module cache under tmp, the tests' build cache."""
    work = out.parent
    (work / "go.mod").write_text("module sample\n\ngo 1.21\n")
    shutil.copy(source, work / source.name)
    env = {"GOARCH": goarch, "GOTOOLCHAIN": "local", "GOFLAGS": "", "GOPROXY": "off",
           "GOCACHE": GO_CACHE, "GOPATH": str(work / "gopath")}
    if goarch != "amd64":
        env["CGO_ENABLED"] = "0"  # (no cross C toolchain needed)
    check([GO, "build", *flags, "-o", str(out), source.name], env=env, cwd=work)
    return out


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """(kind -> original, rewritten): each built in a directory of its own."""
    built = {}
    kinds = {"static": ((), "amd64"), "pie": (("-buildmode=pie",), "amd64"),
             "arm64": ((), "arm64")}
    for kind, (flags, goarch) in kinds.items():
        d = tmp_path_factory.mktemp(f"go-{kind}")
        original = _go_build(SAMPLES / "go" / "workers.go", d / "workers", *flags, goarch=goarch)
        probed = d / "workers.probed"
        rewrite(original, probed, "main.work", extra=["-r", "main.work"])
        built[kind] = (original, probed)
    return built


def _command(kind: str, program: Path, *args) -> list:
    if kind == "arm64":
        if QEMU is None:
            pytest.skip("needs qemu-aarch64 (Debian: apt-get install qemu-user)")
        return [QEMU, program, *map(str, args)]
    return [program, *map(str, args)]


def _own_count(output: str) -> int:
    match = re.search(r"calls=(\d+)", output)
    assert match, output
    return int(match.group(1))


def _fsgsbase() -> bool:
    """Whether the kernel lets rdfsbase run (AT_HWCAP2 of this process)."""
    data = Path("/proc/self/auxv").read_bytes()
    for at in range(0, len(data) - 15, 16):
        kind, value = struct.unpack_from("<QQ", data, at)
        if kind == AT_HWCAP2:
            return bool(value & HWCAP2_FSGSBASE)
    return False


@pytest.mark.parametrize("kind", ["static", "pie", "arm64"])
def test_counts_equal_the_programs_own(programs, kind, tmp_path):
    original, probed = programs[kind]
    plain = check(_command(kind, original, GOROUTINES, EACH))
    assert check(_command(kind, probed, GOROUTINES, EACH)).stdout == plain.stdout  # disarmed
    run_ = stat(_command(kind, probed, GOROUTINES, EACH), tmp_path, latency=True)
    assert run_.proc.returncode == 0, run_.proc.stderr
    assert run_.proc.stdout == plain.stdout
    calls = _own_count(plain.stdout)
    assert calls == GOROUTINES * EACH
    entry = [p for p in run_.probes if p["name"] == "main.work" and p["kind"] == "entry"]
    returns = [p for p in run_.probes if p["name"] == "main.work" and p["kind"] == "return"]
    assert [p["hits"] for p in entry] == [calls]
    assert [p["hits"] for p in returns] == [calls]
    assert sum(b["count"] for b in returns[0]["histogram"]) == calls  # a sample per call
    assert run_.report["latency_missed"] == 0


def _regions(kind: str, program: Path, tmp_path: Path, locked: bool = False):
    regions = tmp_path / "regions"
    regions.mkdir()
    check(_command(kind, program, GOROUTINES, EACH, *([1] if locked else [])),
          env={"UREWRITE_DIR": str(regions), "UREWRITE_LATENCY": "1"})
    (region,) = read_regions(str(regions))
    return region


@pytest.mark.skipif(not _fsgsbase(), reason="the kernel does not let rdfsbase run "
                    "(AT_HWCAP2 without FSGSBASE): Go's threads count in the shared row")
@pytest.mark.parametrize("kind", ["static", "pie"])
def test_threads_count_in_rows_of_their_own(programs, kind, tmp_path):
    """Told apart by their fs base: several threads claim rows (plain adds there). Each
    goroutine keeps a thread of its own, so that several threads call for sure."""
    region = _regions(kind, programs[kind][1], tmp_path, locked=True)
    assert region.threads > 1
    assert [p.hits for p in region.probes] == [GOROUTINES * EACH] * 2
    _every_call_sampled(region)


def _every_call_sampled(region) -> None:
    """Latency pairs are kept by goroutine (r14, x28: ABIInternal): each call gives a
    sample, whichever thread it entered and returned on, in whichever row."""
    ret = next(p for p in region.probes if p.kind == "return")
    assert sum(ret.histogram) == ret.hits and region.latency_missed == 0


def test_without_rdfsbase_counts_are_exact_in_the_shared_row(programs, tmp_path):
    """Where the kernel does not allow rdfsbase, Go's threads cannot be told apart:
    every hit counts in the shared row, atomically. The start hook's store of the
    flag it reads from AT_HWCAP2 is made to store 0, as such a kernel would leave it."""
    probed = programs["static"][1]
    data = probed.read_bytes()
    store = bytes.fromhex("c68318100000" "01")  # mov byte ptr [rbx + 0x1018], 1
    assert data.count(store) == 1
    blind = tmp_path / "workers.blind"
    blind.write_bytes(data.replace(store, store[:-1] + b"\0"))
    blind.chmod(0o755)
    region = _regions("static", blind, tmp_path)
    assert region.threads == 0
    assert [p.hits for p in region.probes] == [GOROUTINES * EACH] * 2
    _every_call_sampled(region)  # (pairs by goroutine need no row of the thread's own)


def test_arm64_threads_share_no_row(programs, tmp_path):
    """On arm64 Go's threads all hold the stand-in thread pointer: none claims a row
    (its adds there would mix the threads' latency stacks), all count in the shared one,
    where pairs kept by goroutine are measured all the same."""
    region = _regions("arm64", programs["arm64"][1], tmp_path)
    assert region.threads == 0
    assert [p.hits for p in region.probes] == [GOROUTINES * EACH] * 2
    _every_call_sampled(region)


@pytest.mark.skipif(not _fsgsbase(), reason="the kernel does not let rdfsbase run: "
                    "events of Go's threads name no thread (tid 0)")
def test_trace_events_name_their_threads(programs, tmp_path):
    probed = programs["static"][1]
    events = tmp_path / "events.jsonl"
    for _ in range(3):  # (on a busy machine Go may run every goroutine on one thread)
        proc = run([sys.executable, "-m", "urewrite", "trace", "--ring", 1 << 18, "--json",
                    "-o", events, "--", probed, GOROUTINES, EACH])
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
        work = [e for e in lines if e.get("probe") == "main.work"]
        assert len(work) == 2 * GOROUTINES * EACH
        tids = {e["tid"] for e in work}
        assert 0 not in tids
        if len(tids) > 1:
            break
    assert len(tids) > 1


@pytest.fixture(scope="module")
def growth(tmp_path_factory):
    """samples/go/growth.go, static for x86_64 and arm64: (kind -> original, rewritten)."""
    built = {}
    for kind, goarch in (("static", "amd64"), ("arm64", "arm64")):
        d = tmp_path_factory.mktemp(f"go-growth-{kind}")
        original = _go_build(SAMPLES / "go" / "growth.go", d / "growth", goarch=goarch)
        probed = d / "growth.probed"
        rewrite(original, probed, "main.descend", extra=["-r", "main.descend"])
        built[kind] = (original, probed)
    return built


@pytest.mark.parametrize("kind", ["static", "arm64"])
def test_a_call_that_grows_its_stack_enters_twice_and_returns_once(growth, kind, tmp_path):
    """Go's prologue restarts a function from its entry after morestack has copied
    the stack: the entry probe counts that call twice; the return probe (exits are
    patched, never the return address, so the copy carries nothing of ours) counts
    each call once."""
    original, probed = growth[kind]
    depth, rounds = 5000, 20
    plain = check(_command(kind, original, depth, rounds))
    run_ = stat(_command(kind, probed, depth, rounds), tmp_path, latency=True)
    assert run_.proc.returncode == 0, run_.proc.stderr
    assert run_.proc.stdout == plain.stdout
    calls = _own_count(plain.stdout)
    assert calls == (depth + 1) * rounds
    entries = [p["hits"] for p in run_.probes if p["kind"] == "entry"]
    returns = [p["hits"] for p in run_.probes if p["kind"] == "return"]
    assert returns == [calls]
    (entered,) = entries
    assert calls < entered <= calls + 64 * rounds  # a few restarts per new goroutine's stack
    # the restarted entry replaces the first: one pair per call
    histogram = next(p["histogram"] for p in run_.probes if p["kind"] == "return")
    assert sum(b["count"] for b in histogram) == calls
    assert run_.report["latency_missed"] == 0


@pytest.mark.parametrize("kind", ["static", "arm64"])
def test_calls_beyond_the_table_of_open_go_calls_are_counted(growth, kind, tmp_path):
    """One goroutine with more calls open at once than the region's table of Go calls
    holds: the entries that find no room give no sample, and their returns are counted
    as missed, never dropped; the table fills (nearly) up before any is missed."""
    depth = GO_CALLS + 20000
    run_ = stat(_command(kind, growth[kind][1], depth, 1), tmp_path, latency=True)
    assert run_.proc.returncode == 0, run_.proc.stderr
    calls = _own_count(run_.proc.stdout)
    assert calls == depth + 1
    ret = next(p for p in run_.probes if p["kind"] == "return")
    sampled = sum(b["count"] for b in ret["histogram"])
    assert ret["hits"] == calls
    assert sampled + run_.report["latency_missed"] == calls
    assert GO_CALLS * 0.99 <= sampled <= GO_CALLS
    assert f"{calls - sampled} returns of functions measured for latency gave no sample" \
        in run_.proc.stderr
