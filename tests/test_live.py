"""Arming running processes: `stat -p PID`, `trace -p PID`, `--all FILE` (reader/arming.py).

samples/live_server.c runs without UREWRITE_DIR and does work only when told on its
stdin, so the window a tracer is armed for holds exactly the requests sent in it;
the server's own "done N TOTAL" lines are the accounting the counts must equal.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import SAMPLES, check, clean_env, rewrite
from urewrite.trampolines import live_note
from urewrite.trampolines.region import CLOCK_FILE

TIMEOUT = 120


@pytest.fixture(scope="module")
def programs():
    """A world-readable directory (a process of another user runs from it) with the
    server, its library, and their rewritten copies."""
    d = Path(tempfile.mkdtemp(prefix="urewrite-live-test-"))
    os.chmod(d, 0o755)
    try:
        lib_dir, probed_lib_dir = d / "lib", d / "probed-lib"
        lib_dir.mkdir()
        probed_lib_dir.mkdir()
        check(["gcc", "-O2", "-shared", "-fPIC", "-Wl,-soname,liblive.so",
               SAMPLES / "live_lib.c", "-o", lib_dir / "liblive.so"])
        check(["gcc", "-O2", "-pthread", SAMPLES / "live_server.c", f"-L{lib_dir}", "-llive",
               "-o", d / "live_server"])
        rewrite(d / "live_server", d / "live_server.probed", "handle_request", "usdt:live:batch",
                extra=["-r", "handle_request"])
        rewrite(lib_dir / "liblive.so", probed_lib_dir / "liblive.so", "live_step")
        for p in d.rglob("*"):
            os.chmod(p, 0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Server:
    """samples/live_server.c, talked to line by line."""

    def __init__(self, program, libs, user=None, threads=4, emulator=()):
        cmd = [*emulator, str(program), str(threads)]
        if user:
            cmd = as_user(user, cmd)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=clean_env({"LD_LIBRARY_PATH": str(libs)}))
        ready = self.proc.stdout.readline().split()
        assert ready[:1] == ["ready"], ready
        self.pid = int(ready[1])
        self.total = 0

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def work(self, n: int) -> None:
        """n requests; the server's own count of them must say so."""
        self.total += n
        assert self.ask(f"work {n}") == f"done {n} {self.total}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.stdin.write("exit\n")
            self.proc.stdin.flush()
        return self.proc.wait(timeout=TIMEOUT)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def as_user(user, cmd):
    return ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}",
            "--clear-groups", *map(str, cmd)]


def python_for(user, d: Path):
    """(interpreter, PYTHONPATH) with which `user` runs urewrite: copies of the installed
    urewrite, click and numpy (the live readers sum with it) where anyone may read them;
    None when no interpreter is open to that user (this one may live in root's home)."""
    import click
    import numpy
    import urewrite
    site = d / "site"
    if not site.exists():
        for module in (urewrite, click, numpy):
            home = os.path.dirname(module.__file__)
            shutil.copytree(home, site / module.__name__)
            libs = home + ".libs"  # (a wheel's own shared libraries, beside the package)
            if os.path.isdir(libs):
                shutil.copytree(libs, site / os.path.basename(libs))
        for p in [site, *site.rglob("*")]:
            os.chmod(p, 0o755)
    for python in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(as_user(user, [python, "-c", "import urewrite.interval_report"]),
                               capture_output=True, env=clean_env({"PYTHONPATH": str(site)}))
        if probe.returncode == 0:
            return python, str(site)
    return None


class Tracer:
    """`urewrite ARGS` running beside the server; armed once it says so on stderr.
    `user`: (name, interpreter, PYTHONPATH) to run it as another user."""

    def __init__(self, *args, user=None):
        cmd = [sys.executable, "-m", "urewrite", *map(str, args)]
        env = clean_env()
        if user:
            name, python, path = user
            cmd = as_user(name, [python, *cmd[1:]])
            env = clean_env({"PYTHONPATH": path})
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)

    def armed(self) -> str:
        line = self.proc.stderr.readline()
        assert "urewrite: armed pid" in line, line + self.proc.stderr.read()
        return line

    def finish(self):
        out, err = self.proc.communicate(timeout=TIMEOUT)
        assert "Traceback" not in err, err
        return self.proc.returncode, out, err


def hits(report: dict, name: str, kind: str = "entry") -> int:
    found = [p["hits"] for p in report["probes"] if p["name"] == name and p["kind"] == kind]
    assert found, report
    return sum(found)


def state_of(pid: int, program: Path):
    """(state word, region directory) of the program's runtime in the process, read by the
    test itself through /proc/PID/mem."""
    note = live_note.read(str(program))
    with open(f"/proc/{pid}/maps") as f:
        start = next(int(line.split("-")[0], 16) for line in f
                     if line.rstrip().endswith(str(program)) and line.split()[2] == "00000000")
    bias = start - note.file_delta
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(note.state + bias)
        word = struct.unpack("<Q", mem.read(8))[0]
        mem.seek(note.state + bias + note.offsets["dir"])
        directory = mem.read(64).split(b"\0")[0]
    return word, directory


def live_dirs():
    return [n for n in os.listdir("/dev/shm") if n.startswith("urewrite-live-")] \
        if os.path.isdir("/dev/shm") else []


def test_stat_pid_counts_the_window_exactly_and_rearms(programs):
    program = programs / "live_server.probed"
    server = Server(program, programs / "lib")
    try:
        server.work(5000)  # before arming: not counted
        assert state_of(server.pid, program) == (1, b"")
        assert server.ask("enabled") == "enabled 0"
        for _ in range(2):
            tracer = Tracer("stat", "--json", "-p", server.pid, "--duration", 2)
            tracer.armed()
            server.work(100_000)
            server.work(2345)
            assert server.ask("enabled") == "enabled 1"  # armed: the USDT semaphore is on
            code, out, err = tracer.finish()
            assert code == 0, err
            report = json.loads(out)
            assert hits(report, "handle_request") == 102_345
            assert hits(report, "handle_request", "return") == 102_345
            assert hits(report, "live:batch", "usdt") == 2
            assert report["processes"] == 1
            # disarmed: the state word is 1 again, the directory forgotten, the
            # semaphore off, nothing left behind
            assert state_of(server.pid, program) == (1, b"")
            assert server.ask("enabled") == "enabled 0"
            assert server.ask("ping") == "pong"
            server.work(777)
            assert not [d for d in live_dirs() if d.startswith(f"urewrite-live-{server.pid}-")]
        assert server.stop() == 0
    finally:
        server.kill()


def test_a_child_forked_while_armed_counts_and_is_disarmed(programs):
    program = programs / "live_server.probed"
    server = Server(program, programs / "lib")
    try:
        tracer = Tracer("stat", "--json", "-p", server.pid, "--duration", 2)
        tracer.armed()
        server.work(300)
        assert server.ask("fork 41") == "forked 41"
        code, out, err = tracer.finish()
        assert code == 0, err
        report = json.loads(out)
        assert hits(report, "handle_request") == 341
        assert report["processes"] == 2
        assert server.stop() == 0
    finally:
        server.kill()


def test_a_process_that_exits_while_armed_ends_the_session(programs):
    server = Server(programs / "live_server.probed", programs / "lib")
    try:
        tracer = Tracer("stat", "--json", "-p", server.pid)  # no duration: until it exits
        tracer.armed()
        server.work(1000)
        assert server.stop() == 0
        code, out, err = tracer.finish()
        assert code == 0, err
        assert hits(json.loads(out), "handle_request") == 1000
    finally:
        server.kill()


def test_a_second_tracer_gets_a_clear_error(programs):
    server = Server(programs / "live_server.probed", programs / "lib")
    try:
        first = Tracer("stat", "--json", "-p", server.pid, "--duration", 3)
        first.armed()
        second = Tracer("stat", "-p", server.pid, "--duration", 1)
        code, out, err = second.finish()
        assert code == 1
        assert err.count("\n") == 1 and "armed by another urewrite tracer" in err, err
        server.work(250)
        code, out, err = first.finish()
        assert code == 0, err
        assert hits(json.loads(out), "handle_request") == 250
    finally:
        server.kill()


def test_a_tracer_killed_while_armed_is_taken_over(programs):
    program = programs / "live_server.probed"
    server = Server(program, programs / "lib")
    try:
        tracer = Tracer("stat", "-p", server.pid)
        tracer.armed()
        server.work(10)  # its region is set up, the semaphore on
        tracer.proc.kill()
        tracer.proc.wait()
        assert server.ask("enabled") == "enabled 1"
        tracer = Tracer("stat", "--json", "-p", server.pid, "--duration", 2)
        tracer.armed()
        server.work(90)
        code, out, err = tracer.finish()
        assert code == 0, err
        assert hits(json.loads(out), "handle_request") == 90
        assert state_of(server.pid, program) == (1, b"")
        assert server.ask("enabled") == "enabled 0"
        assert not [d for d in live_dirs() if d.startswith(f"urewrite-live-{server.pid}-")]
    finally:
        server.kill()


def _users():
    """Two unprivileged users: the target's and the tracer's."""
    try:
        return pwd.getpwnam("nobody").pw_name, pwd.getpwnam("daemon").pw_name
    except KeyError:
        return None


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or not _users(),
                    reason="needs root, setpriv and the users nobody and daemon")
def test_another_users_process(programs):
    target_user, tracer_user = _users()
    python = python_for(tracer_user, programs)
    if python is None:
        pytest.skip(f"no Python interpreter that {tracer_user} can run urewrite with")
    server = Server(programs / "live_server.probed", programs / "lib", user=target_user)
    try:
        tracer = Tracer("stat", "-p", server.pid, "--duration", 1,
                        user=(tracer_user, *python))
        code, out, err = tracer.finish()
        assert code == 1
        assert err.count("\n") == 1 and "permission denied" in err, err
        # root may: the process creates its region, 0600 and its own, in a directory
        # it can write
        tracer = Tracer("stat", "--json", "-p", server.pid, "--duration", 2)
        tracer.armed()
        server.work(64)
        holders = [Path("/dev/shm", d) for d in live_dirs()
                   if d.startswith(f"urewrite-live-{server.pid}-")]
        assert len(holders) == 1
        # root's holder others pass through but cannot list; in it a directory any
        # user may create files in, and not list, rename or delete other users'
        (directory,) = holders[0].iterdir()
        assert [(p.stat().st_mode & 0o7777, p.stat().st_uid) for p in (holders[0], directory)] \
            == [(0o711, 0), (0o1733, 0)]
        files = [f for f in directory.iterdir() if f.name != CLOCK_FILE]  # (x86_64: the
        assert len(files) == 1                                   # TSC's rate, see test_clock)
        info = files[0].stat()
        assert (info.st_mode & 0o777, info.st_uid) == (0o600, pwd.getpwnam(target_user).pw_uid)
        code, out, err = tracer.finish()
        assert code == 0, err
        assert hits(json.loads(out), "handle_request") == 64
    finally:
        server.kill()


def test_a_rewritten_library_in_an_unmodified_program(programs):
    server = Server(programs / "live_server", programs / "probed-lib")
    try:
        tracer = Tracer("stat", "--json", "-p", server.pid, "--duration", 2)
        assert "(liblive.so)" in tracer.armed()
        server.work(4321)
        code, out, err = tracer.finish()
        assert code == 0, err
        report = json.loads(out)
        assert [(p["object"], p["name"], p["hits"]) for p in report["probes"]] == \
            [("liblive.so", "live_step", 4321)]
        assert server.ask("ping") == "pong"
    finally:
        server.kill()


def test_all_arms_every_process_of_a_file(programs):
    program = programs / "live_server.probed"
    servers = [Server(program, programs / "lib", threads=t) for t in (1, 2, 3)]
    try:
        tracer = Tracer("stat", "--json", "--all", program, "--duration", 2)
        line = tracer.armed()
        assert all(str(s.pid) in line for s in servers), line
        for k, server in enumerate(servers):
            server.work(1000 * (k + 1))
        code, out, err = tracer.finish()
        assert code == 0, err
        report = json.loads(out)
        assert report["processes"] == 3
        assert hits(report, "handle_request") == 6000
    finally:
        for server in servers:
            server.kill()


def test_trace_pid_shows_the_events(programs):
    server = Server(programs / "live_server.probed", programs / "lib")
    try:
        tracer = Tracer("trace", "--json", "-p", server.pid, "--duration", 2)
        tracer.armed()
        server.work(50)
        code, out, err = tracer.finish()
        assert code == 0, err
        events = [json.loads(line) for line in out.splitlines()]
        assert {e["pid"] for e in events} == {server.pid}
        assert sum(e["kind"] == "entry" for e in events) == 50
        assert sum(e["kind"] == "return" for e in events) == 50
        # and again as stat: no ring now, the counts as before
        tracer = Tracer("stat", "--json", "-p", server.pid, "--duration", 1)
        tracer.armed()
        server.work(20)
        code, out, err = tracer.finish()
        assert hits(json.loads(out), "handle_request") == 20
    finally:
        server.kill()


def test_bad_targets_get_one_line(programs, tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"])
    armed_by_env = Server(programs / "live_server.probed", programs / "lib")
    armed_by_env.proc.kill()
    armed_by_env.proc.wait()
    env = {"LD_LIBRARY_PATH": str(programs / "lib"), "UREWRITE_DIR": str(tmp_path)}
    armed_by_env.proc = subprocess.Popen([programs / "live_server.probed"], text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         env=clean_env(env))
    assert armed_by_env.proc.stdout.readline().startswith("ready")
    unused = tmp_path / "unused.probed"
    shutil.copy(programs / "live_server.probed", unused)
    try:
        for args, words in [(["-p", sleeper.pid], "maps no object rewritten by urewrite"),
                            (["--all", programs / "live_server"], "not rewritten by urewrite"),
                            (["--all", unused], "no running process maps"),
                            (["-p", armed_by_env.proc.pid], f"armed already: it writes its "
                                                            f"region to {tmp_path}"),
                            (["-p", "2147483646"], "no such process"),
                            (["-p", "x1"], "expected PID")]:
            proc = subprocess.run([sys.executable, "-m", "urewrite", "stat", *map(str, args)],
                                  capture_output=True, text=True, env=clean_env(),
                                  timeout=TIMEOUT)
            assert proc.returncode == 1, proc.stderr
            assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
    finally:
        sleeper.kill()
        sleeper.wait()
        armed_by_env.kill()


def test_arming_and_disarming_under_load(programs):
    """Threads hit the probes all the time while tracers arm and disarm (set-up, trace
    ring and state changing under them): the server never fails, and no tracer counts
    more than the requests answered."""
    import threading
    server = Server(programs / "live_server.probed", programs / "lib")
    stop = threading.Event()
    lock = threading.Lock()

    def load():
        while not stop.is_set():
            with lock:
                server.work(20_000)
    worker = threading.Thread(target=load)
    worker.start()
    try:
        for k in range(8):
            before = server.total
            command = "trace" if k % 2 else "stat"
            tracer = Tracer(command, "--json", "-p", server.pid, "--duration", 0.2)
            tracer.armed()
            code, out, err = tracer.finish()
            assert code == 0, err
            with lock:
                answered = server.total - before
            counted = (sum(json.loads(line)["kind"] == "entry" for line in out.splitlines())
                       if command == "trace" else hits(json.loads(out), "handle_request"))
            assert 0 < counted <= answered
    finally:
        stop.set()
        worker.join()
    try:
        assert server.ask("ping") == "pong"
        assert server.stop() == 0
    finally:
        server.kill()


# -- arm64, under qemu-aarch64 (its guest memory is the qemu process's own) -----------------

from cross import CC as CROSS_CC, QEMU, SYSROOT  # noqa: E402 (the arm64 toolchain)


@pytest.mark.skipif(shutil.which(CROSS_CC) is None or shutil.which(QEMU) is None,
                    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64")
def test_arm64_under_qemu(tmp_path):
    sysroot = SYSROOT
    check([CROSS_CC, "-O2", "-shared", "-fPIC", "-Wl,-soname,liblive.so",
           SAMPLES / "live_lib.c", "-o", tmp_path / "liblive.so"])
    check([CROSS_CC, "-O2", "-pthread", SAMPLES / "live_server.c", f"-L{tmp_path}", "-llive",
           "-o", tmp_path / "live_server"])
    probed = tmp_path / "live_server.probed"
    rewrite(tmp_path / "live_server", probed, "handle_request", extra=["-r", "handle_request"])
    server = Server(probed, tmp_path, emulator=(QEMU, "-L", sysroot, "-E",
                                                f"LD_LIBRARY_PATH={tmp_path}"))
    try:
        server.work(100)
        for command in ("stat", "trace", "stat"):
            tracer = Tracer(command, "--json", "-p", server.pid, "--duration", 2)
            tracer.armed()
            server.work(3000)
            server.work(45)
            code, out, err = tracer.finish()
            assert code == 0, err
            if command == "stat":
                report = json.loads(out)
                assert hits(report, "handle_request") == 3045
                assert hits(report, "handle_request", "return") == 3045
            else:
                kinds = [json.loads(line)["kind"] for line in out.splitlines()]
                assert (kinds.count("entry"), kinds.count("return")) == (3045, 3045)
            assert server.ask("ping") == "pong"
        assert server.stop() == 0
    finally:
        server.kill()
