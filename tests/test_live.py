"""Arming running processes: `stat -p PID`, `trace -p PID`, `--all FILE` (reader/arming.py).

samples/live_server.c runs without UREWRITE_DIR and does work only when told on its
stdin, so the window a tracer is armed for holds exactly the requests sent in it;
the server's own "done N TOTAL" lines are the accounting the counts must equal.
"""

from __future__ import annotations

import json
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cross
from conftest import SAMPLES, check, clean_env, rewrite
from live_server import TIMEOUT, Server, Tracer, hits, live_dirs, python_for, state_of
from live_server import programs  # noqa: F401 (the fixture: the server and its rewrites)
from users import needs_switching, switch_users
from urewrite.trampolines.region import CLOCK_FILE

def test_stat_pid_counts_the_window_exactly_and_rearms(programs):
    program = programs / "live_server.probed"
    with Server(program, programs / "lib") as server:
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


def test_a_child_forked_while_armed_counts_and_is_disarmed(programs):
    program = programs / "live_server.probed"
    with Server(program, programs / "lib") as server:
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


def test_a_process_that_exits_while_armed_ends_the_session(programs):
    with Server(programs / "live_server.probed", programs / "lib") as server:
        tracer = Tracer("stat", "--json", "-p", server.pid)  # no duration: until it exits
        tracer.armed()
        server.work(1000)
        assert server.stop() == 0
        code, out, err = tracer.finish()
        assert code == 0, err
        assert hits(json.loads(out), "handle_request") == 1000


def test_a_second_tracer_gets_a_clear_error(programs):
    with Server(programs / "live_server.probed", programs / "lib") as server:
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


def test_a_tracer_killed_while_armed_is_taken_over(programs):
    program = programs / "live_server.probed"
    with Server(program, programs / "lib") as server:
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


@needs_switching
def test_another_users_process(programs):
    target_user, tracer_user = (user.pw_name for user in switch_users())
    python = python_for(tracer_user, programs)
    if python is None:
        pytest.skip(f"no Python interpreter that {tracer_user} can run urewrite with")
    with Server(programs / "live_server.probed", programs / "lib", user=target_user) as server:
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


def test_a_rewritten_library_in_an_unmodified_program(programs):
    with Server(programs / "live_server", programs / "probed-lib") as server:
        tracer = Tracer("stat", "--json", "-p", server.pid, "--duration", 2)
        assert "(liblive.so)" in tracer.armed()
        server.work(4321)
        code, out, err = tracer.finish()
        assert code == 0, err
        report = json.loads(out)
        assert [(p["object"], p["name"], p["hits"]) for p in report["probes"]] == \
            [("liblive.so", "live_step", 4321)]
        assert server.ask("ping") == "pong"


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
    with Server(programs / "live_server.probed", programs / "lib") as server:
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

@cross.needs(cross.CC, cross.QEMU)
def test_arm64_under_qemu(tmp_path):
    cross.require_sysroot()
    check([cross.CC, "-O2", "-shared", "-fPIC", "-Wl,-soname,liblive.so",
           SAMPLES / "live_lib.c", "-o", tmp_path / "liblive.so"])
    check([cross.CC, "-O2", "-pthread", SAMPLES / "live_server.c", f"-L{tmp_path}", "-llive",
           "-o", tmp_path / "live_server"])
    probed = tmp_path / "live_server.probed"
    rewrite(tmp_path / "live_server", probed, "handle_request", extra=["-r", "handle_request"])
    with Server(probed, tmp_path, emulator=tuple(cross.emulator(tmp_path))) as server:
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
