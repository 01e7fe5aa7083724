"""Tracing and latency on arm64, under qemu-aarch64: what tests/test_usdt.py and
tests/test_returns.py check on x86_64.

Cross-compiled with aarch64-linux-gnu-gcc at -O0/-O2/-O3 (and one static build):
- samples/usdt.c: `urewrite trace --json` records, for every USDT hit, exactly
  the arguments the program printed it passed, in program order, with its
  thread id and a time inside the run; `stat` counts each probe exactly and the
  semaphore is enabled; disarmed, the program prints what the original does.
- FORMS_C below: every operand form GCC emits for sdt.h on arm64 (registers,
  constants, [base], [base, disp], sp-relative), narrow views of a wide
  register, register plus register written by hand, and a symbol form, whose
  probe is refused with its reason (no value rather than a wrong one).
- CALLS_C below, rewritten with `--args 6`, entry and return probes: entry events
  carry the arguments each call printed, return events the value it returned,
  event times fall between the program's own CLOCK_MONOTONIC readings, and
  `stat` gives each function a latency histogram whose counts sum to its
  returned calls (the ones left by longjmp give none), a 3 ms sleep landing in
  the millisecond buckets; ten worker threads too, each in a row of its own even
  where its thread pointer hashes to another thread's owner entry (under
  qemu-aarch64 the fourth thread's hashes to the main thread's), so every thread's
  events carry its own id and every call, a thread's first included, is measured.
- samples/usdt_threads.c: many writers on a small ring never deliver a torn or
  duplicated event and count every loss; a large ring loses nothing.

Everything is built once per module, in parallel, into a temporary directory.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import struct
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from conftest import check, run, urewrite
from cross import CC, QEMU, emulate, exit_status, needs, require_sysroot
from urewrite.trampolines import region as R
from urewrite.trampolines.ring import RingReader

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
SDT_HEADERS = [Path(p) for p in ("/usr/include/sys/sdt.h",
                                 "/usr/include/x86_64-linux-gnu/sys/sdt.h",
                                 "/usr/include/aarch64-linux-gnu/sys/sdt.h")]
SDT_H = next((p for p in SDT_HEADERS if p.is_file()), None)

pytestmark = needs(CC, QEMU, also=None if SDT_H else "needs <sys/sdt.h> (Debian: apt-get install "
                                                      "systemtap-sdt-dev)")

OPTS = ["-O0", "-O2", "-O3"]
USDT_ROUNDS = 12
CALL_ROUNDS = 9
# Ten workers: under qemu-aarch64 the fourth one's thread pointer hashes to the main
# thread's owner entry, and it must find a row of its own nearby (docs/region.md).
THREADS, PER_THREAD = 10, 1500
# longjmp leaves every fourth call open: more than a thread's stack of open calls holds
# (126) unless entries drop the ones their frame shows have ended
LEAPS = 600
CALLS_ARGV = [str(CALL_ROUNDS), str(THREADS), str(PER_THREAD), str(LEAPS)]
NAP_US = 3000
PAIRING_NS = 20_000

# The operand forms of sdt.h arguments on arm64; each probe prints what it passed.
FORMS_C = r"""
#include <stdio.h>
#include <string.h>
#include <sys/sdt.h>
int g_int = 7;
long g_arr[8] = {1, 2, 3, 4, 5, 6, 7, 8};
static short s_short = -3;
struct S { long a; int b; signed char c; } gs = {11, -22, -33};
volatile long sink;

__attribute__((noipa)) void forms(struct S *p, long *arr, int i, unsigned char uc) {
    DTRACE_PROBE4(t, consts, 5, -1, 0x12345678, -100000L);
    printf("fire consts 5 -1 %d %ld\n", 0x12345678, -100000L);
    DTRACE_PROBE3(t, globals, g_int, s_short, g_arr[3]);
    printf("fire globals %d %d %ld\n", g_int, s_short, g_arr[3]);
    DTRACE_PROBE3(t, pointer, p->a, p->b, p->c);
    printf("fire pointer %ld %d %d\n", p->a, p->b, p->c);
    DTRACE_PROBE2(t, indexed, arr[i], arr[i + 1]);
    printf("fire indexed %ld %ld\n", arr[i], arr[i + 1]);
    DTRACE_PROBE3(t, narrow, uc, (short)(i * -1000 - 7), (unsigned short)(i * 1000 + 40000));
    printf("fire narrow %u %d %u\n", uc, (short)(i * -1000 - 7), (unsigned short)(i * 1000 + 40000));
}

/* narrow views of a wide register: the upper bits are the runtime's to drop or extend */
__attribute__((noipa)) void truncated(long wide) {
    DTRACE_PROBE6(t, truncated, (unsigned short)wide, (short)wide, (unsigned int)wide, (int)wide,
                  (unsigned char)wide, (signed char)wide);
    printf("fire truncated %u %d %u %d %u %d\n", (unsigned short)wide, (short)wide,
           (unsigned int)wide, (int)wide, (unsigned char)wide, (signed char)wide);
}

/* the same views, written by hand: GCC masks or extends first, this leaves it to us */
__attribute__((noipa)) void views(long wide) {
    __asm__ volatile(STAP_PROBE_ASM(t, views, ".ascii \"2@%0 -2@%0 4@%0 -4@%0 1@%0 -1@%0\"\n", "")
                     : : "r"(wide));
    printf("fire views %u %d %u %d %u %d\n", (unsigned short)wide, (short)wide,
           (unsigned int)wide, (int)wide, (unsigned char)wide, (signed char)wide);
}

/* register plus register, a w register and xzr, written by hand */
__attribute__((noipa)) long regreg(long *base, long i) {
    long v, unaligned;
    __asm__ volatile("ldr %0, [%1, %2, lsl 3]\n"
                     STAP_PROBE_ASM(t, regreg,
                                    ".ascii \"8@[%1, %2, lsl 3] -8@[%1, %2] -4@%w2 8@xzr\"\n", "")
                     : "=&r"(v) : "r"(base), "r"(i) : "memory");
    memcpy(&unaligned, (char *)base + i, 8);
    printf("fire regreg %ld %ld %d 0\n", v, unaligned, (int)i);
    return v;
}

/* a symbol operand: its probe is refused at rewrite time (a warning: a glob named it) */
__attribute__((noipa)) void symbolic(void) {
    __asm__ volatile(STAP_PROBE_ASM(t, symbolic, ".ascii \"8@[x0, #:lo12:sink]\"\n", ""));
    printf("fire symbolic\n");
}

int main(int argc, char **argv) {
    long local[6] = {90, -80, 70, -60, 50, -40};
    (void)argv;
    for (int k = 0; k < 3; k++) {
        forms(&gs, local, argc - 1 + k, (unsigned char)(250 + k));
        regreg(local, k + 1);
        symbolic();
        truncated(0x7edcba98f6e5d4c3L + k);
        views(0x7edcba98f6e5d4c3L + k);
    }
    return 0;
}
"""

# Entry arguments, return values, latency; the main thread prints every call.
CALLS_C = r"""
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile long sink;

__attribute__((noipa)) long mix(long a, long b, long c, long d, long e, long f) {
    long r = a * 3 - b + c * d - e + (f ^ 0x5a) + sink;
    printf("call mix %ld %ld %ld %ld %ld %ld -> %ld\n", a, b, c, d, e, f, r);
    return r;
}

__attribute__((noipa)) long depth(long n) {
    long r = n == 0 ? 7 : depth(n - 1) * 2 + sink;
    printf("call depth %ld -> %ld\n", n, r);
    return r;
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

__attribute__((noipa)) long nap(long us) {
    struct timespec t = {0, us * 1000};
    nanosleep(&t, NULL);
    printf("call nap %ld -> %ld\n", us, us + 1);
    return us + 1;
}

static jmp_buf jb;
__attribute__((noipa)) long leap(long i) {
    if (i % 4 == 0)
        longjmp(jb, 1); /* leaves the frame without returning */
    return i * 5 + sink;
}

__attribute__((noipa)) long work(long t, long k) { return t * 1000003 + k * 7 + sink; }

static long per_thread;
__attribute__((noipa)) void *worker(void *arg) {
    long s = 0;
    for (long k = 0; k < per_thread; k++)
        s += work((long)arg, k);
    return (void *)s;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    int leaps = argc > 4 ? atoi(argv[4]) : rounds;
    per_thread = argc > 3 ? atol(argv[3]) : 0;
    long acc = 0;
    /* first, so that the calls below find their stack of open calls cleared */
    for (volatile long i = 0; i < leaps; i++) {
        if (setjmp(jb) == 0)
            printf("call leap %ld -> %ld\n", (long)i, leap(i));
        else
            printf("call leap %ld -> longjmp\n", (long)i);
    }
    for (int i = 0; i < rounds; i++) {
        acc += mix(i, -i * 1000L, 1L << (i + 30), i - 3, 0x7fffffffffffffffL - i, -(long)i * 77);
        acc += depth(i % 4);
    }
    for (int k = 0; k < 2; k++) {
        long before = now_ns();
        acc += nap(%NAP%);
        printf("clock nap %ld %ld\n", before, now_ns());
    }
    pthread_t th[16];
    for (long t = 0; t < threads && t < 16; t++)
        pthread_create(&th[t], NULL, worker, (void *)t);
    long total = 0;
    for (int t = 0; t < threads && t < 16; t++) {
        void *s;
        pthread_join(th[t], &s);
        total += (long)s;
    }
    printf("acc %ld total %ld\n", acc, total);
    return 0;
}
""".replace("%NAP%", str(NAP_US))
CALLS_PROBES = ["-p", "main", "-p", "worker", "-p", "mix", "-p", "depth", "-p", "nap",
                "-p", "leap", "-p", "work", "-r", "mix", "-r", "depth", "-r", "nap",
                "-r", "leap", "-r", "work", "--args", "6"]

# Threads whose thread pointers hash alike: each worker runs on a stack placed so that
# its thread pointer hashes to the owner entry of its group's first thread.
COLLIDE_C = r"""
/* Threads whose thread pointers hash alike (docs/region.md): each worker runs on a
 * stack placed so that its thread pointer hashes to the owner entry of a group's
 * first thread. collide THREADS PER_THREAD SAME: groups of SAME threads, the main
 * thread first in the first group. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define STACK (128 * 1024)
#define POOL (256L << 20)
#define STEP 4096

static volatile long sink;
__attribute__((noipa)) long work(long t, long k) { return t * 1000003 + k * 7 + sink; }

static long per_thread;
__attribute__((noipa)) void *worker(void *arg) {
    long s = 0;
    for (long k = 0; k < per_thread; k++)
        s += work((long)arg, k);
    return (void *)s;
}

static void *where(void *arg) { (void)arg; return __builtin_thread_pointer(); }

static unsigned slot_of(uintptr_t tp) { return (unsigned)((tp * 0x9E3779B97F4A7C15ull) >> 56); }

static pthread_t start(char *stack, void *(*fn)(void *), void *arg) {
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    pthread_attr_setstack(&attr, stack, STACK);
    if (pthread_create(&th, &attr, fn, arg) != 0) {
        perror("pthread_create");
        exit(3);
    }
    pthread_attr_destroy(&attr);
    return th;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 10;
    per_thread = argc > 2 ? atol(argv[2]) : 1000;
    int same = argc > 3 ? atoi(argv[3]) : 4;
    char *pool = mmap(NULL, POOL, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (pool == MAP_FAILED || threads > 64) {
        perror("mmap");
        return 3;
    }
    /* where a thread's pointer lies on its stack: the same for every stack */
    void *tp;
    pthread_join(start(pool, where, NULL), &tp);
    uintptr_t below_top = (uintptr_t)(pool + STACK) - (uintptr_t)tp;
    unsigned home = slot_of((uintptr_t)__builtin_thread_pointer());
    pthread_t th[64];
    char *next = pool;
    for (long t = 0; t < threads; t++) {
        long group = (t + 1) / same;
        unsigned target = (home + 40 * group) % 256;
        while (slot_of((uintptr_t)(next + STACK) - below_top) != target) {
            next += STEP;
            if (next + STACK > pool + POOL) {
                fprintf(stderr, "no stack for thread %ld\n", t);
                return 3;
            }
        }
        th[t] = start(next, worker, (void *)t);
        next += STACK;
    }
    long total = 0;
    for (int t = 0; t < threads; t++) {
        void *s;
        pthread_join(th[t], &s);
        total += (long)s;
    }
    printf("total %ld\n", total);
    return 0;
}
"""
COLLIDE_PROBES = ["-p", "main", "-p", "worker", "-p", "work", "-r", "work", "--args", "2"]
COLLIDERS = 10


@dataclass
class Build:
    name: str  # usdt, threads, forms, calls, collide
    opt: str
    static: bool
    plain: Path
    probed: Path
    rewrite_stderr: str = ""
    original: Optional[Tuple[int, str]] = None  # exit status, stdout
    error: Optional[str] = None

    @property
    def id(self) -> str:
        return f"{self.name}{self.opt}" + ("-static" if self.static else "")


def _sources(root: Path) -> Dict[str, Tuple[Path, List[str], List[str], List[str]]]:
    """name -> (source, compiler flags, probe specs, arguments of the original run)."""
    (root / "forms.c").write_text(FORMS_C)
    (root / "calls.c").write_text(CALLS_C)
    (root / "collide.c").write_text(COLLIDE_C)
    return {
        "usdt": (SAMPLES / "usdt.c", [], ["-p", "usdt:sample:*"], [str(USDT_ROUNDS)]),
        "threads": (SAMPLES / "usdt_threads.c", ["-pthread"], ["-p", "usdt:sample:tick"],
                    [str(THREADS), "100"]),
        "forms": (root / "forms.c", [], ["-p", "usdt:t:*"], []),
        "calls": (root / "calls.c", ["-pthread"], CALLS_PROBES, CALLS_ARGV),
        "collide": (root / "collide.c", ["-pthread"], COLLIDE_PROBES,
                    [str(COLLIDERS), str(PER_THREAD), "4"]),
    }


def _prepare(b: Build, root: Path, sources: dict) -> Build:
    try:
        source, flags, probes, argv = sources[b.name]
        check([CC, b.opt, *flags, *(["-static"] if b.static else []), "-isystem",
               root / "include", source, "-o", b.plain])
        out = urewrite(b.plain, *probes, "-o", b.probed)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        b.rewrite_stderr = out.stderr
        original = run(emulate(b.plain) + argv)
        b.original = (exit_status(original.returncode), original.stdout)
    except Exception:  # reported by each test of the build
        b.error = traceback.format_exc()
    return b


def _builds(root: Path) -> List[Build]:
    out = []
    for name, opts in (("usdt", OPTS), ("forms", OPTS), ("calls", OPTS), ("threads", ["-O2"])):
        for opt in opts:
            out.append(Build(name, opt, False, root / f"{name}{opt}", root / f"{name}{opt}.probed"))
    out.append(Build("calls", "-O2", True, root / "calls-static", root / "calls-static.probed"))
    out.append(Build("collide", "-O2", False, root / "collide-O2", root / "collide-O2.probed"))
    out.append(Build("collide", "-O2", True, root / "collide-static",
                     root / "collide-static.probed"))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Dict[str, Build]:
    require_sysroot()
    root = tmp_path_factory.mktemp("aarch64_trace")
    # sdt.h is the same for every architecture; the cross compiler may not see the host's
    (root / "include" / "sys").mkdir(parents=True)
    for header in ("sdt.h", "sdt-config.h"):
        shutil.copy(SDT_H.parent / header, root / "include" / "sys" / header)
    sources = _sources(root)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda b: _prepare(b, root, sources), _builds(root)))
    return {b.id: b for b in done}


def _get(built: Dict[str, Build], bid: str) -> Build:
    b = built[bid]
    if b.error:
        pytest.fail(f"{bid} could not be prepared:\n{b.error}")
    return b


# -- running ---------------------------------------------------------------------------------------

def trace(b: Build, *argv, ring: Optional[int] = None,
          retry_losses: bool = True) -> Tuple[str, str, List[dict], int, int]:
    """(program stdout, stderr, events, time before, time after) of `urewrite trace --json`.

    The reader gives up on a record still unwritten after a second and counts it
    lost: a writer thread descheduled that long (a loaded machine, qemu) loses its
    event. Such a run is tried again, unless a small ring is what is under test."""
    events = b.probed.parent / f"{b.probed.name}-{len(argv)}-{ring}.jsonl"
    ring_args = ["--ring", str(ring)] if ring else []
    for _ in range(3):
        before = time.monotonic_ns()
        out = urewrite("trace", "--json", *ring_args, "-o", events, "--", *emulate(b.probed),
                       *argv)
        after = time.monotonic_ns()
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        if not retry_losses or lost(out.stderr) == 0:
            break
    return (out.stdout, out.stderr, [json.loads(line) for line in events.read_text().splitlines()],
            before, after)


def stat(b: Build, *argv) -> Tuple[str, dict]:
    """`stat --latency` of the build: its output, the report."""
    report = b.probed.parent / f"{b.probed.name}-stat.json"
    out = urewrite("stat", "--json", "--latency", "-o", report, "--", *emulate(b.probed),
                   *argv)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    return out.stdout, json.loads(report.read_text())


def lost(stderr: str) -> int:
    return sum(int(m.group(1)) for m in re.finditer(r"(\d+) of \d+ events lost", stderr))


def steady(stdout: str) -> str:
    """The output without the clock readings, which differ from run to run."""
    return "".join(line for line in stdout.splitlines(True) if not line.startswith("clock "))


def fired(stdout: str) -> Dict[str, List[List[int]]]:
    """What the program says it passed: {probe: [args, ...]} in program order."""
    seen: Dict[str, List[List[int]]] = {}
    for line in stdout.splitlines():
        if line.startswith("fire "):
            name, *args = line.split()[1:]
            seen.setdefault(name, []).append([int(a) for a in args])
    return seen


def recorded(events: List[dict]) -> Dict[str, List[List[int]]]:
    out: Dict[str, List[List[int]]] = {}
    for e in events:
        out.setdefault(e["probe"].split(":")[1], []).append(e["args"])
    return out


def calls_made(stdout: str) -> List[Tuple[str, List[int], Optional[int]]]:
    """(function, arguments, returned value or None after longjmp), in print order."""
    out = []
    for line in stdout.splitlines():
        m = re.fullmatch(r"call (\w+) ([-\d ]+) -> (-?\d+|longjmp)", line)
        if m:
            result = None if m.group(3) == "longjmp" else int(m.group(3))
            out.append((m.group(1), [int(a) for a in m.group(2).split()], result))
    return out


# -- USDT ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("opt", OPTS)
def test_usdt_trace_records_the_arguments_the_program_passed(built, opt):
    b = _get(built, f"usdt{opt}")
    program, stderr, events, before, after = trace(b, USDT_ROUNDS)
    # armed, the semaphore is on: "guarded" fires, and the totals differ
    unguarded = [line for line in program.splitlines()
                 if not line.startswith(("fire guarded", "acc "))]
    assert unguarded == [line for line in b.original[1].splitlines()
                         if not line.startswith("acc ")]
    assert lost(stderr) == 0
    pid = events[0]["pid"]
    assert all(e["kind"] == "usdt" and e["object"] == b.probed.name and e["pid"] == pid
               and e["tid"] == pid for e in events)
    expected = fired(program)
    expected["zero"] = [[] for _ in range(USDT_ROUNDS)]
    expected["edge"] = [[i] for i in range(0, USDT_ROUNDS, 3)]
    assert recorded(events) == expected
    times = [e["ts_ns"] for e in events]
    # the counter's clock is CLOCK_MONOTONIC's: every event falls inside the run
    assert times == sorted(times) and before <= times[0] and times[-1] <= after


@pytest.mark.parametrize("opt", OPTS)
def test_usdt_counts_are_exact_and_the_semaphore_is_enabled(built, opt):
    b = _get(built, f"usdt{opt}")
    program, report = stat(b, USDT_ROUNDS)
    hits = {p["name"]: p["hits"] for p in report["probes"]}
    thirds = len(range(0, USDT_ROUNDS, 3))
    assert hits == {"sample:six": USDT_ROUNDS, "sample:third": thirds, "sample:zero": USDT_ROUNDS,
                    "sample:pair": USDT_ROUNDS, "sample:guarded": USDT_ROUNDS,
                    "sample:edge": thirds}
    assert f"enabled {USDT_ROUNDS} " in program


@pytest.mark.parametrize("opt", OPTS)
def test_disarmed_programs_print_what_the_originals_do(built, opt):
    for name, argv in (("usdt", [str(USDT_ROUNDS)]), ("forms", []),
                       ("calls", CALLS_ARGV)):
        b = _get(built, f"{name}{opt}")
        disarmed = run(emulate(b.probed) + argv)
        assert (exit_status(disarmed.returncode), steady(disarmed.stdout)) \
            == (b.original[0], steady(b.original[1])), name
        if name == "usdt":
            assert "enabled 0 " in disarmed.stdout  # nobody listens: the semaphore stays off


@pytest.mark.parametrize("opt", OPTS)
def test_every_operand_form_gives_the_value_passed(built, opt):
    b = _get(built, f"forms{opt}")
    program, stderr, events, _, _ = trace(b)
    assert program == b.original[1] and lost(stderr) == 0
    expected = fired(program)
    del expected["symbolic"]  # refused, the probe whole: no value, never a wrong one
    assert recorded(events) == expected
    assert "urewrite: warning: not probing t:symbolic: argument 1 '8@[x0, #:lo12:sink]' cannot " \
        "be read: operand [x0, #:lo12:sink] names a symbol" in b.rewrite_stderr


# -- entry arguments, return values, latency ---------------------------------------------------------

CALL_BUILDS = [f"calls{opt}" for opt in OPTS] + ["calls-O2-static"]
ARITY = {"mix": 6, "depth": 1, "nap": 1, "leap": 1}
# the calls the main thread makes, known without the program
CALLS_EXPECTED = Counter({"mix": CALL_ROUNDS, "depth": sum(i % 4 + 1 for i in range(CALL_ROUNDS)),
                          "leap": LEAPS, "nap": 2})


@pytest.mark.parametrize("bid", CALL_BUILDS)
def test_entry_arguments_and_return_values(built, bid):
    b = _get(built, bid)
    program, stderr, events, _, _ = trace(b, *CALLS_ARGV)
    assert steady(program) == steady(b.original[1]) and lost(stderr) == 0
    pid = events[0]["pid"]
    main = [e for e in events if e["tid"] == pid and e["probe"] != "main"]
    made = calls_made(program)
    assert Counter(name for name, _, _ in made) == CALLS_EXPECTED
    # every call's entry carries what it was passed (--args 6: x0-x5, as many as it takes)
    entries = [e for e in main if e["kind"] == "entry"]
    assert all(len(e["args"]) == 6 for e in entries)
    assert Counter((e["probe"], tuple(e["args"][:ARITY[e["probe"]]])) for e in entries) \
        == Counter((name, tuple(args)) for name, args, _ in made)
    # every return carries the value, in the order the calls returned
    returns = [(e["probe"], e["args"]) for e in main if e["kind"] == "return"]
    assert returns == [(name, [value]) for name, _, value in made if value is not None]
    # the workers: their own thread ids; work(t, k) returns t * 1000003 + k * 7
    workers = [e for e in events if e["tid"] != pid]
    assert len({e["tid"] for e in workers}) == THREADS and all(e["tid"] > 0 for e in workers)
    work_in = sorted(tuple(e["args"][:2]) for e in workers if e["probe"] == "work"
                     and e["kind"] == "entry")
    assert work_in == sorted((t, k) for t in range(THREADS) for k in range(PER_THREAD))
    work_out = Counter(e["args"][0] for e in workers if e["probe"] == "work"
                       and e["kind"] == "return")
    assert work_out == Counter(t * 1000003 + k * 7 for t in range(THREADS)
                               for k in range(PER_THREAD))
    # event times are CLOCK_MONOTONIC's: each nap's entry and return fall between the
    # clock readings the program took around the call (give or take the uncertainty of
    # the set-up's pairing of the two clocks: a few microseconds under qemu), 3 ms apart
    naps = [e["ts_ns"] for e in main if e["probe"] == "nap"]
    clocks = [[int(v) for v in line.split()[2:]] for line in program.splitlines()
              if line.startswith("clock nap ")]
    assert len(naps) == 4 and len(clocks) == 2
    for (entry, leave), (before, after) in zip((naps[0:2], naps[2:4]), clocks):
        assert before - PAIRING_NS <= entry < leave <= after + PAIRING_NS
        assert leave - entry >= NAP_US * 1000


@pytest.mark.parametrize("bid", CALL_BUILDS)
def test_latency_histograms_count_every_returned_call(built, bid):
    b = _get(built, bid)
    program, report = stat(b, *CALLS_ARGV)
    assert steady(program) == steady(b.original[1])
    made = calls_made(program)
    assert Counter(name for name, _, _ in made) == CALLS_EXPECTED
    returned = Counter(name for name, _, value in made if value is not None)
    returned["work"] = THREADS * PER_THREAD
    hits = {(p["name"], p["kind"]): p["hits"] for p in report["probes"]}
    histograms = {p["name"]: p["histogram"] for p in report["probes"] if "histogram" in p}
    assert set(histograms) == {"mix", "depth", "nap", "leap", "work"}
    for name, histogram in histograms.items():
        # every thread has a row of its own: every call is measured, a thread's first too
        assert sum(bucket["count"] for bucket in histogram) == returned[name] \
            == hits[(name, "return")], name
    assert hits[("leap", "entry")] == LEAPS
    assert returned["leap"] == LEAPS - len(range(0, LEAPS, 4))
    # the naps: 3 ms each, in the buckets of milliseconds
    naps = [bucket for bucket in histograms["nap"] if bucket["count"]]
    assert all(bucket["lo_ns"] >= 1 << 20 and bucket["hi_ns"] <= 1 << 26 for bucket in naps)
    assert all(bucket["hi_ns"] > NAP_US * 1000 for bucket in naps)


# -- a row for every thread ----------------------------------------------------------------------------

@dataclass
class Rows:
    """One run traced and measured at once: output, region, events, and the owner
    table's claimed entries as {tid: entries past the one its thread pointer hashes to}."""
    stdout: str
    region: R.Region
    events: list
    claimed: Dict[int, int]


def run_traced(b: Build, argv: List[str], directory: Path) -> Rows:
    proc = run(emulate(b.probed) + argv,
               env={R.ENV_VAR: str(directory), R.TRACE_ENV_VAR: str(1 << 17),
                    R.LATENCY_ENV_VAR: "1"})
    assert (exit_status(proc.returncode), steady(proc.stdout)) \
        == (b.original[0], steady(b.original[1])), proc.stderr
    (path,) = directory.glob("*.ure")
    ring = RingReader(str(path))
    events = ring.poll(final=True)
    assert ring.lost() == 0
    ring.close()
    data = path.read_bytes()
    owners = struct.unpack_from("<Q", data, R.OFF_OWNERS)[0]
    claimed = {}
    for slot in range(R.SLOT_COUNT):
        tp, _, tid = struct.unpack_from("<QQI", data, owners + slot * R.OWNER_ENTRY_SIZE)
        if tp:
            home = (tp * R.HASH_MULTIPLIER % (1 << 64) >> R.SLOT_SHIFT & R.SLOT_MASK) \
                // R.OWNER_ENTRY_SIZE
            assert tid and tid not in claimed
            claimed[tid] = (slot - home) % R.SLOT_COUNT
    return Rows(proc.stdout, R.read_region(str(path)), events, claimed)


def worker_tids(rows: Rows) -> Dict[int, set]:
    """{tid: the worker numbers its work() entries carry}, for threads other than main."""
    out: Dict[int, set] = {}
    for e in rows.events:
        if e.tid != rows.region.pid:
            assert e.probe in ("worker", "work"), e
            if e.probe == "work" and e.kind == "entry":
                out.setdefault(e.tid, set()).add(e.args[0])
    return out


@pytest.mark.parametrize("bid", CALL_BUILDS)
def test_every_thread_gets_a_row_of_its_own(built, bid, tmp_path):
    """The main thread and each worker claim an owner entry, every event carries its
    own thread's id, and every returned call is measured."""
    rows = run_traced(_get(built, bid), CALLS_ARGV, tmp_path)
    pid = rows.region.pid
    assert rows.region.threads == len(rows.claimed) == THREADS + 1 and pid in rows.claimed
    assert all(distance < R.OWNER_PROBES for distance in rows.claimed.values())
    assert {e.tid for e in rows.events} == set(rows.claimed)
    assert sorted(worker_tids(rows).values(), key=min) == [{t} for t in range(THREADS)]
    hits = {(p.name, p.kind): p.hits for p in rows.region.probes}
    returned = Counter(name for name, _, value in calls_made(rows.stdout) if value is not None)
    returned["work"] = THREADS * PER_THREAD
    assert hits[("main", "entry")] == 1 and hits[("worker", "entry")] == THREADS
    assert hits[("work", "entry")] == THREADS * PER_THREAD
    assert all(hits[(name, "entry")] == calls for name, calls in CALLS_EXPECTED.items())
    for p in rows.region.probes:
        if p.histogram is not None:
            assert sum(p.histogram) == returned[p.name] == p.hits, p.name


@pytest.mark.parametrize("bid", ["collide-O2", "collide-O2-static"])
def test_threads_hashing_alike_find_rows_of_their_own_nearby(built, bid, tmp_path):
    """Groups of 4 threads (the main thread and 3 workers, then 4 and 3 workers) whose
    thread pointers hash to one owner entry: each takes that entry or one of the next 3."""
    rows = run_traced(_get(built, bid), [str(COLLIDERS), str(PER_THREAD), "4"], tmp_path)
    pid = rows.region.pid
    assert rows.region.threads == len(rows.claimed) == COLLIDERS + 1
    assert rows.claimed[pid] == 0
    assert sorted(rows.claimed.values()) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3]
    assert {e.tid for e in rows.events} == set(rows.claimed)
    assert sorted(worker_tids(rows).values(), key=min) == [{t} for t in range(COLLIDERS)]
    hits = {(p.name, p.kind): (p.hits, p.histogram) for p in rows.region.probes}
    assert hits[("main", "entry")][0] == 1 and hits[("worker", "entry")][0] == COLLIDERS
    calls, histogram = hits[("work", "return")]
    assert hits[("work", "entry")][0] == calls == sum(histogram) == COLLIDERS * PER_THREAD


@pytest.mark.parametrize("bid", ["collide-O2", "collide-O2-static"])
def test_past_eight_threads_hashing_alike_count_in_the_shared_row(built, bid, tmp_path):
    """All 11 threads hash to one owner entry: the first 8 to hit take it and the next
    7; the other 3 count in the shared row, exactly, with thread id 0 and no latency."""
    rows = run_traced(_get(built, bid), [str(COLLIDERS), str(PER_THREAD), str(COLLIDERS + 1)],
                      tmp_path)
    assert rows.region.threads == len(rows.claimed) == R.OWNER_PROBES
    assert sorted(rows.claimed.values()) == list(range(R.OWNER_PROBES))
    shared = COLLIDERS + 1 - R.OWNER_PROBES
    assert Counter(e.tid for e in rows.events)[0] == shared * (1 + 2 * PER_THREAD)
    own = {tid: t for tid, t in worker_tids(rows).items() if tid}
    assert all(len(t) == 1 for t in own.values()) and len(own) == COLLIDERS - shared
    hits = {(p.name, p.kind): (p.hits, p.histogram) for p in rows.region.probes}
    assert hits[("worker", "entry")][0] == COLLIDERS
    calls, histogram = hits[("work", "return")]
    assert hits[("work", "entry")][0] == calls == COLLIDERS * PER_THREAD
    assert sum(histogram) == (COLLIDERS - shared) * PER_THREAD


# -- many writers ------------------------------------------------------------------------------------

def test_many_writers_small_ring_no_torn_or_duplicate_event_and_exact_loss(built):
    b = _get(built, "threads-O2")
    _, stderr, events, _, _ = trace(b, THREADS, 20000, ring=64, retry_losses=False)
    args = [e["args"] for e in events]
    assert all(c == t * 1000003 + k * 7 for t, k, c in args)  # never torn
    assert len({(t, k) for t, k, _ in args}) == len(args)  # never twice
    assert lost(stderr) > 0 and len(args) + lost(stderr) == THREADS * 20000


def test_large_ring_loses_nothing(built):
    b = _get(built, "threads-O2")
    _, stderr, events, _, _ = trace(b, THREADS, 10000, ring=1 << 20)
    assert lost(stderr) == 0 and sorted(e["args"] for e in events) == sorted(
        [t, k, t * 1000003 + k * 7] for t in range(THREADS) for k in range(10000))
    assert len({e["tid"] for e in events}) == THREADS


# -- operand parsing -------------------------------------------------------------------------------

def test_operand_forms_are_parsed_or_refused_with_a_reason():
    from urewrite.arch.aarch64 import arguments as A
    from urewrite.trampolines.arguments import CONSTANT, MEMORY, REGISTER, ArgSpec

    assert A.sdt_arguments("-4@[sp, 44] 8@[x29, -16] -8@[x19] 1@x3 -4@w1 4@5 -4@-1 "
                           "8@[x0, x1, lsl 3] 8@xzr", None) == [
        ArgSpec(MEMORY, 4, True, base=31, index=A.NONE, value=44),
        ArgSpec(MEMORY, 8, False, base=29, index=A.NONE, value=-16),
        ArgSpec(MEMORY, 8, True, base=19, index=A.NONE),
        ArgSpec(REGISTER, 1, False, base=3, index=A.NONE),
        ArgSpec(REGISTER, 4, True, base=1, index=A.NONE),
        ArgSpec(CONSTANT, 4, False, base=A.NONE, index=A.NONE, value=5),
        ArgSpec(CONSTANT, 4, True, base=A.NONE, index=A.NONE, value=-1),
        ArgSpec(MEMORY, 8, False, base=0, index=1, scale=8),
        ArgSpec(REGISTER, 8, False, base=A.NONE, index=A.NONE)]
    refused = {"8@d0": "floating-point", "8@[x1, #:lo12:g]": "names a symbol",
               "8@[x0, 8]!": "not understood", "8@[x0, w1, sxtw]": "not understood",
               "16@x0": "size 16", "8@x31": "not understood", "8@[x0, x1, lsl 4]": "shift"}
    for text, reason in refused.items():
        with pytest.raises(ValueError, match=re.escape(reason)):
            A.sdt_arguments(text, None)
    with pytest.raises(ValueError):
        A.abi_arguments(7)
