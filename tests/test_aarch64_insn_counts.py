"""samples/aarch64_insn_counts.py on one row: it builds, rewrites, counts, checks its hits.

The figures themselves are in docs/benchmarks.md; here only what must hold
whatever the trampoline looks like: whole numbers of instructions per
iteration, and a probe that adds instructions disarmed and more counting.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cross
SCRIPT = Path(__file__).resolve().parent.parent / "samples" / "aarch64_insn_counts.py"
TOOLS = (cross.CC, cross.QEMU, "gcc")
SDT = list(Path("/usr/include").glob("sys/sdt.h")) + list(Path("/usr/include").glob("*/sys/sdt.h"))

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in TOOLS) or not SDT,
    reason="needs aarch64-linux-gnu-gcc, qemu-aarch64, gcc and <sys/sdt.h>")


def test_counts_a_row_and_cross_checks_it():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rows", "entry-push",
                           "--cross-check", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    rows = {row["row"]: row for row in result["rows"]}
    assert list(rows) == ["entry-push"]
    row = rows["entry-push"]
    assert all(abs(row[k] - round(row[k])) < 0.005 for k in ("plain", "disarmed", "counting"))
    assert round(row["plain"]) < round(row["disarmed"]) < round(row["counting"]), row
    checks = result["cross_check"]
    assert [c["mode"] for c in checks] == ["plain", "disarmed", "counting"]
    assert all(abs(c["plugin"] - c["exec_log"]) < 0.005 for c in checks), checks


def test_refuses_too_few_iterations():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--iterations", "1000"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "at least" in proc.stderr
