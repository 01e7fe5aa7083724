"""`urewrite bench`: what a probe costs here, against kernel uprobes, on this machine.

    urewrite bench [--json] [--threads 1,2] [--no-kernel] [--iterations N] [--repeat R]
                   [--redis [--redis-requests N]] [--rewrite-scaling [--functions N]]
                   [--no-trigger] [--plot FILE]

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

Kernel rows need root and tracefs; every uprobe event made here lives in a
group of its own (urwbench_<pid>) and is removed on exit, on error and on
Ctrl-C; no other event is touched. Hits of enabled events go to a tracing
instance of the same name, not to the global trace buffer.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence

from urewrite.errors import UrewriteError

TRIGGERS = ("nop", "push", "ret")  # functions; "usdt" is the USDT site
TRIGGER_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "share", "bench",
                              "trigger.c")
TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
ENV_VAR = "UREWRITE_DIR"
RUN_TIMEOUT = 900  # seconds, for any one run of a target
UREWRITE_KINDS = ("entry", "return", "entry+return")
KERNEL_KIND = {"entry": "uprobe", "return": "uretprobe", "entry+return": "uretprobe",
               "usdt": "uprobe"}


class BenchError(UrewriteError):
    """The bench could not run, or a count came out wrong: its figures cannot be trusted."""


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env.update(extra or {})
    return env


def parse_threads(text: str) -> List[int]:
    """'1,2,4' -> [1, 2, 4]; every count at least 1."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"not a comma-separated list of thread counts: {text!r}")
    if not counts or any(c < 1 or c > 1024 for c in counts):
        raise ValueError(f"thread counts must be between 1 and 1024: {text!r}")
    return sorted(set(counts))


# -- the target ----------------------------------------------------------------------------

def build_target(work: str, cc: str = "gcc") -> str:
    """Compile the shipped trigger source; the path of the program."""
    if shutil.which(cc) is None:
        raise BenchError(f"{cc} is not installed: the bench builds its target with it")
    out = os.path.join(work, "trigger")
    proc = subprocess.run([cc, "-O2", "-pthread", TRIGGER_SOURCE, "-o", out],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        hint = (" (<sys/sdt.h> comes with systemtap-sdt-dev)" if "sdt.h" in proc.stderr else "")
        raise BenchError(f"cannot build the trigger target{hint}:\n{proc.stderr.strip()}")
    return out


def rewrite_targets(plain: str, work: str) -> Dict[str, str]:
    """Rewritten copies of the target: kind -> path (entry probes + USDT, return, both)."""
    from urewrite.rewriter.pipeline import rewrite
    functions = [f"trigger_{t}" for t in TRIGGERS]
    specs = {"entry": (functions + ["usdt:trigger:usdt"], []),
             "return": ([], functions),
             "entry+return": (functions, functions)}
    out = {}
    for kind, (entry, returns) in specs.items():
        path = os.path.join(work, "trigger." + kind.replace("+", "_"))
        result = rewrite(plain, path, entry, return_specs=returns)
        if result.refusals:
            r = result.refusals[0]
            raise BenchError(f"urewrite refused {r.site.name} in the bench target: {r.reason}")
        out[kind] = path
    return out


def site_offsets(path: str) -> Dict[str, int]:
    """File offsets of the triggers' first instructions and of the USDT site, for
    kernel uprobes: trigger -> offset."""
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.rewriter.functions import discover
    from urewrite.rewriter.usdt import discover as discover_usdt
    elf = ElfFile.open(path)
    by_name = {n: fn.address for fn in discover(elf) for n in fn.names}
    addresses = {t: by_name[f"trigger_{t}"] for t in TRIGGERS}
    addresses["usdt"] = next(u.pc for u in discover_usdt(elf) if u.probe == "trigger:usdt")
    return {t: elf.offset_of(a) for t, a in addresses.items()}


def function_offsets(path: str, names: Sequence[str]) -> Dict[str, int]:
    """File offsets of the named functions (symbol table or dynamic symbols)."""
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.rewriter.functions import discover
    elf = ElfFile.open(path)
    by_name = {n: fn.address for fn in discover(elf) for n in fn.names}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise BenchError(f"{path}: no function named {', '.join(missing)}")
    return {n: elf.offset_of(by_name[n]) for n in names}


def run_trigger(binary: str, trigger: str, iterations: int, threads: int = 1,
                env: Optional[Dict[str, str]] = None) -> float:
    """One run of the loop; the wall-clock ns per hit of all threads."""
    proc = subprocess.run([binary, trigger, str(iterations), str(threads)], capture_output=True,
                          text=True, env=env if env is not None else _clean_env(),
                          timeout=RUN_TIMEOUT)
    if proc.returncode != 0:
        raise BenchError(f"{os.path.basename(binary)} {trigger} exited with {proc.returncode}: "
                         f"{proc.stderr.strip()}")
    return float(proc.stdout.split()[0])


# -- kernel uprobes through tracefs --------------------------------------------------------

def tracefs_write(path: str, line: str) -> None:
    """Append to a tracefs file. Not open(path, "a"): Python seeks to the end, which
    tracefs refuses; and never O_TRUNC, which would clear every uprobe event."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def find_tracefs(mount: bool = True) -> str:
    """The tracefs folder with uprobe_events, mounting tracefs when it is not; or a
    BenchError with the reason it cannot be used."""
    if os.geteuid() != 0:
        raise BenchError("needs root")
    for d in TRACEFS_DIRS:
        if os.path.exists(os.path.join(d, "uprobe_events")):
            break
    else:
        d = TRACEFS_DIRS[0]
        if not (mount and os.path.isdir(d)):
            raise BenchError(f"tracefs is not mounted and {d} does not exist")
        proc = subprocess.run(["mount", "-t", "tracefs", "nodev", d], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise BenchError(f"tracefs is not mounted and mounting it on {d} failed: "
                             f"{proc.stderr.strip()}")
        log(f"mounted tracefs on {d}")
        if not os.path.exists(os.path.join(d, "uprobe_events")):
            raise BenchError("this kernel has no uprobe events (CONFIG_UPROBE_EVENTS)")
    events = os.path.join(d, "uprobe_events")
    try:
        os.close(os.open(events, os.O_WRONLY | os.O_APPEND))
    except OSError as e:
        raise BenchError(f"{events} cannot be opened for writing: {e.strerror}")
    return d


class KernelEvents:
    """Uprobe events made through tracefs, in a group of their own (urwbench_<pid>).

    Every event made is recorded and removed in __exit__, which runs on success,
    on error and on Ctrl-C (SIGINT and SIGTERM are held off while it cleans up).
    Only `-:group/name` lines for recorded events are ever written: no other event
    is touched. Enabled events record into a tracing instance of the same name
    (removed too), so the global trace buffer is left alone.
    """

    def __init__(self, tracefs: str, group: Optional[str] = None):
        self.tracefs = tracefs
        self.group = group or f"urwbench_{os.getpid()}"
        self.created: List[str] = []
        self.enabled: set = set()
        self.paths: Dict[str, str] = {}
        self.instance: Optional[str] = None

    @property
    def events_file(self) -> str:
        return os.path.join(self.tracefs, "uprobe_events")

    def __enter__(self) -> "KernelEvents":
        instance = os.path.join(self.tracefs, "instances", self.group)
        try:
            os.mkdir(instance)
            self.instance = instance
        except OSError:
            self.instance = None  # events then record into the top-level buffer
        return self

    def add(self, name: str, path: str, offset: int, ret: bool = False) -> str:
        """A uprobe (or uretprobe) at a file offset of `path`; returns its name."""
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name in self.created:
            raise ValueError(f"bad or duplicate event name {name!r}")
        path = os.path.realpath(path)
        self.created.append(name)  # first: an interrupt after the write still removes it
        self.paths[name] = path
        try:
            tracefs_write(self.events_file,
                          f"{'r' if ret else 'p'}:{self.group}/{name} {path}:{offset:#x}\n")
        except OSError as e:
            self.created.remove(name)
            raise BenchError(f"cannot add uprobe event {self.group}/{name} at {path}:"
                             f"{offset:#x}: {e.strerror}")
        return name

    def _enable_file(self, name: str) -> str:
        root = self.instance or self.tracefs
        return os.path.join(root, "events", self.group, name, "enable")

    def enable(self, name: str) -> None:
        tracefs_write(self._enable_file(name), "1")
        self.enabled.add(name)

    def disable(self, name: str) -> None:
        tracefs_write(self._enable_file(name), "0")
        self.enabled.discard(name)

    def hits(self, name: str) -> int:
        """The event's hits so far, from uprobe_profile."""
        path = self.paths[name]
        with open(os.path.join(self.tracefs, "uprobe_profile")) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[-2] == name and parts[0] == path:
                    return int(parts[-1])
        raise BenchError(f"uprobe_profile has no line for {self.group}/{name}")

    def leftovers(self) -> List[str]:
        """Lines of uprobe_events that belong to this group (none after __exit__)."""
        with open(self.events_file) as f:
            return [line.strip() for line in f if f":{self.group}/" in line]

    def __exit__(self, *exc) -> None:
        held = {signal.SIGINT, signal.SIGTERM}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            self.cleanup()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def cleanup(self) -> None:
        for name in list(self.enabled):
            with contextlib.suppress(OSError):
                self.disable(name)
        if self.instance:
            for _ in range(50):
                try:
                    os.rmdir(self.instance)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # a reader still has a file of it open
            self.instance = None
        failed = []
        for name in self.created:
            for attempt in range(50):
                try:
                    tracefs_write(self.events_file, f"-:{self.group}/{name}\n")
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if attempt == 49:
                        failed.append(f"{self.group}/{name} ({e.strerror})")
                    time.sleep(0.1)  # busy: a process that used it is still exiting
        self.created = []
        if failed:
            log(f"warning: could not remove uprobe events {', '.join(failed)}: remove them "
                f"with: echo '-:GROUP/NAME' >> {self.events_file}")


# -- bpftrace ------------------------------------------------------------------------------

def bpftrace_unavailable() -> Optional[str]:
    if shutil.which("bpftrace") is None:
        return "bpftrace not installed"
    if os.geteuid() != 0:
        return "needs root"
    return None


def bpftrace_probe(binary: str, trigger: str, kind: str) -> str:
    if trigger == "usdt":
        return f"usdt:{binary}:trigger:usdt"
    return f"{'uretprobe' if kind == 'return' else 'uprobe'}:{binary}:trigger_{trigger}"


def run_bpftrace(probe: str, command: Sequence[str]) -> tuple:
    """Run `command` under a bpftrace program counting `probe`: (its stdout, the count).

    bpftrace starts the command itself once its probe is attached (-c). It runs in
    a session of its own, which is killed, bpftrace and command both, however this
    returns."""
    if any(" " in c for c in command):
        raise BenchError(f"bpftrace -c cannot run a path with spaces: {command[0]}")
    proc = subprocess.Popen(["bpftrace", "-e", f"{probe} {{ @c = count(); }}",
                             "-c", " ".join(command)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_clean_env(), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    errors = [line for line in err.splitlines()
              if line.strip() and "RLIMIT_MEMLOCK" not in line]
    if proc.returncode != 0:
        raise BenchError(f"bpftrace failed (exit {proc.returncode}): "
                         f"{errors[0] if errors else 'no message'}")
    count = re.search(r"^@c: (\d+)$", out, re.M)
    program = [line for line in out.splitlines()
               if line.strip() and not line.startswith(("@", "Attaching"))]
    return "\n".join(program), int(count.group(1)) if count else 0


# -- rows ----------------------------------------------------------------------------------

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
                 work: str) -> Row:
    name = "urewrite usdt" if trigger == "usdt" else f"urewrite {kind}-{trigger}"
    row = Row(name, "urewrite", kind, trigger, threads, iterations)

    def measure() -> float:
        from urewrite.runner import region_directory
        from urewrite.trampolines.region import read_regions
        regions = region_directory()
        try:
            ns = run_trigger(binary, trigger, iterations, threads,
                             _clean_env({ENV_VAR: regions}))
            counted = {(p.name, p.kind): (p.hits, p.histogram)
                       for r in read_regions(regions) for p in r.probes}
        finally:
            shutil.rmtree(regions, ignore_errors=True)
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


# -- summary -------------------------------------------------------------------------------

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
    redis = result.get("redis")
    if redis and not redis.get("skipped"):
        ratio = redis.get("urewrite_rps_ratio")
        add("redis RPS with urewrite probes >= 98% of no probe",
            None if ratio is None else 100 * ratio, None if ratio is None else ratio >= 0.98, "%")
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
    return out


# -- the trigger bench, start to end -------------------------------------------------------

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


# -- rewrite-time scaling ------------------------------------------------------------------

def generated_program(work: str, functions: int, cc: str = "gcc") -> str:
    """A C program with `functions` small noinline functions, all called from main."""
    source = os.path.join(work, "many.c")
    with open(source, "w") as f:
        f.write("#include <stdio.h>\n")
        for i in range(functions):
            f.write(f"__attribute__((noinline)) int f{i}(int x) "
                    f"{{ return x * {i % 7 + 2} + {i}; }}\n")
        f.write("int main(void) {\n  int x = 0;\n")
        for i in range(functions):
            f.write(f"  x = f{i}(x);\n")
        f.write('  printf("%d\\n", x);\n  return 0;\n}\n')
    binary = os.path.join(work, "many")
    proc = subprocess.run([cc, "-O2", source, "-o", binary], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"cannot build the generated program: {proc.stderr.strip()}")
    return binary


def _peak_rss_run(args: Sequence[str]) -> tuple:
    """(seconds, peak RSS MiB, stdout) of `python -m urewrite ARGS`, from wait4."""
    out_file = tempfile.TemporaryFile()
    err_file = tempfile.TemporaryFile()
    try:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "urewrite", *args], stdout=out_file,
                                stderr=err_file, env=_clean_env())
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            os.waitpid(proc.pid, 0)
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        out_file.seek(0)
        err_file.seek(0)
        if proc.returncode != 0:
            raise BenchError(f"urewrite {' '.join(args[:3])} ... failed: "
                             f"{err_file.read().decode(errors='replace').strip()}")
        return seconds, usage.ru_maxrss / 1024, out_file.read().decode()
    finally:
        out_file.close()
        err_file.close()


def probe_counts(functions: int) -> List[int]:
    return [n for n in (1, 10, 100, 1000, 5000) if n < functions] + [functions]


def rewrite_scaling(work: str, functions: int = 10000) -> dict:
    """Time and peak memory of `urewrite` on a generated program with `functions`
    functions, probing 1, 10, 100, 1000, 5000 of them (spread over the file) and all
    of them, each in a fresh process (what a user's build step pays), and with every
    function of the file ('*': crt functions too)."""
    log(f"rewrite scaling: building a program with {functions} functions")
    binary = generated_program(work, functions)
    out = binary + ".probed"
    rows = []
    for n in probe_counts(functions):
        names = [f"f{i * functions // n}" for i in range(n)]
        args = [binary, "--json", "-o", out] + [a for name in names for a in ("-p", name)]
        rows.append(_scaling_row(n, names, args))
    rows.append(_scaling_row(None, ["*"], [binary, "--json", "-o", out, "-p", "*"]))
    # what each further probe cost, between one count and the next ('*' is not one of them)
    rows[0]["marginal_ms_per_probe"] = rows[-1]["marginal_ms_per_probe"] = None
    for a, b in zip(rows[:-2], rows[1:-1]):
        b["marginal_ms_per_probe"] = 1e3 * (b["seconds"] - a["seconds"]) / (b["probes"]
                                                                          - a["probes"])
    with contextlib.suppress(OSError):
        os.unlink(out)
    return {"functions": functions, "file_bytes": os.path.getsize(binary), "rows": rows}


def _scaling_row(n: Optional[int], names: List[str], args: List[str]) -> dict:
    log(f"rewrite scaling: {'every function' if n is None else n} probe(s)")
    seconds, rss, stdout = _peak_rss_run(args)
    placed = len({p["name"] for p in json.loads(stdout)["probes"]})
    return {"requested": "*" if n is None else n, "probes": placed, "seconds": seconds,
            "peak_rss_mib": rss}


# -- redis ---------------------------------------------------------------------------------

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
                            env=_clean_env())
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


# -- formatting ----------------------------------------------------------------------------

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
    parts = [f"machine: {m['cpu']}, {m['cores']} cores, Linux {m['kernel']} ({m['arch']}), "
             f"{m['date']}, load average at start {load[0] if load else '?'}"]
    if "trigger" in result:
        parts.append(format_trigger_table(result["trigger"]))
        if len(result["trigger"]["threads"]) > 1:
            parts.append(format_scaling_table(result["trigger"]))
    if "redis" in result:
        parts.append(format_redis_table(result["redis"]))
    if "rewrite_scaling" in result:
        parts.append(format_rewrite_table(result["rewrite_scaling"]))
    if result.get("targets"):
        parts.append(format_targets(result["targets"]))
    return "\n\n".join(parts) + "\n"


def plot(result: dict, path: str) -> None:
    """A horizontal bar chart of M hits/s per row (1 thread, log scale). Needs matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BenchError("--plot needs matplotlib (pip install matplotlib)")
    rows = [r for r in result["trigger"]["rows"] if r["threads"] == 1 and r["mhits_per_s"]]
    colours = {"usermode": "#888888", "kernel": "#d62728", "bpftrace": "#ff7f0e",
               "urewrite": "#1f77b4"}
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.6))
    names = [r["name"] for r in rows][::-1]
    values = [r["mhits_per_s"] for r in rows][::-1]
    ax.barh(names, values, color=[colours[r["tool"]] for r in rows][::-1])
    ax.set_xscale("log")
    ax.set_xlabel("M hits/s (log scale; higher is better)")
    m = result["machine"]
    ax.set_title(f"urewrite bench: {m['cpu']}, Linux {m['kernel']}, {m['date'].split()[0]}",
                 fontsize=9)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:,.0f}" if v >= 100 else f" {v:.3g}", va="center", fontsize=7)
    from matplotlib.patches import Patch
    labels = {"usermode": "no probe", "kernel": "kernel uprobe (tracefs)",
              "bpftrace": "kernel uprobe (bpftrace)", "urewrite": "urewrite"}
    tools = [t for t in labels if any(r["tool"] == t for r in rows)]
    ax.legend([Patch(color=colours[t]) for t in tools], [labels[t] for t in tools],
              loc="lower right", fontsize=8)
    ax.set_xlim(right=max(values) * 8)
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the command ---------------------------------------------------------------------------

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
        rewrite: bool = False, functions: int = 10000, trigger: bool = True) -> dict:
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
    result["machine"]["loadavg_end"] = loadavg()
    result["targets"] = targets(result)
    return result
