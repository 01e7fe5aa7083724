"""`urewrite bench`: what a probe costs here, against kernel uprobes, on this machine.

    urewrite bench [--json] [--threads 1,2] [--no-kernel] [--iterations N] [--repeat R]
                   [--redis [--redis-requests N]] [--rewrite-scaling [--functions N]]
                   [--big FILE] [--collection [--python FILE]] [--programs]
                   [--postgres [--postgres-seconds S]] [--no-trigger] [--plot FILE]

1. Trigger bench: a target built now from the trigger source shipped in the
   package (share/bench/trigger.c: `nop; ret`, `push %rbp ...`, a bare `ret`,
   and a USDT site, each called in a tight loop), measured as is (the floor),
   under kernel uprobes and uretprobes made through tracefs, under a BPF
   counting program (bpftrace), and rewritten by urewrite (entry, return,
   entry+return with a latency histogram, USDT). Every row's hits are counted
   and checked against the loop's count. Rounds are interleaved (round 1 of
   every row, then round 2, ...) so that a change of load hits every row alike.
2. Scaling: the same rows with 1..N threads on the same probe.
3. Redis (--redis): redis-server under redis-benchmark on 127.0.0.1 with no
   probe, kernel uprobes and urewrite probes; requests per second and counts.
4. Rewrite scaling (--rewrite-scaling): time and peak memory of a rewrite of a
   generated program as the number of probes grows.
5. Big files (--big FILE): `list`, one probe and every function of a given big
   program or library (node, libLLVM), with time and peak memory.
6. Collection (--collection): what reading a process's counts costs (every
   function of a generated program probed at entry and return), and what `stat`
   adds to a loop of short runs of it; with --python FILE, loops of `FILE -S -c pass`
   with every function probed.
7. Probe programs (--programs): what a program adds to a hit, against the same
   program under bpftrace.
8. PostgreSQL (--postgres): pgbench against Debian's PostgreSQL 15, the original,
   the rewrite with every USDT probe counting and with a program keyed by probe,
   and bpftrace's usdt probes on the original, each beside an unprobed copy run at
   the same time; transactions per second and their ratio to the copy's.

Kernel rows need root and tracefs; every uprobe event made here lives in a
group of its own (urwbench_<pid>) and is removed on exit, on error and on
Ctrl-C; no other event is touched. Hits of enabled events go to a tracing
instance of the same name, not to the global trace buffer.

One module per job:

    common.py        BenchError, the log line, the environment of child programs
    kernel.py        tracefs, kernel uprobe events (KernelEvents), bpftrace
    program.py       the trigger program: build, rewrite, probe offsets, one run
    rows.py          the trigger bench's rows and their interleaved rounds
    trigger.py       the trigger bench, start to end
    summary.py       rows as JSON with speed-ups, the machine, the targets
    rewrite_cost.py  rewrite time and memory as probes grow
    big_files.py     list and rewrite time and memory on a given big file
    collection.py    reading a process's counts; stat over a loop of short runs
    redis.py         redis-server under redis-benchmark
    programs.py      probe programs against bpftrace
    postgres.py      PostgreSQL under pgbench
    report.py        the text tables
    chart.py         the --plot chart
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
from typing import Iterator, Optional, Sequence

from urewrite.bench.big_files import big_file_bench
from urewrite.bench.chart import plot
from urewrite.bench.collection import collection_bench
from urewrite.bench.programs import programs_bench
from urewrite.bench.common import ENV_VAR, RUN_TIMEOUT, BenchError, clean_env, log
from urewrite.bench.kernel import (TRACEFS_DIRS, KernelEvents, bpftrace_probe,
                                   bpftrace_unavailable, find_tracefs, function_offsets,
                                   run_bpftrace, tracefs_write)
from urewrite.bench.program import (TRIGGER_SOURCE, TRIGGERS, build_target, rewrite_targets,
                                    run_trigger, site_offsets)
from urewrite.bench.postgres import postgres_bench
from urewrite.bench.redis import (REDIS_FUNCTIONS, REDIS_TESTS, RedisServer, free_port,
                                  redis_bench, redis_benchmark, redis_server, redis_unavailable)
from urewrite.bench.report import (format_redis_table, format_report, format_rewrite_table,
                                   format_scaling_table, format_targets, format_trigger_table)
from urewrite.bench.rewrite_cost import generated_program, probe_counts, rewrite_scaling
from urewrite.bench.rows import (KERNEL_KIND, UREWRITE_KINDS, Row, bpftrace_row, kernel_row,
                                 measure_rows, trigger_rows, urewrite_row, usermode_row)
from urewrite.bench.summary import loadavg, machine, reference_name, summarize, targets
from urewrite.bench.trigger import parse_threads, trigger_bench

__all__ = [
    "BenchError", "ENV_VAR", "KERNEL_KIND", "KernelEvents", "REDIS_FUNCTIONS", "REDIS_TESTS",
    "RUN_TIMEOUT", "RedisServer", "Row", "TRACEFS_DIRS", "TRIGGERS", "TRIGGER_SOURCE",
    "UREWRITE_KINDS", "big_file_bench", "bpftrace_probe", "bpftrace_row", "bpftrace_unavailable", "build_target",
    "clean_env", "collection_bench", "find_tracefs", "format_redis_table", "format_report",
    "format_rewrite_table",
    "format_scaling_table", "format_targets", "format_trigger_table", "free_port",
    "function_offsets", "generated_program", "kernel_row", "loadavg", "log", "machine",
    "measure_rows", "parse_threads", "plot", "probe_counts", "redis_bench", "redis_benchmark",
    "redis_server", "redis_unavailable", "reference_name", "rewrite_scaling", "rewrite_targets",
    "run", "run_bpftrace", "run_trigger", "site_offsets", "summarize", "targets",
    "tracefs_write", "trigger_bench", "trigger_rows", "urewrite_row", "usermode_row",
]

@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every `finally` and __exit__ runs."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run(iterations: int = 100_000_000, repeat: int = 5, threads: Sequence[int] = (1,),
        kernel: bool = True, redis: bool = False, redis_requests: int = 100000,
        rewrite: bool = False, functions: int = 10000, trigger: bool = True,
        big_files: Sequence[str] = (), collection: bool = False,
        python: Optional[str] = None, programs: bool = False, postgres: bool = False,
        postgres_seconds: int = 10) -> dict:
    """Everything `urewrite bench` measures, as one JSON-able dict."""
    result = {"machine": machine()}
    with _sigterm_as_interrupt():
        with tempfile.TemporaryDirectory(prefix="urewrite-bench-") as work:
            if trigger:
                result["trigger"] = trigger_bench(work, iterations, repeat, threads, kernel)
            if redis:
                result["redis"] = redis_bench(work, redis_requests, repeat, kernel)
            if rewrite:
                result["rewrite_scaling"] = rewrite_scaling(work, functions)
            if big_files:
                result["big_files"] = big_file_bench(work, list(big_files))
            if collection:
                result["collection"] = collection_bench(work, functions, python=python,
                                                        rounds=repeat)
            if programs:
                result["programs"] = programs_bench(work, min(iterations, 10_000_000),
                                                    repeat, kernel)
            if postgres:
                result["postgres"] = postgres_bench(postgres_seconds, repeat, kernel=kernel)
    result["machine"]["loadavg_end"] = loadavg()
    result["targets"] = targets(result)
    return result
