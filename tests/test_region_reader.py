"""trampolines/region_reader.py: what it refuses in a directory others may write to,
and that its sums (sparse files, several processes of one rewrite) are exact."""

from __future__ import annotations

import os
import struct
import threading

import pytest

from synthetic_region import PROBES, synthetic_region
from urewrite.trampolines import region, region_reader


def _region(path, pid=4242, counts=None):
    return synthetic_region(path, pid, counts)


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


def _table_one_by_one(blob, header):
    """The probe table read a probe at a time, as the reader once did: what the
    reader's table must equal, and the same first error."""
    names_block = blob[header.strings_off - header.probes_off:]
    out = []
    for i in range(header.count):
        address, kind, name_off = struct.unpack_from("<QII", blob, 16 * i)
        end = names_block.find(b"\0", name_off)
        if end < 0 or name_off > len(names_block):
            return "truncated or inconsistent region"
        name = names_block[name_off:end].decode(errors="replace")
        if (kind >> 16) > header.latency_count:
            return f"probe {name} names a missing histogram"
        out.append((name, region.KIND_NAMES.get(kind & region.KIND_MASK, str(kind & 0xFF)),
                    address, (kind >> 16) - 1))
    return out


@pytest.mark.parametrize("case", ["ascii", "utf8", "invalid utf8", "shared suffix",
                                  "past the end", "unterminated", "missing histogram",
                                  "odd kind", "no names"])
def test_probe_tables_read_as_one_name_at_a_time(case):
    """parse_table looks names up at C speed; each of these tables reads as it would a
    probe at a time: names (non-ASCII, invalid UTF-8, an offset inside another name),
    kinds, histograms, and the first probe that is wrong."""
    names = [f"f{i}".encode() for i in range(50)]
    if case == "utf8":
        names[3] = "späť".encode()
    if case == "invalid utf8":
        names[4] = b"bad\xe2\x82"
        names[5] = b"\xff\xfe"
    block = b"".join(n + b"\0" for n in names)
    offsets = [sum(len(n) + 1 for n in names[:i]) for i in range(len(names))]
    kinds = [region.KIND_ENTRY if i % 2 else region.KIND_RETURN | (1 + i // 2) << 16
             for i in range(len(names))]
    if case == "shared suffix":
        offsets[7] = offsets[12] + 1  # "12" inside "f12"
    if case == "past the end":
        offsets[9] = len(block) + 5
    if case == "unterminated":
        block += b"tail"
        offsets[10] = len(block) - 4
    if case == "missing histogram":
        kinds[20] = region.KIND_RETURN | 99 << 16
        offsets[30] = len(block) + 1  # (later: the histogram is the first error)
    if case == "odd kind":
        kinds[2] = 77
    if case == "no names":
        block, offsets = b"abc", [0] * len(names)
    table = b"".join(struct.pack("<QII", 0x1000 + 16 * i, kinds[i], offsets[i])
                     for i in range(len(names)))
    blob = table + block
    header = region_reader.Header(len(names), 0, 512, 512 + len(table), 0, 0, 0, 1, 62, 0,
                                  "", "x", 25, 0, 0, ())
    expected = _table_one_by_one(blob, header)
    if isinstance(expected, str):
        with pytest.raises(region.RegionError, match=expected):
            region_reader.parse_table(blob, header, "x.ure")
        return
    t = region_reader.parse_table(blob, header, "x.ure")
    assert list(zip(t.names, t.kinds, t.addresses, t.histograms)) == expected


@pytest.mark.parametrize("numpy_words", [0, 1 << 30])
def test_sums_are_exact_in_numpy_and_in_python(tmp_path, monkeypatch, numpy_words):
    """Long rows are added up by numpy, short ones in Python (region_reader.NUMPY_WORDS):
    either way the totals are exact, past 2^64 too (a word of several processes or
    rows may hold anything), latency histograms included."""
    monkeypatch.setattr(region_reader, "NUMPY_WORDS", numpy_words)
    probes = PROBES[:2] + [region.ProbeInfo("send_reply", region.KIND_RETURN, 0x4011a0, 0)]
    template, layout = region.build_template(probes, "server.probed", b"", 62)
    d = tmp_path / "regions"
    d.mkdir()
    big = (1 << 64) - 3
    expected_hits, expected_bucket = [0, 0, 0], 0
    for pid in (21, 22, 23):
        blob = bytearray(layout.region_size)
        blob[:len(template)] = template
        struct.pack_into("<i", blob, region.OFF_PID, pid)
        struct.pack_into("<I", blob, region.OFF_FLAGS, region.FLAG_LATENCY)  # calls timed
        for row in (5, layout.slot_count):
            if row < layout.slot_count:
                struct.pack_into("<Q", blob, layout.owners_offset + row * region.OWNER_ENTRY_SIZE,
                                 0x7F0000001000)
            at = layout.counters_offset + row * layout.slot_stride
            for i, value in enumerate((big, pid, big - pid)):
                struct.pack_into("<Q", blob, at + 8 * i, value)
                expected_hits[i] += value
            struct.pack_into("<Q", blob, at + 8 * (3 + 7), big)  # histogram bucket 7
            expected_bucket += big
        (d / f"server.probed-0123abcd.{pid}.ure").write_bytes(bytes(blob))
    (first, *_) = region_reader.collect(str(d))
    assert [p.hits for p in first.probes] == expected_hits
    assert first.probes[2].histogram[7] == expected_bucket
    assert sum(first.probes[2].histogram) == expected_bucket
    assert max(expected_hits) > 1 << 65


def test_tables_prepared_while_the_command_runs(tmp_path):
    """TableCache.prepare (stat, while its command runs) parses a rewrite's table once
    its process has set the region up (pid written), and reading after it gives what
    reading from scratch gives; a file not set up, or no region, is left for then."""
    d = tmp_path / "regions"
    d.mkdir()
    setting_up = d / "server.probed-0123abcd.9.ure"
    _region(setting_up, pid=0)
    junk = d / "junk.10.ure"
    junk.write_bytes(b"not a region")
    tables = region_reader.TableCache()
    assert not tables.prepare(str(setting_up)) and not tables.prepare(str(junk))
    assert not tables.prepare(str(d / "gone.11.ure"))
    junk.unlink()
    _region(setting_up, pid=9)
    for pid in (12, 13):
        _region(d / f"server.probed-0123abcd.{pid}.ure", pid=pid, counts={pid % 3: pid})
    assert tables.prepare(str(setting_up))
    assert len(tables.by_template) == 1
    broken = d / "other.probed-89abcdef.14.ure"  # set up, its names cut short
    probes = [region.ProbeInfo("f", region.KIND_ENTRY, 0x1000)]
    template, layout = region.build_template(probes, "other.probed", b"", 62)
    blob = bytearray(layout.region_size)
    blob[:len(template)] = template
    struct.pack_into("<i", blob, region.OFF_PID, 14)
    struct.pack_into("<I", blob, layout.probes_offset + 12, 1 << 20)  # (name offset)
    broken.write_bytes(bytes(blob))
    assert tables.prepare(str(broken))  # (nothing more to do: not tried again)
    assert sum(len(parsed) for parsed in tables.by_template.values()) == 1
    problems = []
    region_reader.collect(str(d), problems, tables)
    assert len(problems) == 1 and problems[0].startswith(str(broken))
    broken.unlink()
    fresh, prepared = region_reader.collect(str(d)), region_reader.collect(str(d), None, tables)
    assert [(r.pid, [(p.name, p.hits) for p in r.probes]) for r in prepared] == \
        [(r.pid, [(p.name, p.hits) for p in r.probes]) for r in fresh]


@pytest.mark.parametrize("packed_rows", [1, 2, 255])
def test_python_sums_of_packed_and_word_by_word_rows(packed_rows, monkeypatch):
    """ListSums adds rows of words under 2^56 as one integer, PACKED_ROWS at a time,
    other rows word by word: mixed, at offsets, the totals are exact."""
    monkeypatch.setattr(region_reader.ListSums, "PACKED_ROWS", packed_rows)
    sums, expected = region_reader.ListSums(4), [0] * 12
    # (made for 4 words, as for an untimed region's counters: a timed region's
    # histograms after them make the sums grow)
    rows = [(0, [1, 2, 3]), (2, [(1 << 56) - 1] * 7), (4, [1 << 56, 5]),
            (0, [0] * 9), (1, [(1 << 64) - 1] * 8), (6, [7, 8, 9])] * 3
    for first, words in rows:
        sums.add_bytes(first, memoryview(struct.pack(f"<{len(words)}Q", *words)))
        for i, w in enumerate(words):
            expected[first + i] += w
    assert sums.values(12) == expected and sums.values(3) == expected[:3]


def test_a_table_compared_while_the_command_runs_is_not_read_again(tmp_path, monkeypatch):
    """A region whose table prepare() compared is not read again after the run; a file
    in its place (here the same inode, rewritten by another pid with other names) is."""
    d = tmp_path / "regions"
    d.mkdir()
    first, second = d / "server.probed-0123abcd.12.ure", d / "server.probed-0123abcd.13.ure"
    _region(first, pid=12)
    _region(second, pid=13)
    tables = region_reader.TableCache()
    assert tables.prepare(str(first)) and tables.prepare(str(second))
    reads = []
    real = region_reader._pread_exact
    monkeypatch.setattr(region_reader, "_pread_exact",
                        lambda fd, size, offset, path: reads.append((size, offset)) or
                        real(fd, size, offset, path))
    lead, = [r for r in region_reader.collect(str(d), None, tables) if r.probes]
    fd = os.open(second, os.O_RDONLY)
    try:
        header = region_reader.read_header(fd, str(second), os.path.getsize(second))
    finally:
        os.close(fd)
    table_read = (header.owners_off - header.probes_off, header.probes_off)
    assert table_read not in reads
    assert [p.name for p in lead.probes] == [p.name for p in PROBES]
    # the same file, its names changed in place by another process (pid 14)
    blob = bytearray(second.read_bytes())
    at = blob.index(b"send_reply")
    blob[at:at + len(b"send_reply")] = b"SEND_REPLY"
    struct.pack_into("<i", blob, region.OFF_PID, 14)
    with open(second, "r+b") as f:
        f.write(blob)
    regions = region_reader.collect(str(d), None, tables)
    assert table_read in reads
    assert [r.pid for r in regions] == [12, 14]
    assert len(tables.by_template[header.template_key]) == 2  # (parsed: not the same bytes)
