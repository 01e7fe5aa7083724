"""The arm64 cross toolchain every arm64 test uses, in one place: the compiler and
binutils (aarch64-linux-gnu-), qemu-aarch64 and the libraries it runs programs with,
how to run things (probes disarmed unless asked), and the skip marker for machines
without them. (Test files import it as they import conftest.)"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
ENV_VAR = "UREWRITE_DIR"
CROSS = "aarch64-linux-gnu-"
CC, READELF, NM = CROSS + "gcc", CROSS + "readelf", CROSS + "nm"
QEMU = "qemu-aarch64"
TIMEOUT = 180
BP = "-mbranch-protection=standard"
LIB_INIT = "urw_test_init"  # DT_INIT of the libraries linked without start files
LIB_INIT_C = f"void {LIB_INIT}(void) {{}}\n"

MISSING = [tool for tool in (CC, QEMU, READELF, NM) if shutil.which(tool) is None]
needs_cross = pytest.mark.skipif(
    bool(MISSING),
    reason=f"needs the AArch64 cross toolchain and qemu-user ({', '.join(MISSING)} not found; "
           f"Debian: apt-get install gcc-aarch64-linux-gnu qemu-user)")


def run(cmd, env: Optional[Dict[str, str]] = None, timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    """Run with captured text output, probes disarmed (no UREWRITE_DIR), plus `env`."""
    full = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    full.update(env or {})
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace",
                          env=full, timeout=timeout)


def check(cmd, **kw) -> subprocess.CompletedProcess:
    proc = run(cmd, **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited with {proc.returncode}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def urewrite(*args) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "urewrite", *args])


def exit_status(returncode: int) -> int:
    """As a shell (and `urewrite stat`) reports it: 128+N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _sysroot() -> str:
    """The AArch64 libraries for qemu's -L: QEMU_LD_PREFIX, else where the cross gcc's loader is."""
    if os.environ.get("QEMU_LD_PREFIX"):
        return os.environ["QEMU_LD_PREFIX"]
    if MISSING:
        return ""
    loader = check([CC, "-print-file-name=ld-linux-aarch64.so.1"]).stdout.strip()
    path = Path(os.path.realpath(loader))
    return str(path.parent.parent) if path.is_file() else ""


SYSROOT = _sysroot()


def emulate(program, libdir=None) -> List[str]:
    """The command that runs an AArch64 program (and its libraries from `libdir`) under qemu."""
    cmd = [QEMU]
    if SYSROOT:
        cmd += ["-L", SYSROOT]
    if libdir:
        cmd += ["-E", f"LD_LIBRARY_PATH={libdir}"]
    return cmd + [str(program)]


@dataclass
class Run:
    returncode: int  # exit status, shell style
    stdout: str
    stderr: str
    report: Optional[dict] = None  # stat --json


def prepare_all(tmp_path_factory, name: str, variants, prepare) -> dict:
    """prepare(variant, folder) for every variant, in parallel (each mostly waits for
    gcc and qemu); the results by variant id. Skips without AArch64 libraries."""
    if not SYSROOT:
        pytest.skip("cannot find the AArch64 libraries for qemu -L (set QEMU_LD_PREFIX)")
    root = tmp_path_factory.mktemp(name)
    workers = max(2, os.cpu_count() or 2)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(lambda v: prepare(v, root), variants))
    return {p.variant.id: p for p in done}
