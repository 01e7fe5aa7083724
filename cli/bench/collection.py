"""Collection (--collection): what reading a process's counts costs, and what `stat`
adds to a loop of short runs.

A generated program with N functions (`--functions`; function i called i % 7 + 1
times), every one probed at entry and return (2N probes, N latency histograms, as
`-p '*' -r '*'` gives), is run R times:

- plain: a shell loop of R runs, probes disarmed;
- armed: the same loop with UREWRITE_DIR and UREWRITE_LATENCY set (what the probes,
  their timing and their set-up cost, no reader);
- stat: the same loop under `urewrite stat --latency` (Python's start, the runs,
  reading and adding up R regions, the report).

With --python FILE (#37 names python3.11): the same three loops of R runs of
`FILE -S -c pass`, rewritten with every function probed, at entry, then at entry
and return, under plain `stat`, then under `stat --latency`; each loop timed ROUNDS
times, interleaved, the best kept (other work on a shared machine only slows). The
ratio judged is the median of the rounds' own (each round's stat loop over the plain
loop run just before it): the best of each loop alone came out 1.33x to 1.73x in six
runs at load 3 to 4, the plain loop's best now and then a lucky one. The issue's 1.5x
is judged on `stat` of every function probed, at entry and at entry and return; with
`--latency`, every one of the 227,000 calls a run is timed by two clock reads (15 ns
each on the machine of docs/benchmarks.md), more than the 1.5x leaves, so that row is
shown, not judged.

Then the R regions the armed loop left are read as `stat` reads them, in 3 passes (the
best kept, wall clock and CPU): the first one (its probe table parsed) and each further
one (its counts only). The counts are checked: every function entered and left as often
as it was called, with as many latency samples.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Optional

from urewrite.bench.common import ENV_VAR, LATENCY_ENV_VAR, BenchError, clean_env, log
from urewrite.bench.rewrite_cost import generated_program

RUNS = 40
PASSES = 3  # reads of the regions: the best is kept
TARGET_MS = 5.0  # a process's counts, 20,000 probes (#37)
TARGET_RATIO = 1.5  # stat's loop against the plain loop (#37)
ROUNDS = 5  # of each python loop (bench --repeat)
# label: (probes, calls timed); the rows the 1.5x target judges are the untimed ones
PYTHON_PROBES = {"entries": (("-p", "*"), False),
                 "entries and returns": (("-p", "*", "-r", "*"), False),
                 "entries and returns, --latency": (("-p", "*", "-r", "*"), True)}


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


def _loops(command: str, runs: int, directory: str, latency: bool) -> dict:
    """Seconds of a shell loop of `runs` runs of `command`: plain, armed (regions in
    `directory`) and under stat; with `latency`, calls are timed."""
    loop = f"for i in $(seq {runs}); do {command}; done"
    shell = shutil.which("sh") or "/bin/sh"
    armed = {ENV_VAR: directory, **({LATENCY_ENV_VAR: "1"} if latency else {})}
    return {"plain_s": _timed([shell, "-c", loop], clean_env()),
            "armed_s": _timed([shell, "-c", loop], clean_env(armed)),
            "stat_s": _timed([sys.executable, "-m", "urewrite", "stat", "-o", os.devnull]
                             + ["--latency"] * latency + ["--", shell, "-c", loop],
                             clean_env())}


def _ratios(times: dict, runs: int) -> dict:
    return dict(times, stat_ratio=times["stat_s"] / times["plain_s"],
                stat_ratio_armed=times["stat_s"] / times["armed_s"],
                stat_ms_per_process=1e3 * (times["stat_s"] - times["armed_s"]) / runs)


def python_loops(work: str, python: str, runs: int = RUNS, rounds: int = ROUNDS,
                 probe_sets: dict = PYTHON_PROBES) -> list:
    """A row per probe set: `python -S -c pass` rewritten with it, looped."""
    from urewrite.reader.directories import region_directory, remove_region_directory
    rows = []
    rewrites: dict = {}  # probe arguments: (the output, its probe count)
    for label, (args, latency) in probe_sets.items():
        if args not in rewrites:
            probed = os.path.join(work, f"python-{len(rewrites)}.probed")
            log(f"collection: rewriting {python} ({' '.join(args)})")
            proc = subprocess.run([sys.executable, "-m", "urewrite", python, *args, "--json",
                                   "-o", probed], capture_output=True, text=True,
                                  env=clean_env())
            if proc.returncode != 0:
                raise BenchError(f"collection: the rewrite of {python} failed: "
                                 f"{proc.stderr.strip()[-300:]}")
            rewrites[args] = probed, json.loads(proc.stdout)["probes"]
        probed, probes = rewrites[args]
        best: dict = {}
        ratios = []  # each round's stat loop over its plain loop
        for _ in range(rounds):
            directory = region_directory()
            try:
                times = _loops(f'"{probed}" -S -c pass', runs, directory, latency)
            finally:
                remove_region_directory(directory)
            best = {k: min(v, best.get(k, v)) for k, v in times.items()}
            ratios.append(times["stat_s"] / times["plain_s"])
        row = _ratios(dict(best, probes_given=label, program=python, probes=len(probes),
                           runs=runs, rounds=rounds, latency=latency), runs)
        row["stat_ratio_best"] = row["stat_ratio"]  # (the best of each loop)
        row["stat_ratio"] = statistics.median(ratios)
        row["stat_ratios"] = ratios
        rows.append(row)
    return rows


def collection_bench(work: str, functions: int = 10000, runs: int = RUNS,
                     python: Optional[str] = None, rounds: int = ROUNDS) -> dict:
    from urewrite.reader.directories import region_directory, remove_region_directory
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
    log(f"collection: {runs} runs plain, armed and under stat")
    directory = region_directory()
    try:
        times = _loops(f'"{probed}"', runs, directory, latency=True)
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
    result = _ratios(dict(times, functions=functions, probes=probes, runs=runs,
                          first_region_ms=first_ms, ms_per_process=further_ms,
                          cpu_ms_per_process=further_cpu_ms), runs)
    if python:
        result["python"] = python_loops(work, python, runs, rounds)
    return result


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
        f"a process to the armed loop)"] + [
        f"  {r['program']} -S -c pass, every function probed ({r['probes_given']}: "
        f"{r['probes']:,} probes), loop of {r['runs']} runs, best of {r['rounds']}: plain "
        f"{r['plain_s']:.2f} s, armed {r['armed_s']:.2f} s ({r['armed_s'] / r['plain_s']:.2f}x "
        f"plain), under stat {r['stat_s']:.2f} s ({r['stat_ratio_best']:.2f}x plain, "
        f"{r['stat_ratio_armed']:.2f}x armed; stat adds {r['stat_ms_per_process']:.1f} ms a "
        f"process); stat over plain round by round: "
        f"{', '.join(f'{x:.2f}' for x in r['stat_ratios'])}, median {r['stat_ratio']:.2f}x"
        + (" [not judged]" if r["latency"] else "")
        for r in c.get("python", [])])


def collection_targets(c: dict) -> list:
    """#37's two: a process's counts (the generated program's 20,000 probes) within 5 ms,
    and stat on a loop of short runs of python3.11 (every function probed, at entry and
    at entry and return) within 1.5x the plain loop. (The generated program's loop is
    no target: a run of it takes 2 ms, against Python's start for stat's.)"""
    return [(f"a process's counts ({c['probes']:,} probes) collected within {TARGET_MS:g} ms",
             c["ms_per_process"], c["ms_per_process"] <= TARGET_MS, " ms")] + [
            (f"stat on a loop of {r['runs']} runs of {os.path.basename(r['program'])}, every "
             f"function probed ({r['probes_given']}), within {TARGET_RATIO}x the plain loop "
             f"(median of {r['rounds']} rounds)",
             r["stat_ratio"], r["stat_ratio"] <= TARGET_RATIO, "x")
            for r in c.get("python", []) if not r["latency"]]
