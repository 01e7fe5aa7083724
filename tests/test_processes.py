"""Threads, fork, exec and shared libraries: counts stay exact across them."""

from __future__ import annotations

import json
import os
import struct

import pytest

from conftest import ENV_VAR, check, rewrite, run, stat, urewrite
from urewrite.trampolines import region as R
from urewrite.trampolines.region import read_regions
from variants import LIBDEMO_EXPECTED, USELIB_EXPECTED, USELIB_EXIT


# -- threads -------------------------------------------------------------------------------

@pytest.mark.parametrize("link", ["pie", "static"])
def test_threads_count_exactly(builder, tmp_path, link):
    built = builder.build("threads", ["threads.c"], ["-O2", "-pthread"], ["-pthread", f"-{link}"])
    original = run([built.path])
    assert original.returncode == 0
    assert original.stdout.startswith("threads=4 calls=1200000 ")
    probed = tmp_path / "threads.probed"
    result = rewrite(built.path, probed, "work", "worker", "main")
    assert [p["name"] for p in result["probes"]] == sorted(
        ["work", "worker", "main"], key=lambda n: built.own_functions[n])
    disarmed = run([probed])
    assert (disarmed.returncode, disarmed.stdout) == (0, original.stdout)
    st = stat([probed], tmp_path)
    assert st.proc.returncode == 0
    assert st.proc.stdout == original.stdout
    assert st.hits("work") == 4 * 300_000
    assert st.hits("worker") == 4
    assert st.hits("main") == 1
    assert st.report["processes"] == 1


@pytest.mark.parametrize("threads, calls", [(64, 20_000), (300, 1_000)])
def test_many_threads_sharing_counter_rows(builder, tmp_path, threads, calls):
    """More live threads than per-thread rows (256), or enough for hash collisions."""
    built = builder.build("threads", ["threads.c"], ["-O2", "-pthread"], ["-pthread", "-pie"])
    probed = tmp_path / "threads.probed"
    rewrite(built.path, probed, "work", "worker")
    st = stat([probed, threads, calls], tmp_path)
    assert st.proc.returncode == 0
    assert st.proc.stdout.startswith(f"threads={threads} calls={threads * calls} ")
    assert st.hits("work") == threads * calls
    assert st.hits("worker") == threads


def test_threads_that_hash_alike_still_get_rows_of_their_own(builder, tmp_path):
    """64 live threads with unevenly spaced thread pointers, hashed into 256 rows,
    collide with near certainty (birthday odds above 99.9%); a thread whose row is
    taken probes on for a free one. With rows of their own, every thread's events
    name it and every call is measured."""
    threads, calls = 64, 300
    built = builder.build("threads", ["threads.c"], ["-O2", "-pthread"], ["-pthread", "-pie"])
    probed = tmp_path / "threads.probed"
    rewrite(built.path, probed, "work", extra=["-r", "work"])
    regions = tmp_path / "regions"
    regions.mkdir()
    assert run([probed, threads, calls, 1],
               env={ENV_VAR: str(regions), "UREWRITE_LATENCY": "1"}).returncode == 0
    (region,) = read_regions(str(regions))
    owners = owner_threads(region.path)
    assert len(owners) == threads  # each has a row of its own
    displaced = [slot for slot, tp in owners.items() if slot != home_slot(tp)]
    assert displaced, "no two threads hashed alike: the test proves nothing"
    work_return = next(p for p in region.probes if p.name == "work" and p.kind == "return")
    assert sum(work_return.histogram) == threads * calls

    events = tmp_path / "events.jsonl"
    proc = urewrite("trace", "--json", "--ring", 1 << 16, "-o", events, "--", probed,
                    threads, calls, 1)
    assert proc.returncode == 0, proc.stderr
    tids = [json.loads(line)["tid"] for line in events.read_text().splitlines()]
    assert len(tids) == 2 * threads * calls
    assert 0 not in tids  # 0: a thread counting in the shared row
    assert len(set(tids)) == threads


def home_slot(thread_pointer: int) -> int:
    product = thread_pointer * R.HASH_MULTIPLIER % (1 << 64)
    return ((product >> R.SLOT_SHIFT) & R.SLOT_MASK) // R.OWNER_ENTRY_SIZE


def owner_threads(path: str) -> dict:
    """slot -> thread pointer of each claimed owner entry of a region file."""
    data = open(path, "rb").read()
    owners = struct.unpack_from("<Q", data, R.OFF_OWNERS)[0]
    entries = (struct.unpack_from("<Q", data, owners + slot * R.OWNER_ENTRY_SIZE)[0]
               for slot in range(R.SLOT_COUNT))
    return {slot: tp for slot, tp in enumerate(entries) if tp}


def test_threads_every_function(builder, tmp_path):
    """With every function of the program probed (libpthread's are in libc.so, not here)."""
    built = builder.build("threads", ["threads.c"], ["-O2", "-pthread"], ["-pthread", "-pie"])
    probed = tmp_path / "threads.probed"
    rewrite(built.path, probed, "*")
    st = stat([probed], tmp_path)
    assert st.proc.returncode == 0
    assert st.hits("work") == 1_200_000


# -- fork and exec ---------------------------------------------------------------------------

@pytest.mark.parametrize("link", ["pie", "static"])
def test_fork_parent_and_child_count_exactly(builder, tmp_path, link):
    built = builder.build("forks", ["forks.c"], ["-O2"], [f"-{link}"])
    original = run([built.path])
    assert original.returncode == 0
    assert original.stdout == "child sink=124\nparent sink=2058\n"
    probed = tmp_path / "forks.probed"
    rewrite(built.path, probed, "*")
    disarmed = run([probed])
    assert (disarmed.returncode, disarmed.stdout) == (0, original.stdout)
    st = stat([probed], tmp_path)
    assert st.proc.returncode == 0
    assert st.proc.stdout == original.stdout
    assert st.report["processes"] == 2
    assert st.hits("tick") == 3 + 7 + 11
    assert st.hits("child_only") == 1
    assert st.hits("parent_only") == 2
    assert st.hits("main") == 1


def test_fork_gives_each_process_its_own_region(builder, tmp_path):
    built = builder.build("forks", ["forks.c"], ["-O2"], ["-pie"])
    probed = tmp_path / "forks.probed"
    rewrite(built.path, probed, "tick", "child_only", "parent_only")
    regions = tmp_path / "regions"
    regions.mkdir()
    proc = run([probed], env={ENV_VAR: str(regions)})
    assert proc.returncode == 0
    from urewrite.trampolines.region import read_regions
    found = read_regions(str(regions))
    assert len(found) == 2 and len({r.pid for r in found}) == 2
    per_pid = sorted(({p.name: p.hits for p in r.probes} for r in found),
                     key=lambda h: h["parent_only"])
    child, parent = per_pid
    assert child == {"tick": 7, "child_only": 1, "parent_only": 0}
    assert parent == {"tick": 3 + 11, "child_only": 0, "parent_only": 2}


def test_exec_of_itself(builder, tmp_path):
    built = builder.build("reexec", ["reexec.c"], ["-O2"], ["-pie"])
    original = run([built.path])
    assert original.returncode == 4
    probed = tmp_path / "reexec.probed"
    rewrite(built.path, probed, "hop", "main")
    st = stat([probed], tmp_path)
    assert st.proc.returncode == 4
    assert st.proc.stdout == original.stdout
    assert st.hits("hop") == 5
    assert st.hits("main") == 2
    # the second image has the same pid: its region gets a name of its own
    regions = tmp_path / "regions"
    regions.mkdir()
    assert run([probed], env={ENV_VAR: str(regions)}).returncode == 4
    names = sorted(os.listdir(regions))
    assert len(names) == 2, names
    assert any(n.endswith("-1.ure") for n in names)


# -- shared libraries ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def uselib(builder):
    lib = builder.build("libdemo.so", ["libdemo.c"], ["-O2", "-fPIC"], ["-Wl,-soname,libdemo.so"],
                        shared=True, subdir="proc-lib")
    prog = builder.build("uselib", ["uselib.c"], ["-O2"], [f"-L{lib.dir}", "-ldemo"],
                         subdir="proc-uselib")
    original = run([prog.path], env={"LD_LIBRARY_PATH": str(lib.dir)})
    assert original.returncode == USELIB_EXIT
    return lib, prog, original


def _probe_both(lib, prog, tmp_path):
    libdir = tmp_path / "lib"
    libdir.mkdir()
    rewrite(lib.path, libdir / "libdemo.so", "*")
    program = tmp_path / "uselib"
    rewrite(prog.path, program, "*")
    return libdir, program


def test_library_found_by_soname_in_another_directory(uselib, tmp_path):
    lib, prog, original = uselib
    libdir = tmp_path / "lib"
    libdir.mkdir()
    rewrite(lib.path, libdir / "libdemo.so", "demo_*")
    env = {"LD_LIBRARY_PATH": str(libdir)}
    ldd = check(["ldd", prog.path], env=env).stdout
    assert f"{libdir}/libdemo.so" in ldd
    disarmed = run([prog.path], env=env)
    assert (disarmed.returncode, disarmed.stdout) == (USELIB_EXIT, original.stdout)
    st = stat([prog.path], tmp_path, env=env)
    assert st.proc.returncode == USELIB_EXIT
    assert st.proc.stdout == original.stdout
    assert {p["object"] for p in st.probes} == {"libdemo.so"}
    assert {n: st.hits(n) for n in LIBDEMO_EXPECTED} == LIBDEMO_EXPECTED


def test_program_and_library_rewritten_together(uselib, tmp_path):
    lib, prog, original = uselib
    libdir, program = _probe_both(lib, prog, tmp_path)
    env = {"LD_LIBRARY_PATH": str(libdir)}
    disarmed = run([program], env=env)
    assert (disarmed.returncode, disarmed.stdout) == (USELIB_EXIT, original.stdout)
    st = stat([program], tmp_path, env=env)
    assert st.proc.returncode == USELIB_EXIT
    assert st.proc.stdout == original.stdout
    assert {p["object"] for p in st.probes} == {"libdemo.so", "uselib"}
    assert {n: st.hits(n, "libdemo.so") for n in LIBDEMO_EXPECTED} == LIBDEMO_EXPECTED
    assert {n: st.hits(n, "uselib") for n in USELIB_EXPECTED} == USELIB_EXPECTED
    # one region per object
    regions = tmp_path / "regions"
    regions.mkdir()
    assert run([program], env={**env, ENV_VAR: str(regions)}).returncode == USELIB_EXIT
    from urewrite.trampolines.region import read_regions
    found = read_regions(str(regions))
    assert sorted(r.object for r in found) == ["libdemo.so", "uselib"]
    assert len({r.pid for r in found}) == 1


def test_processes_counts_processes_not_objects(uselib, tmp_path):
    lib, prog, _ = uselib
    libdir, program = _probe_both(lib, prog, tmp_path)
    st = stat([program], tmp_path, env={"LD_LIBRARY_PATH": str(libdir)})
    assert st.report["processes"] == 1


def test_library_counts_equal_uprobe_oracle(uselib, uprobes, tmp_path):
    lib, prog, original = uselib
    libdir = tmp_path / "lib"
    libdir.mkdir()
    rewrite(lib.path, libdir / "libdemo.so", "*")
    st = stat([prog.path], tmp_path, env={"LD_LIBRARY_PATH": str(libdir)})
    addresses = lib.own_functions
    oracle = uprobes.count(lib.path, addresses,
                           lambda: run([prog.path], env={"LD_LIBRARY_PATH": str(lib.dir)}))
    hits = st.by_address("libdemo.so")
    assert {n: hits[a] for n, a in addresses.items()} == oracle


def test_dlopen_of_a_rewritten_library(builder, tmp_path):
    """A library loaded with dlopen() sets up its probes from DT_INIT too."""
    lib = builder.build("libdemo.so", ["libdemo.c"], ["-O2", "-fPIC"], ["-Wl,-soname,libdemo.so"],
                        shared=True, subdir="proc-lib")
    src = tmp_path / "dl.c"
    src.write_text(
        '#include <dlfcn.h>\n#include <stdio.h>\n'
        'int main(int argc, char **argv) {\n'
        '  void *h = dlopen(argv[1], RTLD_NOW); if (!h) { puts(dlerror()); return 1; }\n'
        '  int (*fib)(int) = (int (*)(int))dlsym(h, "demo_fib");\n'
        '  printf("%d\\n", fib(10)); dlclose(h); return 0; }\n')
    exe = tmp_path / "dl"
    check(["gcc", "-O2", str(src), "-o", str(exe), "-ldl"])
    probed = tmp_path / "libdemo.so"
    rewrite(lib.path, probed, "demo_fib")
    assert run([exe, lib.path]).stdout == "55\n"
    st = stat([exe, probed], tmp_path)
    assert st.proc.returncode == 0 and st.proc.stdout == "55\n"
    assert st.hits("demo_fib") == 177  # 2 * F(11) - 1


@pytest.mark.parametrize("link", ["pie", "static"])
def test_a_thread_in_an_exited_threads_control_block_is_named_by_its_own_id(
        builder, tmp_path, link):
    """glibc starts a thread in the stack and thread control block of one joined before
    it, and so in that thread's owner entry: events and a program's `tid` still name
    each thread by its own id (the entry's id is checked against the word libc keeps
    the thread's id in, which it sets for each new thread)."""
    import re
    built = builder.build("reused_threads", ["reused_threads.c"], ["-O2", "-pthread"],
                          ["-pthread", f"-{link}"])
    probed = tmp_path / "reused_threads.probed"
    rewrite(built.path, probed, "work")
    events = tmp_path / "events.jsonl"
    traced = urewrite("trace", "--json", "-o", events, "--", probed)
    assert traced.returncode == 0, traced.stderr
    tids = [int(line.split()[1]) for line in traced.stdout.splitlines()]
    assert len(set(tids)) == 4
    seen = [json.loads(line)["tid"] for line in events.read_text().splitlines() if line.strip()]
    assert seen == [tid for tid in tids for _ in range(3)]  # (CALLS in the sample)
    program = f"uprobe:{probed}:work {{ @[tid] = count(); }}"
    ran = urewrite("run", "-e", program, "--", probed)
    assert ran.returncode == 0, ran.stderr
    tids = [int(m.group(1)) for m in re.finditer(r"^thread (\d+)$", ran.stdout, re.M)]
    keys = {int(m.group(1)): int(m.group(2))
            for m in re.finditer(r"^@\[(\d+)\]: (\d+)$", ran.stdout, re.M)}
    assert len(tids) == 4 and keys == {tid: 3 for tid in tids}
