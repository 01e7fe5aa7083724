"""The arm64 cross toolchain of every arm64 test: compilers, binutils, qemu-user, the
AArch64 libraries qemu loads programs with, and the skip marker for machines without them.

Programs run as `emulate(program)` (qemu-aarch64 -L SYSROOT program), probes disarmed
through conftest's run. The parts the arm64 matrices share (a variant's runs, building
every variant at once) are here too.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import pytest

from conftest import check

CROSS = "aarch64-linux-gnu-"
CC, CXX = CROSS + "gcc", CROSS + "g++"
READELF, NM, OBJCOPY = CROSS + "readelf", CROSS + "nm", CROSS + "objcopy"
QEMU = "qemu-aarch64"
BP = "-mbranch-protection=standard"

# shared libraries linked without the toolchain's start files (which carry no BTI
# marking) keep the GNU property note saying BTI and PAC; this is their DT_INIT
LIB_INIT = "urw_test_init"
LIB_INIT_C = f"void {LIB_INIT}(void) {{}}\n"

PACKAGES = {CC: "gcc-aarch64-linux-gnu", CXX: "g++-aarch64-linux-gnu", QEMU: "qemu-user",
            READELF: "binutils-aarch64-linux-gnu", NM: "binutils-aarch64-linux-gnu",
            OBJCOPY: "binutils-aarch64-linux-gnu"}


def missing(*tools: str) -> List[str]:
    """Those of `tools` not on PATH."""
    return [tool for tool in tools if shutil.which(tool) is None]


def needs(*tools: str, also: Optional[str] = None) -> pytest.MarkDecorator:
    """Skips without any of `tools` (the cross compiler and qemu when none are named);
    `also`: a further condition's reason, given only when it is not met (None: met)."""
    tools = tools or (CC, QEMU)
    absent = missing(*tools)
    packages = sorted({PACKAGES.get(tool, tool) for tool in absent})
    reasons = ([f"needs {', '.join(absent)} (Debian: apt-get install {' '.join(packages)})"]
               if absent else []) + ([also] if also else [])
    return pytest.mark.skipif(bool(reasons), reason="; ".join(reasons) or "-")


def _sysroot() -> str:
    """The AArch64 libraries for qemu's -L: QEMU_LD_PREFIX, else where the cross gcc's
    loader is; "" when neither is known."""
    if os.environ.get("QEMU_LD_PREFIX"):
        return os.environ["QEMU_LD_PREFIX"]
    if missing(CC):
        return ""
    loader = check([CC, "-print-file-name=ld-linux-aarch64.so.1"]).stdout.strip()
    path = Path(os.path.realpath(loader))
    return str(path.parent.parent) if path.is_file() else ""


SYSROOT = _sysroot()


def require_sysroot() -> None:
    """Skips the test when the AArch64 libraries are not found."""
    if not SYSROOT:
        pytest.skip("cannot find the AArch64 libraries for qemu -L (set QEMU_LD_PREFIX)")


def emulator(libdir=None) -> List[str]:
    """qemu and its options, to go before an AArch64 program (its libraries from `libdir`)."""
    cmd = [QEMU]
    if SYSROOT:
        cmd += ["-L", SYSROOT]
    if libdir:
        cmd += ["-E", f"LD_LIBRARY_PATH={libdir}"]
    return cmd


def emulate(program, libdir=None) -> List[str]:
    """The command that runs an AArch64 program (and its libraries from `libdir`) under qemu."""
    return emulator(libdir) + [str(program)]


def exit_status(returncode: int) -> int:
    """As a shell (and `urewrite stat`) reports it: 128+N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


# -- the matrices: many variants built, rewritten and run once per module ----------------------

@dataclass
class Run:
    returncode: int  # exit status, shell style
    stdout: str
    stderr: str
    report: Optional[dict] = None  # stat --json


def prepare_all(tmp_path_factory, name: str, variants, prepare) -> dict:
    """prepare(variant, folder) for every variant, in parallel (each mostly waits for
    gcc and qemu); the results by variant id. Skips without AArch64 libraries."""
    require_sysroot()
    root = tmp_path_factory.mktemp(name)
    workers = max(2, os.cpu_count() or 2)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(lambda v: prepare(v, root), variants))
    return {p.variant.id: p for p in done}
