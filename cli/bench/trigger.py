"""The trigger bench, start to end: build, rewrite, make kernel events, measure every
row for each thread count, summarize."""

from __future__ import annotations

import contextlib
from typing import List, Optional, Sequence

from urewrite.bench.common import BenchError, log
from urewrite.bench.kernel import KernelEvents, bpftrace_unavailable, find_tracefs
from urewrite.bench.program import build_target, rewrite_targets, site_offsets
from urewrite.bench.rows import Row, measure_rows, trigger_rows
from urewrite.bench.summary import summarize


def parse_threads(text: str) -> List[int]:
    """'1,2,4' -> [1, 2, 4]; every count at least 1."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"not a comma-separated list of thread counts: {text!r}")
    if not counts or any(c < 1 or c > 1024 for c in counts):
        raise ValueError(f"thread counts must be between 1 and 1024: {text!r}")
    return sorted(set(counts))


def trigger_bench(work: str, iterations: int, repeat: int, thread_counts: Sequence[int],
                  kernel: bool = True, kernel_iterations: Optional[int] = None) -> dict:
    """Build, rewrite, measure. Kernel events live only inside this call."""
    if kernel_iterations is None:
        # a trap costs microseconds: 1/1000 of the calls is plenty for a stable median
        kernel_iterations = min(iterations, max(iterations // 1000, 10000))
    log("building the target")
    plain = build_target(work)
    probed = rewrite_targets(plain, work)
    offsets = site_offsets(plain)
    kernel_skip = None
    tracefs = None
    if not kernel:
        kernel_skip = "--no-kernel"
    else:
        try:
            tracefs = find_tracefs()
        except BenchError as e:
            kernel_skip = str(e)
    bpf_skip = kernel_skip if kernel_skip else bpftrace_unavailable()
    with (KernelEvents(tracefs) if tracefs else contextlib.nullcontext()) as events:
        counts = sorted(set(thread_counts) | {1})
        all_rows: List[Row] = []
        for threads in counts:
            rows = trigger_rows(plain, probed, offsets, events, kernel_skip, bpf_skip,
                                iterations, kernel_iterations, threads, work)
            measure_rows(rows, repeat, f"{threads} thread{'s' if threads > 1 else ''}: ")
            all_rows += rows
        group = events.group if events else None
    return {"iterations": iterations, "kernel_iterations": kernel_iterations,
            "repeat": repeat, "threads": counts, "event_group": group,
            "kernel_skipped": kernel_skip, "bpftrace_skipped": bpf_skip,
            "rows": summarize(all_rows)}
