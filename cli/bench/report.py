"""The result as text: the trigger, scaling, redis, rewrite and target tables."""

from __future__ import annotations

import os

from typing import Dict, List


def _f(value, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _speedup(value) -> str:
    return "-" if value is None else f"{value:,.0f}x" if value >= 10 else f"{value:.1f}x"


def format_trigger_table(bench: dict) -> str:
    rows = [r for r in bench["rows"] if r["threads"] == 1]
    k = bench["kernel_iterations"]
    lines = [f"trigger bench: 1 thread, median of {bench['repeat']} runs of "
             f"{bench['iterations']:,} calls (kernel and BPF rows: {k:,} calls)",
             f"{'ROW':<26} {'M hits/s':>9} {'ns/hit':>9} {'+ns/hit':>9} {'vs kernel':>9} "
             f"{'vs BPF':>8}  spread (ns/hit)"]
    skipped_groups = set()
    for r in rows:
        if r["skipped"]:
            group = (r["tool"], r["skipped"])
            if r["tool"] in ("kernel", "bpftrace"):
                if group in skipped_groups:
                    continue
                skipped_groups.add(group)
                what = "kernel uprobe rows" if r["tool"] == "kernel" else "BPF (bpftrace) rows"
                lines.append(f"{what}: skipped: {r['skipped']}")
            else:
                lines.append(f"{r['name']:<26} skipped: {r['skipped']}")
            continue
        spread = f"{r['min_ns']:.2f}..{r['max_ns']:.2f}"
        lines.append(f"{r['name']:<26} {r['mhits_per_s']:>9.2f} {r['ns_per_hit']:>9.2f} "
                     f"{_f(r['added_ns'], '9.2f'):>9} {_speedup(r['speedup_vs_kernel']):>9} "
                     f"{_speedup(r['speedup_vs_bpf']):>8}  {spread}")
    return "\n".join(lines)


def format_scaling_table(bench: dict) -> str:
    counts = bench["threads"]
    by_name: Dict[str, Dict[int, dict]] = {}
    for r in bench["rows"]:
        by_name.setdefault(r["name"], {})[r["threads"]] = r
    head = "".join(f" {f'{t} thread' + ('s' if t > 1 else ''):>18}" for t in counts)
    lines = [f"scaling: total M hits/s with {', '.join(map(str, counts))} threads on the same "
             f"probe (x: over 1 thread)", f"{'ROW':<26}{head}"]
    for name, per in by_name.items():
        if any(r["skipped"] for r in per.values()):
            continue
        one = per.get(1, {}).get("mhits_per_s")
        cells = []
        for t in counts:
            m = per.get(t, {}).get("mhits_per_s")
            ratio = f" ({m / one:.2f}x)" if m and one and t != 1 else ""
            cells.append(f" {_f(m, '.2f') + ratio:>18}")
        lines.append(f"{name:<26}{''.join(cells)}")
    return "\n".join(lines)


def format_rewrite_table(scaling: dict) -> str:
    lines = [f"rewrite time: a generated program with {scaling['functions']:,} functions "
             f"({scaling['file_bytes'] / 1024:.0f} KiB), one urewrite process per row",
             f"{'PROBES':>8} {'SECONDS':>8} {'PEAK MiB':>9} {'ms/probe (marginal)':>20}"]
    for r in scaling["rows"]:
        label = f"{r['probes']}" + (" (*)" if r["requested"] == "*" else "")
        lines.append(f"{label:>8} {r['seconds']:>8.2f} {r['peak_rss_mib']:>9.0f} "
                     f"{_f(r['marginal_ms_per_probe'], '20.3f'):>20}")
    return "\n".join(lines)


def format_big_files_table(big: dict) -> str:
    lines = ["big files: one urewrite process per step",
             f"{'FILE':<28} {'MiB':>5}  {'STEP':<15} {'SECONDS':>8} {'PEAK MiB':>9} {'COUNT':>8}"]
    for r in big["rows"]:
        name = os.path.basename(r["file"])
        for step in ("list", "one probe", "every function"):
            s = r[step]
            count = s.get("functions", s.get("probes"))
            lines.append(f"{name:<28} {r['file_bytes'] / 2**20:>5.0f}  {step:<15} "
                         f"{s['seconds']:>8.2f} {s['peak_rss_mib']:>9.0f} {count:>8}")
            name = ""
    return "\n".join(lines)


def format_redis_table(redis: dict) -> str:
    if redis.get("skipped"):
        return f"redis: skipped: {redis['skipped']}"
    tests = redis["tests"]
    lines = [f"redis: {redis['version'].split(' sha=')[0]}; redis-benchmark -n "
             f"{redis['requests']:,} -c {redis['clients']} -t {','.join(tests)} on "
             f"127.0.0.1, median of {redis['repeat']} runs (min..max); probes on "
             f"{', '.join(redis['functions'])}",
             f"{'CONFIGURATION':<15}" + "".join(f" {t.upper() + ' rps':>26}" for t in tests)
             + f" {'vs no probe':>12} {'server CPU us/request':>22}"]
    base_cpu = redis["median_cpu_us_per_request"].get("no probe")
    for config, med in redis["median_rps"].items():
        if not med:
            lines.append(f"{config:<15} skipped: {redis['kernel_skipped']}")
            continue
        cells = []
        for t in tests:
            runs = redis["rps"][config][t]
            cells.append(f" {f'{med[t]:,.0f} ({min(runs):,.0f}..{max(runs):,.0f})':>26}")
        ratio = {"kernel uprobes": redis["kernel_rps_ratio"],
                 "urewrite": redis["urewrite_rps_ratio"]}.get(config)
        cpu = redis["median_cpu_us_per_request"].get(config)
        added = (f" ({cpu - base_cpu:+.2f})" if cpu is not None and base_cpu is not None
                 and config != "no probe" else "")
        lines.append(f"{config:<15}" + "".join(cells)
                     + f" {_f(ratio and 100 * ratio, '.1f') + ('%' if ratio else ''):>12}"
                     + f" {_f(cpu, '.2f') + added:>22}")
    lines.append("(vs no probe: the worse of the tests' median RPS ratios)")
    if redis["counts"]:
        lines.append(f"{'probe counts':<15}" + "".join(f" {fn:>20}" for fn in redis["functions"]))
        for config, hits in redis["counts"].items():
            lines.append(f"{config:<15}" + "".join(f" {hits[fn]:>20,}"
                                                   for fn in redis["functions"]))
        if redis["counts_agree"] is not None:
            lines.append(f"counts agree: {'yes' if redis['counts_agree'] else 'NO'}")
    return "\n".join(lines)


def format_targets(items: List[dict]) -> str:
    lines = ["targets:"]
    for t in items:
        mark = "n/a" if t["met"] is None else "met" if t["met"] else "NOT MET"
        value = "-" if t["value"] is None else f"{t['value']:,.2f}{t['unit']}"
        lines.append(f"  {mark:<8} {t['target']}: {value}")
    return "\n".join(lines)


def format_report(result: dict) -> str:
    m = result["machine"]
    load = m.get("loadavg")
    python = f"Python {m.get('python', '?')}" + \
        (f" ({m['python_executable']})" if m.get("python_executable") else "")
    parts = [f"machine: {m['cpu']}, {m['cores']} cores, Linux {m['kernel']} ({m['arch']}), "
             f"{m['date']}, load average at start {load[0] if load else '?'}; {python}"]
    if "trigger" in result:
        parts.append(format_trigger_table(result["trigger"]))
        if len(result["trigger"]["threads"]) > 1:
            parts.append(format_scaling_table(result["trigger"]))
    if "redis" in result:
        parts.append(format_redis_table(result["redis"]))
    if "rewrite_scaling" in result:
        parts.append(format_rewrite_table(result["rewrite_scaling"]))
    if "big_files" in result:
        parts.append(format_big_files_table(result["big_files"]))
    if "collection" in result:
        from urewrite.bench.collection import format_collection_table
        parts.append(format_collection_table(result["collection"]))
    if "programs" in result:
        from urewrite.bench.programs import format_programs_table
        parts.append(format_programs_table(result["programs"]))
    if "postgres" in result:
        from urewrite.bench.postgres import format_postgres_table
        parts.append(format_postgres_table(result["postgres"]))
    if result.get("targets"):
        parts.append(format_targets(result["targets"]))
    return "\n\n".join(parts) + "\n"
