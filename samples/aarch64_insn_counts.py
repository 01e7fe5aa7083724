#!/usr/bin/env python3
"""Guest instructions per probe hit on arm64, counted under qemu-aarch64.

    python3 samples/aarch64_insn_counts.py [--iterations N] [--rows ROW,...] [--cross-check] [--json]

Wall time under emulation says little about a real arm64 core, so this counts
the instructions the guest executes instead. samples/trigger.c (the file
`urewrite bench` uses) is cross-compiled for arm64 (PIE, -O2) and rewritten
with entry, return, entry+return and USDT probes; each row runs the trigger
loop N and 2N times, plain, rewritten with probes disarmed (no UREWRITE_DIR)
and counting (UREWRITE_DIR set; the region's hits are checked to equal the
loop's), and prints the difference divided by N: instructions per loop
iteration, with start-up, exit and the first hit's set-up cancelled out.
"+disarmed" and "+counting" are what the probe adds to one iteration (an
entry+return row: both probes of one call).

The counting is a QEMU TCG plugin: Debian's qemu-user 7.2 loads plugins but
ships none, so a small one (an inline add per executed instruction) is built
here with the host gcc against the few entry points of QEMU's plugin API
version 1 it uses.

An entry+return row also measures the call's latency, and a call whose
duration reads 0 ns skips the bucket search: under qemu-user the counter
(cntvct_el0) follows the host's clock in whole microseconds, so most calls
do. Its "counting" figure is the path of a call that reads more: N/5 and 2N/5
iterations with the plugin holding every cntvct_el0 read back by 2 us (guest
time only; the histogram must then show no call of 0 ns). The plain run's
average is shown too, and what the 0 ns path skips.

--cross-check counts a second way, on a -no-pie build: `-singlestep -d
nochain,exec` logs one line per executed instruction with its address; the
lines inside the program's own code (its .text and urewrite's trampolines),
over 2N minus N small iterations, must equal the plugin's count of the same
binary for every row (a latency row's with the slowed clock, as above). Exit status 1 when they differ or a count is not exact.

Needs aarch64-linux-gnu-gcc, qemu-aarch64, gcc and <sys/sdt.h>
(Debian: gcc-aarch64-linux-gnu qemu-user gcc systemtap-sdt-dev).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
TRIGGER_C = os.path.join(HERE, "trigger.c")
CROSS_CC, QEMU, HOST_CC = "aarch64-linux-gnu-gcc", "qemu-aarch64", "gcc"
FUNCTIONS = ("nop", "push", "ret")
CROSS_CHECK_ITERATIONS = 2000  # a log line per instruction: small
MIN_ITERATIONS = 1_000_000

# The part of QEMU's plugin API (version 1: QEMU 4.2 to 8.x) used here, declared
# rather than included: no distribution package ships qemu-plugin.h.
PLUGIN_C = r"""
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
struct qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*tb_trans_cb)(qemu_plugin_id_t, struct qemu_plugin_tb *);
typedef void (*udata_cb)(qemu_plugin_id_t, void *);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, tb_trans_cb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, udata_cb, void *);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *, size_t);
void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn *, enum qemu_plugin_op,
                                                void *, uint64_t);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *);
typedef void (*vcpu_udata_cb)(unsigned int, void *);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *, vcpu_udata_cb,
                                            int /* QEMU_PLUGIN_CB_NO_REGS */, void *);
void qemu_plugin_outs(const char *);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;
static uint64_t executed; /* one thread runs the trigger loop: no atomics needed */

static long spin_ns; /* spin_ns=N: hold each cntvct_el0 read back by N ns of host time */

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void before_counter_read(unsigned int vcpu, void *unused) {
    (void)vcpu, (void)unused;
    for (long start = now_ns(); now_ns() - start < spin_ns;)
        ;
}

static int reads_counter(struct qemu_plugin_insn *insn) {
    uint32_t word;
    memcpy(&word, qemu_plugin_insn_data(insn), 4);
    return (word & ~31u) == 0xD53BE040u; /* mrs xN, cntvct_el0 */
}

/* per instruction, not per block: exact even when a block is left midway */
static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    for (size_t i = 0, n = qemu_plugin_tb_n_insns(tb); i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64,
                                                   &executed, 1);
        if (spin_ns && reads_counter(insn))
            qemu_plugin_register_vcpu_insn_exec_cb(insn, before_counter_read, 0, NULL);
    }
}

static void on_exit_(qemu_plugin_id_t id, void *unused) {
    (void)id, (void)unused;
    char line[64];
    snprintf(line, sizeof line, "guest instructions: %" PRIu64 "\n", executed);
    qemu_plugin_outs(line);
}

__attribute__((visibility("default")))
int qemu_plugin_install(qemu_plugin_id_t id, const struct qemu_info_t *info, int argc,
                        char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++)
        if (!strncmp(argv[i], "spin_ns=", 8))
            spin_ns = atol(argv[i] + 8);
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, on_exit_, NULL);
    return 0;
}
"""


class Failure(Exception):
    pass


def sh(*cmd, env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise Failure(f"{' '.join(map(str, cmd))} exited with {proc.returncode}:\n{proc.stderr}")
    return proc


def disarmed_env() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "UREWRITE_DIR"}


# -- building ---------------------------------------------------------------------------

def sysroot() -> str:
    """The arm64 libraries for qemu's -L: QEMU_LD_PREFIX, else the cross gcc's."""
    if os.environ.get("QEMU_LD_PREFIX"):
        return os.environ["QEMU_LD_PREFIX"]
    loader = sh(CROSS_CC, "-print-file-name=ld-linux-aarch64.so.1").stdout.strip()
    return os.path.dirname(os.path.dirname(os.path.realpath(loader)))


def sdt_include(work: str) -> str:
    """A folder with sys/sdt.h for the cross compiler, which does not search the host's.

    sdt.h writes only assembler directives and a note: it is the same for every target.
    """
    found = sorted(glob.glob("/usr/include/sys/sdt.h") + glob.glob("/usr/include/*/sys/sdt.h"))
    if not found:
        raise Failure("<sys/sdt.h> not found (Debian: apt-get install systemtap-sdt-dev)")
    folder = os.path.join(work, "include", "sys")
    os.makedirs(folder)
    for name in ("sdt.h", "sdt-config.h"):
        source = os.path.join(os.path.dirname(found[0]), name)
        if os.path.exists(source):
            shutil.copy(source, folder)
    return os.path.dirname(folder)


def build_plugin(work: str) -> str:
    source, plugin = os.path.join(work, "insns.c"), os.path.join(work, "insns.so")
    with open(source, "w") as f:
        f.write(PLUGIN_C)
    sh(HOST_CC, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", source, "-o", plugin)
    return plugin


def rewrite(plain: str, output: str, specs: List[str]) -> None:
    sh(sys.executable, "-m", "urewrite", plain, *specs, "-q", "-o", output)


KINDS = {
    "entry": [a for f in FUNCTIONS for a in ("-p", f"trigger_{f}")],
    "return": [a for f in FUNCTIONS for a in ("-r", f"trigger_{f}")],
    "entry+return": [a for f in FUNCTIONS for a in ("-p", f"trigger_{f}", "-r", f"trigger_{f}")],
    "usdt": ["-p", "usdt:trigger:usdt"],
}


@dataclass(frozen=True)
class Row:
    kind: str  # a key of KINDS
    trigger: str  # nop, push, ret, usdt

    @property
    def name(self) -> str:
        return "usdt" if self.kind == "usdt" else f"{self.kind}-{self.trigger}"

    @property
    def latency(self) -> bool:
        """Probed at entry and return: the function's latency is measured too."""
        return self.kind == "entry+return"

    def probes(self) -> Dict[Tuple[str, str], int]:
        """(name, kind) -> hits per loop iteration."""
        if self.kind == "usdt":
            return {("trigger:usdt", "usdt"): 1}
        kinds = ("entry", "return") if self.kind == "entry+return" else (self.kind,)
        return {(f"trigger_{self.trigger}", kind): 1 for kind in kinds}


ROWS = [Row(kind, f) for kind in ("entry", "return", "entry+return") for f in FUNCTIONS]
ROWS.append(Row("usdt", "usdt"))


@dataclass
class Subject:
    """The trigger program built one way, and its rewritten copies (kind -> path)."""
    plain: str
    rewritten: Dict[str, str]


def build_subject(work: str, link: List[str], include: str, kinds) -> Subject:
    folder = os.path.join(work, "pie" if not link else link[-1].strip("-"))
    os.makedirs(folder)
    plain = os.path.join(folder, "trigger")
    sh(CROSS_CC, "-O2", *link, f"-I{include}", TRIGGER_C, "-o", plain, "-pthread")
    rewritten = {}
    for kind in kinds:
        rewritten[kind] = os.path.join(folder, f"trigger.{kind}")
        rewrite(plain, rewritten[kind], KINDS[kind])
    return Subject(plain, rewritten)


# -- counting -----------------------------------------------------------------------------

@dataclass
class Count:
    """One run: guest instructions, and calls whose latency read 0 ns (latency rows)."""
    instructions: int
    zero_ns: int = 0

    def __sub__(self, other: "Count") -> "Count":
        return Count(self.instructions - other.instructions, self.zero_ns - other.zero_ns)


PLUGIN, EXEC_LOG = "plugin", "exec log"  # how a run is counted
SPIN_NS = 2000  # the slowed clock: over one tick of qemu-user's microsecond counter


class Counter:
    def __init__(self, work: str, plugin: str, libraries: str):
        self.work, self.plugin, self.libraries = work, plugin, libraries
        self.serial = 0

    def _fresh(self, what: str) -> str:
        self.serial += 1
        return os.path.join(self.work, f"{what}-{self.serial}")

    def options(self, method: str, slow_clock: bool) -> List[str]:
        plugin = self.plugin + (f",spin_ns={SPIN_NS}" if slow_clock else "")
        if method == PLUGIN:
            return ["-plugin", plugin, "-d", "plugin"]
        return ["-singlestep", "-d", "nochain,exec"] + (["-plugin", plugin] if slow_clock else [])

    def count(self, method: str, program: str, trigger: str, iterations: int,
              probes: Optional[Dict[Tuple[str, str], int]] = None,
              slow_clock: bool = False) -> Count:
        """Run the loop under qemu, armed when `probes` are given (their hits are checked)."""
        options = self.options(method, slow_clock)
        log, env = self._fresh("log"), disarmed_env()
        if probes is not None:
            env["UREWRITE_DIR"] = self._fresh("regions")
            os.makedirs(env["UREWRITE_DIR"])
        sh(QEMU, "-L", self.libraries, *options, "-D", log, program, trigger, iterations,
           env=env)
        zero_ns = check_hits(env["UREWRITE_DIR"], probes, iterations) if probes else 0
        instructions = exec_log_count(log, code_ranges(program)) if method == EXEC_LOG \
            else plugin_count(log)
        os.unlink(log)
        return Count(instructions, zero_ns)

    def per_iteration(self, method: str, program: str, trigger: str, n: int,
                      probes=None, slow_clock: bool = False) -> Tuple[float, float]:
        """(instructions, calls read as 0 ns) per iteration: a 2N run minus an N run, over N."""
        d = (self.count(method, program, trigger, 2 * n, probes, slow_clock)
             - self.count(method, program, trigger, n, probes, slow_clock))
        return d.instructions / n, d.zero_ns / n

    def slow_clock_per_iteration(self, method: str, program: str, row: "Row", n: int) -> float:
        """Instructions per iteration of a latency row when no call reads 0 ns."""
        instructions, zero_share = self.per_iteration(method, program, row.trigger, n,
                                                      row.probes(), slow_clock=True)
        if zero_share:
            raise Failure(f"{row.name}: with the clock slowed, {zero_share:.2%} of the calls "
                          f"still read 0 ns")
        return instructions


def plugin_count(log: str) -> int:
    with open(log) as f:
        lines = [l for l in f if l.startswith("guest instructions: ")]
    if len(lines) != 1:
        raise Failure(f"the plugin printed {len(lines)} counts")
    return int(lines[0].split(": ")[1])


def exec_log_count(log: str, ranges: List[Tuple[int, int]]) -> int:
    """Executed instructions inside `ranges`: with -singlestep, a log line is one instruction."""
    count = 0
    with open(log) as f:
        for line in f:
            if line.startswith("Trace "):  # Trace 0: 0xHOST [FLAGS/GUEST_PC/...]
                pc = int(line.split("[", 1)[1].split("/", 2)[1], 16)
                count += any(lo <= pc < hi for lo, hi in ranges)
    return count


def check_hits(regions: str, probes: Dict[Tuple[str, str], int], iterations: int) -> int:
    """Checks every probe's hits; returns the latency samples of 0 ns (histogram bucket 0)."""
    from urewrite.trampolines.region import read_regions

    hits: Dict[Tuple[str, str], int] = {}
    zero_ns = 0
    for region in read_regions(regions):
        for p in region.probes:
            hits[(p.name, p.kind)] = hits.get((p.name, p.kind), 0) + p.hits
            if p.histogram and (p.name, p.kind) in probes:
                zero_ns += p.histogram[0]
    for key, per_iteration in probes.items():
        if hits.get(key) != per_iteration * iterations:
            raise Failure(f"{key[0]} ({key[1]}): {hits.get(key)} hits, expected "
                          f"{per_iteration * iterations}")
    return zero_ns


def code_ranges(path: str) -> List[Tuple[int, int]]:
    """Address ranges of the executable sections (.text, .plt, ..., .urewrite.text).

    Read from the section headers here, not through urewrite: a cross-check.
    """
    with open(path, "rb") as f:
        data = f.read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    ranges = []
    for i in range(shnum):
        _, _, flags, address, _, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        if flags & 0x4:  # SHF_EXECINSTR
            ranges.append((address, address + size))
    return ranges


# -- the figures --------------------------------------------------------------------------

def latency_paths(counter: Counter, program: str, row: Row, n: int) -> dict:
    """A function probed at entry and return has its latency measured, and a call whose
    duration reads 0 ns skips the bucket search: the path of a call that reads more,
    with the clock slowed; the plain run's average and share of 0 ns calls; and so
    how many instructions the 0 ns path skips."""
    counting = counter.slow_clock_per_iteration(PLUGIN, program, row, max(1, n // 5))
    average, zero_share = counter.per_iteration(PLUGIN, program, row.trigger, n, row.probes())
    skipped = (counting - average) / zero_share if zero_share > 0.05 else None
    return {"counting": counting, "counting_average": average, "zero_ns_share": zero_share,
            "latency_skipped": skipped}


def measure(counter: Counter, subject: Subject, rows: List[Row], n: int) -> List[dict]:
    plain: Dict[str, float] = {}
    out = []
    for row in rows:
        if row.trigger not in plain:
            plain[row.trigger], _ = counter.per_iteration(PLUGIN, subject.plain, row.trigger, n)
        program = subject.rewritten[row.kind]
        figures = {"row": row.name, "plain": plain[row.trigger]}
        figures["disarmed"], _ = counter.per_iteration(PLUGIN, program, row.trigger, n)
        if row.latency:
            figures.update(latency_paths(counter, program, row, n))
        else:
            figures["counting"], _ = counter.per_iteration(PLUGIN, program, row.trigger, n,
                                                           row.probes())
        figures["added_disarmed"] = figures["disarmed"] - figures["plain"]
        figures["added_counting"] = figures["counting"] - figures["plain"]
        out.append(figures)
    return out


def cross_check(counter: Counter, subject: Subject, rows: List[Row], n: int,
                plugin_n: int) -> List[dict]:
    """Per row and mode: the plugin's count and the exec log's, on the same binary."""
    out = []
    for row in rows:
        program = subject.rewritten[row.kind]
        runs = [("plain", subject.plain, None), ("disarmed", program, None),
                ("counting", program, row.probes())]
        for mode, path, probes in runs:
            if mode == "counting" and row.latency:  # both with the slowed clock
                traced = counter.slow_clock_per_iteration(EXEC_LOG, path, row, n)
                plugin = counter.slow_clock_per_iteration(PLUGIN, path, row, plugin_n // 5)
            else:
                traced, _ = counter.per_iteration(EXEC_LOG, path, row.trigger, n, probes)
                plugin, _ = counter.per_iteration(PLUGIN, path, row.trigger, plugin_n, probes)
            out.append({"row": row.name, "mode": mode, "plugin": plugin, "exec_log": traced})
    return out


def print_table(figures: List[dict], n: int, checks: Optional[List[dict]]) -> None:
    print(f"guest instructions per loop iteration, arm64 under qemu-aarch64 "
          f"({2 * n:,} minus {n:,} iterations)")
    print(f"{'ROW':<22}{'plain':>8}{'disarmed':>10}{'counting':>10}{'+disarmed':>11}"
          f"{'+counting':>11}")
    for f in figures:
        print(f"{f['row']:<22}{f['plain']:>8.2f}{f['disarmed']:>10.2f}{f['counting']:>10.2f}"
              f"{f['added_disarmed']:>11.2f}{f['added_counting']:>11.2f}")
    for f in figures:
        if "counting_average" in f:
            skips = "" if f["latency_skipped"] is None else \
                f", and skipped {f['latency_skipped']:.2f} instructions"
            print(f"{f['row']}: counting, with the clock not slowed: {f['counting_average']:.2f} "
                  f"on average; {f['zero_ns_share']:.1%} of the calls read 0 ns{skips}")
    if checks is not None:
        bad = [c for c in checks if not agrees(c)]
        print(f"cross-check (-no-pie build, exec log of -singlestep against the plugin): "
              f"{len(checks) - len(bad)} of {len(checks)} agree")
        for c in bad:
            print(f"  {c['row']} {c['mode']}: plugin {c['plugin']:.3f}, exec log {c['exec_log']:.3f}")


def agrees(check: dict) -> bool:
    return abs(check["plugin"] - check["exec_log"]) < 0.005


def exact(figures: List[dict]) -> bool:
    """A loop iteration is a fixed instruction sequence: every figure is a whole number."""
    return all(abs(f[k] - round(f[k])) < 0.005 for f in figures
               for k in ("plain", "disarmed", "counting"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=1_000_000,
                        help="N: each row runs N and 2N iterations (at least and by default "
                             f"{MIN_ITERATIONS:,}: printing the timing varies by a few hundred "
                             "instructions, which must stay below 0.005 per iteration)")
    parser.add_argument("--rows", help="comma-separated rows (default: all): "
                        + ", ".join(r.name for r in ROWS))
    parser.add_argument("--cross-check", action="store_true",
                        help="also count with qemu's exec log, on a -no-pie build")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = ROWS
    if args.rows:
        wanted = args.rows.split(",")
        rows = [r for r in ROWS if r.name in wanted]
        if len(rows) != len(wanted):
            parser.error(f"unknown rows in {args.rows!r}")
    if args.iterations < MIN_ITERATIONS:
        parser.error(f"--iterations must be at least {MIN_ITERATIONS:,}")
    missing = [t for t in (CROSS_CC, QEMU, HOST_CC) if shutil.which(t) is None]
    if missing:
        print(f"aarch64_insn_counts: {', '.join(missing)} not found", file=sys.stderr)
        return 2
    try:
        with tempfile.TemporaryDirectory(prefix="insn-counts-") as work:
            counter = Counter(work, build_plugin(work), sysroot())
            include = sdt_include(work)
            kinds = sorted({row.kind for row in rows})
            figures = measure(counter, build_subject(work, [], include, kinds), rows,
                              args.iterations)
            checks = None
            if args.cross_check:
                subject = build_subject(work, ["-no-pie"], include, kinds)
                checks = cross_check(counter, subject, rows, CROSS_CHECK_ITERATIONS,
                                     args.iterations)
    except Failure as e:
        print(f"aarch64_insn_counts: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"iterations": args.iterations, "rows": figures,
                          "cross_check": checks}, indent=2))
    else:
        print_table(figures, args.iterations, checks)
    if not exact(figures):
        print("aarch64_insn_counts: a figure is not a whole number of instructions: "
              "something besides the loop depends on N", file=sys.stderr)
        return 1
    return 0 if checks is None or all(agrees(c) for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
