"""A probe region written from Python, as a running process would leave it, for the
tests of the region readers (test_region_header, test_region_reader)."""

from __future__ import annotations

import struct
from pathlib import Path

from urewrite.trampolines import region

PROBES = [
    region.ProbeInfo("parse_request", region.KIND_ENTRY, 0x401136),
    region.ProbeInfo("parse_request+0x1c", region.KIND_ADDRESS, 0x401152),
    region.ProbeInfo("send_reply", region.KIND_RETURN, 0x4011a0),
    region.ProbeInfo("provider:mark", region.KIND_USDT, 0x4011f0),
    region.ProbeInfo("from_the_future", 7, 0xffffffffff600000),  # a kind this reader lacks
]


def synthetic_region(path: Path, pid: int = 4242, counts=None) -> dict:
    """A region as a running process would leave it; returns the expected hits."""
    template, layout = region.build_template(PROBES, "server.probed", bytes(range(20)), 62)
    data = bytearray(layout.region_size)
    data[:len(template)] = template
    struct.pack_into("<i", data, region.OFF_PID, pid)
    struct.pack_into("<q", data, region.OFF_LOAD_BIAS, 0x7F0000000000)
    expected = {p.name: 0 for p in PROBES}
    rows = counts or {0: 1, 3: 10, 200: 1 << 33, layout.slot_count: 1000}  # last row: shared
    for row, scale in rows.items():
        if row < layout.slot_count:  # a per-thread row has an owner
            struct.pack_into("<QQ", data, layout.owners_offset + row * region.OWNER_ENTRY_SIZE,
                             0x7F00DEAD0000 + row * 0x1000,
                             0x7F0000000000 + layout.counters_offset + row * layout.slot_stride)
        for i, probe in enumerate(PROBES):
            value = scale * (i + 1)
            struct.pack_into("<Q", data, layout.counters_offset + row * layout.slot_stride + 8 * i,
                             value)
            expected[probe.name] += value
    path.write_bytes(bytes(data))
    return expected
