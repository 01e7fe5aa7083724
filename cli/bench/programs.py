"""Probe programs (--programs): what a program adds to a hit, against the same program
under bpftrace with kernel uprobes, in the same run.

The shipped target `calls.c` calls `target(i, word)` N times and prints nanoseconds per
call. It is rewritten twice: with an entry probe on `target`, and with an entry and a
return probe (the latency idiom's); each row runs it (best of `repeat` rounds, every
row once a round): unprobed; counting (`urewrite stat`) with each rewrite; then under
`urewrite run` with each program below, on the rewrite it needs; then (best of `repeat`
runs each) the same program under bpftrace on the unprobed target (root and tracefs
only, unless --no-kernel). "Added" is over counting with the same
rewrite. Each program's maps are checked: a row whose counts are wrong fails the bench.
The C callbacks beside it (--call) are rows too, each against the bpftrace program
that does the same. Each row but the string one is also run built into a rewrite (under
`stat`), its own row, against the same bpftrace row. The targets #34 gives are judged on the "added" column; the
latency idiom's (two clock reads + 5 ns) with a clock read timed in the same run
(`calls N clock`: the counter nsecs reads, in a loop of nothing else).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Dict, List, Optional

from urewrite.bench.common import RUN_TIMEOUT, BenchError, clean_env, log

KERNEL_SHARE = 50  # bpftrace's rows make 1/50 of the calls

SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "share", "bench", "calls.c")

# name -> (program, with {path} for the file, a line its maps must print for N calls)
PROGRAMS = {
    "predicate false": ("uprobe:{path}:target /arg0 == 0xffffffffff/ {{ @never = count(); }}",
                        lambda n: "@never: 0"),
    "@[arg0 % 1000] = count()": ("uprobe:{path}:target {{ @[arg0 % 1000] = count(); }}",
                                 lambda n: f"@[999]: {n // 1000}"),
    "latency idiom": ("uprobe:{path}:target {{ @s[tid] = nsecs; }} "
                      "uretprobe:{path}:target /@s[tid]/ {{ @n = count(); "
                      "@ns = hist(nsecs - @s[tid]); delete(@s[tid]); }}",
                      lambda n: f"@n: {n}"),
    "@[str(arg1)] = count()": ("uprobe:{path}:target {{ @[str(arg1)] = count(); }}",
                               lambda n: f"@[delta]: {n // 4}"),
    # floating point (farg0 is i / 4.0): bpftrace reads no floating-point register
    "float predicate false": ("uprobe:{path}:target /farg0 < -1.5/ {{ @never = count(); }}",
                              lambda n: "@never: 0"),
    "sum(farg0)": ("uprobe:{path}:target {{ @s = sum(farg0); }}",
                   lambda n: f"@s: {4 * (n // 4) * (n // 4 - 1) // 2 + n % 4 * (n // 4)}"),
}
NO_BPFTRACE = ("float predicate false", "sum(farg0)")  # (it has no floating point)
BUILT_IN = ", built in"  # (a row's name, built into the rewrite)


def under_bpftrace(row: str) -> bool:
    """Whether bpftrace can run a row's program (a built-in row: as its loaded row)."""
    return row.removesuffix(BUILT_IN) not in NO_BPFTRACE


# rows not built in as well: a checked read's system call is what that one costs
NOT_BUILT_IN = ("@[str(arg1)] = count()",)

# C callbacks (--call): name -> (FILE:FUNCTION beside calls.c, the bpftrace program that
# does the same, a line its maps must print for N calls, or None)
CALLBACKS = {
    "C callback, empty": ("empty_callback.c:empty", "uprobe:{path}:target {{ }}",
                          lambda n: None),
    "C callback, keyed count": ("keyed_callback.c:keyed_count", "uprobe:{path}:target "
                                "{{ @keyed[arg0 % 1000] = count(); }}",
                                lambda n: f"@keyed[999]: {n // 1000}"),
}


def build(work: str) -> str:
    if shutil.which("gcc") is None:
        raise BenchError("gcc is not installed: the bench builds its target with it")
    out = os.path.join(work, "calls")
    proc = subprocess.run(["gcc", "-O2", SOURCE, "-o", out], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"cannot build the calls target:\n{proc.stderr.strip()}")
    return out


def _ns(command: List[str], expect: Optional[str] = None, strict: bool = True) -> tuple:
    """(ns per call, whether the maps hold `expect`); a wrong map fails when `strict`."""
    proc = subprocess.run(command, capture_output=True, text=True, env=clean_env(),
                          timeout=RUN_TIMEOUT)
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(command[:3])} ...: {proc.stderr.strip()[-300:]}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    numbers = [line for line in lines if line.replace(".", "", 1).isdigit()]
    if not numbers:
        raise BenchError(f"{' '.join(command[:3])} ...: no timing in its output")
    right = expect is None or expect in lines
    if strict and not right:
        raise BenchError(f"{' '.join(command[:3])} ...: its maps lack '{expect}'")
    return float(numbers[0]), right


def programs_bench(work: str, iterations: int, repeat: int, kernel: bool) -> Dict:
    plain = build(work)
    urewrite = [sys.executable, "-m", "urewrite"]
    rewrites = {}
    for returns in (False, True):
        probed = os.path.join(work, "calls.both" if returns else "calls.entry")
        proc = subprocess.run(urewrite + [plain, "-p", "target", "--args", "2", "-o", probed,
                                          "-q"] + (["-r", "target"] if returns else []),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise BenchError(f"cannot rewrite the calls target: {proc.stderr.strip()}")
        rewrites[returns] = probed
    n = str(iterations)

    def best(command, expect=None, strict=True):
        runs = [_ns(command, expect, strict) for _ in range(repeat)]
        return min(ns for ns, _ in runs), all(right for _, right in runs)

    rows_to_run = [(name, text, expect, ["-e", text]) for name, (text, expect) in
                   PROGRAMS.items()] + \
        [(name, text, expect, ["--call", os.path.join(os.path.dirname(SOURCE), call)])
         for name, (call, text, expect) in CALLBACKS.items()]
    # Our rows run in rounds, each row once a round, so that a slow spell of the
    # machine (seconds long here) falls on every row alike rather than on the few it
    # happens to meet; each row's figure is its best round.
    ours_commands = {"unprobed": ([plain, n], None), "clock_read": ([plain, n, "clock"], None),
                     "counting": (urewrite + ["stat", "--", rewrites[False], n], None),
                     "counting_with_return": (urewrite + ["stat", "--", rewrites[True], n], None)}
    for name, text, expect, how in rows_to_run:
        probed = rewrites["uretprobe" in text]
        what = [how[0], how[1].format(path=probed)] if how[0] == "-e" else how
        ours_commands[name] = (urewrite + ["run", *what, "--", probed, n], expect(iterations))
    # each program and callback built into a rewrite too, run under stat (its
    # trampoline calls it, docs/design.md "Built-in calls")
    for k, (name, text, expect, how) in enumerate(list(rows_to_run)):
        if name in NOT_BUILT_IN:
            continue
        probed = os.path.join(work, f"calls.built-in.{k}")
        given = ["-e", how[1].format(path=probed)] if how[0] == "-e" else \
            ["-p", "target", "--args", "2", *how]
        proc = subprocess.run(urewrite + [plain, *given, "-o", probed, "-q"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise BenchError(f"cannot rewrite the calls target with {how[1]}: "
                             f"{proc.stderr.strip()}")
        rows_to_run.append((name + BUILT_IN, text, expect, None))
        ours_commands[name + BUILT_IN] = (urewrite + ["stat", "--", probed, n],
                                              expect(iterations))
    ours_best: Dict[str, float] = {}
    for round_number in range(repeat):
        log(f"programs: round {round_number + 1} of {repeat}")
        for key, (command, expect) in ours_commands.items():
            ns, _ = _ns(command, expect)
            ours_best[key] = min(ns, ours_best.get(key, ns))
    counting = {False: ours_best["counting"], True: ours_best["counting_with_return"]}
    rows = {key: ours_best[key] for key in ("unprobed", "counting", "counting_with_return",
                                            "clock_read")}
    bpftrace = shutil.which("bpftrace") if kernel and os.geteuid() == 0 else None
    programs, kernel_rows = [], {}
    for name, text, expect, how in rows_to_run:
        returns = "uretprobe" in text
        ours = ours_best[name]
        if bpftrace and under_bpftrace(name) and text not in kernel_rows:
            log(f"programs: {name} under bpftrace")
            # (a kernel uprobe hit costs microseconds: fewer calls, the same per-call figure)
            calls = max(iterations // KERNEL_SHARE, 4000)
            kernel_rows[text] = best([bpftrace, "-e", text.format(path=plain), "-c",
                                      f"{plain} {calls}"], expect(calls), strict=False)
        theirs, same = kernel_rows.get(text, (None, None))  # (a callback's built-in row:
        # its loaded row's)
        programs.append({"program": name, "ns": ours, "added_ns": ours - counting[returns],
                         "bpftrace_ns": theirs, "bpftrace_maps_right": same})
    return {"iterations": iterations, "repeat": repeat, **rows, "programs": programs}


# #34's targets: program -> (what it may add over counting, in ns, from the row's
# result; how the target reads)
TARGETS = {
    "predicate false": (lambda r: 2.0, "within 2 ns of counting"),
    "@[arg0 % 1000] = count()": (lambda r: 10.0, "within 10 ns of counting"),
    "latency idiom": (lambda r: 2 * r["clock_read"] + 5,
                      "within two clock reads + 5 ns of counting"),
    "C callback, empty": (lambda r: 1.5, "within 1.5 ns of counting"),
}
TARGETS.update({name + BUILT_IN: target for name, target in list(TARGETS.items())})


def programs_targets(result: Dict) -> list:
    """(what, ns added, met, unit) for each program #34 gives a figure; the clock read
    is this run's (a loop of nothing else)."""
    out = []
    for row in result["programs"]:
        if row["program"] in TARGETS and "clock_read" in result:
            limit, text = TARGETS[row["program"]]
            bound = limit(result)
            out.append((f"probe program {row['program']}: {text} ({bound:.2f} ns)",
                        row["added_ns"], row["added_ns"] <= bound, " ns"))
    return out


def format_programs_table(result: Dict) -> str:
    lines = [f"Probe programs: ns per call of target() (best of {result['repeat']} rounds, "
             f"{result['iterations']:,} calls)",
             f"  {'unprobed':<36}{result['unprobed']:>10.2f}",
             f"  {'counting (stat), entry':<36}{result['counting']:>10.2f}",
             f"  {'  and return':<36}{result['counting_with_return']:>10.2f}",
             f"  {'a clock read (loop)':<36}{result.get('clock_read', 0):>10.2f}",
             f"  {'program':<36}{'urewrite':>10}{'+ over counting':>17}{'bpftrace':>11}"]
    for row in result["programs"]:
        theirs = "-" if row["bpftrace_ns"] is None else f"{row['bpftrace_ns']:.1f}" + \
            ("" if row["bpftrace_maps_right"] else "*")
        lines.append(f"  {row['program']:<36}{row['ns']:>10.2f}{row['added_ns']:>17.2f}"
                     f"{theirs:>11}")
    if any(row["bpftrace_maps_right"] is False for row in result["programs"]):
        lines.append("  * bpftrace's maps were not the counts the calls make")
    return "\n".join(lines) + "\n"
