"""Returns of functions measured for latency that give no sample are counted, never
dropped silently: samples/latency_depth.c recurses deeper than a thread's stack of
open calls holds (126), in several threads; every return either adds a sample to
the histogram or counts in the region's `latency_missed`, exactly as many as the
calls that were open beyond the limit. x86_64, and arm64 under qemu-aarch64.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import cross
import json

from conftest import SAMPLES, check, rewrite, urewrite
from urewrite.trampolines.region import GO_CALLS, LATENCY_DEPTH, read_regions

DEPTH, ROUNDS, THREADS = 200, 50, 4
CALLS = DEPTH * ROUNDS * THREADS
SAMPLED = LATENCY_DEPTH * ROUNDS * THREADS


def _region_after(command, tmp_path: Path):
    regions = tmp_path / "regions"
    regions.mkdir()
    out = check([*command, DEPTH, ROUNDS, THREADS], env={"UREWRITE_DIR": str(regions),
                                                        "UREWRITE_LATENCY": "1"})
    assert out.stdout.strip() == f"calls={CALLS}"  # (descend(n) returns n)
    (region,) = read_regions(str(regions))
    return region


def _check_region(region) -> None:
    entry = next(p for p in region.probes if p.kind == "entry")
    ret = next(p for p in region.probes if p.kind == "return")
    assert entry.hits == ret.hits == CALLS
    assert sum(ret.histogram) == SAMPLED
    assert region.latency_missed == CALLS - SAMPLED


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_calls_beyond_the_stack_of_open_calls_are_counted(tmp_path):
    program = tmp_path / "latency_depth"
    check(["gcc", "-O2", "-pthread", SAMPLES / "latency_depth.c", "-o", program])
    probed = tmp_path / "latency_depth.probed"
    rewrite(program, probed, "descend", extra=["-r", "descend"])
    _check_region(_region_after([probed], tmp_path))
    # and `stat --json` reports them, as stat's stderr does
    urewrite("stat", "--json", "--latency", "-o", tmp_path / "stat.json", "--", probed, DEPTH,
             ROUNDS, THREADS)
    report = json.loads((tmp_path / "stat.json").read_text())
    assert report["latency_missed"] == CALLS - SAMPLED and report["returns_missed"] == 0
    # and so does a live reader of a directory (stat --dir: the regions mapped)
    regions = tmp_path / "live"
    regions.mkdir()
    check([probed, DEPTH, ROUNDS, THREADS], env={"UREWRITE_DIR": str(regions),
                                                 "UREWRITE_LATENCY": "1"})
    live = urewrite("stat", "--dir", regions, "--duration", "0", "--json")
    assert json.loads(live.stdout)["latency_missed"] == CALLS - SAMPLED
    assert f"{CALLS - SAMPLED} returns of functions measured" in live.stderr
    # a loop of runs says so once, for all its processes
    loop = urewrite("stat", "--latency", "--", "sh", "-c",
                    f"for i in 1 2 3; do {probed} {DEPTH} {ROUNDS} {THREADS}; done")
    missed = [line for line in loop.stderr.splitlines() if "gave no sample" in line]
    assert missed == [f"urewrite: latency_depth.probed (3 processes): {3 * (CALLS - SAMPLED)} "
                      f"returns of functions measured for latency gave no sample (more than "
                      f"{LATENCY_DEPTH} calls open in a thread, or entered on another thread; "
                      f"Go functions: more calls open than the region's {GO_CALLS} entries "
                      f"hold, or run with no goroutine)"]


@cross.needs(cross.CC, cross.QEMU)
def test_arm64_calls_beyond_the_stack_of_open_calls_are_counted(tmp_path):
    program = tmp_path / "latency_depth"
    check([cross.CC, "-O2", "-static", "-pthread", SAMPLES / "latency_depth.c", "-o", program])
    probed = tmp_path / "latency_depth.probed"
    rewrite(program, probed, "descend", extra=["-r", "descend"])
    _check_region(_region_after([cross.QEMU, probed], tmp_path))
