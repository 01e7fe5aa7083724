"""USDT probes and event tracing (x86_64): counts, arguments, semaphores, the ring."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import run

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "samples")
ROUNDS = 40

pytestmark = pytest.mark.skipif(
    not shutil.which("gcc") or not any(os.path.exists(p) for p in (
        "/usr/include/sys/sdt.h", "/usr/include/x86_64-linux-gnu/sys/sdt.h")),
    reason="needs gcc and <sys/sdt.h> (Debian: systemtap-sdt-dev)")


def urewrite(*args, **kw):
    return run([sys.executable, "-m", "urewrite", *args], **kw)


@pytest.fixture(scope="module", params=["-O0", "-O2", "-O3"])
def usdt(request, tmp_path_factory):
    work = tmp_path_factory.mktemp("usdt" + request.param)
    plain, probed = work / "usdt", work / "usdt.probed"
    subprocess.run(["gcc", request.param, os.path.join(SAMPLES, "usdt.c"), "-o", plain],
                   check=True)
    out = urewrite(plain, "-p", "usdt:sample:*", "-o", probed)
    assert out.returncode == 0, out.stderr
    return plain, probed, work


def fired(stdout: str):
    """What the program says it passed: {probe: [args, ...]} in program order."""
    seen = {}
    for line in stdout.splitlines():
        if line.startswith("fire "):
            name, *args = line.split()[1:]
            seen.setdefault(name, []).append([int(a) for a in args])
    return seen


def test_disarmed_program_is_unchanged(usdt):
    plain, probed, _ = usdt
    a = subprocess.run([plain, str(ROUNDS)], capture_output=True, text=True)
    b = subprocess.run([probed, str(ROUNDS)], capture_output=True, text=True)
    assert (a.returncode, a.stdout) == (b.returncode, b.stdout)
    assert "enabled 0 " in b.stdout  # nobody listens: the semaphore stays off


def test_counts_are_exact_and_the_semaphore_is_enabled(usdt):
    _, probed, _ = usdt
    out = urewrite("stat", "--json", "--", probed, ROUNDS)
    assert out.returncode == 0, out.stderr
    program, report = out.stdout.split("\n{", 1)
    hits = {p["name"]: p["hits"] for p in json.loads("{" + report)["probes"]}
    thirds = len(range(0, ROUNDS, 3))
    assert hits == {"sample:six": ROUNDS, "sample:third": thirds, "sample:zero": ROUNDS,
                    "sample:pair": ROUNDS, "sample:guarded": ROUNDS, "sample:edge": thirds}
    assert f"enabled {ROUNDS} " in program


def test_trace_records_the_arguments_the_program_passed(usdt):
    _, probed, work = usdt
    events = work / "events.jsonl"
    out = urewrite("trace", "--json", "-o", events, "--", probed, ROUNDS)
    assert out.returncode == 0, out.stderr
    recorded = {}
    for line in events.read_text().splitlines():
        e = json.loads(line)
        assert e["kind"] == "usdt" and e["object"] == "usdt.probed" and e["tid"] > 0
        recorded.setdefault(e["probe"].split(":")[1], []).append(e["args"])
    expected = fired(out.stdout)
    expected["zero"] = [[] for _ in range(ROUNDS)]
    expected["edge"] = [[i] for i in range(0, ROUNDS, 3)]
    assert recorded == expected
    times = [json.loads(line)["ts_ns"] for line in events.read_text().splitlines()]
    assert times == sorted(times) and times[0] > 0


def test_list_shows_sites_semaphores_and_arguments(usdt):
    plain, _, _ = usdt
    out = urewrite("list", "--json", plain)
    assert out.returncode == 0, out.stderr
    sites = json.loads(out.stdout)["usdt"]
    by_name = {}
    for s in sites:
        by_name.setdefault(s["name"], []).append(s)
    assert set(by_name) == {"six", "third", "zero", "pair", "guarded", "edge"}
    assert len(by_name["pair"]) == 2  # one name, two sites
    assert all(s["patchable"] for s in sites), [s["reason"] for s in sites]
    assert all(s["semaphore"] for s in sites)
    assert by_name["six"][0]["arguments"].count("@") == 6


def test_text_trace_names_probe_thread_and_arguments(usdt):
    _, probed, _ = usdt
    out = urewrite("trace", "--", probed, 3)
    lines = [l for l in out.stdout.splitlines() if "usdt.probed:sample:six" in l]
    assert len(lines) == 3
    time, pid, tid, probe, *args = lines[1].split()
    assert int(pid) == int(tid) and args == ["1", "-1000", "-1", "-19", "201", "4294967281"]


@pytest.fixture(scope="module")
def threads(tmp_path_factory):
    work = tmp_path_factory.mktemp("usdt_threads")
    plain, probed = work / "usdt_threads", work / "usdt_threads.probed"
    subprocess.run(["gcc", "-O2", "-pthread", os.path.join(SAMPLES, "usdt_threads.c"),
                    "-o", plain], check=True)
    assert urewrite(plain, "-p", "usdt:sample:tick", "-o", probed).returncode == 0
    return probed, work


def traced_ticks(probed, work, ring, threads_n, per_thread):
    events = work / f"ticks{ring}.jsonl"
    out = urewrite("trace", "--json", "--ring", ring, "-o", events, "--", probed, threads_n,
                   per_thread)
    assert out.returncode == 0, out.stderr
    lost = sum(int(m.group(1)) for m in re.finditer(r"(\d+) of \d+ events lost", out.stderr))
    return [json.loads(l)["args"] for l in events.read_text().splitlines()], lost


def test_many_writers_small_ring_no_torn_or_duplicate_event_and_exact_loss(threads):
    probed, work = threads
    args, lost = traced_ticks(probed, work, 64, 4, 50000)
    assert all(c == t * 1000003 + k * 7 for t, k, c in args)  # never torn
    assert len({(t, k) for t, k, _ in args}) == len(args)  # never twice
    assert lost > 0 and len(args) + lost == 4 * 50000  # every event delivered or counted lost


def test_large_ring_loses_nothing(threads):
    probed, work = threads
    args, lost = traced_ticks(probed, work, 1 << 20, 4, 20000)
    assert lost == 0 and sorted(args) == sorted(
        [t, k, t * 1000003 + k * 7] for t in range(4) for k in range(20000))


def test_counting_stays_exact_with_many_threads(threads):
    probed, _ = threads
    out = urewrite("stat", "--json", "--", probed, 8, 125000)
    report = json.loads(out.stdout[out.stdout.index("{"):])
    assert report["probes"][0]["hits"] == 1000000
