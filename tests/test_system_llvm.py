"""Debian's libLLVM (a 110 MB shared object) with every function probed at entry: llc
and opt, unmodified, load it through LD_LIBRARY_PATH and produce the same output as
with the original, disarmed and armed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import urewrite
from urewrite.trampolines.region import read_regions

LLC, OPT = shutil.which("llc-14"), shutil.which("opt-14")
LIBRARY = Path("/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1")
pytestmark = pytest.mark.skipif(
    not (LLC and OPT and LIBRARY.exists()),
    reason="needs Debian's llvm-14 (llc-14, opt-14, libLLVM-14.so.1)")

IR = """
define i32 @square(i32 %x) {
  %r = mul i32 %x, %x
  ret i32 %r
}
define i32 @sum(i32 %n) {
entry:
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %next, %loop ]
  %acc = phi i32 [ 0, %entry ], [ %acc2, %loop ]
  %sq = call i32 @square(i32 %i)
  %acc2 = add i32 %acc, %sq
  %next = add i32 %i, 1
  %done = icmp eq i32 %next, %n
  br i1 %done, label %out, label %loop
out:
  ret i32 %acc2
}
"""


def test_llc_and_opt_run_as_with_the_original(tmp_path):
    libdir = tmp_path / "lib"
    libdir.mkdir()
    proc = urewrite(str(LIBRARY), "-p", "*", "-q", "--json", "-o", str(libdir / LIBRARY.name))
    assert proc.returncode == 0, proc.stderr
    source = tmp_path / "t.ll"
    source.write_text(IR)
    regions = tmp_path / "regions"
    regions.mkdir()

    def outputs(env=None) -> list:
        env = {**{k: v for k, v in os.environ.items() if k != "UREWRITE_DIR"}, **(env or {})}
        return [subprocess.run(cmd, capture_output=True, env=env, timeout=120)
                for cmd in ([LLC, "-O2", str(source), "-o", "-"],
                            [OPT, "-O3", "-S", str(source), "-o", "-"])]

    def key(runs) -> list:
        return [(r.returncode, r.stdout, r.stderr) for r in runs]

    original = outputs()
    assert all(r.returncode == 0 and r.stdout for r in original)
    assert key(outputs({"LD_LIBRARY_PATH": str(libdir)})) == key(original)
    armed = outputs({"LD_LIBRARY_PATH": str(libdir), "UREWRITE_DIR": str(regions)})
    assert key(armed) == key(original)
    found = read_regions(str(regions))
    assert len(found) == 2  # one per process
    assert all(sum(p.hits for p in r.probes) > 10000 for r in found)
