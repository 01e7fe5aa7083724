"""`urewrite bench`: its plumbing, with tiny iteration counts (never its figures).

Kernel rows run only as root with tracefs; the redis script only when Debian's
redis-server and redis-benchmark are installed. Every test checks that what the
bench made in tracefs is gone afterwards, and that events of others are not.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time

import pytest

import cross
from conftest import check, kernel_tracing_alone, run, running
from urewrite import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACEFS = "/sys/kernel/tracing"
EVENTS = os.path.join(TRACEFS, "uprobe_events")
TINY = ["--iterations", "20000", "--repeat", "1"]

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def urewrite(*args, timeout=300):
    return run([sys.executable, "-m", "urewrite", *args], timeout=timeout)


def bench_json(*args) -> dict:
    proc = urewrite("bench", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


def tracefs_unusable():
    if os.geteuid() != 0:
        return "needs root"
    try:
        os.close(os.open(EVENTS, os.O_WRONLY | os.O_APPEND))
    except OSError as e:
        return f"{EVENTS}: {e.strerror}"
    return None


needs_tracefs = pytest.mark.skipif(tracefs_unusable() is not None,
                                   reason=f"kernel rows: {tracefs_unusable()}")


@pytest.fixture
def tracing_alone():
    """The bench's kernel rows add uprobes and a tracing instance: not beside another
    worker's uprobes (conftest.kernel_tracing_alone). Only the tests that touch the
    kernel's tracing take it: the others would wait for another worker's turn."""
    with kernel_tracing_alone():
        yield


def event_lines(group: str):
    with open(EVENTS) as f:
        return [line.strip() for line in f if f":{group}/" in line]


def instances():
    path = os.path.join(TRACEFS, "instances")
    return set(os.listdir(path)) if os.path.isdir(path) else set()


@pytest.fixture
def foreign_event(tracing_alone):
    """An event of someone else's (a group the bench does not own), left disabled."""
    group = f"urwforeign_{os.getpid()}"
    target = os.path.realpath(sys.executable)
    bench.tracefs_write(EVENTS, f"p:{group}/other {target}:0x0\n")
    try:
        yield group
    finally:
        bench.tracefs_write(EVENTS, f"-:{group}/other\n")


# -- the target ------------------------------------------------------------------------

def test_trigger_source_is_shipped_and_is_the_sample():
    assert os.path.isfile(bench.TRIGGER_SOURCE)
    sample = os.path.join(ROOT, "samples", "trigger.c")
    with open(sample) as a, open(bench.TRIGGER_SOURCE) as b:
        assert a.read() == b.read()
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert "share/bench/*.c" in f.read()


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump")
def test_trigger_functions_start_as_the_kernel_bench_does(tmp_path):
    plain = bench.build_target(str(tmp_path))
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", plain], capture_output=True,
                          text=True, check=True).stdout
    bodies = {}
    for name in ("trigger_nop", "trigger_push", "trigger_ret"):
        block = dump.split(f"<{name}>:\n", 1)[1].split("\n\n", 1)[0]
        bodies[name] = [line.split("\t")[-1].split()[0] for line in block.splitlines()
                        if "\t" in line]
    assert bodies["trigger_nop"][:2] == ["nop", "ret"]
    assert bodies["trigger_push"][0] == "push" and "%rbp" in dump.split("<trigger_push>:")[1][:80]
    assert bodies["trigger_ret"][0] == "ret"
    for body in bodies.values():  # alignment padding follows each
        tail = body[body.index("ret") + 1:]
        assert tail and all(m in ("nop", "nopw", "nopl", "data16", "cs", "xchg") for m in tail)
    for args, threads in ((["nop", "1000"], 1), (["usdt", "1000", "3"], 3)):
        out = subprocess.run([plain, *args], capture_output=True, text=True, check=True).stdout
        assert float(out) > 0


@pytest.mark.parametrize("config, text", [("urewrite run", "\n"), ("urewrite stat", ""),
                                          ("bpftrace", "Attaching 71 probes...\n")])
def test_a_postgres_report_that_is_not_json_is_one_line(tmp_path, config, text):
    """A tracer's report the bench cannot read (a program that counted nothing prints
    no map; bpftrace's text) ends the bench with one line, not a traceback."""
    from urewrite.bench.common import BenchError
    from urewrite.bench.postgres import _hits
    report = tmp_path / "report.out"
    report.write_text(text)
    with pytest.raises(BenchError, match=f"postgres under {config}: its report"):
        _hits(config, str(report))


def test_thread_lists():
    assert bench.parse_threads("2,1,2") == [1, 2]
    for bad in ("", "0", "a,b", "1,-2"):
        with pytest.raises(ValueError):
            bench.parse_threads(bad)
    proc = urewrite("bench", "--threads", "x")
    assert proc.returncode == 2 and "--threads" in proc.stderr


# -- the trigger bench ---------------------------------------------------------------------

def test_table_without_kernel_rows():
    proc = urewrite("bench", *TINY, "--no-kernel")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("machine: ")
    # (the interpreter that ran it: its builds differ by a fifth on big files)
    assert f"; Python {platform.python_version()} ({sys.executable})" in out.splitlines()[0]
    for row in ("usermode-nop", "usermode-usdt", "urewrite entry-push", "urewrite return-ret",
                "urewrite entry+return-nop", "urewrite usdt"):
        assert f"\n{row} " in out, row
    assert "kernel uprobe rows: skipped: --no-kernel" in out
    assert "BPF (bpftrace) rows: skipped: --no-kernel" in out
    assert "scaling:" not in out  # one thread count: no scaling table
    assert "targets:" in out


def test_json_schema_and_scaling_rows():
    data = bench_json(*TINY[:2], "--repeat", "2", "--no-kernel", "--threads", "1,2")
    assert set(data) >= {"machine", "trigger", "targets"}
    assert set(data["machine"]) >= {"cpu", "cores", "kernel", "date", "loadavg", "python",
                                    "python_executable"}
    t = data["trigger"]
    assert t["threads"] == [1, 2] and t["repeat"] == 2 and t["iterations"] == 20000
    assert t["event_group"] is None and t["kernel_skipped"] == "--no-kernel"
    names = {r["name"] for r in t["rows"]}
    assert {"usermode-push", "uprobe-ret", "uretprobe-nop", "uprobe-usdt", "bpf uprobe-nop",
            "urewrite entry-nop", "urewrite return-push", "urewrite entry+return-ret",
            "urewrite usdt"} <= names
    for r in t["rows"]:
        assert set(r) >= {"name", "tool", "kind", "trigger", "threads", "iterations", "runs_ns",
                          "ns_per_hit", "min_ns", "max_ns", "mhits_per_s", "added_ns",
                          "speedup_vs_kernel", "speedup_vs_bpf", "skipped"}
        assert r["threads"] in (1, 2)
        if r["tool"] in ("kernel", "bpftrace"):
            assert r["skipped"] == "--no-kernel" and r["ns_per_hit"] is None
            continue
        assert r["skipped"] is None and len(r["runs_ns"]) == 2
        assert r["min_ns"] <= r["ns_per_hit"] <= r["max_ns"]
        assert r["mhits_per_s"] == pytest.approx(1e3 / r["ns_per_hit"])
        assert r["speedup_vs_kernel"] is None
        if r["tool"] == "usermode":
            assert r["added_ns"] == 0
    per_threads = {}
    for r in t["rows"]:
        per_threads.setdefault(r["threads"], set()).add(r["name"])
    assert per_threads[1] == per_threads[2]
    for target in data["targets"]:
        assert set(target) == {"target", "value", "unit", "met"}


def test_scaling_table_in_text():
    proc = urewrite("bench", *TINY, "--no-kernel", "--threads", "1,3")
    assert proc.returncode == 0, proc.stderr
    scaling = proc.stdout.split("scaling: ", 1)[1]
    assert "1 thread" in scaling and "3 threads" in scaling
    assert "\nurewrite entry-nop " in scaling


@needs_tracefs
def test_kernel_rows_leave_nothing_behind(foreign_event):
    before_instances = instances()
    data = bench_json(*TINY, "--threads", "1,2")
    t = data["trigger"]
    group = t["event_group"]
    assert group and group.startswith("urwbench_")
    rows = {(r["name"], r["threads"]): r for r in t["rows"]}
    for name in ("uprobe-nop", "uprobe-push", "uprobe-ret", "uretprobe-nop", "uretprobe-push",
                 "uretprobe-ret", "uprobe-usdt"):
        for threads in (1, 2):
            r = rows[(name, threads)]
            assert r["skipped"] is None and r["ns_per_hit"] > 0, r
            assert r["iterations"] == 10000
    for kind in ("entry", "return"):
        assert rows[(f"urewrite {kind}-nop", 1)]["speedup_vs_kernel"] > 0
    if shutil.which("bpftrace"):
        bpf = rows[("bpf uprobe-nop", 1)]
        assert bpf["skipped"] is None or "bpftrace" in bpf["skipped"]
    else:
        assert rows[("bpf uprobe-nop", 1)]["skipped"] == "bpftrace not installed"
    assert event_lines(group) == []
    assert instances() == before_instances
    assert len(event_lines(foreign_event)) == 1  # someone else's: untouched


@needs_tracefs
def test_ctrl_c_removes_the_events(foreign_event):
    env = {k: v for k, v in os.environ.items() if k != "UREWRITE_DIR"}
    with running([sys.executable, "-m", "urewrite", "bench", "--iterations",
                  "2000000", "--repeat", "5"], stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True, env=env) as proc:
        group = f"urwbench_{proc.pid}"
        deadline = time.monotonic() + 120
        while not event_lines(group) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert event_lines(group), "the bench made no uprobe event"
        time.sleep(1.0)  # inside the kernel rows
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert event_lines(group) == [], err
    assert group not in instances(), err  # (err: the cleanup's warning, if it gave up)
    assert len(event_lines(foreign_event)) == 1


@needs_tracefs
def test_event_manager_cleans_up_on_error(tmp_path, foreign_event):
    plain = bench.build_target(str(tmp_path))
    offsets = bench.site_offsets(plain)
    tracefs = bench.find_tracefs()
    with pytest.raises(RuntimeError):
        with bench.KernelEvents(tracefs, group=f"urwbenchtest_{os.getpid()}") as events:
            events.add("a", plain, offsets["nop"])
            events.add("b", plain, offsets["ret"], ret=True)
            events.enable("a")
            assert len(events.leftovers()) == 2
            bench.run_trigger(plain, "nop", 1000)
            assert events.hits("a") == 1000
            raise RuntimeError("boom")
    assert event_lines(events.group) == []
    assert events.group not in instances()
    assert len(event_lines(foreign_event)) == 1


def test_cleanup_tries_again_while_the_kernel_is_busy(monkeypatch):
    """A removal the kernel refuses as busy is tried again until the deadline; one
    that finds nothing left is done; past the deadline, the reason is given."""
    import errno
    from urewrite.bench import kernel
    monkeypatch.setattr(kernel.time, "sleep", lambda s: None)
    tries = []

    def busy_twice():
        tries.append(1)
        if len(tries) < 3:
            raise OSError(errno.EBUSY, "Device or resource busy")
    assert kernel.until_done(busy_twice, time.monotonic() + 60) is None and len(tries) == 3

    def gone():
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")
    assert kernel.until_done(gone, time.monotonic() + 60) is None

    def always_busy():
        tries.append(1)
        raise OSError(errno.EBUSY, "Device or resource busy")
    tries.clear()
    assert kernel.until_done(always_busy, time.monotonic() - 1) == "Device or resource busy"
    assert len(tries) == 1  # (one try at least, even past the deadline)


# -- summaries and formatting -----------------------------------------------------------------

def _row(name, tool, kind, trigger, runs, threads=1):
    return bench.Row(name, tool, kind, trigger, threads, 100, list(runs))


def test_summary_speedups_and_targets():
    rows = [_row("usermode-nop", "usermode", "none", "nop", [2.0, 1.0, 3.0]),
            _row("uprobe-nop", "kernel", "entry", "nop", [1000.0]),
            _row("uretprobe-nop", "kernel", "return", "nop", [1500.0]),
            _row("bpf uprobe-nop", "bpftrace", "entry", "nop", [800.0]),
            _row("urewrite entry-nop", "urewrite", "entry", "nop", [4.0]),
            _row("urewrite return-nop", "urewrite", "return", "nop", [30.0]),
            _row("urewrite entry+return-nop", "urewrite", "entry+return", "nop", [50.0])]
    out = {r["name"]: r for r in bench.summarize(rows)}
    assert out["usermode-nop"]["ns_per_hit"] == 2.0
    assert out["urewrite entry-nop"]["added_ns"] == 2.0
    assert out["urewrite entry-nop"]["speedup_vs_kernel"] == 250.0
    assert out["urewrite entry-nop"]["speedup_vs_bpf"] == 200.0
    assert out["urewrite return-nop"]["speedup_vs_kernel"] == 50.0
    assert out["urewrite entry+return-nop"]["speedup_vs_kernel"] == 30.0  # vs the uretprobe
    assert out["urewrite return-nop"]["speedup_vs_bpf"] is None  # no BPF row for it
    result = {"trigger": {"rows": list(out.values())},
              "rewrite_scaling": {"rows": [{"probes": 1, "seconds": 0.4},
                                           {"probes": 10001, "seconds": 6.0}]},
              "redis": {"urewrite_rps_ratio": 0.985}}
    met = {t["target"]: t["met"] for t in bench.targets(result)}
    assert met["urewrite entry-nop >= 50x kernel uprobe-nop"] is True
    assert met["urewrite entry-nop within 3 ns of usermode-nop"] is True
    assert met["urewrite return-nop >= 50x kernel uretprobe-nop"] is True
    assert met["urewrite return-nop within 3 ns of usermode-nop"] is False
    assert met["rewrite with 1 probe under 0.5 s"] is True
    assert met["rewrite with 10001 probes under 5 s"] is False
    assert met["redis RPS with urewrite probes >= 98% of no probe"] is True


def test_plot(tmp_path):
    out = tmp_path / "bench.png"
    proc = urewrite("bench", *TINY, "--no-kernel", "--plot", out)
    if importlib.util.find_spec("matplotlib") is None:
        assert proc.returncode == 1 and "matplotlib" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- rewrite scaling ------------------------------------------------------------------------

def test_rewrite_scaling_rows():
    data = bench_json("--no-trigger", "--rewrite-scaling", "--functions", "120")
    assert "trigger" not in data
    s = data["rewrite_scaling"]
    assert s["functions"] == 120 and s["file_bytes"] > 0
    assert [r["requested"] for r in s["rows"]] == [1, 10, 100, 120, "*"]
    assert [r["probes"] for r in s["rows"][:4]] == [1, 10, 100, 120]
    assert s["rows"][4]["probes"] >= 120  # '*' probes main and the C runtime's too
    for r in s["rows"]:
        assert r["seconds"] > 0 and r["peak_rss_mib"] > 10
    assert any(t["target"] == "rewrite with 1 probe under 0.5 s" for t in data["targets"])


def test_collection_row():
    """--collection: the generated program's every function probed at entry and return,
    its counts checked (the bench fails on a wrong count), the figures and targets
    there, and the text table shows them."""
    data = bench_json("--no-trigger", "--collection", "--functions", "150")
    c = data["collection"]
    assert c["functions"] == 150 and c["runs"] == 40
    assert c["probes"] >= 300  # (main and the C runtime's functions too)
    assert 0 < c["ms_per_process"] and 0 < c["first_region_ms"] and c["cpu_ms_per_process"] > 0
    assert 0 < c["plain_s"] and 0 < c["armed_s"] and 0 < c["stat_s"]
    assert c["stat_ratio"] == pytest.approx(c["stat_s"] / c["plain_s"])
    targets = {t["target"]: t for t in data["targets"]}
    assert f"a process's counts ({c['probes']:,} probes) collected within 5 ms" in targets
    proc = urewrite("bench", "--no-trigger", "--collection", "--functions", "150")
    assert proc.returncode == 0, proc.stderr
    assert "a process's counts read and added up:" in proc.stdout


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_python_loop_row(tmp_path):
    """--python FILE (#37: python3.11): FILE with every function probed at entry, and at
    entry and return, its loop of short runs (`FILE -S -c pass`) plain, armed and under
    stat, then under stat --latency; the target judges the untimed rows. (A short C
    program stands in for python: it ignores its arguments.)"""
    from urewrite.bench import collection
    source = tmp_path / "short.c"
    source.write_text("__attribute__((noinline)) int one(int x) { return x + 1; }\n"
                      "int main(int argc, char **argv) { (void)argv; return one(argc) - argc - 1; }\n")
    program = str(tmp_path / "short")
    check(["gcc", "-O2", source, "-o", program])
    rows = collection.python_loops(str(tmp_path), program, runs=2, rounds=1)
    assert [r["probes_given"] for r in rows] == ["entries", "entries and returns",
                                                 "entries and returns, --latency"]
    assert [r["latency"] for r in rows] == [False, False, True]
    for row in rows:
        assert row["probes"] >= 2 and row["runs"] == 2  # (one, main and the C runtime's)
        assert row["program"] == program
        assert 0 < row["plain_s"] and 0 < row["armed_s"] and 0 < row["stat_s"]
        assert row["stat_ratio_best"] == pytest.approx(row["stat_s"] / row["plain_s"])
        (ratio,) = row["stat_ratios"]  # (one round: its ratio is the median, and the best's)
        assert row["stat_ratio"] == ratio == pytest.approx(row["stat_ratio_best"])
    c = {"probes": 1, "runs": 2, "ms_per_process": 1, "stat_ratio": 1, "python": rows}
    judged = [t[0] for t in collection.collection_targets(c)]
    assert any("short, every function probed (entries)" in t for t in judged)
    assert any("short, every function probed (entries and returns)" in t for t in judged)
    assert not any("--latency" in t for t in judged)
    table = collection.format_collection_table(
        dict(c, functions=1, cpu_ms_per_process=1, first_region_ms=1, plain_s=1,
             armed_s=1, stat_s=1, stat_ratio_armed=1, stat_ms_per_process=1))
    assert "-S -c pass, every function probed (entries:" in table
    assert "(entries and returns:" in table
    assert "(entries and returns, --latency:" in table and "[not judged]" in table


def test_big_file_rows(builder):
    """--big FILE: list, one probe (main) and every function, each timed, counted and
    judged against the issue's limits; the text table names each step."""
    built = builder.build("counts", ["counts.c"], ["-O2"])
    data = bench_json("--no-trigger", "--big", str(built.path))
    row, = data["big_files"]["rows"]
    assert row["file"] == str(built.path) and row["one_probe_name"] == "main"
    listed = row["list"]["functions"]
    assert listed >= len(built.own_functions)
    assert row["one probe"]["probes"] == 1
    assert listed - 5 <= row["every function"]["probes"] <= listed
    for step in ("list", "one probe", "every function"):
        assert row[step]["seconds"] > 0 and row[step]["peak_rss_mib"] > 10
    judged = [t for t in data["targets"] if t["target"].startswith("counts: ")]
    assert len(judged) == 6 and all(t["met"] in (True, False) for t in judged)
    text = urewrite("bench", "--no-trigger", "--big", str(built.path))
    assert text.returncode == 0, text.stderr
    assert "every function" in text.stdout and "one probe" in text.stdout


# -- redis ---------------------------------------------------------------------------------------

needs_redis = pytest.mark.skipif(bench.redis_unavailable() is not None,
                                 reason=str(bench.redis_unavailable()))


@needs_redis
def test_redis_script(tracing_alone):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "samples", "redis_bench.py"),
                           "--requests", "2000", "--repeat", "1", "--clients", "4", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["functions"] == ["readQueryFromClient", "processCommand", "call"]
    assert set(data["median_rps"]["no probe"]) == {"set", "get"}
    assert data["urewrite_rps_ratio"] > 0
    assert data["median_cpu_us_per_request"]["urewrite"] > 0
    hits = data["counts"]["urewrite"]
    assert hits["processCommand"] == hits["call"] >= 2 * 2000
    assert hits["readQueryFromClient"] >= hits["processCommand"]
    if tracefs_unusable() is None:
        assert data["counts_agree"] is True
        assert data["counts"]["kernel uprobes"] == hits
    else:
        assert data["kernel_skipped"]


@needs_redis
def test_redis_from_the_bench_command():
    data = bench_json("--no-trigger", "--redis", "--redis-requests", "1000", "--repeat", "1",
                      "--no-kernel")
    redis = data["redis"]
    assert redis["kernel_skipped"] == "--no-kernel"
    assert redis["median_rps"]["kernel uprobes"] == {}
    assert redis["median_rps"]["urewrite"]["get"] > 0
    assert "kernel uprobes" not in redis["counts"]


@pytest.mark.parametrize("compiler", ["gcc", cross.CC])
def test_trigger_builds_without_sdt_h_with_the_same_usdt_site(tmp_path, compiler):
    """The README's first command must work without systemtap-sdt-dev: the trigger then
    writes its own note, which reads as sdt.h's does (same probe, argument sizes, values)."""
    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    sample = os.path.join(ROOT, "samples", "trigger.c")
    notes = {}
    for own in (False, True):
        out = str(tmp_path / f"trigger-{own}")
        subprocess.run([compiler, "-O2", "-pthread", sample, "-o", out]
                       + (["-DTRIGGER_OWN_NOTE"] if own else []), check=True)
        listed = json.loads(urewrite("list", "--json", out).stdout)
        notes[own] = [(s["provider"], s["name"], [a.split("@")[0] for a in s["arguments"].split()])
                      for s in listed["usdt"]]
        if compiler == "gcc":  # run it: the values the site passes are the loop's
            probed = out + ".probed"
            assert urewrite(out, "-p", "usdt:trigger:usdt", "-o", probed, "-q").returncode == 0
            traced = urewrite("trace", "--json", "--", probed, "usdt", "3")
            assert traced.returncode == 0, traced.stderr
            events = [json.loads(line) for line in traced.stdout.splitlines() if line.startswith("{")]
            assert [e["args"] for e in events] == [[0, 3], [1, 2], [2, 1]]
    assert notes[True] == notes[False] == [("trigger", "usdt", ["-8", "-8"])]


def test_programs_rows_check_their_maps():
    """bench --programs: every program's row, with its maps checked (a wrong count fails)."""
    result = bench_json("--no-trigger", "--programs", "--no-kernel", "--iterations", "20000",
                        "--repeat", "1")["programs"]
    from urewrite.bench.programs import CALLBACKS, NOT_BUILT_IN, PROGRAMS
    # (each row loaded by run, then each but the string one built into a rewrite)
    loaded = list(PROGRAMS) + list(CALLBACKS)
    rows = loaded + [f"{name}, built in" for name in loaded if name not in NOT_BUILT_IN]
    assert [row["program"] for row in result["programs"]] == rows
    assert all(row["ns"] > 0 and row["bpftrace_ns"] is None for row in result["programs"])
    assert result["unprobed"] > 0 and result["counting"] > 0 and result["clock_read"] > 0
    from urewrite.bench.programs import TARGETS, programs_targets
    judged = programs_targets(result)  # (#34's figures, the idiom's from this run's clock)
    assert [what.split(":")[0] for what, *_ in judged] == \
        [f"probe program {name}" for name in rows if name in TARGETS]
    idioms = [t for t in judged if "latency idiom" in t[0]]  # (loaded, then built in)
    assert len(idioms) == 2 and all(f"({2 * result['clock_read'] + 5:.2f} ns)" in t[0]
                                    for t in idioms)


def test_rows_bpftrace_cannot_run_are_left_to_us_built_in_too():
    """bpftrace reads no floating-point register: those rows, loaded or built in, get
    no bpftrace run (a built-in row once did, and the whole bench failed)."""
    from urewrite.bench.programs import BUILT_IN, NO_BPFTRACE, under_bpftrace
    for row in NO_BPFTRACE:
        assert not under_bpftrace(row) and not under_bpftrace(row + BUILT_IN)
    assert under_bpftrace("predicate false") and under_bpftrace("predicate false" + BUILT_IN)
