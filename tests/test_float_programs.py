"""Floating-point values in probe programs, end to end: samples/programs/floats.c
rewritten with the probes a program names, run under `urewrite run` and built in
(`stat`), on x86_64 (-O0, -O2, non-PIE, static) and arm64 under qemu (-O0, -O2):
the maps must be the ones the sample computes itself. bpftrace has no floating point
(its arguments are the integer registers), so the sample is the reference here; the
meaning of each operation is held to C's over awkward values in test_program_code.py
and test_aarch64_program_code.py."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

import pytest

from conftest import urewrite
from cross import CC, QEMU, emulate, missing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "samples", "programs", "floats.c")
CALLS = 1000

PROGRAM = """
uprobe:{path}:scale /farg0 > 0.5/ {{ @big = count(); @whole = sum(farg0); }}
uprobe:{path}:scale {{ @k[arg0, farg1 < 0] = count(); }}
uretprobe:{path}:scale {{ @neg = sum(fretval < 0); @rmax = max(fretval); }}
uprobe:{path}:shrink {{ @fsmall = sum((float)farg0 < -0.5); @fb[(float)farg1] = count(); }}
uretprobe:{path}:shrink {{ @fr = sum((float)fretval >= 0.1); }}
uprobe:{path}:weigh {{ @w = sum(*(double *)(arg0 + 8)); @ratio = sum(*(float *)(arg0 + 16) > 0.3); }}
uprobe:{path}:spread {{ @last = farg7; @h = sum(farg7); }}
"""
# (with `run` only: a program that prints is not built in)
PRINTF = """uprobe:{path}:spread /farg7 == 2.5/ {{ printf("spread %.2f %g %e\\n", farg7, farg0, farg6); }}"""
PRINTED = "spread 2.50 1 7.000000e+00"
BUILDS = {"x86_64 -O0": ["-O0"], "x86_64 -O2": ["-O2"],
          "x86_64 -O2 no-pie": ["-O2", "-no-pie", "-fno-pie"],
          "x86_64 -O2 static": ["-O2", "-static"], "arm64 -O0": ["-O0"], "arm64 -O2": ["-O2"]}


def _maps(text: str) -> dict:
    return dict(line.split(": ", 1) for line in text.splitlines() if line.startswith("@"))


@pytest.fixture(scope="module", params=sorted(BUILDS))
def built(request, tmp_path_factory):
    arm64 = request.param.startswith("arm64")
    if arm64 and missing(CC, QEMU):
        pytest.skip("needs the arm64 cross compiler and qemu-aarch64")
    if not arm64 and (platform.machine() != "x86_64" or shutil.which("gcc") is None):
        pytest.skip("needs gcc on x86_64")
    work = tmp_path_factory.mktemp(request.param.replace(" ", "_"))
    plain, rewritten = work / "floats", work / "floats.probed"
    proc = subprocess.run([CC if arm64 else "gcc", *BUILDS[request.param], SAMPLE, "-o",
                           str(plain)], capture_output=True, text=True)
    if proc.returncode != 0 and "-static" in BUILDS[request.param]:
        pytest.skip(f"no static libc: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr
    proc = urewrite(str(plain), "-e", PROGRAM.format(path=rewritten), "-o", str(rewritten),
                    "-q")
    assert proc.returncode == 0, proc.stderr
    run = emulate if arm64 else (lambda path: [str(path)])
    printed = subprocess.run(run(plain) + [str(CALLS)], capture_output=True, text=True,
                             check=True).stdout
    expected = _maps(printed)
    assert len(expected) == 22, printed  # (the sample's own lines: all of them)
    return run(rewritten), (PROGRAM + PRINTF).format(path=rewritten), expected


def test_loaded_by_run_floats_read_as_the_sample_computes(built):
    command, program, expected = built
    ran = urewrite("run", "-e", program, "--", *command, str(CALLS))
    assert ran.returncode == 0, ran.stderr
    printed, maps = ran.stdout.split("\n\n\n", 1)
    assert _maps(maps) == expected
    assert printed.count(PRINTED) == 1, printed


def test_built_in_floats_read_as_the_sample_computes(built):
    command, _, expected = built
    proc = urewrite("stat", "--", *command, str(CALLS))
    assert proc.returncode == 0, proc.stderr
    program_part = proc.stdout.split("the program built into the probes:", 1)[1]
    assert _maps(program_part) == expected


COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "gt": ">", "le": "<=", "ge": ">="}


def _holds(op: str, a: float, b: float) -> bool:
    return {"==": a == b, "!=": a != b, "<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]


@pytest.mark.parametrize("machine", ["x86_64", "arm64"])
def test_leading_float_predicates_of_every_comparison(tmp_path, machine):
    """A filter on a floating-point register and a number (`/farg0 > 0.5/`) is decided by
    the direct entry before it saves anything (the code shared with the programs'
    fcompare): each comparison, of a double and of a float against a constant the float
    cannot hold, against the calls the sample makes."""
    import struct
    arm64 = machine == "arm64"
    if arm64 and missing(CC, QEMU) or not arm64 and (platform.machine() != "x86_64" or
                                                     shutil.which("gcc") is None):
        pytest.skip(f"needs {'the arm64 cross compiler and qemu' if arm64 else 'gcc on x86_64'}")
    plain, rewritten = tmp_path / "floats", tmp_path / "floats.probed"
    subprocess.run([CC if arm64 else "gcc", "-O2", SAMPLE, "-o", str(plain)], check=True)
    proc = urewrite(str(plain), "-p", "scale", "-p", "shrink", "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    command = emulate(rewritten) if arm64 else [str(rewritten)]
    xs = [(i - CALLS // 2) * 0.37 for i in range(CALLS)]  # (as the sample computes them)
    halves = [struct.unpack("<f", struct.pack("<f", x))[0] * 0.5 for x in xs]
    for name, op in COMPARISONS.items():
        program = (f"uprobe:{rewritten}:scale /farg0 {op} 0.74/ {{ @d_{name} = count(); }} "
                   f"uprobe:{rewritten}:shrink /(float)farg0 {op} 0.3/ {{ @f_{name} = count(); }}")
        ran = urewrite("run", "-e", program, "--", *command, str(CALLS))
        assert ran.returncode == 0, ran.stderr
        maps = _maps(ran.stdout.split("\n\n\n", 1)[1])
        assert maps.get(f"@d_{name}", "0") == str(sum(_holds(op, x, 0.74) for x in xs)), name
        assert maps.get(f"@f_{name}", "0") == str(sum(_holds(op, h, 0.3) for h in halves)), name
