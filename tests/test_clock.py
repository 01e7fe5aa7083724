"""The clock of latencies and events on x86_64: a TSC reading paired with CLOCK_MONOTONIC
and the TSC's rate, in each region's header. The rate is measured (2 ms) only by the
first process of a region directory, which leaves it in the directory's clock file
(trampolines/region.py CLOCK_FILE) for the processes after it; a file that is not
whole, not this user's, or that the TSC disagrees with is measured again and replaced.

Checked on samples/service.c (nap() sleeps 3 ms, measured entry to return): each
region's pair and rate agree with another process's pair, within 1%; nap's samples lie
in the buckets of 3 ms, with `stat` and without a tracer.
"""

from __future__ import annotations

import os
import platform
import struct
import subprocess
import time
from pathlib import Path

import pytest

from conftest import clean_env, stat
from live_service import NAP_NS, build_service
from urewrite.trampolines import region as R

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="the clock file is the x86_64 runtime's")
NAPS = 3


def _run(probed: Path, directory: Path, latency: bool = True):
    """One run of the service with NAPS naps, armed in `directory` (calls timed, unless
    not `latency`): its region, and the clock fields of its header."""
    before = set(directory.glob("*" + R.FILE_SUFFIX))
    env = {R.ENV_VAR: str(directory), **({R.LATENCY_ENV_VAR: "1"} if latency else {})}
    proc = subprocess.run([probed], input=f"nap {NAPS}\nquit\n", capture_output=True,
                          text=True, env=clean_env(env), timeout=60)
    assert proc.returncode == 0 and proc.stdout == f"ok nap {NAPS}\n", proc
    (path,) = set(directory.glob("*" + R.FILE_SUFFIX)) - before
    return R.read_region(str(path)), _clock(path)


def _clock(path: Path):
    """(ref ticks, ref ns, hz, kind, ns_mult) from a region's header."""
    header = path.read_bytes()[:R.HEADER_SIZE]
    ticks, ns, hz = struct.unpack_from("<QQQ", header, R.OFF_CLOCK_REF_TICKS)
    (kind,) = struct.unpack_from("<I", header, R.OFF_CLOCK_KIND)
    (mult,) = struct.unpack_from("<Q", header, R.OFF_NS_MULT)
    return ticks, ns, hz, kind, mult


def _rate_between(a, b) -> float:
    """Ticks per second from one region's clock pair to another's."""
    return (b[0] - a[0]) * 1e9 / (b[1] - a[1])


def _check_naps(histogram) -> None:
    """NAPS samples, each 3 ms or a little more (a sleep may overrun under load)."""
    assert sum(histogram) == NAPS
    for k, count in enumerate(histogram):
        if count:  # bucket k: [2^(k-1), 2^k) ns
            assert 1 << k > NAP_NS and 1 << (k - 1) <= 8 * NAP_NS, (k, histogram)


def _nap_histogram(region: R.Region):
    return next(p.histogram for p in region.probes if p.name == "nap" and p.kind == "return")


def _clock_file(directory: Path):
    return R.CLOCK_FILE_FORMAT.unpack((directory / R.CLOCK_FILE).read_bytes())


@pytest.fixture(scope="module")
def probed(builder) -> Path:
    return build_service(builder)


def test_the_first_process_measures_the_rate_and_the_next_reads_it(probed, tmp_path):
    first, a = _run(probed, tmp_path)
    magic, hz, ticks, ns = _clock_file(tmp_path)
    assert magic == R.CLOCK_FILE_MAGIC and a[3] == R.CLOCK_TSC
    assert (ticks, ns, hz) == a[:3]  # the measuring process's rate and its later pair
    assert a[4] == (10**9 << 32) // hz
    time.sleep(0.05)
    second, b = _run(probed, tmp_path)
    assert b[2] == hz and b[4] == a[4]  # read, not measured again
    assert b[1] > a[1] + 40_000_000  # a pair of its own
    assert abs(_rate_between(a, b) - hz) < hz / 100
    _check_naps(_nap_histogram(first))
    _check_naps(_nap_histogram(second))


def _planted(directory: Path, good, **change) -> None:
    fields = dict(magic=R.CLOCK_FILE_MAGIC, hz=good[2], ticks=good[0], ns=good[1])
    fields.update(change)
    blob = R.CLOCK_FILE_FORMAT.pack(fields["magic"], fields["hz"], fields["ticks"],
                                    fields["ns"])
    path = directory / R.CLOCK_FILE
    path.unlink(missing_ok=True)
    path.write_bytes(blob[:fields.get("size", len(blob))])


BAD_FILES = {
    "a rate the TSC disagrees with": lambda g: dict(hz=g[2] * 2),
    "a rate off by 4%": lambda g: dict(hz=g[2] * 104 // 100),
    "a pair from the future": lambda g: dict(ns=g[1] + 10**12),
    "another magic": lambda g: dict(magic=b"URWCLOCX"),
    "a file cut short": lambda g: dict(size=24),
    "an implausible rate": lambda g: dict(hz=1000, ticks=g[0] - 1, ns=g[1]),
}


@pytest.mark.parametrize("what", sorted(BAD_FILES))
def test_a_wrong_clock_file_is_measured_again_and_replaced(probed, tmp_path, what):
    _, good = _run(probed, tmp_path)
    _planted(tmp_path, good, **BAD_FILES[what](good))
    planted = (tmp_path / R.CLOCK_FILE).read_bytes()
    time.sleep(0.01)
    region, b = _run(probed, tmp_path)
    assert abs(b[2] - good[2]) < good[2] / 100, what  # measured: the machine's rate
    assert abs(_rate_between(good, b) - b[2]) < b[2] / 100
    _check_naps(_nap_histogram(region))
    magic, hz, ticks, ns = _clock_file(tmp_path)  # replaced by the measuring process's
    assert (tmp_path / R.CLOCK_FILE).read_bytes() != planted
    assert (magic, ticks, ns, hz) == (R.CLOCK_FILE_MAGIC, *b[:3])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file another owner")
def test_another_users_clock_file_is_not_trusted(probed, tmp_path):
    _, good = _run(probed, tmp_path)
    _planted(tmp_path, good, hz=good[2] * 2)
    os.chown(tmp_path / R.CLOCK_FILE, 65534, 65534)
    os.chmod(tmp_path / R.CLOCK_FILE, 0o644)
    _, b = _run(probed, tmp_path)
    assert abs(b[2] - good[2]) < good[2] / 100


def test_latency_under_stat_uses_the_shared_rate(probed, tmp_path):
    script = tmp_path / "naps"
    script.write_text(f"nap {NAPS}\nquit\n")
    run = stat(["sh", "-c", f'"{probed}" < "{script}"; "{probed}" < "{script}"'], tmp_path,
               latency=True)
    assert run.proc.returncode == 0, run.proc.stderr
    (nap,) = [p for p in run.probes if p["name"] == "nap" and p["kind"] == "return"]
    assert nap["hits"] == 2 * NAPS
    buckets = [b for b in nap["histogram"] if b["count"]]
    assert sum(b["count"] for b in buckets) == 2 * NAPS
    # a nap is never shorter than asked; under load one may be much longer (a busy
    # machine's scheduler), so most, not all, must be near it: a wrong rate would put
    # every one of them far off
    assert all(b["hi_ns"] > NAP_NS for b in buckets), buckets
    near = sum(b["count"] for b in buckets if b["lo_ns"] <= 8 * NAP_NS)
    assert near >= 2 * NAPS - 1, buckets


def test_untimed_calls_need_no_clock(probed, tmp_path):
    """Latency not asked for (no event ring, no program): the set-up neither measures
    the clock (2 ms a process) nor reads or leaves a clock file; the counts are exact."""
    region, clock = _run(probed, tmp_path, latency=False)
    assert clock == (0, 0, 0, 0, 0)
    assert not (tmp_path / R.CLOCK_FILE).exists()
    nap = [p for p in region.probes if p.name == "nap"]
    assert [(p.kind, p.hits, p.histogram) for p in nap] == [("entry", NAPS, None),
                                                            ("return", NAPS, None)]
