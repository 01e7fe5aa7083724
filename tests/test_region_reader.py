"""trampolines/region_reader.py: what it refuses in a directory others may write to,
and that its sums (sparse files, several processes of one rewrite) are exact."""

from __future__ import annotations

import os
import struct
import threading

import pytest

from test_region_header import PROBES, _synthetic_region
from urewrite.trampolines import region, region_reader


def _region(path, pid=4242, counts=None):
    return _synthetic_region(path, pid, counts)


def test_symlinks_fifos_and_hard_links_are_skipped_with_a_line(tmp_path):
    d = tmp_path / "regions"
    d.mkdir()
    expected = _region(d / "server.probed-0123abcd.1.ure", pid=1)
    elsewhere = tmp_path / "elsewhere.ure"
    _region(elsewhere, pid=2)
    os.symlink(elsewhere, d / "link.2.ure")
    os.mkfifo(d / "fifo.3.ure")  # opened blocking, it would wait for a writer forever
    os.link(elsewhere, d / "hard.4.ure")
    done = {}
    reader = threading.Thread(target=lambda: done.update(
        problems=(p := []), regions=region_reader.collect(str(d), p)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the reader blocked on a FIFO"
    assert [r.pid for r in done["regions"]] == [1]
    assert {p.name: p.hits for p in done["regions"][0].probes} == expected
    problems = sorted(done["problems"])
    assert len(problems) == 3
    assert problems[0].startswith(str(d / "fifo.3.ure")) and "regular file" in problems[0]
    assert problems[1].startswith(str(d / "hard.4.ure")) and "one name" in problems[1]
    assert problems[2].startswith(str(d / "link.2.ure"))
    with pytest.raises(region.RegionError):
        region.read_region(str(d / "link.2.ure"))


@pytest.mark.parametrize("offset, fmt, value", [
    (region.OFF_PROBE_COUNT, "<I", 1 << 30),  # a table larger than any rewrite
    (region.OFF_SLOT_COUNT, "<I", 1 << 20),
    (region.OFF_SLOT_STRIDE, "<Q", 1 << 40),
    (region.OFF_OWNERS, "<Q", 1 << 50),
    (region.OFF_LATENCY_COUNT, "<I", 1000),  # more histograms than probes
    (region.OFF_STRINGS, "<Q", 100),  # names inside the probe table
])
def test_sizes_in_a_header_are_never_trusted(tmp_path, offset, fmt, value):
    """A sparse file can be as large as its writer likes: a header's sizes must
    agree with each other and with limits, or nothing is read."""
    path = tmp_path / "bad.1.ure"
    _region(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(fmt, value))
        f.truncate(1 << 38)  # (a hole: costs nothing)
    with pytest.raises(region.RegionError, match="truncated or inconsistent"):
        region.read_region(str(path))


def test_a_sparse_region_sums_only_its_data(tmp_path):
    """A region of 2,000 probes (rows of 16 KB) written only where a process would
    have written, the rest holes, as on tmpfs: the same hits as the file written out
    in full, and only the data is read."""
    probes = [region.ProbeInfo(f"f{i}", region.KIND_ENTRY, 0x1000 + 16 * i) for i in range(2000)]
    template, layout = region.build_template(probes, "big.probed", b"", 62)
    rows = {0: 5, 17: 1 << 40, 255: 3, layout.slot_count: 9}
    writes = [(0, template), (region.OFF_PID, struct.pack("<i", 7))]
    expected = {p.name: 0 for p in probes}
    for row, value in rows.items():
        if row < layout.slot_count:
            writes.append((layout.owners_offset + row * region.OWNER_ENTRY_SIZE,
                           struct.pack("<Q", 0x7F0000001000 + row)))
        at = layout.counters_offset + row * layout.slot_stride
        for i in (0, 1, 1000, 1999):  # (the row's first and last pages)
            writes.append((at + 8 * i, struct.pack("<Q", value * (i + 1))))
            expected[f"f{i}"] += value * (i + 1)
    full, sparse = tmp_path / "full.7.ure", tmp_path / "sparse.7.ure"
    blob = bytearray(layout.region_size)
    for at, data in writes:
        blob[at:at + len(data)] = data
    full.write_bytes(bytes(blob))
    with open(sparse, "wb") as f:
        f.truncate(layout.region_size)
        for at, data in writes:
            f.seek(at)
            f.write(data)
    assert os.stat(sparse).st_blocks * 512 < layout.region_size // 4
    for path in (full, sparse):
        r = region.read_region(str(path))
        assert {p.name: p.hits for p in r.probes} == expected
        assert r.threads == 3


def test_collect_adds_up_processes_of_one_rewrite(tmp_path):
    """stat's reader: the totals and their order are read_regions'; every process
    keeps its own entry (pid) for the process count."""
    d = tmp_path / "regions"
    d.mkdir()
    for pid in (11, 12, 13):
        _region(d / f"server.probed-0123abcd.{pid}.ure", pid=pid, counts={pid % 3: pid})
    other = [region.ProbeInfo("elsewhere", region.KIND_ENTRY, 0x1000)]
    template, layout = region.build_template(other, "other.probed", b"", 62)
    blob = bytearray(layout.region_size)
    blob[:len(template)] = template
    struct.pack_into("<i", blob, region.OFF_PID, 14)
    struct.pack_into("<Q", blob, layout.counters_offset + layout.slot_count * layout.slot_stride,
                     77)
    (d / "other.probed-89abcdef.14.ure").write_bytes(bytes(blob))

    def totals(regions):
        out = {}
        for r in regions:
            for p in r.probes:
                key = (r.object, p.name, p.kind, p.address)
                out[key] = out.get(key, 0) + p.hits
        return list(out.items())

    plain = region.read_regions(str(d))
    collected = region_reader.collect(str(d))
    assert totals(collected) == totals(plain)
    assert dict(totals(collected))[("other.probed", "elsewhere", "entry", 0x1000)] == 77
    assert dict(totals(collected))[("server.probed", "parse_request", "entry", 0x401136)] \
        == 11 + 12 + 13
    assert [(r.pid, r.object, r.threads) for r in collected] == \
        [(r.pid, r.object, r.threads) for r in plain]
    assert [len(r.probes) for r in collected] == [1, len(PROBES), 0, 0]
