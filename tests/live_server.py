"""samples/live_server.c and the tracers armed at it, for the tests of arming running
processes (test_live, test_live_armed_views, test_api): the server built and rewritten
once per module, driven line by line, and read through /proc by the test itself."""

from __future__ import annotations

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

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()  # (after a stop(): only reaped)


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
