"""Every function of the system's libc.so.6 probed: real programs must not notice."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import cross
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
pytestmark = pytest.mark.skipif(not os.path.exists(LIBC) or not shutil.which("gcc"),
                                reason="needs Debian's x86_64 libc.so.6 and gcc")

SCRIPT = textwrap.dedent("""\
    set -e
    seq 1 5000 | sort -r | uniq | wc -l
    echo hello | tr a-z A-Z | sed s/H/J/ | awk '{print $1, length($1)}'
    /bin/true </dev/null
    {python} -c "import json, threading, subprocess; t = threading.Thread(target=print, args=('thread',)); t.start(); t.join(); print(json.dumps([1, 2]), subprocess.run(['echo', 'child'], capture_output=True).stdout)"
    {atoi} 1234 250
    kill -TERM $$ &
    wait
    """)

ATOI = textwrap.dedent("""\
    #include <signal.h>
    #include <stdio.h>
    #include <stdlib.h>
    static volatile int got;
    static void on_signal(int s) { got = s; }
    int main(int argc, char **argv) {
        long sum = 0;
        int n = atoi(argv[2]);              /* 1 call */
        signal(SIGUSR1, on_signal);
        raise(SIGUSR1);                     /* returns through __restore_rt */
        for (int i = 0; i < n; i++)
            sum += atoi(argv[1]);           /* n more (gcc calls strtol) */
        printf("%ld %d\\n", sum, got);
        return 0;
    }
    """)


@pytest.fixture(scope="module")
def probed_libc(tmp_path_factory):
    work = tmp_path_factory.mktemp("libc")
    libdir = work / "lib"
    libdir.mkdir()
    out = subprocess.run([sys.executable, "-m", "urewrite", LIBC, "-p", "*", "-r", "*",
                          "--keep-going", "-o", str(libdir / "libc.so.6"), "--json"],
                         capture_output=True, text=True, check=True)
    source = work / "atoi.c"
    source.write_text(ATOI)
    subprocess.run(["gcc", "-O2", str(source), "-o", str(work / "atoi")], check=True)
    script = work / "script.sh"
    script.write_text(SCRIPT.replace("{python}", sys.executable).replace("{atoi}", str(work / "atoi")))
    return work, libdir, out.stdout


def run(script, env):
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)


def test_programs_behave_the_same_on_a_fully_probed_libc(probed_libc):
    work, libdir, _ = probed_libc
    plain = run(work / "script.sh", dict(os.environ))
    probed = run(work / "script.sh", dict(os.environ, LD_LIBRARY_PATH=str(libdir)))
    assert plain.returncode == probed.returncode == -15  # the script ends by SIGTERM
    assert plain.stdout == probed.stdout
    assert "308500 10" in plain.stdout


def test_counts_in_a_fully_probed_libc(probed_libc):
    work, libdir, _ = probed_libc
    out = subprocess.run([sys.executable, "-m", "urewrite", "stat", "--json", "--",
                          str(work / "atoi"), "7", "250"],
                         capture_output=True, text=True,
                         env=dict(os.environ, LD_LIBRARY_PATH=str(libdir)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("1750 10\n")
    import json
    report = json.loads(out.stdout.split("\n", 1)[1])
    hits = {p["name"]: p["hits"] for p in report["probes"]
            if p["object"] == "libc.so.6" and p["kind"] == "entry"}
    assert hits["strtol"] == 251  # gcc turns atoi(s) into strtol(s, 0, 10)
    assert hits.get("raise", hits.get("gsignal")) == 1  # one function, two names


def test_signal_return_trampoline_is_refused(probed_libc):
    import json
    refused = json.loads(probed_libc[2])["refused"]
    # the FDE of __restore_rt starts one byte early; the kernel returns into it
    assert any("inside the displaced bytes" in r["reason"] for r in refused)


# Functions that do not return once per call: they never return, or return twice
# (fork: in the parent and in the child). Unnamed ones (fn_<address>: static
# functions of a stripped libc, such as the exit handlers and thread start) may
# never return either.
NEVER_RETURN = {"exit", "_exit", "_Exit", "__libc_start_main", "execve", "abort", "__pthread_exit",
                "pthread_exit", "__libc_start_call_main", "__run_exit_handlers"}
RETURN_TWICE = {"fork", "__libc_fork", "_Fork", "vfork", "__vfork"}


def test_every_libc_function_returns_as_often_as_it_is_entered(probed_libc):
    """Return probes on every function of libc (each exit patched, its split-off
    parts followed): every process of the script, each function's returns."""
    import json
    work, libdir, _ = probed_libc
    script = work / "returns.sh"  # the script without its ending, which kills the shell
    script.write_text((work / "script.sh").read_text().replace("kill -TERM $$ &\nwait\n", ""))
    out = subprocess.run([sys.executable, "-m", "urewrite", "stat", "--json", "--",
                          "bash", str(script)], capture_output=True, text=True,
                         env=dict(os.environ, LD_LIBRARY_PATH=str(libdir)))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout[out.stdout.index('{\n  "exit_code"'):])
    assert report["processes"] >= 8
    counts, kinds = {}, {}  # (some functions are refused one of their probes)
    for p in report["probes"]:
        if p["object"] == "libc.so.6":
            pair = counts.setdefault(p["name"], [0, 0])
            pair[p["kind"] == "return"] += p["hits"]
            kinds.setdefault(p["name"], set()).add(p["kind"])
    counts = {name: pair for name, pair in counts.items() if len(kinds[name]) == 2}
    assert sum(r for _, r in counts.values()) > 100_000
    common = [n for n in ("malloc", "__libc_malloc", "free", "__libc_free", "strtol",
                          "__libc_read", "read", "__libc_write", "write") if n in counts]
    assert len(common) >= 4, sorted(counts)[:50]
    for name in common:
        entries, returns = counts[name]
        assert entries == returns > 0, name
    for name, (entries, returns) in counts.items():
        if entries == returns:
            continue
        if name in RETURN_TWICE:
            assert returns <= 2 * entries, name
        else:
            assert returns < entries, name
            assert name in NEVER_RETURN or name.startswith("fn_"), (name, entries, returns)


ARM64_LIBC = "/usr/aarch64-linux-gnu/lib/libc.so.6"
ARM64_PROGRAM = textwrap.dedent("""\
    #include <pthread.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    static void *work(void *arg) {
        char *p = malloc(100);
        snprintf(p, 100, "t%ld", (long)arg);
        long n = strlen(p);
        free(p);
        return (void *)n;
    }
    int main(void) {
        pthread_t t[4];
        long s = 0;
        for (long i = 0; i < 4; i++)
            pthread_create(&t[i], 0, work, (void *)i);
        for (int i = 0; i < 4; i++) {
            void *r;
            pthread_join(t[i], &r);
            s += (long)r;
        }
        char buf[256];
        for (int i = 0; i < 1000; i++) {
            snprintf(buf, sizeof buf, "%d-%s", i, "abc");
            s += strlen(buf);
        }
        printf("%ld %.3f\\n", s, atof("3.25") * 2);
        return 0;
    }
    """)


@pytest.mark.skipif(not os.path.exists(ARM64_LIBC) or bool(cross.missing(cross.CC, cross.QEMU)),
                    reason="needs Debian's arm64 libc.so.6, its cross gcc and qemu-aarch64")
def test_arm64_libc_probed_at_every_entry_and_return(tmp_path):
    import json
    libdir = tmp_path / "lib"
    libdir.mkdir()
    out = subprocess.run([sys.executable, "-m", "urewrite", ARM64_LIBC, "-p", "*", "-r", "*",
                          "--keep-going", "-q", "-o", str(libdir / "libc.so.6")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (tmp_path / "work.c").write_text(ARM64_PROGRAM)
    program = tmp_path / "work"
    subprocess.run([cross.CC, "-O2", "-pthread", str(tmp_path / "work.c"),
                    "-o", str(program)], check=True)
    qemu = [cross.QEMU, "-L", "/usr/aarch64-linux-gnu"]  # (where ARM64_LIBC is)
    plain = subprocess.run([*qemu, program], capture_output=True, text=True)
    assert plain.returncode == 0 and plain.stdout == "6898 6.500\n"
    run = subprocess.run([sys.executable, "-m", "urewrite", "stat", "--json", "--", *qemu,
                          "-E", f"LD_LIBRARY_PATH={libdir}", program],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(plain.stdout)
    counts, kinds = {}, {}
    for p in json.loads(run.stdout[len(plain.stdout):])["probes"]:
        pair = counts.setdefault(p["name"], [0, 0])
        pair[p["kind"] == "return"] += p["hits"]
        kinds.setdefault(p["name"], set()).add(p["kind"])
    both = {name: pair for name, pair in counts.items() if len(kinds[name]) == 2}
    assert sum(r for _, r in both.values()) > 5000
    # the functions that never return: exit, _exit, and those with no exit at all
    # (__libc_start_call_main, start_thread, the clone child's start, ...: they call
    # through a pointer, blr, then leave the thread or the process)
    listed = json.loads(subprocess.run([sys.executable, "-m", "urewrite", "list", "--json",
                                        ARM64_LIBC], capture_output=True, text=True,
                                       check=True).stdout)["functions"]
    no_exit = {f["name"] for f in listed
               if f["return"]["mechanism"] == "exit sites" and f["return"]["exits"] == 0}
    unequal = {name: pair for name, pair in both.items() if pair[0] != pair[1]}
    assert {"exit": [1, 0], "_exit": [1, 0]}.items() <= unequal.items()
    # the others never returned either (__libc_start_main and the like: besides the
    # functions with no exit at all, some have exits, conditional tail calls or checked
    # indirect jumps, that this run never took)
    assert all(returns == 0 for name, (_, returns) in unequal.items()), unequal
    assert {name for name in no_exit if both.get(name, [0])[0]} <= set(unequal)
