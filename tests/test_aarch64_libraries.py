"""Debian's AArch64 libraries (the cross packages' libc, libm, libstdc++ and libgcc_s)
with every function probed at entry and return, loaded under qemu by a C++ program
that works them (samples/library_workout.cc): its output as with the originals,
disarmed and armed, and the libraries' hits counted in each thread."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import cross
from conftest import SAMPLES, check, run, urewrite
from urewrite.trampolines.region import read_regions

pytestmark = cross.needs(cross.CXX, cross.QEMU)
# library -> hits the workout makes in it at least
LIBRARIES = {"libc.so.6": 100_000, "libstdc++.so.6": 5_000, "libm.so.6": 1,
             "libgcc_s.so.1": 50}


def test_libraries_with_every_function_probed_run_as_the_originals(tmp_path):
    cross.require_sysroot()
    program = tmp_path / "workout"
    check([cross.CXX, "-O2", "-pthread", SAMPLES / "library_workout.cc", "-o", program])
    libs = tmp_path / "lib"
    libs.mkdir()
    for name in LIBRARIES:
        original = Path(os.path.realpath(Path(cross.SYSROOT) / "lib" / name))
        if not original.exists():
            pytest.skip(f"no {name} in {cross.SYSROOT}/lib")
        out = urewrite(original, "-p", "*", "-r", "*", "-q", "--keep-going",
                       "-o", libs / name)
        assert out.returncode == 0, out.stderr
    want = check(cross.emulate(program))
    assert want.stdout.startswith("k00=") and want.stdout.endswith(" 999 3.142\n")
    disarmed = run(cross.emulate(program, libs))
    assert (disarmed.returncode, disarmed.stdout, disarmed.stderr) == (0, want.stdout, "")
    # armed through the environment qemu itself has: a shared object's set-up reads
    # /proc/self/environ (docs/design.md), which under qemu-user is qemu's
    regions = tmp_path / "regions"
    regions.mkdir()
    armed = run(cross.emulate(program, libs), env={"UREWRITE_DIR": str(regions)})
    assert (armed.returncode, armed.stdout, armed.stderr) == (0, want.stdout, "")
    counted = {r.object: (sum(p.hits for p in r.probes), r.threads)
               for r in read_regions(str(regions))}
    for name, least in LIBRARIES.items():
        assert counted[name][0] >= least, (name, counted)
    assert counted["libc.so.6"][1] == 5  # the main thread and the workout's four
