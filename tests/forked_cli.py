"""`python -m urewrite ARGS` without a new interpreter's imports each time.

A fresh interpreter spends most of a short rewrite's CPU importing urewrite and its
libraries (numpy, lief, capstone), and the tests run the command line thousands of
times. Here a server process imports them once, then forks a child per command that
runs `python -m urewrite` as the interpreter would (runpy, `__main__`), with the
command's own environment, folder, stdin from /dev/null and its output in files:
the same code from the same entry point, with the state of a fresh import.

What a fresh interpreter does before the command runs (starting, importing) is not
exercised this way: the commands tests start with Popen still start one, and
UREWRITE_TESTS_FRESH=1 makes every command do so. Each server runs one command at a
time; callers on several threads take servers from a pool.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Dict, List, Optional

# imported by the server before it forks: what the commands load
PRELOAD = ["urewrite.entry", "urewrite.commands", "urewrite.rewriter.pipeline",
           "urewrite.arch.x86_64", "urewrite.arch.aarch64", "urewrite.reader.command_run",
           "urewrite.stat_report", "numpy", "lief", "capstone"]

FRESH = os.environ.get("UREWRITE_TESTS_FRESH") == "1"


# -- the server (its own process) ---------------------------------------------------------------

def _child(request: dict) -> None:
    """In the forked child: become `python -m urewrite ARGS`; never returns."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                                (2, request["stderr"], os.O_WRONLY)):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, closefd=False)  # (not the server's, which read requests)
        sys.argv = ["urewrite", *request["args"]]
        import runpy
        try:
            runpy.run_module("urewrite", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:  # as the interpreter turns it into a status
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        import atexit as exits
        exits._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def serve() -> None:
    """Reads a request a line from stdin; answers "pid" then "status" lines on stdout."""
    for name in PRELOAD:
        __import__(name)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(f"{os.waitstatus_to_exitcode(status)}\n")
        sys.stdout.flush()


# -- the client (the tests' process) ------------------------------------------------------------

class _Server:
    def __init__(self):
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # no BLAS threads before a fork
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import forked_cli; forked_cli.serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=here, env=env,
            start_new_session=True)
        self.buffer = b""

    def _line(self, deadline: Optional[float]) -> Optional[str]:
        """The server's next answer, or None at the deadline (read from the descriptor:
        a buffered reader would hide a second line from select)."""
        import time
        fd = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the urewrite fork server died")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def run(self, cmd: List[str], args: List[str], env: Dict[str, str], cwd: Optional[str],
            timeout: Optional[float]) -> subprocess.CompletedProcess:
        import time
        with tempfile.TemporaryDirectory(prefix="urewrite-cli-") as d:
            out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
            open(out, "w").close()
            open(err, "w").close()
            request = {"args": args, "env": env, "cwd": os.path.abspath(cwd or os.getcwd()),
                       "stdout": out, "stderr": err}
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            deadline = None if timeout is None else time.monotonic() + timeout
            pid = int(self._line(None))
            status = self._line(deadline)
            if status is None:
                os.kill(pid, signal.SIGKILL)
                self._line(None)
                raise subprocess.TimeoutExpired(cmd, timeout)

            def read(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    return f.read()
            return subprocess.CompletedProcess(cmd, int(status), read(out), read(err))

    def close(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()


_idle: List[_Server] = []
_all: List[_Server] = []
_lock = threading.Lock()


def _close_all() -> None:
    for server in _all:
        server.close()


atexit.register(_close_all)


def run_urewrite(args: List[str], env: Dict[str, str], cwd=None,
                 timeout: Optional[float] = None) -> subprocess.CompletedProcess:
    """As subprocess.run([python, -m, urewrite, *args], capture_output=True, text=True,
    errors="replace", env=env, cwd=cwd, timeout=timeout), in a child of a fork server."""
    args = [str(a) for a in args]
    cmd = [sys.executable, "-m", "urewrite", *args]
    if FRESH:
        return subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                              cwd=cwd, timeout=timeout)
    with _lock:
        server = _idle.pop() if _idle else None
    if server is None:
        server = _Server()
        with _lock:
            _all.append(server)
    try:
        result = server.run(cmd, args, env, None if cwd is None else str(cwd), timeout)
    except BaseException:
        server.close()
        raise
    with _lock:
        _idle.append(server)
    return result
