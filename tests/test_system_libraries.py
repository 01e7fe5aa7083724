"""Debian shared libraries nobody here wrote (SQLite, OpenSSL's libcrypto, jq's, zlib),
with every function probed at entry and return, loaded through LD_LIBRARY_PATH by
Debian's programs: each workload runs exactly as with the original library, armed
(hits counted in the library) and disarmed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import SAMPLES, check, urewrite
from urewrite.trampolines.region import read_regions

LIBDIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")
SQL = ("create table t(a, b text); "
       "with recursive c(x) as (select 1 union all select x + 1 from c where x < 3000) "
       "insert into t select x, printf('%05d', x * 7 % 1000) from c; "
       "create index i on t(b); select count(*), sum(a), min(b), max(b) from t where b like '0%'; "
       "select b, count(*) from t group by b order by 2 desc, 1 limit 3;")
# library -> (program, its arguments, standard input, hits the library must count at least)
WORKLOADS = {
    "libsqlite3.so.0": ("sqlite3", [":memory:", SQL], "", 100_000),
    "libcrypto.so.3": ("openssl", ["enc", "-aes-256-cbc", "-pbkdf2", "-k", "secret", "-S",
                                   "0011223344556677", "-md", "sha256"], "the text " * 3000,
                       100_000),
    "libjq.so.1": ("jq", ["-c", "{s: ([range(2000)] | map(. * 3) | add), k: (.a | keys)}"],
                   '{"a": {"z": 1, "y": [1, 2, {"x": null}]}}', 100_000),
    "libz.so.1": (sys.executable, ["-c", "import sys, zlib; d = sys.stdin.buffer.read() * 50; "
                                         "c = zlib.compress(d, 9); print(len(c), "
                                         "zlib.decompress(c) == d, zlib.crc32(c))"],
                  "a line of text to squeeze\n" * 200, 1_000),
}


def _library(name: str):
    for directory in LIBDIRS:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return os.path.realpath(path)
    return None


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_library_with_every_function_probed_runs_as_the_original(name, tmp_path):
    program, args, stdin, least = WORKLOADS[name]
    path = _library(name)
    if path is None or shutil.which(program) is None:
        pytest.skip(f"needs Debian's {name} and {program}")
    libs = tmp_path / "libs"
    libs.mkdir()
    out = urewrite(path, "-p", "*", "-r", "*", "-q", "-o", str(libs / name))
    assert out.returncode == 0, out.stderr

    def execute(env):
        return subprocess.run([shutil.which(program), *args], input=stdin.encode(),
                              capture_output=True, env={**os.environ, **env}, timeout=120)

    original = execute({})
    assert original.returncode == 0, original.stderr
    disarmed = execute({"LD_LIBRARY_PATH": str(libs)})
    assert (disarmed.returncode, disarmed.stdout, disarmed.stderr) == \
        (original.returncode, original.stdout, original.stderr)
    regions = tmp_path / "regions"
    regions.mkdir()
    armed = execute({"LD_LIBRARY_PATH": str(libs), "UREWRITE_DIR": str(regions)})
    assert (armed.returncode, armed.stdout, armed.stderr) == \
        (original.returncode, original.stdout, original.stderr)
    hits = sum(p.hits for r in read_regions(str(regions)) if r.object == name
               for p in r.probes)
    assert hits >= least, hits


def test_cxx_libraries_with_every_function_probed_run_as_the_originals(tmp_path):
    """libstdc++, libm and libgcc_s (its unwinder: the workout throws) rewritten whole,
    loaded by a C++ workout (samples/library_workout.cc) with four threads."""
    names = {"libstdc++.so.6": 5_000, "libm.so.6": 1, "libgcc_s.so.1": 50}
    if shutil.which("g++") is None or any(_library(n) is None for n in names):
        pytest.skip("needs g++ and Debian's libstdc++, libm and libgcc_s")
    program = tmp_path / "workout"
    check(["g++", "-O2", "-pthread", SAMPLES / "library_workout.cc", "-o", program])
    libs = tmp_path / "libs"
    libs.mkdir()
    for name in names:
        out = urewrite(_library(name), "-p", "*", "-r", "*", "-q", "-o", str(libs / name))
        assert out.returncode == 0, out.stderr
    want = check([program])
    assert want.stdout.endswith(" 999 3.142\n")
    for env in ({}, {"UREWRITE_DIR": str(tmp_path)}):
        got = subprocess.run([program], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "LD_LIBRARY_PATH": str(libs), **env})
        assert (got.returncode, got.stdout, got.stderr) == (0, want.stdout, "")
    counted = {r.object: sum(p.hits for p in r.probes) for r in read_regions(str(tmp_path))}
    for name, least in names.items():
        assert counted.get(name, 0) >= least, (name, counted)
