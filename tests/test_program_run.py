"""`urewrite run`: the probes run the program, and its maps are the ones bpftrace
builds with kernel uprobes for the same program on the original file."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from conftest import kernel_tracing_alone, running, uprobes_unavailable, urewrite
from probe_programs import MATRIX_PROGRAM, PROGRAM, maps_of, ties_sorted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "samples", "programs", "values.c")
NAMED_THREADS = os.path.join(ROOT, "samples", "named_threads.c")
RENAMED_THREAD = os.path.join(ROOT, "samples", "renamed_thread.c")

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="probe programs run in x86_64 files for now")

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The sample, and its rewrite under the same name (so that comm is the same)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    work = tmp_path_factory.mktemp("run")
    plain = work / "values"
    subprocess.run(["gcc", "-O2", SAMPLE, "-o", str(plain)], check=True)
    (work / "rw").mkdir()
    rewritten = work / "rw" / "values"
    proc = urewrite(str(plain), "-e", PROGRAM.format(path=rewritten), "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    return plain, rewritten


def _bpftrace(program: str, command: str, env=None) -> subprocess.CompletedProcess:
    """bpftrace with kernel uprobes running `program` over `command`; the test skips
    where there is neither."""
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace is not installed")
    why = uprobes_unavailable()
    if why:
        pytest.skip(f"bpftrace needs kernel uprobes: {why}")
    with kernel_tracing_alone():
        return subprocess.run(["bpftrace", "-e", program, "-c", command], capture_output=True,
                              text=True, timeout=120, env=env)





def test_the_probes_run_the_program_as_bpftrace_does(files):
    plain, rewritten = files
    ours = urewrite("run", "-e", PROGRAM.format(path=rewritten), "--", str(rewritten), "1000")
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.startswith("0\n")  # the command's own output, left alone
    theirs = _bpftrace(PROGRAM.format(path=plain), f"{plain} 1000")
    assert theirs.returncode == 0, theirs.stderr
    assert ties_sorted(maps_of(ours.stdout)) == ties_sorted(maps_of(theirs.stdout))
    printed = ours.stdout.split("\n\n\n", 1)[0].splitlines()
    assert sorted(printed) == sorted(theirs.stdout.split("\n\n\n", 1)[0].splitlines()[1:])
    assert "at 300: 12 values B" in printed and len(printed) == 11  # 10 printf()s, the output
    assert "@took: 1000" in ours.stdout and "@c[3]: 141" in ours.stdout


def test_json_begin_end_and_the_exit_status(files, tmp_path):
    _, rewritten = files
    report = tmp_path / "maps.json"
    program = (f'BEGIN {{ printf("start %d\\n", 7); }} '
               f'uprobe:{rewritten}:work {{ @n = count(); @k[arg1] = sum(arg0); }} '
               f'END {{ printf("calls %d\\n", @n); }}')
    proc = urewrite("run", "--json", "-o", str(report), "-e", program, "--", "sh", "-c",
                    f"{rewritten} 70 >/dev/null; exit 3")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "start 7\ncalls 70\n"
    import json
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert lines[0] == {"type": "map", "data": {"@k": {str(k): sum(range(k, 70, 7))
                                                       for k in sorted(range(7), key=lambda k: sum(range(k, 70, 7)))}}}
    assert lines[1] == {"type": "map", "data": {"@n": 70}}


def test_globs_name_each_probe_they_match_and_a_probe_runs_every_block(files):
    """`probe` and `func` under a glob are the matched probe's, as bpftrace has them; a
    function two of the program's probes match (a glob and its name) runs both blocks."""
    plain, _ = files
    short = tempfile.mkdtemp(prefix="urw")  # (a probe's name is a string: 63 bytes at most)
    try:
        out = os.path.join(short, "values")
        proc = urewrite(str(plain), "-p", "w*", "-p", "named", "--args", "1", "-o", out, "-q")
        assert proc.returncode == 0, proc.stderr
        ours = urewrite("run", "-e", f"uprobe:{out}:w*, uprobe:{out}:named {{ @[probe, func] = "
                        f"count(); }} uprobe:{out}:work /arg0 > 4/ {{ @n = count(); }} "
                        f"uprobe:{out}:w* {{ @m = count(); }}", "--", out, "10")
        assert ours.returncode == 0, ours.stderr
        assert ties_sorted(maps_of(ours.stdout)) == ties_sorted(
            f"@[uprobe:{out}:named, named]: 10\n@[uprobe:{out}:work, work]: 10\n@m: 10\n@n: 5\n")
        program = "uprobe:{path}:w*, uprobe:{path}:named { @[probe] = count(); }"
        ours = urewrite("run", "-e", program.replace("{path}", out), "--", out, "10")
    finally:
        shutil.rmtree(short)
    theirs = _bpftrace(program.replace("{path}", str(plain)), f"{plain} 10")
    assert theirs.returncode == 0, theirs.stderr
    assert ties_sorted(maps_of(ours.stdout).replace(out, "PATH")) == \
        ties_sorted(maps_of(theirs.stdout).replace(str(plain), "PATH"))


def test_a_probe_the_file_lacks_is_named_with_the_rewrite_that_adds_it(files):
    plain, rewritten = files
    proc = urewrite("run", "-e", f"uprobe:{rewritten}:named, uretprobe:{rewritten}:main "
                                 f"{{ @ = count(); }}", "--", str(rewritten), "5")
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1
    assert f"{rewritten} was not rewritten with uprobe:{rewritten}:named, uretprobe:{rewritten}:main" \
        in proc.stderr
    assert "urewrite ORIGINAL -p 'named' -r 'main' ... -o" in proc.stderr
    proc = urewrite("run", "-e", f"uprobe:{plain}:work {{ @ = count(); }}", "--", str(plain), "5")
    assert proc.returncode == 1 and "is not rewritten by urewrite" in proc.stderr
    proc = urewrite("run", "-e", "uprobe:./nowhere:work { @ = count(); }", "--", str(plain), "5")
    assert proc.returncode == 1 and "no file ./nowhere" in proc.stderr


def test_loaded_into_a_running_process_and_unloaded(files):
    _, rewritten = files
    with running([str(rewritten), "4000000000"], stdout=subprocess.DEVNULL) as process:
        import time
        time.sleep(0.3)  # (its runtime started)
        program = f"uprobe:{rewritten}:work {{ @n = count(); @parity[arg0 % 2] = count(); }}"
        proc = urewrite("run", "-e", program, "-p", str(process.pid), "--duration", "0.5")
        assert proc.returncode == 0, proc.stderr
        assert f"armed pid {process.pid}" in proc.stderr
        counts = dict(line.split(": ") for line in proc.stdout.strip().splitlines())
        total = int(counts["@n"])
        assert total > 1000 and int(counts["@parity[0]"]) + int(counts["@parity[1]"]) == total
        # unloaded: the process runs on, and another tracer counts it as usual
        assert process.poll() is None
        stat = urewrite("stat", "-p", str(process.pid), "--duration", "0.3")
        assert stat.returncode == 0, stat.stderr
        work = [line for line in stat.stdout.splitlines() if " work " in line and "entry" in line]
        assert work and int(work[0].split()[-1]) > 1000


def _program_mappings(pid: int, path) -> tuple:
    """(the lowest address `path` is mapped at in process `pid`, [(start, end) of each
    mapping of a probe program's code])."""
    lowest, programs = None, []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            name = fields[5].strip().removesuffix(" (deleted)") if len(fields) > 5 else ""
            if name == str(path):
                lowest = start if lowest is None else min(lowest, start)
            elif name.endswith(".program"):  # (the tracer removes its files at the end)
                programs.append((start, end))
    return lowest, programs


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """samples/programs/served.c, built: a threaded process driven by lines on stdin."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    plain = tmp_path_factory.mktemp("served") / "served"
    subprocess.run(["gcc", "-O2", "-pthread", os.path.join(ROOT, "samples", "programs",
                                                             "served.c"), "-o", str(plain)],
                   check=True)
    return plain


def test_programs_loaded_replaced_and_unloaded_in_a_running_threaded_process(served, tmp_path):
    """One program, then another, each loaded into the same running process (four and
    three threads calling) and unloaded: each one's maps hold exactly the calls made
    while it was loaded; the process never restarts, and calls between the windows
    are in no program's maps."""
    from live_service import LineReader
    plain = served
    rewritten = tmp_path / "served.probed"
    proc = urewrite(str(plain), "-p", "work", "--args", "2", "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    with running([str(rewritten)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 text=True) as process:
        lines = LineReader(process.stdout)

        def send(command):
            process.stdin.write(command + "\n")
            process.stdin.flush()
            assert lines.next_line() == f"ok {command}"

        def loaded(program, commands):
            tracer = subprocess.Popen([sys.executable, "-m", "urewrite", "run", "-e", program,
                                       "-p", str(process.pid)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
            try:
                errors = LineReader(tracer.stderr)
                while f"armed pid {process.pid}" not in errors.next_line():
                    pass
                for command in commands:
                    send(command)
            finally:
                tracer.send_signal(signal.SIGINT)
                out, rest = tracer.communicate(timeout=60)
            assert tracer.returncode == 0, rest
            placed.append(_program_mappings(process.pid, rewritten))
            return dict(line.split(": ") for line in out.strip().splitlines())

        placed = []

        assert lines.next_line() == "ready"
        send("calls 2 1000")  # before any program
        first = loaded(f"uprobe:{rewritten}:work {{ @n = count(); @t[arg1] = count(); }}",
                       ["calls 4 5000", "calls 1 7"])
        send("calls 3 1000")  # between the two
        second = loaded(f"uprobe:{rewritten}:work /arg0 % 2 == 0/ {{ @even = count(); "
                        f"@sum = sum(arg0); }}", ["calls 3 2000"])
        send("calls 2 10")
        assert first == {"@n": "20007", "@t[1]": "5000", "@t[2]": "5000", "@t[3]": "5000",
                         "@t[0]": "5007"}
        assert second == {"@even": "3000", "@sum": str(3 * sum(range(0, 2000, 2)))}
        # each program's code just below the executable: the second's first place was
        # the first's (whose mapping stays: a hit may still run it), so one lower
        (lowest, one), (_, two) = placed
        assert len(one) == 1 and len(two) == 2 and one[0] in two, placed
        assert all(end <= lowest and lowest - start <= 1 << 20 for start, end in two), placed
        process.stdin.close()
        assert process.wait(timeout=60) == 0


def test_usdt_arguments_and_addresses_in_a_program(tmp_path):
    """A USDT probe's arguments are its note's; an address probe runs too."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    plain = tmp_path / "trigger"
    subprocess.run(["gcc", "-O2", "-pthread", os.path.join(ROOT, "samples", "trigger.c"), "-o",
                    str(plain)], check=True)
    rewritten = tmp_path / "trigger.probed"
    program = (f"usdt:{rewritten}:trigger:usdt {{ @mod[arg1 % 3] = count(); @sum = sum(arg0); }} "
               f"uprobe:{rewritten}:trigger_last {{ @last = count(); }}")
    proc = urewrite(str(plain), "-e", program, "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    ran = urewrite("run", "-e", program, "--", str(rewritten), "usdt", "3000")
    assert ran.returncode == 0, ran.stderr
    maps = maps_of(ran.stdout)
    # the site passes (i, n - i) for i < n: n - i covers 1..3000
    assert "@mod[0]: 1000\n@mod[1]: 1000\n@mod[2]: 1000\n" in maps
    assert f"@sum: {sum(range(3000))}\n" in maps and "@last: 1\n" in maps


def test_interval_prints_the_maps_as_they_grow(files):
    _, rewritten = files
    program = f"uprobe:{rewritten}:work {{ @n = count(); }}"
    proc = urewrite("run", "--interval", "0.2", "-e", program, "--", "sh", "-c",
                    f"{rewritten} 10 >/dev/null; sleep 0.7; {rewritten} 5 >/dev/null; sleep 0.5")
    assert proc.returncode == 0, proc.stderr
    shown = [line for line in proc.stdout.splitlines() if line.startswith("@n")]
    assert shown[-1] == "@n: 15" and "@n: 10" in shown[:-1] and len(shown) >= 4
    assert shown == sorted(shown, key=lambda line: int(line.split()[1]))


def test_a_full_map_and_bad_reads_are_reported(files):
    _, rewritten = files
    program = (f"uprobe:{rewritten}:work {{ @k[arg0] = count(); @n = count(); "
               f"@bad = sum(*(uint32 *)arg1); }}")
    proc = urewrite("run", "--map-size", "100", "-e", program, "--", str(rewritten), "300")
    assert proc.returncode == 0, proc.stderr
    assert "@n: 300" in proc.stdout and proc.stdout.count("@k[") == 128
    assert proc.stderr.splitlines() == [
        "urewrite: 172 map updates were dropped: a map with keys holds 128 entries (--map-size N)",
        'urewrite: 300 memory reads found nothing to read (str() or a pointer read of a bad '
        'address): they gave "" or 0']


# build -> (compiler and flags, the arguments of the run); "shared" puts work and named
# in a shared object, which the probes name
MATRIX = {
    "O0": (["gcc", "-O0"], ["3000"]),
    "O3-static": (["gcc", "-O3", "-static", "-pthread"], ["3000"]),
    "shared": (["gcc", "-O2"], ["3000"]),
    "threads": (["gcc", "-O2", "-pthread"], ["3000", "4"]),
    "cxx": (["g++", "-x", "c++", "-O2", "-pthread"], ["3000", "3"]),
}


def _matrix_build(work, name: str):
    """(the command, the probed file, the rewrite's program) for a build of the sample:
    the original in work/plain, the rewrite in work/rw under the same name."""
    compiler, args = MATRIX[name]
    if shutil.which(compiler[0]) is None:
        pytest.skip(f"{compiler[0]} is not installed")
    plain, rw = work / "plain", work / "rw"
    plain.mkdir()
    rw.mkdir()
    if name == "shared":
        subprocess.run(compiler + ["-fPIC", "-shared", "-DVALUES_LIBRARY", SAMPLE, "-o",
                                   str(plain / "libvalues.so")], check=True)
        subprocess.run(compiler + ["-DVALUES_MAIN", SAMPLE, "-L", str(plain), "-lvalues",
                                   "-o", str(plain / "values")], check=True)
        target = "libvalues.so"
    else:
        subprocess.run(compiler + [SAMPLE, "-o", str(plain / "values")], check=True)
        target = "values"
    names = {"work": '"work(long, long)"', "named": '"named(char const*, long)"'} \
        if name == "cxx" else {"work": "work", "named": "named"}
    proc = urewrite(str(plain / target), "-e", MATRIX_PROGRAM.format(path=rw / target, **names),
                    "-o", str(rw / target), "-q")
    assert proc.returncode == 0, proc.stderr
    program = {where: MATRIX_PROGRAM.format(path=where / target, **names)
               for where in (plain, rw)}
    return plain, rw, target, args, program


@pytest.mark.parametrize("name", list(MATRIX))
def test_builds_and_threads_give_the_maps_bpftrace_gives(tmp_path, name):
    """-O0, -O3 static, a shared object, four threads, C++ names: the same maps as
    bpftrace with kernel uprobes on the original, loaded by `run` and built in (under
    `stat`: named()'s block is then called by its trampoline itself)."""
    plain, rw, target, args, program = _matrix_build(tmp_path, name)
    shared = target != "values"
    command = [str((plain if shared else rw) / "values"), *args]
    env = dict(os.environ, LD_LIBRARY_PATH=str(rw)) if shared else None
    ours = urewrite("run", "-e", program[rw], "--", *command, env=env)
    assert ours.returncode == 0, ours.stderr
    assert f"@took: {args[0]}" in ours.stdout, ours.stdout
    built_in = urewrite("stat", "--", *command, env=env)
    assert built_in.returncode == 0, built_in.stderr
    theirs = _bpftrace(program[plain], " ".join([str(plain / "values"), *args]),
                       env=dict(os.environ, LD_LIBRARY_PATH=str(plain)) if shared else None)
    assert theirs.returncode == 0, theirs.stderr
    expected = ties_sorted(maps_of(theirs.stdout).strip("\n"))
    assert ties_sorted(maps_of(ours.stdout).strip("\n")) == expected
    assert ties_sorted(built_in.stdout.split("the program built into the probes:", 1)[1]
                       .strip("\n")) == expected


def test_loaded_into_a_region_directory(files, tmp_path):
    """--dir: processes that start with UREWRITE_DIR=DIR while it runs run the program
    (two, one with threads: their calls add up); at the end it is unloaded."""
    import time
    _, rewritten = files
    directory = tmp_path / "regions"
    directory.mkdir()
    program = f"uprobe:{rewritten}:work {{ @n = count(); @k[arg1 % 2] = count(); }}"
    loader = subprocess.Popen(
        [sys.executable, "-m", "urewrite", "run", "-e", program, "--dir", str(directory),
         "--duration", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        waited = time.monotonic() + 30
        while not list(directory.glob("*.program")) and loader.poll() is None and \
                time.monotonic() < waited:
            time.sleep(0.05)
        env = dict(os.environ, UREWRITE_DIR=str(directory))
        for args in (["700"], ["700", "3"]):
            done = subprocess.run([str(rewritten), *args], env=env, capture_output=True)
            assert done.returncode == 0, done.stderr
        out, err = loader.communicate(timeout=60)
    finally:
        loader.kill()
    assert loader.returncode == 0, err
    assert "@n: 1400" in out and "@k[0]: 800" in out and "@k[1]: 600" in out, out
    assert not list(directory.glob("*.program")) and not list(directory.glob("*.maps"))
    proc = urewrite("run", "-e", program, "--dir", str(tmp_path / "none"), "--duration", "1")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "no directory" in proc.stderr
    proc = urewrite("run", "-e", program, "--dir", str(directory), "--", str(rewritten))
    assert proc.returncode == 2 and "--dir goes without a command" in proc.stderr


def _served_built_in(served, tmp_path):
    """served.c rewritten with `@n = count(); @t[arg1] = count();` at work() built in."""
    built = tmp_path / "served.built"
    proc = urewrite(str(served), "-e", "uprobe:served:work { @n = count(); @t[arg1] = count(); }",
                    "-o", str(built), "-q")
    assert proc.returncode == 0, proc.stderr
    return built


def test_stat_of_a_running_process_shows_its_built_in_program(served, tmp_path):
    """`stat -p PID` of a process whose probes have a program built in: armed, the
    program runs, and the report shows its maps for the calls made while armed."""
    from live_service import LineReader
    built = _served_built_in(served, tmp_path)
    with running([str(built)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 text=True) as process:
        lines = LineReader(process.stdout)
        assert lines.next_line() == "ready"
        process.stdin.write("calls 2 500\n")  # before: not armed, not counted
        process.stdin.flush()
        assert lines.next_line() == "ok calls 2 500"
        tracer = subprocess.Popen([sys.executable, "-m", "urewrite", "stat", "-p",
                                   str(process.pid), "--duration", "30"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        errors = LineReader(tracer.stderr)
        while f"armed pid {process.pid}" not in errors.next_line():
            pass
        process.stdin.write("calls 3 1000\n")
        process.stdin.flush()
        assert lines.next_line() == "ok calls 3 1000"
        tracer.send_signal(signal.SIGINT)
        out, rest = tracer.communicate(timeout=60)
        assert tracer.returncode == 0, rest
        assert out.endswith("the program built into the probes:\n\n"
                            "@n: 3000\n@t[0]: 1000\n@t[1]: 1000\n@t[2]: 1000\n"), out


def test_a_tracers_program_takes_the_built_in_ones_place_and_gives_it_back(served, tmp_path):
    """A process whose probes call their built-in program from the trampoline itself
    (x86_64: built_in_call.py): a tracer's program loaded into it (`run -p`) runs in
    its place, with its own maps, exactly (the trampoline sees another run's maps and
    goes the direct table's way); once it is unloaded, `stat -p` arms the process
    again and the built-in program counts the calls made then, exactly."""
    from live_service import LineReader
    built = _served_built_in(served, tmp_path)
    with running([str(built)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 text=True) as process:
        lines = LineReader(process.stdout)
        assert lines.next_line() == "ready"

        def send(command):
            process.stdin.write(command + "\n")
            process.stdin.flush()
            assert lines.next_line() == f"ok {command}"

        def traced(command: list, calls: str) -> str:
            tracer = subprocess.Popen(command + ["-p", str(process.pid)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
            errors = LineReader(tracer.stderr)
            while f"armed pid {process.pid}" not in errors.next_line():
                pass
            send(calls)
            tracer.send_signal(signal.SIGINT)
            out, rest = tracer.communicate(timeout=60)
            assert tracer.returncode == 0, rest
            return out

        out = traced([sys.executable, "-m", "urewrite", "run", "-e",
                      f"uprobe:{built}:work {{ @c = count(); @s = sum(arg1); }}"], "calls 3 2000")
        assert dict(line.split(": ") for line in out.strip().splitlines()) == \
            {"@c": "6000", "@s": str(2000 * (0 + 1 + 2))}
        send("calls 2 100")  # (between: disarmed)
        out = traced([sys.executable, "-m", "urewrite", "stat", "--duration", "30"],
                     "calls 4 500")
        assert out.endswith("the program built into the probes:\n\n@n: 2000\n"
                            "@t[0]: 500\n@t[1]: 500\n@t[2]: 500\n@t[3]: 500\n"), out
        process.stdin.close()
        assert process.wait(timeout=60) == 0


def test_maps_of_strings_in_the_probes(files, tmp_path):
    """@m[k] = str(...) runs in the probes (bpftrace 0.17's str() reads nothing here,
    so the expected maps are values.c's own: the last word of each class of i)."""
    plain, _ = files
    rewritten = tmp_path / "values"
    program = (f"uprobe:{rewritten}:named {{ @last[arg1 % 3] = str(arg0); "
               f"@first[str(arg0)] = @last[(arg1 + 1) % 3]; }}")
    proc = urewrite(str(plain), "-e", program, "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    ours = urewrite("run", "-e", program, "--", str(rewritten), "300")
    assert ours.returncode == 0, ours.stderr
    # (@first: named(words[i % 3], i) stores the word of i - 2 under word i's, "" first)
    assert maps_of(ours.stdout) == ("@first[alpha]: beta\n@first[beta]: gamma\n"
                                  "@first[gamma]: alpha\n@last[0]: alpha\n@last[1]: beta\n"
                                  "@last[2]: gamma\n")


SLOW_C = """
#include <stdio.h>
#include <unistd.h>
__attribute__((noinline)) long work(long i) { return i * 2; }
int main(void) {
    long s = 0;
    for (long i = 0; i < 20; i++) { s += work(i); usleep(500000); }
    printf("done %ld\\n", s);
    return 0;
}
"""


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """SLOW_C built and rewritten with an entry probe on work (its argument recorded)."""
    work = tmp_path_factory.mktemp("slow")
    source, plain, probed = work / "slow.c", work / "slow", work / "slow.probed"
    source.write_text(SLOW_C)
    subprocess.run(["gcc", "-O2", str(source), "-o", str(plain)], check=True)
    proc = urewrite(str(plain), "-p", "work", "--args", "1", "-o", str(probed), "-q")
    assert proc.returncode == 0, proc.stderr
    return probed


def test_exit_ends_the_run(slow):
    """exit() in a probe, as bpftrace's -c: the command gets SIGTERM, END runs, the
    maps are printed, the status is 0; the hits before it counted, none after
    (the command waits half a second between calls)."""
    import time
    probed = slow
    program = (f"uprobe:{probed}:work /arg0 == 2/ {{ @b = count(); exit(); @a = count(); }} "
               f"uprobe:{probed}:work {{ @all = count(); }} END {{ printf(\"end\\n\"); }}")
    started = time.monotonic()
    ours = urewrite("run", "-e", program, "--", str(probed))
    assert time.monotonic() - started < 6  # (the command alone: 10 s)
    assert ours.returncode == 0, ours.stderr
    assert "done" not in ours.stdout and ours.stdout.startswith("end\n"), ours.stdout
    assert "@all: 3\n" in ours.stdout and "@b: 1\n" in ours.stdout and "@a: 0\n" in ours.stdout


def test_print_clear_and_zero_in_the_probes(slow):
    """print(@m), clear(@m) and zero(@m) in a probe: the tracer does them when it reads
    their event, as bpftrace's user space does (the command waits half a second
    between calls: each is done before the next call)."""
    probed = slow
    program = (f"uprobe:{probed}:work {{ @c = count(); @k[arg0 % 2] = count(); "
               f"if (arg0 == 3) {{ print(@k); clear(@k); zero(@c); }} "
               f"if (arg0 == 6) {{ print(@c); exit(); }} }}")
    ours = urewrite("run", "-e", program, "--", str(probed))
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == ("@k[0]: 2\n@k[1]: 2\n@c: 3\n\n\n@c: 3\n@k[1]: 1\n@k[0]: 2\n"), \
        ours.stdout


PRINT_PROGRAM = """
uprobe:{path}:work {{ @s[arg1] = sum(arg0); @h[arg0 * arg0 / 200000] = hist(arg0);
    @l[arg0 * arg0 / 200000] = lhist(arg0, 0, 1000, 100); @a[arg0 * arg0 / 200000] = avg(arg0);
    @m[arg1] = max(arg0); @n = count(); if (arg0 == 999) {{ print(@s, 3, 10); }} }}
END {{ print(@s, 2); print(@h, 2, 10); print(@l, 2, 3); print(@a, 3, 7); print(@m, 0, 0);
    print(@n, 1, 3); clear(@s); clear(@h); clear(@l); clear(@a); clear(@m); clear(@n); }}
"""


def test_print_with_top_and_div_prints_what_bpftrace_prints(files):
    """print(@m, top, div) in a probe and in END, on every kind of map (keys of
    distinct values: bpftrace leaves ties in its hash table's order), then the maps
    cleared (an empty avg() map's two blank lines): the same text as bpftrace's."""
    plain, rewritten = files
    ours = urewrite("run", "-e", PRINT_PROGRAM.format(path=rewritten), "--", str(rewritten),
                    "1000")
    assert ours.returncode == 0, ours.stderr
    theirs = _bpftrace(PRINT_PROGRAM.format(path=plain), f"{plain} 1000")
    assert theirs.returncode == 0, theirs.stderr
    assert theirs.stdout.startswith("Attaching")

    def printed(text):  # (the command's own line, "0": before or after the probe's print())
        lines = text.split("\n")
        lines.remove("0")
        return lines
    assert printed(ours.stdout) == printed(theirs.stdout.split("\n", 1)[1])
    assert "@s[4]: 7164\n" in ours.stdout and "@n: 333\n" in ours.stdout


def test_comm_follows_a_thread_that_renames_itself(tmp_path):
    """A thread that ran the program under one name, then renamed itself, is counted
    under its new name after that, as bpftrace counts it (the tracer clears a learnt
    name the kernel no longer gives: reader/thread_names.py)."""
    plain = tmp_path / "renamed_thread"
    subprocess.run(["gcc", "-O2", "-pthread", RENAMED_THREAD, "-o", str(plain)], check=True)
    rewritten = tmp_path / "renamed_thread.probed"
    proc = urewrite(str(plain), "-p", "work", "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    program = "uprobe:PATH:work { @[comm] = count(); }"
    ours = urewrite("run", "-e", program.replace("PATH", str(rewritten)), "--", str(rewritten))
    assert ours.returncode == 0, ours.stderr
    names = {line for line in ours.stdout.splitlines() if line.startswith("@[")}
    assert names == {"@[before]: 3", "@[after-rename]: 5"}
    # built into the rewrite, under stat (no tracer of its own): the same
    built = tmp_path / "renamed_thread.built"
    proc = urewrite(str(plain), "-e", program.replace("PATH", built.name), "-o", str(built), "-q")
    assert proc.returncode == 0, proc.stderr
    stat = urewrite("stat", "--", str(built))
    assert stat.returncode == 0, stat.stderr
    assert names == {line for line in stat.stdout.splitlines() if line.startswith("@[")}
    # the region of a process that has exited is looked at once, then left alone
    from urewrite.reader.thread_names import forget_renamed
    (tmp_path / "regions").mkdir()
    subprocess.run([str(rewritten)], check=True,
                   env={**os.environ, "UREWRITE_DIR": str(tmp_path / "regions")})
    gone = set()
    assert forget_renamed([str(tmp_path / "regions")], gone) == 0
    assert len(gone) == 1 and next(iter(gone)).startswith(str(tmp_path / "regions"))
    theirs = _bpftrace(program.replace("PATH", str(plain)), str(plain))
    assert theirs.returncode == 0, theirs.stderr
    assert names == {line for line in theirs.stdout.splitlines() if line.startswith("@[")}


def test_comm_is_each_threads_own_name(tmp_path):
    """`comm` is the thread's own name, as bpftrace gives it: threads named by
    pthread_setname_np, one started in an exited thread's TCB (so in its owner entry)."""
    plain = tmp_path / "named_threads"
    subprocess.run(["gcc", "-O2", "-pthread", NAMED_THREADS, "-o", str(plain)], check=True)
    (tmp_path / "rw").mkdir()
    rewritten = tmp_path / "rw" / "named_threads"  # (the same name: the same comm for main)
    proc = urewrite(str(plain), "-p", "work", "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    program = "uprobe:PATH:work { @[comm] = count(); @calls[comm, tid] = count(); }"
    ours = urewrite("run", "-e", program.replace("PATH", str(rewritten)), "--",
                    str(rewritten), "late")
    assert ours.returncode == 0, ours.stderr
    names = {line for line in ours.stdout.splitlines() if line.startswith("@[")}
    assert names == {"@[worker-0]: 3", "@[worker-1]: 4", "@[worker-2]: 5", "@[worker-7]: 10"}
    theirs = _bpftrace(program.replace("PATH", str(plain)), f"{plain} late")
    assert theirs.returncode == 0, theirs.stderr
    assert names == {line for line in theirs.stdout.splitlines() if line.startswith("@[")}
    # a thread per (comm, tid) key: each worker's own id, none shared
    keys = {line for line in ours.stdout.splitlines() if line.startswith("@calls[")}
    threads = [line.split() for line in ours.stdout.splitlines() if line.startswith("thread ")]
    assert keys == {f"@calls[{name}, {tid}]: {int(name[-1]) + 3}" for _, name, tid in threads}
    assert len(keys) == 4 and len({k.split(",")[1] for k in keys}) == 4  # (worker-7's
    # thread control block was one of the others': its id is its own all the same)
