"""Collection (--collection): what reading a process's counts costs, and what `stat`
adds to a loop of short runs.

A generated program with N functions (`--functions`; function i called i % 7 + 1
times), every one probed at entry and return (2N probes, N latency histograms, as
`-p '*' -r '*'` gives), is run R times:

- plain: a shell loop of R runs, probes disarmed;
- armed: the same loop with UREWRITE_DIR set (what the probes and their set-up
  cost, no reader);
- stat: the same loop under `urewrite stat` (Python's start, the runs, reading and
  adding up R regions, the report).

Then the R regions the armed loop left are read as `stat` reads them, in 3 passes (the
best kept, wall clock and CPU): the first one (its probe table parsed) and each further
one (its counts only). The counts are checked: every function entered and left as often
as it was called, with as many latency samples.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from urewrite.bench.common import BenchError, clean_env, log
from urewrite.bench.rewrite_cost import generated_program

RUNS = 40
PASSES = 3  # reads of the regions: the best is kept
TARGET_MS = 5.0  # a process's counts, 20,000 probes (#37)
TARGET_RATIO = 1.5  # stat's loop against the plain loop (#37)


def calls_of(i: int) -> int:
    """How many times a run calls function f<i>: unlike counts tell a count read into
    the wrong column."""
    return i % 7 + 1


def _wrong_counts(region, runs: int) -> list:
    """Probes of f<i> whose hits (or histogram samples) are not runs x calls_of(i)."""
    wrong = []
    for p in region.probes:
        if p.name.startswith("f") and p.name[1:].isdigit():
            expected = runs * calls_of(int(p.name[1:]))
            if p.hits != expected or (p.histogram is not None
                                      and sum(p.histogram) != expected):
                wrong.append(f"{p.name} {p.kind} {p.hits}")
    if sum(1 for p in region.probes if p.name == "f0") != 2:
        wrong.append("f0 missing")
    return wrong


def _timed(cmd, env) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"collection: {' '.join(cmd[:4])} ... exited with "
                         f"{proc.returncode}: {proc.stderr.strip()[-300:]}")
    return seconds


def collection_bench(work: str, functions: int = 10000, runs: int = RUNS) -> dict:
    from urewrite.runner import region_directory, remove_region_directory
    from urewrite.trampolines import region_reader
    work = os.path.join(work, "collection")
    os.makedirs(work, exist_ok=True)
    log(f"collection: building and rewriting a program with {functions} functions")
    binary = generated_program(work, functions, calls_of=calls_of)
    probed = binary + ".probed"
    proc = subprocess.run([sys.executable, "-m", "urewrite", binary, "-p", "*", "-r", "*",
                           "-q", "-o", probed], capture_output=True, text=True, env=clean_env())
    if proc.returncode != 0:
        raise BenchError(f"collection: the rewrite failed: {proc.stderr.strip()}")
    loop = f'for i in $(seq {runs}); do "{probed}"; done'
    shell = shutil.which("sh") or "/bin/sh"
    log(f"collection: {runs} runs plain, armed and under stat")
    plain = _timed([shell, "-c", loop], clean_env())
    directory = region_directory()
    try:
        armed = _timed([shell, "-c", loop], clean_env({"UREWRITE_DIR": directory}))
        stat = _timed([sys.executable, "-m", "urewrite", "stat", "-o", os.devnull, "--",
                       shell, "-c", loop], clean_env())
        paths = region_reader.region_paths(directory)
        if len(paths) != runs:
            raise BenchError(f"collection: {len(paths)} regions for {runs} runs")
        first_ms = further_ms = further_cpu_ms = float("inf")
        for _ in range(PASSES):  # (the best pass: other work on the machine only slows)
            tables, shared = region_reader.TableCache(), {}
            start = time.perf_counter()
            first = region_reader.read_counts_of(paths[0], tables, shared)
            first_ms = min(first_ms, 1e3 * (time.perf_counter() - start))
            start, cpu = time.perf_counter(), time.process_time()
            for path in paths[1:]:
                region_reader.read_counts_of(path, tables, shared)
            further_ms = min(further_ms, 1e3 * (time.perf_counter() - start) / max(1, runs - 1))
            further_cpu_ms = min(further_cpu_ms,
                                 1e3 * (time.process_time() - cpu) / max(1, runs - 1))
        totals = region_reader.to_region(first)
    finally:
        remove_region_directory(directory)
    probes = len(totals.probes)
    wrong = _wrong_counts(totals, runs)
    if wrong:
        raise BenchError(f"collection: wrong counts: {', '.join(wrong[:3])}")
    return {"functions": functions, "probes": probes, "runs": runs,
            "first_region_ms": first_ms, "ms_per_process": further_ms,
            "cpu_ms_per_process": further_cpu_ms,
            "plain_s": plain, "armed_s": armed, "stat_s": stat,
            "stat_ratio": stat / plain, "stat_ratio_armed": stat / armed,
            "stat_ms_per_process": 1e3 * (stat - armed) / runs}


def format_collection_table(c: dict) -> str:
    return "\n".join([
        f"collection: a generated program, {c['functions']:,} functions, every one probed "
        f"at entry and return ({c['probes']:,} probes), {c['runs']} runs",
        f"  a process's counts read and added up: {c['ms_per_process']:.2f} ms "
        f"({c['cpu_ms_per_process']:.2f} ms of CPU; best of {PASSES} passes; the first "
        f"region, its probe table parsed: {c['first_region_ms']:.1f} ms)",
        f"  loop of {c['runs']} runs: plain {c['plain_s']:.2f} s, armed {c['armed_s']:.2f} s, "
        f"under stat {c['stat_s']:.2f} s ({c['stat_ratio']:.2f}x plain, "
        f"{c['stat_ratio_armed']:.2f}x armed; stat adds {c['stat_ms_per_process']:.1f} ms "
        f"a process to the armed loop)"])


def collection_targets(c: dict) -> list:
    return [(f"a process's counts ({c['probes']:,} probes) collected within {TARGET_MS:g} ms",
             c["ms_per_process"], c["ms_per_process"] <= TARGET_MS, " ms"),
            (f"stat on a loop of {c['runs']} short runs within {TARGET_RATIO}x the plain loop",
             c["stat_ratio"], c["stat_ratio"] <= TARGET_RATIO, "x")]
