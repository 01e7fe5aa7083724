"""Redis (--redis): redis-server under redis-benchmark on 127.0.0.1 with no probe,
kernel uprobes and urewrite probes; requests per second, server CPU and counts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional

from urewrite.bench.common import RUN_TIMEOUT, BenchError, clean_env, log
from urewrite.bench.kernel import KernelEvents, find_tracefs, function_offsets

REDIS_FUNCTIONS = ("readQueryFromClient", "processCommand", "call")
REDIS_TESTS = ("set", "get")


def redis_unavailable() -> Optional[str]:
    missing = [p for p in ("redis-server", "redis-benchmark") if shutil.which(p) is None]
    if missing:
        return (f"{' and '.join(missing)} not installed (apt-get install redis-server "
                f"redis-tools)")
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, alive: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise BenchError("redis-server exited before it accepted connections")
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        time.sleep(0.05)
    raise BenchError(f"redis-server did not listen on 127.0.0.1:{port} within {timeout} s")


def _read_pid(pidfile: str, parent: int, timeout: float = 10.0) -> int:
    """The server's PID from its pidfile, checked to be a child of `parent` (or `parent`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            with open(pidfile) as f:
                pid = int(f.read().strip())
            if pid == parent or _parent_of(pid) == parent:
                return pid
        time.sleep(0.05)
    raise BenchError(f"redis-server wrote no usable pidfile ({pidfile})")


def _parent_of(pid: int) -> Optional[int]:
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    return None


@dataclass
class RedisServer:
    port: int
    pid: int


@contextlib.contextmanager
def redis_server(server: str, work: str,
                 under_stat: Optional[str] = None) -> Iterator[RedisServer]:
    """A redis-server on 127.0.0.1 and a free port: yields its port and PID. Stopped with SIGTERM by
    its PID (read from its pidfile) when the block ends, however it ends; SIGKILL if it
    does not stop within 30 s. `under_stat`: run it under `urewrite stat --json -o FILE`."""
    port = free_port()
    pidfile = os.path.join(work, f"redis-{port}.pid")
    command = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--daemonize", "no", "--pidfile", pidfile,
               "--dir", work, "--logfile", os.path.join(work, f"redis-{port}.log")]
    if under_stat:
        command = [sys.executable, "-m", "urewrite", "stat", "--json", "-o", under_stat,
                   "--"] + command
    errors = open(os.path.join(work, f"redis-{port}.stderr"), "w+")
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors,
                            env=clean_env())
    pid = None
    try:
        try:
            _wait_for_port(port, lambda: proc.poll() is None)
        except BenchError as e:
            errors.seek(0)
            raise BenchError(f"{e}: {errors.read().strip()[-300:]}")
        pid = _read_pid(pidfile, proc.pid)
        yield RedisServer(port, pid)
    finally:
        if pid is None and proc.poll() is None:
            with contextlib.suppress(BenchError):
                pid = _read_pid(pidfile, proc.pid, timeout=2)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()
        errors.close()


def redis_benchmark(port: int, requests: int, clients: int) -> Dict[str, float]:
    """requests per second of each test, from `redis-benchmark -q`."""
    proc = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-q",
                           "-n", str(requests), "-c", str(clients), "-t", ",".join(REDIS_TESTS)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)
    rps = {m.group(1).lower(): float(m.group(2))
           for m in re.finditer(r"([A-Z]+): ([0-9.]+) requests per second", proc.stdout)}
    if proc.returncode != 0 or set(rps) != set(REDIS_TESTS):
        raise BenchError(f"redis-benchmark failed (exit {proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    return rps


def redis_bench(work: str, requests: int = 100000, repeat: int = 3, kernel: bool = True,
                clients: int = 50) -> dict:
    """redis-server under redis-benchmark: no probe, kernel uprobes, urewrite probes on
    readQueryFromClient, processCommand and call. Rounds are interleaved; the median
    RPS per configuration is kept, and the probe counts of each tool's last run."""
    why = redis_unavailable()
    if why:
        return {"skipped": why}
    from urewrite.rewriter.pipeline import rewrite
    plain = os.path.join(work, "redis-server")
    shutil.copy(os.path.realpath(shutil.which("redis-server")), plain)
    probed = plain + ".probed"
    result = rewrite(plain, probed, list(REDIS_FUNCTIONS))
    if result.refusals:
        r = result.refusals[0]
        raise BenchError(f"urewrite refused {r.site.name} in redis-server: {r.reason}")
    version = subprocess.run([plain, "--version"], capture_output=True, text=True).stdout.strip()
    kernel_skip = None if kernel else "--no-kernel"
    tracefs = None
    if kernel:
        try:
            tracefs = find_tracefs()
        except BenchError as e:
            kernel_skip = str(e)
    configs = ["no probe", "kernel uprobes", "urewrite"]
    rps: Dict[str, Dict[str, List[float]]] = {c: {t: [] for t in REDIS_TESTS} for c in configs}
    counts: Dict[str, Dict[str, int]] = {}
    cpu: Dict[str, List[float]] = {c: [] for c in configs}
    with (KernelEvents(tracefs) if tracefs else contextlib.nullcontext()) as events:
        if events:
            offsets = function_offsets(plain, REDIS_FUNCTIONS)
            for i, fn in enumerate(REDIS_FUNCTIONS):
                events.add(f"redis_{i}", plain, offsets[fn])
        for r in range(repeat):
            log(f"redis: round {r + 1}/{repeat}")
            for config in configs:
                if config == "kernel uprobes" and kernel_skip:
                    continue
                got, hits, cpu_us = _redis_run(config, plain, probed, work, events, requests,
                                               clients)
                for t in REDIS_TESTS:
                    rps[config][t].append(got[t])
                if cpu_us is not None:
                    cpu[config].append(cpu_us)
                if hits:
                    counts[config] = hits
    medians = {c: {t: statistics.median(v) for t, v in tests.items() if v}
               for c, tests in rps.items()}

    def ratio(config: str) -> Optional[float]:
        if not medians.get(config) or not medians["no probe"]:
            return None
        return min(medians[config][t] / medians["no probe"][t] for t in REDIS_TESTS)

    agree = None
    if "kernel uprobes" in counts and "urewrite" in counts:
        agree = counts["kernel uprobes"] == counts["urewrite"]
    return {"version": version, "requests": requests, "clients": clients, "repeat": repeat,
            "tests": list(REDIS_TESTS), "functions": list(REDIS_FUNCTIONS),
            "rps": {c: rps[c] for c in configs}, "median_rps": medians,
            "kernel_rps_ratio": ratio("kernel uprobes"), "urewrite_rps_ratio": ratio("urewrite"),
            "cpu_us_per_request": cpu,
            "median_cpu_us_per_request": {c: statistics.median(v) if v else None
                                          for c, v in cpu.items()},
            "counts": counts, "counts_agree": agree, "kernel_skipped": kernel_skip}


def _redis_run(config: str, plain: str, probed: str, work: str,
               events: Optional[KernelEvents], requests: int, clients: int) -> tuple:
    """One server, one redis-benchmark run: (rps per test, probe counts or {}, the
    server's CPU time per request in µs, user + system: kernel probe handling counts
    as the server's system time)."""
    names = [f"redis_{i}" for i in range(len(REDIS_FUNCTIONS))]
    report = os.path.join(work, "redis-stat.json") if config == "urewrite" else None
    if report:
        with contextlib.suppress(OSError):
            os.unlink(report)
    kernel = config == "kernel uprobes"
    before = {n: events.hits(n) for n in names} if kernel else {}
    try:
        for n in names if kernel else ():
            events.enable(n)
        with redis_server(probed if report else plain, work, under_stat=report) as server:
            got = redis_benchmark(server.port, requests, clients)
            cpu = _cpu_seconds(server.pid)
    finally:
        for n in names if kernel else ():
            events.disable(n)
    cpu_us = 1e6 * cpu / (requests * len(REDIS_TESTS)) if cpu is not None else None
    if kernel:
        return got, {fn: events.hits(n) - before[n] for fn, n in zip(REDIS_FUNCTIONS, names)}, \
            cpu_us
    if report:
        try:
            with open(report) as f:
                probes = json.load(f)["probes"]
        except (OSError, ValueError, KeyError):
            raise BenchError("urewrite stat wrote no report for redis-server")
        hits = {fn: sum(p["hits"] for p in probes if p["name"] == fn) for fn in REDIS_FUNCTIONS}
        return got, hits, cpu_us
    return got, {}, cpu_us


def _cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU time of a live process: the sum over its threads of
    /proc/PID/task/TID/schedstat (ns), else /proc/PID/stat (clock ticks)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None
