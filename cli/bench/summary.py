"""What the measurements say, as JSON: rows with added ns and speed-ups, the machine
they ran on, and which of the targets are met."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from typing import List, Optional

from urewrite.bench.program import TRIGGERS
from urewrite.bench.rows import KERNEL_KIND, Row


def reference_name(row: Row, tool: str) -> Optional[str]:
    """The row of `tool` (kernel or bpftrace) that a urewrite row is compared with."""
    if row.tool != "urewrite":
        return None
    base = "uprobe-usdt" if row.trigger == "usdt" else f"{KERNEL_KIND[row.kind]}-{row.trigger}"
    return base if tool == "kernel" else ("bpf usdt" if row.trigger == "usdt" else f"bpf {base}")


def summarize(rows: List[Row]) -> List[dict]:
    """Rows as JSON, with ns added over usermode and urewrite's speed-ups:
    `speedup_vs_kernel` = the kernel row's ns per hit / this row's (a ratio of
    throughputs); the same for `speedup_vs_bpf`."""
    by_key = {(r.name, r.threads): r for r in rows}
    out = []
    for r in rows:
        j = r.to_json()
        floor = by_key.get((f"usermode-{r.trigger}", r.threads))
        j["added_ns"] = (r.ns - floor.ns) if r.ns is not None and floor and floor.ns else None
        for tool, key in (("kernel", "speedup_vs_kernel"), ("bpftrace", "speedup_vs_bpf")):
            ref = by_key.get((reference_name(r, tool), r.threads))
            j[key] = ref.ns / r.ns if ref and ref.ns and r.ns else None
        out.append(j)
    return out


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")),
                       cpu)
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "arch": platform.machine(), "python": platform.python_version(),
            # (which interpreter: builds of one version differ by a fifth on `list`)
            "python_executable": sys.executable,
            "date": time.strftime("%Y-%m-%d %H:%M %Z"), "loadavg": loadavg()}


def loadavg() -> Optional[List[float]]:
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    return None


def targets(result: dict) -> List[dict]:
    """The issue's targets, each with the figure it is judged on and whether it is met
    (None when the figure is missing)."""
    rows = {(r["name"], r["threads"]): r for r in result.get("trigger", {}).get("rows", [])}
    out = []

    def add(what: str, value, met, unit: str = "") -> None:
        out.append({"target": what, "value": value, "unit": unit, "met": met})

    for t in TRIGGERS:
        for kind, ref in (("entry", "uprobe"), ("return", "uretprobe")):
            r = rows.get((f"urewrite {kind}-{t}", 1))
            if not r:
                continue
            s = r["speedup_vs_kernel"]
            add(f"urewrite {kind}-{t} >= 50x kernel {ref}-{t}", s,
                None if s is None else s >= 50, "x")
            a = r["added_ns"]
            add(f"urewrite {kind}-{t} within 3 ns of usermode-{t}", a,
                None if a is None else a <= 3, "ns")
        hop, plain = rows.get((f"urewrite entry-{t} (hop)", 1)), rows.get((f"urewrite entry-{t}", 1))
        if hop and plain and hop["ns_per_hit"] is not None and plain["ns_per_hit"] is not None:
            extra = hop["ns_per_hit"] - plain["ns_per_hit"]
            add(f"urewrite entry-{t} by hop within 1 ns of the plain jump", extra, extra <= 1, "ns")
    redis = result.get("redis")
    if redis and not redis.get("skipped"):
        ratio = redis.get("urewrite_rps_ratio")
        add("redis RPS with urewrite probes >= 98% of no probe",
            None if ratio is None else 100 * ratio, None if ratio is None else ratio >= 0.98, "%")
    postgres = result.get("postgres")
    if postgres and not postgres.get("skipped"):
        for config in ("urewrite stat", "urewrite run"):
            ratio = postgres["ratio"].get(config)
            add(f"postgres TPS under {config} >= 98% of the original's beside it",
                100 * ratio, ratio >= 0.98, "%")
            cpu = postgres.get("cpu_ratio", {}).get(config)
            if cpu is not None:  # (the server's own CPU a transaction)
                add(f"postgres server CPU a transaction under {config}: the original's "
                    f"beside it >= 98% of it", 100 * cpu, cpu >= 0.98, "%")
    scaling = result.get("rewrite_scaling")
    if scaling and not scaling.get("skipped"):
        by_probes = {r["probes"]: r for r in scaling["rows"]}
        one = by_probes.get(1)
        if one:
            add("rewrite with 1 probe under 0.5 s", one["seconds"], one["seconds"] < 0.5, "s")
        big = [r for r in scaling["rows"] if r["probes"] >= 10000]
        if big:
            r = min(big, key=lambda r: r["probes"])
            add(f"rewrite with {r['probes']} probes under 5 s", r["seconds"],
                r["seconds"] < 5, "s")
    if result.get("programs"):
        from urewrite.bench.programs import programs_targets
        for what, value, met, unit in programs_targets(result["programs"]):
            add(what, value, met, unit)
    if result.get("collection"):
        from urewrite.bench.collection import collection_targets
        for what, value, met, unit in collection_targets(result["collection"]):
            add(what, value, met, unit)
    for r in result.get("big_files", {}).get("rows", []):
        for step, (seconds, mib) in result["big_files"]["limits"].items():
            s = r[step]
            name = os.path.basename(r["file"])
            add(f"{name}: {step} within {seconds} s", s["seconds"], s["seconds"] <= seconds,
                " s")
            add(f"{name}: {step} within {mib} MiB", s["peak_rss_mib"],
                s["peak_rss_mib"] <= mib, " MiB")
    return out
