"""Return probes by return-address redirection (x86_64): the fallback for functions
whose exits cannot all be patched. Exact counts where frames return, none where
they do not, and the program behaves as the original."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import run

from urewrite.trampolines.region import read_regions

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "samples")
SOURCE = os.path.join(SAMPLES, "redirect.c")
FUNCTIONS = ["depth", "work", "maybe_jump", "dive", "nested", "twice", "via", "forker", "die"]
# functions that redirect (the others patch their exits) at each build; at -O2 the
# shapes depend on the compiler version: the indirect tail call of `via` is an exit
# checked where it goes, unless every return that can be redirected is (+redirect-all,
# the UREWRITE_REDIRECT_RETURNS switch of the rewrite).
# `die` leaves by no exit at all: its jump table's cases are all its own.
REDIRECT_ALL = " +redirect-all"
REDIRECTED = {
    "-O0": set(FUNCTIONS) - {"die"},
    "-O0 -static": set(FUNCTIONS) - {"die"},
    "-O2": set(),
    "-O2" + REDIRECT_ALL: {"via"},
}
CASES = ["recursion", "threads", "longjmp", "dive", "signal", "tail", "chain", "fork", "die"]

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")


def urewrite(*args, env=None):
    """Rewrites and listings try the plain jump only (--tactics jump): hops would patch
    most of the -O0 exits this file needs redirected."""
    args = list(map(str, args))
    if args[0] not in ("stat", "trace"):
        args += ["--tactics", "jump"]
    return run([sys.executable, "-m", "urewrite", *args], env=env)


def stat(command, env=None):
    """`stat --latency`: the output, the program's part of it, the report."""
    out = urewrite("stat", "--json", "--latency", "--", *command, env=env)
    start = out.stdout.index('{\n  "exit_code"')  # the report follows the program's output
    return out, out.stdout[:start], json.loads(out.stdout[start:])


def expected_returns(program_output: str) -> dict:
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^returns (\w+) (\d+)$", program_output, re.M)}


def mechanisms(path, env=None) -> dict:
    listed = json.loads(urewrite("list", "--json", path, env=env).stdout)["functions"]
    return {f["name"]: f["return"] for f in listed}


@pytest.fixture(scope="module", params=list(REDIRECTED))
def build(request, tmp_path_factory):
    work = tmp_path_factory.mktemp("redirect")
    plain, probed = work / "redirect", work / "redirect.probed"
    flags = request.param.replace(REDIRECT_ALL, "")
    subprocess.run(["gcc", *flags.split(), "-pthread", SOURCE, "-o", plain], check=True)
    args = [a for name in FUNCTIONS for a in ("-r", name)] + ["-p", "depth", "-p", "work"]
    env = dict(os.environ, UREWRITE_REDIRECT_RETURNS="1") \
        if request.param.endswith(REDIRECT_ALL) else None
    out = urewrite(plain, *args, "-o", probed, env=env)
    assert out.returncode == 0, out.stderr
    listed = mechanisms(plain, env)
    redirected = {name for name in FUNCTIONS if listed[name]["mechanism"] == "redirection"}
    assert redirected >= REDIRECTED[request.param]
    assert all(listed[name]["mechanism"] for name in FUNCTIONS)  # none refused
    # (at -O0 via calls twice and returns after it, as a redirected via does)
    return plain, probed, env is not None or flags.startswith("-O0")


@pytest.mark.parametrize("case", CASES)
def test_redirected_returns_are_counted_exactly(build, case):
    plain, probed, _ = build
    args = [case] + (["2"] if case == "die" else [])
    original = subprocess.run([plain, *args], capture_output=True, text=True)
    out, program, report = stat([probed, *args])
    assert (report["exit_code"], program) == (original.returncode, original.stdout)
    assert "could not redirect" not in out.stderr
    hits = {(p["name"], p["kind"]): p["hits"] for p in report["probes"]}
    expected = expected_returns(original.stdout)
    if case == "die":
        expected = {"die": 0}
    assert expected
    for name, count in expected.items():
        assert hits[(name, "return")] == count, name
    samples = {p["name"]: sum(b["count"] for b in p["histogram"])
               for p in report["probes"] if "histogram" in p}
    if case == "recursion":
        assert hits[("depth", "entry")] == 10001
        assert samples["depth"] == 126  # the outermost open calls
    if case == "threads":
        assert hits[("work", "entry")] == 1000000
        assert samples["work"] == 1000000  # a thread's first call too


def test_disarmed_behaviour_is_unchanged(build):
    plain, probed, _ = build
    for case in CASES:
        a = subprocess.run([plain, case], capture_output=True, text=True)
        b = subprocess.run([probed, case], capture_output=True, text=True)
        assert (a.returncode, a.stdout) == (b.returncode, b.stdout), case


def test_events_through_the_stub_carry_the_return_value(build):
    _, probed, via_redirected = build
    out = urewrite("trace", "--json", "--", probed, "tail")
    events = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    returns = [(e["probe"], e["args"][:1]) for e in events if e["kind"] == "return"]
    if via_redirected:
        # via tail-calls twice: twice returns first (to via's stub), then via, same value
        assert returns == [(name, [2 * x]) for x in range(30) for name in ("twice", "via")]
    else:
        # via's return counts at its tail call, before twice runs: no value yet
        assert returns == [(name, value) for x in range(30)
                           for name, value in (("via", []), ("twice", [2 * x]))]


STALE = r"""
#include <setjmp.h>
#include <stdio.h>
static jmp_buf jb;
static volatile int sink;
__attribute__((noipa)) int down(int n) {
    if (n == 0)
        longjmp(jb, 1);
    if (n < 0)
        return 0;
    return down(n - 1) + sink;
}
__attribute__((noipa)) int leaf(int n) {
    if (n < 0)
        return 0;
    return n + sink;
}
int main(void) {
    long s = 0;
    for (volatile int i = 0; i < 200; i++) {
        if (setjmp(jb) == 0)
            down(1000 + i);     /* 1000+ frames left at once, each round */
        s += leaf(i);           /* returns past the stale entries */
    }
    printf("%ld\n", s);
    return 0;
}
"""


def test_stale_entries_after_longjmp(tmp_path):
    """Frames left by longjmp leave entries on the shadow stack; the next return
    drops them, and every later return still finds its own."""
    (tmp_path / "stale.c").write_text(STALE)
    plain, probed = tmp_path / "stale", tmp_path / "stale.probed"
    subprocess.run(["gcc", "-O0", tmp_path / "stale.c", "-o", plain], check=True)
    listed = mechanisms(plain)
    assert listed["down"]["mechanism"] == listed["leaf"]["mechanism"] == "redirection"
    out = urewrite(plain, "-r", "down", "-r", "leaf", "-p", "down", "-o", probed)
    assert out.returncode == 0, out.stderr
    original = subprocess.run([plain], capture_output=True, text=True)
    _, program, report = stat([probed])
    assert program == original.stdout
    hits = {(p["name"], p["kind"]): p["hits"] for p in report["probes"]}
    assert hits == {("down", "entry"): sum(1001 + i for i in range(200)),
                    ("down", "return"): 0, ("leaf", "return"): 200}


LIBRARY = r"""
#include <pthread.h>
static volatile int sink;
__attribute__((noipa)) int lib_twice(int x) {
    if (x < 0)
        return 0;
    return 2 * x + sink;
}
static void *spin(void *arg) {
    long s = 0;
    for (int i = 0; i < 100000; i++)
        s += lib_twice(i & 7);
    return (void *)s;
}
__attribute__((noipa)) long lib_threads(int n) {
    pthread_t t[8];
    long s = 0;
    if (n > 8)
        return -1;
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], 0, spin, 0);
    for (int i = 0; i < n; i++) {
        void *r;
        pthread_join(t[i], &r);
        s += (long)r;
    }
    return s;
}
/* last in .text: the window of lib_threads' exit could borrow the gap after .text */
int lib_last(void) { return 0; }
"""
PROGRAM = r"""
#include <stdio.h>
long lib_threads(int);
int main(void) { printf("%ld\n", lib_threads(3)); return 0; }
"""


def test_redirection_in_a_shared_object_with_threads(tmp_path):
    (tmp_path / "lib.c").write_text(LIBRARY)
    (tmp_path / "main.c").write_text(PROGRAM)
    probed_dir = tmp_path / "probed"
    probed_dir.mkdir()
    subprocess.run(["gcc", "-O0", "-shared", "-fPIC", "-pthread", tmp_path / "lib.c", "-o",
                    tmp_path / "libredir.so"], check=True)
    subprocess.run(["gcc", "-O2", tmp_path / "main.c", "-L", tmp_path, "-lredir", "-o",
                    tmp_path / "main"], check=True)
    listed = mechanisms(tmp_path / "libredir.so")
    assert listed["lib_twice"]["mechanism"] == listed["lib_threads"]["mechanism"] == "redirection"
    out = urewrite(tmp_path / "libredir.so", "-r", "lib_t*", "-o", probed_dir / "libredir.so")
    assert out.returncode == 0, out.stderr
    original = subprocess.run([tmp_path / "main"], capture_output=True, text=True,
                              env=dict(os.environ, LD_LIBRARY_PATH=str(tmp_path)))
    _, program, report = stat([tmp_path / "main"],
                              env=dict(os.environ, LD_LIBRARY_PATH=str(probed_dir)))
    assert program == original.stdout
    hits = {(p["name"], p["kind"]): p["hits"] for p in report["probes"]}
    assert hits == {("lib_twice", "return"): 300000, ("lib_threads", "return"): 1}


MANY_THREADS = r"""
#include <pthread.h>
#include <stdio.h>
static volatile int sink;
static pthread_barrier_t all_alive;
__attribute__((noipa)) int once(int x) {
    if (x < 0)
        return 0;
    return x + sink;
}
static void *run(void *arg) {
    pthread_barrier_wait(&all_alive); /* every thread alive at once: distinct TCBs */
    return (void *)(long)once((int)(long)arg);
}
int main(void) {
    enum { N = 1100 };
    static pthread_t t[N];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_barrier_init(&all_alive, 0, N);
    for (long i = 0; i < N; i++)
        pthread_create(&t[i], &attr, run, (void *)i);
    long s = 0;
    for (int i = 0; i < N; i++) {
        void *r;
        pthread_join(t[i], &r);
        s += (long)r;
    }
    printf("%ld\n", s);
    return 0;
}
"""


def test_threads_beyond_the_table_are_counted_as_missed(tmp_path):
    """More live threads than the table of shadow stacks holds: the calls of those
    without one are not redirected, and the region counts them; nothing else changes."""
    (tmp_path / "many.c").write_text(MANY_THREADS)
    plain, probed = tmp_path / "many", tmp_path / "many.probed"
    subprocess.run(["gcc", "-O0", "-pthread", tmp_path / "many.c", "-o", plain], check=True)
    out = urewrite(plain, "-r", "once", "-p", "once", "-o", probed)
    assert out.returncode == 0, out.stderr
    original = subprocess.run([plain], capture_output=True, text=True)
    regions = tmp_path / "regions"
    regions.mkdir()
    run = subprocess.run([probed], capture_output=True, text=True,
                         env=dict(os.environ, UREWRITE_DIR=str(regions)))
    assert (run.returncode, run.stdout) == (0, original.stdout)
    [region] = read_regions(str(regions))
    hits = {(p.name, p.kind): p.hits for p in region.probes}
    assert hits[("once", "entry")] == 1100
    assert region.returns_missed == 1100 - 1024  # the table holds 1024 threads
    assert hits[("once", "return")] + region.returns_missed == 1100
    out = urewrite("stat", "--", probed)
    assert "76 calls could not redirect their return address" in out.stderr


def test_refused_under_a_cet_shadow_stack(tmp_path):
    plain = tmp_path / "cet"
    subprocess.run(["gcc", "-O0", "-fcf-protection=full", "-Wl,-z,shstk", "-pthread", SOURCE,
                    "-o", plain], check=True)
    out = urewrite(plain, "-r", "depth", "-o", tmp_path / "out")
    assert out.returncode == 1
    assert "cannot be redirected: the file enables the CET shadow stack" in out.stderr
    assert not (tmp_path / "out").exists()


CXX = r"""
#include <cstdio>
#include <stdexcept>
static volatile int sink;
__attribute__((noinline)) int check(int i) {
    if (i % 5 == 0)
        throw std::runtime_error("bad");
    if (i < 0)
        return 0;
    return i + sink;
}
/* -O0: its `ret` follows `call *%rdx; leave`, and no window of the plain jump fits;
   -O2: an indirect tail call, an exit checked where it goes */
__attribute__((noinline)) int via(int (*f)(int), int x) { return f(x); }
int main() {
    int caught = 0;
    for (int i = 0; i < 20; i++)
        try { via(check, i); } catch (const std::exception &) { caught++; }
    std::printf("%d\n", caught);
}
"""


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++")
def test_refused_where_cxx_exceptions_are_thrown(tmp_path):
    (tmp_path / "x.cc").write_text(CXX)
    plain = tmp_path / "x"
    subprocess.run(["g++", "-O0", tmp_path / "x.cc", "-o", plain], check=True)
    ret = mechanisms(plain)["_Z3viaPFiiEi"]
    assert ret["mechanism"] is None
    assert "cannot be redirected: the file can throw C++ exceptions" in ret["reason"]
    subprocess.run(["g++", "-O2", tmp_path / "x.cc", "-o", plain], check=True)
    assert mechanisms(plain)["_Z3viaPFiiEi"]["mechanism"] == "exit sites"


WHENCE = r"""
#include <setjmp.h>
#include <stdio.h>
__attribute__((noipa)) void *whence(int x) {
    if (x < 0)
        return 0;
    return __builtin_return_address(0);
}
int main(void) { jmp_buf jb; if (setjmp(jb) == 0) printf("%d\n", whence(1) != 0); return 0; }
"""


@pytest.mark.parametrize("flags", ["-O0", "-O2", "-O2 -static"])
def test_functions_that_must_keep_their_return_address(tmp_path, flags):
    """A redirected return address would be seen by code that reads it, and lost by
    a second return: such functions are refused, with the reason."""
    from urewrite.rewriter import redirection
    from urewrite.rewriter.pipeline import analyse

    (tmp_path / "whence.c").write_text(WHENCE)
    plain = tmp_path / "whence"
    subprocess.run(["gcc", *flags.split(), tmp_path / "whence.c", "-o", plain], check=True)
    a = analyse(str(plain))
    by_name = {name: fn for fn in a.functions for name in fn.names}

    frames = redirection.entry_frames(a.elf)

    def problem(name):
        return redirection.function_problem(a.elf, a.planner.backend, by_name[name], frames)
    assert "reads its return address" in problem("whence")
    assert "entry point" in problem("_start")
    assert problem("main") is None
    if "-static" in flags:
        assert "may return twice" in problem("_setjmp")
        assert "may return twice" in problem("__sigsetjmp")


def test_refused_without_unwind_info(tmp_path):
    """Without an FDE of its own, nothing shows a function is entered by a call."""
    plain = tmp_path / "bare"
    subprocess.run(["gcc", "-O0", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables",
                    "-pthread", SOURCE, "-o", plain], check=True)
    ret = mechanisms(plain)["depth"]
    assert ret["mechanism"] is None
    assert "no .eh_frame entry starts at it" in ret["reason"]


SET_TP = r"""
#include <asm/prctl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
static unsigned long fake[64];
static volatile int sink;
/* returns with another thread pointer than it was called with, as a static
   program's start-up does when libc replaces the stand-in TCB */
__attribute__((noipa)) int set_tp(unsigned long tp) {
    if (tp == 0)
        return 0;
    syscall(SYS_arch_prctl, ARCH_SET_FS, tp);
    return 1 + sink;
}
int main(void) {
    unsigned long old;
    syscall(SYS_arch_prctl, ARCH_GET_FS, &old);
    memcpy(fake, (void *)old, sizeof fake); /* the stack guard at fs:0x28 too */
    fake[0] = (unsigned long)fake;          /* fs:[0] holds the thread pointer */
    int n = 0;
    for (int i = 0; i < 3; i++)
        n += set_tp((unsigned long)fake) + set_tp(old);
    printf("switched %d\n", n);
    return 0;
}
"""


def test_a_return_after_the_thread_pointer_changed(tmp_path):
    """The stub finds the entry on the stack of the thread pointer the call was made with."""
    (tmp_path / "tp.c").write_text(SET_TP)
    plain, probed = tmp_path / "tp", tmp_path / "tp.probed"
    subprocess.run(["gcc", "-O0", tmp_path / "tp.c", "-o", plain], check=True)
    assert mechanisms(plain)["set_tp"]["mechanism"] == "redirection"
    assert urewrite(plain, "-r", "set_tp", "-o", probed).returncode == 0
    _, program, report = stat([probed])
    assert program == "switched 6\n"
    assert [(p["name"], p["hits"]) for p in report["probes"]] == [("set_tp", 6)]


# samples/coroutines.c (ucontext) and a program running one (built in one file or apart)
COROUTINES = open(os.path.join(SAMPLES, "coroutines.c")).read()
COROUTINE_USER = open(os.path.join(SAMPLES, "coroutine_user.c")).read()


def test_stack_switching(tmp_path):
    """A file that switches stacks itself is refused. Switching done elsewhere (here
    in a library) can leave a suspended frame without its entry: the program then
    stops with a message, never returns to a wrong address."""
    (tmp_path / "co.c").write_text(COROUTINES)
    (tmp_path / "user.c").write_text(COROUTINE_USER)
    (tmp_path / "all.c").write_text(COROUTINES + COROUTINE_USER)
    subprocess.run(["gcc", "-O0", tmp_path / "all.c", "-o", tmp_path / "all"], check=True)
    ret = mechanisms(tmp_path / "all")["inner"]
    assert ret["mechanism"] is None and "the file switches stacks" in ret["reason"]

    subprocess.run(["gcc", "-O0", "-shared", "-fPIC", tmp_path / "co.c", "-o",
                    tmp_path / "libco.so"], check=True)
    plain, probed = tmp_path / "user", tmp_path / "user.probed"
    subprocess.run(["gcc", "-O0", tmp_path / "user.c", "-L", tmp_path, "-lco",
                    "-Wl,-rpath," + str(tmp_path), "-o", plain], check=True)
    assert mechanisms(plain)["inner"]["mechanism"] == "redirection"
    assert urewrite(plain, "-r", "inner", "-r", "outer", "-o", probed).returncode == 0
    assert subprocess.run([plain], capture_output=True, text=True).stdout == "done\n"
    out = urewrite("stat", "--", probed)
    assert out.returncode == 128 + 4  # SIGILL: ud2
    assert "urewrite: a redirected return address was lost; stopping" in out.stderr
