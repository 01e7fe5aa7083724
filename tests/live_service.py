"""The service sample (samples/service.c) as the live-view tests drive it: a process
that runs until told to quit and answers each command once its calls are made."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from conftest import clean_env, rewrite

# what the tests probe: entries, and nap at entry and return (a latency histogram)
PROBES = ["handle", "fast", "slow", "nap"]
RETURNS = ["nap"]
NAP_NS = 3_000_000  # samples/service.c: NAP_US


def build_service(builder, subdir: str = "live-service") -> Path:
    built = builder.build("service", ["service.c"], ["-O2"], [], subdir=subdir)
    probed = built.dir / "service.probed"
    if not probed.exists():
        rewrite(built.path, probed, *PROBES, extra=[a for r in RETURNS for a in ("-r", r)])
    return probed


class LineReader:
    """Lines of a pipe, each within a time limit. (select() on a buffered text file
    misses lines already in its buffer: this reads the descriptor itself.)"""

    def __init__(self, pipe):
        self.fd = pipe.fileno()
        self.buffer = b""

    def next_line(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no line in {timeout} s")
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise EOFError("the pipe closed")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def rest(self) -> str:
        """Everything left, up to the end (the writer has exited)."""
        while True:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                break
            self.buffer += chunk
        text, self.buffer = self.buffer.decode(), b""
        return text


class Service:
    """A running service.probed with UREWRITE_DIR set (or not), and then calls timed
    (UREWRITE_LATENCY=1) unless not `latency`, as docs/production.md starts one;
    `command` runs it some other way (under qemu)."""

    def __init__(self, probed: Path, directory: Optional[Path],
                 extra_env: Optional[Dict[str, str]] = None,
                 command: Optional[List[str]] = None, latency: bool = True):
        env = dict(extra_env or {})
        if directory is not None:
            env["UREWRITE_DIR"] = str(directory)
            if latency:
                env["UREWRITE_LATENCY"] = "1"
        self.proc = subprocess.Popen(command or [str(probed)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=clean_env(env))
        self.pid = self.proc.pid
        self.lines = LineReader(self.proc.stdout)

    def start(self, command: str) -> None:
        """Send a command without waiting for its answer."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def answer(self, command: str, timeout: float = 60) -> List[str]:
        """The lines up to `ok COMMAND`: its calls are all made then."""
        lines, deadline = [], time.monotonic() + timeout
        while True:
            try:
                line = self.lines.next_line(max(0.0, deadline - time.monotonic()))
            except AssertionError:
                raise AssertionError(f"service gave no answer to {command!r} in {timeout} s")
            except EOFError:
                raise AssertionError(f"service ended before answering {command!r}")
            lines.append(line)
            if line == f"ok {command}":
                return lines

    def send(self, command: str) -> List[str]:
        self.start(command)
        return self.answer(command)

    def quit(self) -> int:
        self.start("quit")
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def region_bytes(directory: Path) -> Dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(directory).glob("*.ure"))}


def stop_all(*services: Service) -> None:
    for s in services:
        s.kill()


def wait_for(predicate, timeout: float = 60, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s")


def with_arguments(service: Path, tmp: Path) -> Path:
    """The service rewritten with its handler's argument recorded (for programs that
    read arg0), in `tmp`."""
    from conftest import urewrite
    built = tmp / "service.args"
    proc = urewrite(str(service.parent / "service"), "-p", "handle", "--args", "1", "-o",
                    str(built), "-q")
    assert proc.returncode == 0, proc.stderr
    return built


class ProgramLoader:
    """`urewrite run -e PROGRAM --dir DIRECTORY` in the background, until stop(): the
    processes that start with UREWRITE_DIR=DIRECTORY meanwhile run the program."""

    def __init__(self, program: str, directory: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "urewrite", "run", "-e", program,
                                      "--dir", str(directory), "--duration", "120"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=clean_env())
        assert wait_for(lambda: list(directory.glob("*.program")) or self.proc.poll() is not None)
        assert self.proc.poll() is None, self.proc.communicate()

    def stop(self) -> str:
        """Ctrl-C: the program is unloaded, its maps printed; its output."""
        self.proc.send_signal(signal.SIGINT)
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def table(lines):
    """A table of plain output (a header line, then rows): rows as dicts by column."""
    header = lines[0].split()
    return [dict(zip(header, line.split())) for line in lines[1:] if line.strip()]


def top_tables(text):
    """Each refresh of plain `top` output: (title, rows as dicts)."""
    tables = []
    for line in text.splitlines():
        if line.startswith("urewrite top - "):
            tables.append((line, []))
        elif line.strip():
            tables[-1][1].append(line)
    return [(title, table(lines)) for title, lines in tables]
