#!/usr/bin/env python3
"""Measures what probes cost, and how long a rewrite takes. Prints figures.

    python3 samples/bench_probes.py [--iterations N] [--repeat R] [--functions F] [--json]

1. Hit cost: samples/trigger.c's trigger functions (entry probes) and its USDT
   site (2 arguments) in a tight loop, in one run: the plain binary, the
   rewritten one with probes disarmed, armed (counting), traced (USDT only:
   `urewrite trace` recording every event with its arguments while it reads
   the ring), and a kernel uprobe on the plain binary (root and tracefs only).
   The median of R runs is shown with the spread (min..max); armed counts are
   checked to be exact.
2. Rewrite time and peak memory: a generated program with F functions,
   rewritten with 1 probe and with every function probed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRIGGERS = ("nop", "push", "ret", "usdt")
TRACED_EVENTS = 2_000_000  # ring large enough that no event is dropped
TRACEFS = "/sys/kernel/tracing"


def sh(*cmd, env=None) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout


def urewrite(*args):
    """Run the CLI in a child process; return (seconds, peak RSS in MiB)."""
    start = time.perf_counter()
    pid = subprocess.Popen([sys.executable, "-m", "urewrite", *args],
                           stdout=subprocess.DEVNULL).pid
    _, status, usage = os.wait4(pid, 0)
    if status:
        raise SystemExit(f"urewrite {' '.join(args)} failed")
    return time.perf_counter() - start, usage.ru_maxrss / 1024


def ns_per_call(binary: str, trigger: str, iterations: int, env=None) -> float:
    return float(sh(binary, trigger, str(iterations), env=env))


def measure(label, runs):
    values = sorted(runs)
    return {"row": label, "ns_per_hit": statistics.median(values), "min": values[0],
            "max": values[-1]}


def tracefs_write(path: str, line: str) -> None:
    # not open(path, "a"): Python seeks to the end, which tracefs refuses
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def site_address(plain: str, trigger: str) -> int:
    if trigger == "usdt":
        from urewrite.rewriter.elf_file import ElfFile
        from urewrite.rewriter.usdt import discover
        return next(u.pc for u in discover(ElfFile.open(plain)) if u.name == "usdt")
    import lief
    lief.logging.disable()
    binary = lief.parse(plain)  # keep it alive: its symbols point into it
    return next(s.value for s in binary.symtab_symbols if s.name == f"trigger_{trigger}")


def kernel_uprobe(plain: str, trigger: str, iterations: int, repeat: int):
    """The same loop with a kernel uprobe on the site, or None without tracefs."""
    events = os.path.join(TRACEFS, "uprobe_events")
    if not os.access(events, os.W_OK):
        return None
    import lief
    lief.logging.disable()
    binary = lief.parse(plain)
    offset = binary.virtual_address_to_offset(site_address(plain, trigger))
    group = f"urwbench{os.getpid()}"
    event = f"{group}/{trigger}"
    enable = os.path.join(TRACEFS, "events", group, trigger, "enable")
    tracefs_write(events, f"p:{event} {plain}:{offset:#x}\n")
    try:
        tracefs_write(enable, "1")
        return [ns_per_call(plain, trigger, iterations) for _ in range(repeat)]
    finally:
        tracefs_write(enable, "0")
        tracefs_write(events, f"-:{event}\n")


def hit_cost(work: str, iterations: int, repeat: int):
    plain = os.path.join(work, "trigger")
    probed = plain + ".probed"
    sh("gcc", "-O2", os.path.join(HERE, "trigger.c"), "-o", plain)
    urewrite(plain, "-q", *[a for t in TRIGGERS[:3] for a in ("-p", f"trigger_{t}")],
             "-p", "usdt:trigger:usdt", "-o", probed)
    regions = os.path.join(work, "regions")
    os.mkdir(regions)
    armed_env = dict(os.environ, UREWRITE_DIR=regions)
    from urewrite.trampolines.region import read_regions
    rows = []
    for trigger in TRIGGERS:
        plain_runs = [ns_per_call(plain, trigger, iterations) for _ in range(repeat)]
        disarmed = [ns_per_call(probed, trigger, iterations) for _ in range(repeat)]
        armed = [ns_per_call(probed, trigger, iterations, armed_env) for _ in range(repeat)]
        name = "trigger:usdt" if trigger == "usdt" else f"trigger_{trigger}"
        hits = sum(p.hits for r in read_regions(regions) for p in r.probes if p.name == name)
        for name in os.listdir(regions):
            os.unlink(os.path.join(regions, name))
        if hits != iterations * repeat:
            raise SystemExit(f"trigger_{trigger}: counted {hits}, expected {iterations * repeat}")
        base = statistics.median(plain_runs)
        group = [measure("usermode (no probe)", plain_runs),
                 measure("urewrite, disarmed", disarmed),
                 measure("urewrite, counting", armed)]
        if trigger == "usdt":
            group.append(measure("urewrite, traced", [traced(probed) for _ in range(repeat)]))
        kernel = kernel_uprobe(plain, trigger, max(iterations // 100, 10000), repeat)
        group.append(measure("kernel uprobe", kernel) if kernel else
                     {"row": "kernel uprobe", "skipped": "needs root and tracefs"})
        for row in group:
            row["trigger"] = trigger
            if "ns_per_hit" in row:
                row["added_ns"] = row["ns_per_hit"] - base
                row["mhits_per_s"] = 1e3 / row["ns_per_hit"]
        rows += group
    return rows


def traced(probed: str) -> float:
    """ns per iteration while `urewrite trace` records and reads every event."""
    out = subprocess.run([sys.executable, "-m", "urewrite", "trace", "--ring",
                          str(1 << 21), "-o", os.devnull, "--", probed, "usdt",
                          str(TRACED_EVENTS)], capture_output=True, text=True, check=True)
    if "lost" in out.stderr:
        raise SystemExit(f"events were lost: {out.stderr.strip()}")
    return float(out.stdout.split()[0])


def generated_program(work: str, functions: int) -> str:
    source = os.path.join(work, "many.c")
    with open(source, "w") as f:
        f.write("#include <stdio.h>\n")
        for i in range(functions):
            f.write(f"__attribute__((noinline)) int f{i}(int x) {{ return x * {i % 7 + 2} + {i}; }}\n")
        f.write("int main(void) { int x = 0;\n")
        for i in range(functions):
            f.write(f"  x = f{i}(x);\n")
        f.write('  printf("%d\\n", x); return 0; }\n')
    binary = os.path.join(work, "many")
    sh("gcc", "-O2", source, "-o", binary)
    return binary


def rewrite_cost(work: str, functions: int):
    binary = generated_program(work, functions)
    rows = []
    for label, specs in (("1 probe", ["-p", "f0"]), ("every function", ["-p", "*"])):
        seconds, rss = urewrite(binary, *specs, "-q", "-o", binary + ".probed")
        rows.append({"rewrite": label, "functions": functions, "seconds": seconds,
                     "peak_rss_mib": rss})
    return rows


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--functions", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="urewrite-bench-") as work:
        result = {"machine": machine(), "hit_cost": hit_cost(work, args.iterations, args.repeat),
                  "rewrite": rewrite_cost(work, args.functions)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    m = result["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, Python {m['python']}, {m['date']}")
    print(f"\nhit cost, median of {args.repeat} runs of {args.iterations} calls "
          f"(kernel uprobe: {max(args.iterations // 100, 10000)} calls)")
    print(f"{'trigger':<8} {'row':<22} {'ns/hit':>8} {'added ns':>9} {'M hits/s':>9}  spread")
    for r in result["hit_cost"]:
        if "skipped" in r:
            print(f"{r['trigger']:<8} {r['row']:<22} skipped: {r['skipped']}")
            continue
        print(f"{r['trigger']:<8} {r['row']:<22} {r['ns_per_hit']:>8.2f} {r['added_ns']:>9.2f} "
              f"{r['mhits_per_s']:>9.1f}  {r['min']:.2f}..{r['max']:.2f}")
    print(f"\nrewrite time ({args.functions} functions)")
    for r in result["rewrite"]:
        print(f"{r['rewrite']:<16} {r['seconds']:>7.2f} s  peak {r['peak_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
