"""The C reader's view of a region (trampolines/urewrite.h) against region.py.

region.py is the single source of truth for the layout; these tests make sure
the header third parties include, and samples/read_region.c built on it, agree
with it: field by field, on a region built in Python, and on the regions a
rewritten program leaves behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from synthetic_region import PROBES, synthetic_region
from urewrite.trampolines import region

ROOT = Path(__file__).resolve().parents[1]
INCLUDE_DIR = ROOT / "trampolines"
HEADER = INCLUDE_DIR / "urewrite.h"
READER_SOURCE = ROOT / "samples" / "read_region.c"
GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed: cannot build C readers")

# struct urewrite_header field -> region.py offset, in declaration order
HEADER_FIELDS = {
    "magic": region.OFF_MAGIC,
    "version": region.OFF_VERSION,
    "header_size": region.OFF_HEADER_SIZE,
    "region_size": region.OFF_REGION_SIZE,
    "probe_count": region.OFF_PROBE_COUNT,
    "slot_count": region.OFF_SLOT_COUNT,
    "probes_offset": region.OFF_PROBES,
    "strings_offset": region.OFF_STRINGS,
    "owners_offset": region.OFF_OWNERS,
    "counters_offset": region.OFF_COUNTERS,
    "slot_stride": region.OFF_SLOT_STRIDE,
    "pid": region.OFF_PID,
    "machine": region.OFF_MACHINE,
    "load_bias": region.OFF_LOAD_BIAS,
    "build_id_size": region.OFF_BUILD_ID_SIZE,
    "flags": region.OFF_FLAGS,
    "build_id": region.OFF_BUILD_ID,
    "object": region.OFF_OBJECT,
    "ring_offset": region.OFF_RING,
    "ring_entries": region.OFF_RING_ENTRIES,
    "record_size": region.OFF_RECORD_SIZE,
    "clock_ref_ticks": region.OFF_CLOCK_REF_TICKS,
    "clock_ref_ns": region.OFF_CLOCK_REF_NS,
    "clock_hz": region.OFF_CLOCK_HZ,
    "clock_kind": region.OFF_CLOCK_KIND,
    "latency_count": region.OFF_LATENCY_COUNT,
    "ns_mult": region.OFF_NS_MULT,
    "returns_missed": region.OFF_RETURNS_MISSED,
    "latency_missed": region.OFF_LATENCY_MISSED,
    "go_calls_offset": region.OFF_GO_CALLS,
    "go_call_count": region.OFF_GO_CALL_COUNT,
}


def _compile(source: Path, output: Path, *flags: str) -> Path:
    command = [GCC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-I", str(INCLUDE_DIR), *flags,
               str(source), "-o", str(output)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stderr}"
    return output


def _struct_fields(fmt: str):
    """(offset, size) of each field of a little-endian struct format, in order."""
    fields, offset = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt.lstrip("<")):
        n = int(count) if count else 1
        if code in "sp":
            fields.append((offset, n))
            offset += n
        else:
            size = struct.calcsize("<" + code)
            for _ in range(n):
                fields.append((offset, size))
                offset += size
    return fields


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("region_header")


@pytest.fixture(scope="module")
def read_region(build_dir) -> Path:
    if GCC is None:
        pytest.skip("gcc is not installed: cannot build samples/read_region.c")
    return _compile(READER_SOURCE, build_dir / "read_region")


def _run_reader(reader: Path, paths):
    done = subprocess.run([str(reader), *map(str, paths)], capture_output=True, text=True)
    rows = []
    for line in done.stdout.splitlines():
        obj, name, kind, address, hits = line.split(" ")
        assert address.startswith("0x"), line
        rows.append((obj, name, kind, int(address, 16), int(hits)))
    return done.returncode, rows, done.stderr


def _python_rows(regions):
    return [(r.object, p.name, p.kind, p.address, p.hits) for r in regions for p in r.probes]


# --- the layout itself -------------------------------------------------------------

def test_asserted_offsets_are_region_py_offsets():
    """Every _Static_assert on a header field states region.py's OFF_* value."""
    text = HEADER.read_text()
    asserted = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"_Static_assert\(offsetof\(struct urewrite_header, (\w+)\) == (\d+)", text)}
    assert {k: v for k, v in asserted.items() if k != "reserved"} == HEADER_FIELDS
    assert asserted["reserved"] == region._HEADER.size
    size = re.search(r"#define UREWRITE_HEADER_SIZE (\d+)", text)
    assert size and int(size.group(1)) == region.HEADER_SIZE


def test_region_py_offsets_follow_its_struct_format():
    """OFF_* and the struct format that packs the header describe the same fields."""
    fields = _struct_fields(region._HEADER.format)
    assert [offset for offset, _ in fields] == list(HEADER_FIELDS.values())
    assert sum(size for _, size in fields) == region._HEADER.size


@needs_gcc
def test_compiled_layout_matches_region_py(build_dir):
    """What a C compiler makes of the header: offsets, sizes and constants."""
    lines = [f'    F({name});' for name in list(HEADER_FIELDS) + ["reserved"]]
    source = build_dir / "layout.c"
    source.write_text("\n".join([
        "#include <stdio.h>",
        '#include "urewrite.h"',
        "#define F(f) printf(\"field %s %zu %zu\\n\", #f, offsetof(struct urewrite_header, f), "
        "sizeof(((struct urewrite_header *)0)->f))",
        "#define N(x) printf(\"const %s %lld\\n\", #x, (long long)(x))",
        "int main(void) {",
        *lines,
        "    N(sizeof(struct urewrite_header)); N(sizeof(struct urewrite_probe));",
        "    N(offsetof(struct urewrite_probe, address)); N(offsetof(struct urewrite_probe, kind));",
        "    N(offsetof(struct urewrite_probe, name_offset));",
        "    N(sizeof(struct urewrite_slot_owner)); N(offsetof(struct urewrite_slot_owner, counters));",
        "    N(UREWRITE_VERSION); N(UREWRITE_HEADER_SIZE); N(sizeof(UREWRITE_MAGIC) - 1);",
        "    N(UREWRITE_KIND_ENTRY); N(UREWRITE_KIND_RETURN); N(UREWRITE_KIND_USDT);",
        "    N(UREWRITE_KIND_ADDRESS); N(UREWRITE_FLAG_LATENCY); N(UREWRITE_FLAG_LATENCY_ASKED);",
        "    printf(\"magic %s\\nenv %s\\nsuffix %s\\nlatency %s\\n\", UREWRITE_MAGIC,",
        "           UREWRITE_ENV_VAR, UREWRITE_FILE_SUFFIX, UREWRITE_LATENCY_ENV_VAR);",
        "    return 0;",
        "}",
        ""]))
    exe = _compile(source, build_dir / "layout", "-pedantic")
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    fields, consts, strings = {}, {}, {}
    for line in out.splitlines():
        what, rest = line.split(" ", 1)
        if what == "field":
            name, offset, size = rest.split(" ")
            fields[name] = (int(offset), int(size))
        elif what == "const":
            expression, value = rest.rsplit(" ", 1)
            consts[expression] = int(value)
        else:
            strings[what] = rest

    c_fields = [fields[name] for name in HEADER_FIELDS]
    assert [offset for offset, _ in c_fields] == list(HEADER_FIELDS.values())
    assert c_fields == _struct_fields(region._HEADER.format)  # sizes too
    assert fields["object"][1] == region.OBJECT_NAME_MAX + 1
    assert fields["reserved"] == (region._HEADER.size, region.HEADER_SIZE - region._HEADER.size)
    assert consts == {
        "sizeof(struct urewrite_header)": region.HEADER_SIZE,
        "sizeof(struct urewrite_probe)": region.PROBE_ENTRY_SIZE,
        "offsetof(struct urewrite_probe, address)": 0,
        "offsetof(struct urewrite_probe, kind)": 8,
        "offsetof(struct urewrite_probe, name_offset)": 12,
        "sizeof(struct urewrite_slot_owner)": region.OWNER_ENTRY_SIZE,
        "offsetof(struct urewrite_slot_owner, counters)": 8,
        "UREWRITE_VERSION": region.VERSION,
        "UREWRITE_HEADER_SIZE": region.HEADER_SIZE,
        "sizeof(UREWRITE_MAGIC) - 1": len(region.MAGIC),
        "UREWRITE_KIND_ENTRY": region.KIND_ENTRY,
        "UREWRITE_KIND_RETURN": region.KIND_RETURN,
        "UREWRITE_KIND_USDT": region.KIND_USDT,
        "UREWRITE_KIND_ADDRESS": region.KIND_ADDRESS,
        "UREWRITE_FLAG_LATENCY": region.FLAG_LATENCY,
        "UREWRITE_FLAG_LATENCY_ASKED": region.FLAG_LATENCY_ASKED,
    }
    assert strings == {"magic": region.MAGIC.decode(), "env": region.ENV_VAR,
                       "suffix": region.FILE_SUFFIX, "latency": region.LATENCY_ENV_VAR}


@needs_gcc
def test_header_builds_as_cxx(build_dir):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed")
    source = build_dir / "include.cc"
    source.write_text('#include "urewrite.h"\nint main() { return urewrite_check(0, 0) == 0; }\n')
    done = subprocess.run([gxx, "-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic",
                           "-I", str(INCLUDE_DIR), str(source), "-o", str(build_dir / "include")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --- a region written from Python --------------------------------------------------

def test_synthetic_region_reads_in_python(tmp_path):
    expected = synthetic_region(tmp_path / "server.probed-0123abcd.4242.ure")
    r = region.read_region(str(tmp_path / "server.probed-0123abcd.4242.ure"))
    assert (r.pid, r.object, r.machine, r.load_bias) == (4242, "server.probed", 62, 0x7F0000000000)
    assert r.build_id == bytes(range(20)).hex()
    assert r.threads == 3
    assert {p.name: p.hits for p in r.probes} == expected


def test_python_readers_sum_the_rows_in_use(tmp_path):
    """Both Python readers, after the process and while it runs, add up the rows of
    claimed slots and the shared row, histograms too; a row nobody claimed was never
    written, and is not read (a fully probed libc's region is 400 MB, nearly all
    rows of free slots)."""
    from urewrite.trampolines import live_region
    probes = PROBES[:2] + [region.ProbeInfo("send_reply", region.KIND_RETURN, 0x4011a0, 0)]
    template, layout = region.build_template(probes, "server.probed", b"", 62)
    data = bytearray(layout.region_size)
    data[:len(template)] = template
    struct.pack_into("<i", data, region.OFF_PID, 4242)
    hist = len(probes)  # (the histogram's first bucket: after the counters)
    values = {0: 1 << 57, 5: (1 << 57) + 3, layout.slot_count: 7}  # claimed rows, shared row
    for row, value in list(values.items()) + [(9, 1 << 40)]:  # row 9: no owner
        if row in (0, 5):
            struct.pack_into("<Q", data, layout.owners_offset + row * region.OWNER_ENTRY_SIZE,
                             0x7F00DEAD0000 + row)
        at = layout.counters_offset + row * layout.slot_stride
        for word in list(range(len(probes))) + [hist, hist + 63]:
            struct.pack_into("<Q", data, at + 8 * word, value * (word + 1))
    path = tmp_path / "server.probed-0123abcd.4242.ure"
    path.write_bytes(bytes(data))
    # calls not timed (latency not asked for): no histogram, whatever its words hold
    assert [p.histogram for p in region.read_region(str(path)).probes] == [None] * 3
    live = live_region.LiveRegion(str(path))
    try:
        assert live.read().histograms == [None] * 3
    finally:
        live.close()
    struct.pack_into("<I", data, region.OFF_FLAGS, region.FLAG_LATENCY_ASKED | region.FLAG_LATENCY)
    path.write_bytes(bytes(data))
    total = sum(values.values())
    expected_hits = [total * (i + 1) for i in range(len(probes))]
    expected_histogram = [total * (hist + 1)] + [0] * 62 + [total * (hist + 64)]
    assert total * (hist + 64) > 1 << 64  # (no wrap at 64 bits: Python's integers)

    after = region.read_region(str(path))
    assert [p.hits for p in after.probes] == expected_hits
    assert [p.histogram for p in after.probes] == [None, None, expected_histogram]
    assert after.threads == 2
    live = live_region.LiveRegion(str(path))
    try:
        counts = live.read()
    finally:
        live.close()
    assert counts.hits == expected_hits
    assert counts.histograms == [None, None, expected_histogram]
    # neither flag: a region of a file rewritten before latency was asked for (its
    # runtime timed every call), read as timed
    struct.pack_into("<I", data, region.OFF_FLAGS, 0)
    path.write_bytes(bytes(data))
    assert [p.histogram for p in region.read_region(str(path)).probes] == \
        [None, None, expected_histogram]


def test_reader_matches_python_on_a_synthetic_region(read_region, tmp_path):
    path = tmp_path / "server.probed-0123abcd.4242.ure"
    expected = synthetic_region(path)
    code, rows, err = _run_reader(read_region, [path])
    assert code == 0, err
    assert rows == _python_rows([region.read_region(str(path))])
    assert [(name, hits) for _, name, _, _, hits in rows] == list(expected.items())
    assert [kind for _, _, kind, _, _ in rows] == ["entry", "address", "return", "usdt", "7"]


def test_reader_refuses_bad_files(read_region, tmp_path):
    good = tmp_path / "good.1.ure"
    synthetic_region(good)
    data = good.read_bytes()

    def variant(name: str, blob: bytes) -> Path:
        path = tmp_path / name
        path.write_bytes(blob)
        return path

    def patched(offset: int, fmt: str, value) -> bytes:
        blob = bytearray(data)
        struct.pack_into(fmt, blob, offset, value)
        return bytes(blob)

    bad = {
        "empty": variant("empty.ure", b""),
        "not a region": variant("text.ure", b"hello, world\n" * 100),
        "zero magic": variant("zero.ure", bytes(len(data))),  # created, not yet filled in
        "truncated": variant("short.ure", data[:len(data) // 2]),
        "version 3": variant("v3.ure", patched(region.OFF_VERSION, "<I", 3)),
        "probes out of range": variant("probes.ure", patched(region.OFF_PROBE_COUNT, "<I", 1 << 28)),
        "counters out of range": variant("rows.ure", patched(region.OFF_SLOT_COUNT, "<I", 1 << 30)),
        "name out of range": variant("name.ure", patched(region.HEADER_SIZE + 12, "<I", 1 << 30)),
        "stride too small": variant("stride.ure", patched(region.OFF_SLOT_STRIDE, "<Q", 8)),
        "missing file": tmp_path / "missing.ure",
    }
    for why, path in bad.items():
        code, rows, err = _run_reader(read_region, [path])
        assert (code, rows) == (1, []), why
        assert err.startswith("read_region: "), why
    # a bad file among good ones: the good ones are still printed
    code, rows, _ = _run_reader(read_region, [good, bad["version 3"], good])
    assert code == 1 and len(rows) == 2 * len(PROBES)


# --- a rewritten program -----------------------------------------------------------

PROGRAM = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long sink;

/* noclone too: a clone would be called instead of the probed symbol */
__attribute__((noinline, noclone)) void urw_target(long x) { sink += x; }
__attribute__((noinline, noclone)) void urw_once(void) { sink -= 1; }

static void *loop(void *arg)
{
    long n = (long)arg;
    for (long i = 0; i < n; i++)
        urw_target(i);
    return NULL;
}

/* prog THREADS CALLS [CHILD_CALLS]: THREADS extra threads and main each call
 * urw_target CALLS times, then urw_once once; with CHILD_CALLS, a forked child
 * then calls urw_target that many times and its pid is printed. */
int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    long calls = argc > 2 ? atol(argv[2]) : 1000;
    long child_calls = argc > 3 ? atol(argv[3]) : -1;
    pthread_t tid[64];

    if (threads < 0 || threads > 64)
        return 2;
    for (int i = 0; i < threads; i++)
        if (pthread_create(&tid[i], NULL, loop, (void *)calls) != 0)
            return 3;
    loop((void *)calls);
    for (int i = 0; i < threads; i++)
        pthread_join(tid[i], NULL);
    urw_once();
    if (child_calls >= 0) {
        int status;
        pid_t pid = fork();
        if (pid < 0)
            return 4;
        if (pid == 0) {
            loop((void *)child_calls);
            _exit(0);
        }
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            return 5;
        printf("%d\n", (int)pid);
    }
    return 0;
}
"""

THREADS, CALLS, CHILD_CALLS = 4, 2500, 777


@pytest.fixture(scope="module")
def probed(build_dir):
    """The test program rewritten with probes on urw_*: (path, rewrite report)."""
    if GCC is None:
        pytest.skip("gcc is not installed: cannot build the program to rewrite")
    source = build_dir / "prog.c"
    source.write_text(PROGRAM)
    prog = _compile(source, build_dir / "prog", "-O2", "-pthread")
    out = build_dir / "prog.probed"
    done = subprocess.run([sys.executable, "-m", "urewrite", str(prog), "-p", "urw_*", "-o",
                           str(out), "--json"], capture_output=True, text=True, cwd=build_dir)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["refused"] == []
    return out, report


def _run_probed(probed_path: Path, regions: Path, *args: str):
    regions.mkdir()
    env = dict(os.environ, **{region.ENV_VAR: str(regions)})
    proc = subprocess.Popen([str(probed_path), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return proc.pid, out


def test_reader_matches_read_regions_on_a_run(read_region, probed, tmp_path):
    probed_path, report = probed
    regions = tmp_path / "regions"
    pid, _ = _run_probed(probed_path, regions, str(THREADS), str(CALLS))

    files = sorted(regions.iterdir())
    assert len(files) == 1  # one process, one rewritten object
    assert re.fullmatch(rf"prog\.probed-[0-9a-f]{{8}}\.{pid}\.ure", files[0].name), files[0].name
    python = region.read_regions(str(regions))
    assert python[0].pid == pid

    code, rows, err = _run_reader(read_region, files)
    assert code == 0, err
    assert rows == _python_rows(python)
    assert [(name, kind, address) for _, name, kind, address, _ in rows] == \
        [(p["name"], p["kind"], p["address"]) for p in report["probes"]]
    hits = {name: h for obj, name, _, _, h in rows}
    assert hits == {"urw_target": (THREADS + 1) * CALLS, "urw_once": 1}
    assert {obj for obj, *_ in rows} == {"prog.probed"}


def test_forked_child_writes_its_own_region(read_region, probed, tmp_path):
    probed_path, _ = probed
    regions = tmp_path / "regions"
    pid, out = _run_probed(probed_path, regions, "0", str(CALLS), str(CHILD_CALLS))
    child = int(out.strip())

    files = sorted(regions.iterdir())
    by_pid = {int(re.fullmatch(r"prog\.probed-[0-9a-f]{8}\.(\d+)\.ure", f.name).group(1)): f
              for f in files}
    assert sorted(by_pid) == sorted([pid, child])
    python = region.read_regions(str(regions))
    code, rows, err = _run_reader(read_region, files)
    assert code == 0, err
    assert rows == _python_rows(python)
    for r in python:
        hits = {p.name: p.hits for p in r.probes}
        if r.pid == pid:
            assert hits == {"urw_target": CALLS, "urw_once": 1}
        else:  # the child starts from zero in a region of its own
            assert r.pid == child
            assert hits == {"urw_target": CHILD_CALLS, "urw_once": 0}


def test_without_the_variable_nothing_is_written(probed, tmp_path):
    probed_path, _ = probed
    env = {k: v for k, v in os.environ.items() if k != region.ENV_VAR}
    done = subprocess.run([str(probed_path), "2", "100"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []
