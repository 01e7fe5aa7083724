"""Rows of the trigger bench: one per tool, probe kind, trigger and thread count,
each knowing how to measure itself and check its hits; and the interleaved rounds
that measure them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from urewrite.bench.common import ENV_VAR, LATENCY_ENV_VAR, BenchError, clean_env, log
from urewrite.bench.kernel import KernelEvents, bpftrace_probe, run_bpftrace
from urewrite.bench.live_row import live_row
from urewrite.bench.program import TRIGGERS, run_trigger

UREWRITE_KINDS = ("entry", "return", "entry+return")
KERNEL_KIND = {"entry": "uprobe", "return": "uretprobe", "entry+return": "uretprobe",
               "usdt": "uprobe"}


@dataclass
class Row:
    name: str  # "usermode-nop", "uprobe-nop", "bpf uretprobe-ret", "urewrite entry-push", ...
    tool: str  # usermode | kernel | bpftrace | urewrite
    kind: str  # none | entry | return | entry+return | usdt
    trigger: str  # nop | push | ret | usdt
    threads: int = 1
    iterations: int = 0  # per thread, per run
    runs: List[float] = field(default_factory=list)  # ns per hit, one per run
    skipped: Optional[str] = None
    measure: Optional[Callable[[], float]] = field(default=None, repr=False)

    @property
    def ns(self) -> Optional[float]:
        return statistics.median(self.runs) if self.runs else None

    def to_json(self) -> dict:
        ns = self.ns
        return {"name": self.name, "tool": self.tool, "kind": self.kind,
                "trigger": self.trigger, "threads": self.threads,
                "iterations": self.iterations, "runs_ns": self.runs,
                "ns_per_hit": ns, "min_ns": min(self.runs) if self.runs else None,
                "max_ns": max(self.runs) if self.runs else None,
                "mhits_per_s": 1e3 / ns if ns else None, "skipped": self.skipped}


def _check_hits(row_name: str, counted: int, expected: int) -> None:
    if counted != expected:
        raise BenchError(f"{row_name}: counted {counted} hits, expected {expected}: the "
                         f"figures of this row cannot be trusted")


def usermode_row(plain: str, trigger: str, iterations: int, threads: int) -> Row:
    row = Row(f"usermode-{trigger}", "usermode", "none", trigger, threads, iterations)
    row.measure = lambda: run_trigger(plain, trigger, iterations, threads)
    return row


def urewrite_row(binary: str, trigger: str, kind: str, iterations: int, threads: int,
                 work: str, tactic: str = "") -> Row:
    name = "urewrite usdt" if trigger == "usdt" else f"urewrite {kind}-{trigger}"
    name += f" ({tactic})" if tactic else ""
    row = Row(name, "urewrite", kind, trigger, threads, iterations)

    def measure() -> float:
        from urewrite.reader.directories import region_directory, remove_region_directory
        from urewrite.trampolines.region import read_regions
        regions = region_directory()
        try:
            timed = {LATENCY_ENV_VAR: "1"} if kind == "entry+return" else {}  # (its histogram)
            ns = run_trigger(binary, trigger, iterations, threads,
                             clean_env({ENV_VAR: regions, **timed}))
            counted = {(p.name, p.kind): (p.hits, p.histogram)
                       for r in read_regions(regions) for p in r.probes}
        finally:
            remove_region_directory(regions)
        expected = iterations * threads
        if trigger == "usdt":
            _check_hits(name, counted.get(("trigger:usdt", "usdt"), (0, None))[0], expected)
            return ns
        fn = f"trigger_{trigger}"
        for k in kind.split("+"):
            _check_hits(f"{name} ({k} probe)", counted.get((fn, k), (0, None))[0], expected)
        if kind == "entry+return":
            histogram = counted[(fn, "return")][1] or []  # every call is measured
            _check_hits(f"{name} (latency samples)", sum(histogram), expected)
        return ns
    row.measure = measure
    return row


def kernel_row(events: Optional[KernelEvents], plain: str, offsets: Dict[str, int],
               trigger: str, kind: str, iterations: int, threads: int,
               skipped: Optional[str]) -> Row:
    name = f"{KERNEL_KIND[kind]}-{trigger}"
    row = Row(name, "kernel", kind, trigger, threads, iterations, skipped=skipped)
    if skipped:
        return row
    event = f"{'r' if kind == 'return' else 'p'}_{trigger}"
    if event not in events.created:
        events.add(event, plain, offsets[trigger], ret=kind == "return")

    def measure() -> float:
        before = events.hits(event)
        events.enable(event)
        try:
            ns = run_trigger(plain, trigger, iterations, threads)
        finally:
            events.disable(event)
        _check_hits(name, events.hits(event) - before, iterations * threads)
        return ns
    row.measure = measure
    return row


def bpftrace_row(plain: str, trigger: str, kind: str, iterations: int, threads: int,
                 skipped: Optional[str]) -> Row:
    name = "bpf usdt" if trigger == "usdt" else f"bpf {KERNEL_KIND[kind]}-{trigger}"
    row = Row(name, "bpftrace", kind, trigger, threads, iterations, skipped=skipped)

    def measure() -> float:
        out, count = run_bpftrace(bpftrace_probe(plain, trigger, kind),
                                  [plain, trigger, str(iterations), str(threads)])
        _check_hits(name, count, iterations * threads)
        return float(out.split()[0])
    row.measure = measure
    return row


def trigger_rows(plain: str, probed: Dict[str, str], offsets: Dict[str, int],
                 events: Optional[KernelEvents], kernel_skip: Optional[str],
                 bpf_skip: Optional[str], iterations: int, kernel_iterations: int,
                 threads: int, work: str) -> List[Row]:
    """Every row of the trigger bench for one thread count, in display order."""
    rows = [usermode_row(plain, t, iterations, threads) for t in TRIGGERS + ("usdt",)]
    kernel_kinds = [(t, k) for k in ("entry", "return") for t in TRIGGERS] + [("usdt", "usdt")]
    rows += [kernel_row(events, plain, offsets, t, k, kernel_iterations, threads, kernel_skip)
             for t, k in kernel_kinds]
    rows += [bpftrace_row(plain, t, k, kernel_iterations, threads, bpf_skip)
             for t, k in kernel_kinds]
    rows += [urewrite_row(probed[k], t, k, iterations, threads, work)
             for k in UREWRITE_KINDS for t in TRIGGERS]
    rows.append(urewrite_row(probed["entry"], "usdt", "usdt", iterations, threads, work))
    rows.append(live_row(probed["entry"], "nop", iterations, threads))
    rows += [urewrite_row(probed["entry-hop"], t, "entry", iterations, threads, work, "hop")
             for t in TRIGGERS]
    return rows


def measure_rows(rows: List[Row], repeat: int, label: str = "") -> None:
    """`repeat` rounds; each round runs every row once, in order."""
    for r in range(repeat):
        log(f"{label}round {r + 1}/{repeat}")
        for row in rows:
            if row.skipped:
                continue
            try:
                row.runs.append(row.measure())
            except BenchError as e:
                if row.tool != "bpftrace" or "counted" in str(e):
                    raise
                row.skipped, row.runs = str(e), []  # bpftrace could not attach: say why
