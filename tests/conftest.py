"""Fixtures for the end-to-end tests: build samples, run urewrite, count hits with uprobes.

Everything built goes into a per-session temporary directory, never into the
repository. Builds are cached by their flags, so each variant is compiled once
per session however many tests use it.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import pytest

import forked_cli

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
ENV_VAR = "UREWRITE_DIR"
TRACEFS = Path("/sys/kernel/tracing")
TIMEOUT = 180

# Tests stop tools with Ctrl-C (SIGINT). A run started in the background of a shell
# without job control (as CI may start it) inherits SIGINT ignored, and so would every
# program the tests start; handling it here gives them the default back at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# -- running things ----------------------------------------------------------------

def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The test's environment without UREWRITE_DIR (probes disarmed) and
    UREWRITE_LATENCY (calls untimed), plus `extra`. Without COLUMNS and LINES too:
    pytest-xdist's workers set them (80x24), and a command in a real terminal (tmux)
    would take them over the terminal's size."""
    env = {k: v for k, v in os.environ.items()
           if k not in (ENV_VAR, "UREWRITE_LATENCY", "COLUMNS", "LINES")}
    env.update(extra or {})
    return env


# Go's build cache, one for every test's Go builds (the runtime and standard library are
# compiled once per architecture, not once per build); Go keeps it safe for builds that
# run at once
GO_CACHE = os.path.join(tempfile.gettempdir(), "urewrite-tests-go-cache")


def run(cmd: Sequence, env: Optional[Dict[str, str]] = None, cwd=None,
        timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    """Run a command with captured text output; `env` adds to a disarmed environment.
    `python -m urewrite ARGS` runs in a child of a fork server (tests/forked_cli.py)."""
    cmd = [str(c) for c in cmd]
    if cmd[:3] == [sys.executable, "-m", "urewrite"]:
        return forked_cli.run_urewrite(cmd[3:], clean_env(env), cwd=cwd, timeout=timeout)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          errors="replace", env=clean_env(env), cwd=cwd, timeout=timeout)


def check(cmd: Sequence, **kw) -> subprocess.CompletedProcess:
    """Run a command that must succeed."""
    proc = run(cmd, **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited with {proc.returncode}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


@contextlib.contextmanager
def running(cmd: Sequence, **popen):
    """A process (subprocess.Popen(cmd, **popen)) for the length of a `with` block: killed
    at its end if it still runs, and always waited for."""
    process = subprocess.Popen([str(c) for c in cmd], **popen)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def urewrite(*args, env: Optional[Dict[str, str]] = None, cwd=None) -> subprocess.CompletedProcess:
    """The command line tool, as `python -m urewrite ARGS`."""
    return run([sys.executable, "-m", "urewrite", *args], env=env, cwd=cwd)


def rewrite(binary, output, *specs: str, extra: Sequence[str] = ()) -> dict:
    """Rewrite with --json; the parsed result. Fails the test when urewrite fails."""
    args = [str(binary)]
    for spec in specs:
        args += ["-p", spec]
    proc = urewrite(*args, "-o", str(output), "--json", *extra)
    assert proc.returncode == 0, f"urewrite {' '.join(args)} failed:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


@dataclass
class StatRun:
    """A run under `urewrite stat --json -o REPORT`."""
    proc: subprocess.CompletedProcess
    report: dict

    @property
    def probes(self) -> List[dict]:
        return self.report["probes"]

    def hits(self, name: str, obj: Optional[str] = None) -> int:
        """Hits of the probe named `name` (summed if several objects have it)."""
        found = [p for p in self.probes if p["name"] == name and (obj is None or p["object"] == obj)]
        assert found, f"no probe named {name!r}" + (f" in {obj}" if obj else "")
        return sum(p["hits"] for p in found)

    def by_address(self, obj: Optional[str] = None) -> Dict[int, int]:
        out: Dict[int, int] = {}
        for p in self.probes:
            if obj is None or p["object"] == obj:
                out[p["address"]] = out.get(p["address"], 0) + p["hits"]
        return out


def stat(cmd: Sequence, tmp_dir: Path, env: Optional[Dict[str, str]] = None,
         latency: bool = False) -> StatRun:
    """Run `cmd` under `urewrite stat --json -o FILE` (`latency`: and --latency); the
    program's own output stays in proc."""
    report = Path(tmp_dir) / f"report-{os.getpid()}-{next(_serial)}.json"
    proc = urewrite("stat", "--json", "-o", str(report), *["--latency"] * latency, "--",
                    *map(str, cmd), env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert report.exists(), f"stat wrote no report (exit {proc.returncode}):\n{proc.stderr}"
    return StatRun(proc, json.loads(report.read_text()))


_serial = itertools.count(1)  # (a C iterator: safe to share between threads)


# -- ELF facts, read independently of urewrite --------------------------------------

NEW_CODE_SYMBOL = re.compile(r"\.urewrite$|^urewrite\.")  # what a rewrite names (debug_sections)


def without_new_code(symbol_lines: str) -> str:
    """nm's (or readelf -s's) lines but those of the symbols a rewrite adds for its new
    code, and readelf's entry numbers (locals added before the globals move them)."""
    kept = [re.sub(r"^\s*\d+:", "", line) for line in symbol_lines.splitlines()
            if not (line.split() and NEW_CODE_SYMBOL.search(line.split()[-1]))]
    return "\n".join(line for line in kept if not line.startswith("Symbol table"))


def function_symbols(path) -> Dict[str, int]:
    """Defined FUNC symbols of a file (symtab, or dynsym without one): name -> address.

    Global names win over local ones of the same name.
    """
    out = check(["readelf", "-sW", str(path)]).stdout
    found: Dict[str, tuple] = {}
    for line in out.splitlines():
        parts = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(parts) < 8 or not parts[0].endswith(":") or parts[3] != "FUNC":
            continue
        if parts[6] in ("UND", "ABS"):
            continue
        name = parts[7].split("@")[0]
        value = int(parts[1], 16)
        rank = 0 if parts[4] in ("GLOBAL", "WEAK") else 1
        if name not in found or rank < found[name][1]:
            found[name] = (value, rank)
    return {name: value for name, (value, _) in found.items()}


def all_symbols(path) -> Dict[str, int]:
    """Every defined symbol with a name (any type): name -> address."""
    out = check(["nm", "--defined-only", str(path)]).stdout
    symbols = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            symbols.setdefault(parts[2], int(parts[0], 16))
    return symbols


def file_offset(path, vaddr: int) -> int:
    """File offset of a virtual address: vaddr - segment vaddr + segment offset."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2
    phoff = struct.unpack_from("<Q", data, 32)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 1 and p_vaddr <= vaddr < p_vaddr + p_filesz:
            return vaddr - p_vaddr + p_offset
    raise AssertionError(f"{path}: {vaddr:#x} is in no loadable segment")


# -- building samples ------------------------------------------------------------------

@dataclass
class Built:
    path: Path
    objects: List[Path]
    own_functions: Dict[str, int] = field(default_factory=dict)  # from the sample's own sources

    @property
    def dir(self) -> Path:
        return self.path.parent


class Builder:
    """Compiles samples with the system gcc into a session directory, once per flag set."""

    def __init__(self, root: Path):
        self.root = root
        self.cache: Dict[tuple, Built] = {}

    def build(self, name: str, sources: Iterable[str], cflags: Sequence[str] = (),
              ldflags: Sequence[str] = (), shared: bool = False, subdir: Optional[str] = None,
              output_name: Optional[str] = None) -> Built:
        sources = tuple(sources)
        key = (name, sources, tuple(cflags), tuple(ldflags), shared, subdir, output_name)
        if key in self.cache:
            return self.cache[key]
        tag = re.sub(r"[^A-Za-z0-9]+", "_", " ".join([*cflags, *ldflags])).strip("_")
        d = self.root / (subdir or f"{name}-{tag}-{len(self.cache)}")
        d.mkdir(parents=True, exist_ok=True)
        objects = []
        for src in sources:
            obj = d / (Path(src).stem + ".o")
            check(["gcc", "-c", *cflags, str(SAMPLES / src), "-o", str(obj)])
            objects.append(obj)
        out = d / (output_name or name)
        link = ["gcc", *cflags, *(["-shared"] if shared else []), *map(str, objects), *ldflags,
                "-o", str(out)]
        check(link)
        own = {}
        for obj in objects:
            own.update(function_symbols(obj))
        built = Built(out, objects, {n: a for n, a in function_symbols(out).items() if n in own})
        self.cache[key] = built
        return built


@pytest.fixture(scope="session")
def builder(tmp_path_factory) -> Builder:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    return Builder(tmp_path_factory.mktemp("build"))


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("work")


# -- the kernel uprobe oracle -------------------------------------------------------------

@contextlib.contextmanager
def kernel_tracing_alone():
    """Held while a test changes the kernel's uprobes or tracing instances: the workers
    of pytest-xdist take turns. While another process adds and removes uprobes, the
    kernel calls a tracing instance busy (rmdir: EBUSY) for as long as that goes on,
    and `bench` (its own instance) would give up its cleanup with a warning."""
    with open(os.path.join(tempfile.gettempdir(), "urewrite-tests-tracing.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Uprobes:
    """Counts how often addresses of a file run, with kernel uprobes (the oracle).

    Events go in a group of their own (urwtest_<pid>) and are always removed.
    Removing an enabled uprobe costs the kernel tens of milliseconds, so callers
    keep to the few dozen addresses they care about.
    """

    def __init__(self):
        self.group = f"urwtest_{os.getpid()}"
        self.events_file = TRACEFS / "uprobe_events"
        self._serial = 0

    def _write(self, line: str) -> None:
        fd = os.open(self.events_file, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def count(self, binary, addresses: Dict[str, int], action: Callable[[], object],
              semaphores: Optional[Dict[str, int]] = None,
              returns: Optional[Dict[str, int]] = None) -> Dict[str, int]:
        """Probe `binary` (the file, by path) at each address, run `action`, return the hits.
        `semaphores` gives a USDT probe's semaphore address by name: the kernel then
        counts the processes that have the probe enabled in it, as a tracer does.
        `returns`: functions (name -> entry address) to count returns of, with
        uretprobes; their hits are under the name too (keep names apart)."""
        with kernel_tracing_alone():
            return self._count(binary, addresses, action, semaphores, returns)

    def _count(self, binary, addresses: Dict[str, int], action: Callable[[], object],
               semaphores: Optional[Dict[str, int]],
               returns: Optional[Dict[str, int]]) -> Dict[str, int]:
        path = os.path.realpath(binary)
        self._serial += 1
        prefix = f"u{os.getpid()}_{self._serial}_"
        events: Dict[str, str] = {}
        enable = TRACEFS / "events" / self.group / "enable"
        try:
            lines = []
            probes = [("p", n, a) for n, a in sorted(addresses.items())] + \
                [("r", n, a) for n, a in sorted((returns or {}).items())]
            for i, (kind, name, address) in enumerate(probes):
                event = f"{prefix}{i}"
                semaphore = (semaphores or {}).get(name) if kind == "p" else None
                ref_ctr = f"({file_offset(path, semaphore):#x})" if semaphore else ""
                lines.append(f"{kind}:{self.group}/{event} "
                             f"{path}:{file_offset(path, address):#x}{ref_ctr}")
                events[event] = name
            if lines:
                self._write("\n".join(lines))
            if events:
                enable.write_text("1")
            action()
            if events:
                enable.write_text("0")
            hits = {}
            for line in (TRACEFS / "uprobe_profile").read_text().splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[-2] in events and parts[0] == path:
                    hits[events[parts[-2]]] = int(parts[-1])
            missing = set(events.values()) - set(hits)
            assert not missing, f"uprobe_profile lacks {sorted(missing)}"
            return hits
        finally:
            if events:
                try:
                    enable.write_text("0")
                except OSError:
                    pass
            if events:
                try:
                    self._write("\n".join(f"-:{self.group}/{event}" for event in events))
                except OSError:
                    for event in events:
                        try:
                            self._write(f"-:{self.group}/{event}")
                        except OSError:
                            pass


def uprobes_unavailable() -> Optional[str]:
    """Why the uprobe oracle cannot be used here, or None."""
    events = TRACEFS / "uprobe_events"
    if not events.exists():
        return f"{events} is missing (tracefs not mounted, or no CONFIG_UPROBE_EVENTS)"
    if not os.access(events, os.W_OK):
        return f"{events} is not writable (needs root)"
    try:
        fd = os.open(events, os.O_WRONLY | os.O_APPEND)
        os.close(fd)
    except OSError as e:
        return f"{events} cannot be opened for writing: {e.strerror}"
    return None


@pytest.fixture(scope="session")
def uprobes() -> Uprobes:
    why = uprobes_unavailable()
    if why:
        pytest.skip(f"uprobe oracle unavailable: {why}")
    return Uprobes()
