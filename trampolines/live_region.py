"""Reads a region while its process runs: mapped read-only, never written.

`region.read_region` unpacks the file byte by byte, which is right once the
writer is gone. A live reader must instead load each counter with one
aligned 8-byte load, or a read racing with a carry (0x0ff -> 0x100) could see
half of each value and a counter would jump back and forth. A memoryview cast
to "Q" over the mapping loads whole words (as the ring reader does), so every
counter read is a value it really held, and totals only ever grow from one
read to the next.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import List, Optional, Tuple

from urewrite.trampolines import region as R
from urewrite.trampolines.region_reader import open_region_file

_HEADER = struct.Struct("<8sIIQIIQQQQQiIqII32s256s")


@dataclass(frozen=True)
class LiveProbe:
    name: str
    kind: str
    address: int
    histogram: int  # index among the row's latency histograms, -1 when none


@dataclass
class RegionCounts:
    """One read of a region: hits per probe (table order), latency buckets per
    probe that has a histogram, and the ring and return-address counters."""
    hits: List[int]
    histograms: List[Optional[List[int]]]
    ring_events: int  # events the writers took a position for (the ring's head)
    ring_dropped: int  # events a writer gave up because their record was busy
    returns_missed: int
    traced: bool = False  # the process has an event ring (it runs under trace)


class NotReady(Exception):
    """The file exists but its process has not finished setting it up: try later."""


class LiveRegion:
    """A region file mapped read-only. Raises NotReady while it is being set up and
    RegionError when it is not a region this reader knows."""

    def __init__(self, path: str):
        self.path = path
        fd = open_region_file(path)  # (no symlink, FIFO or device: see region_reader)
        try:
            st = os.fstat(fd)
            self.inode = (st.st_dev, st.st_ino)
            if st.st_size < R.HEADER_SIZE:
                raise NotReady(path)  # created, not sized yet
            self._map = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        try:
            self._read_header()
        except BaseException:
            self._map.close()
            raise
        self._words = memoryview(self._map)[:len(self._map) // 8 * 8].cast("Q")

    def _read_header(self) -> None:
        data = self._map
        (magic, version, _, size, count, slots, probes_off, strings_off, owners_off,
         counters_off, stride, pid, machine, bias, _, _, _, obj) = _HEADER.unpack_from(data)
        if magic == b"\0" * 8 or pid == 0:
            raise NotReady(self.path)  # sized, template or pid not copied in yet
        if magic != R.MAGIC:
            raise R.RegionError(f"{self.path}: not a urewrite region")
        if version != R.VERSION:
            raise R.RegionError(f"{self.path}: region version {version}, this reader knows "
                                f"{R.VERSION}")
        latency_count = struct.unpack_from("<I", data, R.OFF_LATENCY_COUNT)[0]
        if size > len(data) or counters_off + (slots + 1) * stride > len(data) \
                or strings_off > owners_off or owners_off % 8 \
                or owners_off + slots * R.OWNER_ENTRY_SIZE > len(data) \
                or probes_off + count * R.PROBE_ENTRY_SIZE > strings_off \
                or R.row_bytes(count, latency_count) > stride \
                or counters_off % 8 or stride % 8:
            raise R.RegionError(f"{self.path}: truncated or inconsistent region")
        self.pid, self.machine, self.load_bias = pid, machine, bias
        self.object = obj.split(b"\0")[0].decode(errors="replace")
        self.slots, self.count = slots, count
        self._counters, self._stride = counters_off // 8, stride // 8
        self._owners, self._owner_words = owners_off // 8, R.OWNER_ENTRY_SIZE // 8
        self._row_words = count + R.LATENCY_BUCKETS * latency_count
        probes = []
        for i in range(count):
            address, kind, name_off = struct.unpack_from("<QII", data,
                                                          probes_off + i * R.PROBE_ENTRY_SIZE)
            start = strings_off + name_off
            end = data.find(b"\0", start, owners_off)
            if end < 0:
                raise R.RegionError(f"{self.path}: truncated or inconsistent region")
            name = data[start:end].decode(errors="replace")
            histogram = (kind >> 16) - 1
            if histogram >= latency_count:
                raise R.RegionError(f"{self.path}: probe {name} names a missing histogram")
            kind &= R.KIND_MASK
            probes.append(LiveProbe(name, R.KIND_NAMES.get(kind, str(kind)), address, histogram))
        self.probes: Tuple[LiveProbe, ...] = tuple(probes)

    def _sums(self) -> List[int]:
        """Each u64 of a row (counters, then histograms) summed over the rows in use
        and the shared row, every one read with one 8-byte load."""
        owners = self._words[self._owners:self._owners + self._owner_words * self.slots:
                             self._owner_words]
        try:
            rows = R.claimed_slots(owners.tolist()) + [self.slots]
        finally:
            owners.release()
        return R.sum_rows(self._row(slot) for slot in rows)

    def _row(self, slot: int) -> List[int]:
        start = self._counters + slot * self._stride
        row = self._words[start:start + self._row_words]
        try:
            return row.tolist()
        finally:
            row.release()

    def read(self) -> RegionCounts:
        sums = self._sums()
        hits = sums[:self.count]
        histograms: List[Optional[List[int]]] = []
        for p in self.probes:
            if p.histogram < 0:
                histograms.append(None)
                continue
            base = self.count + R.LATENCY_BUCKETS * p.histogram
            histograms.append(sums[base:base + R.LATENCY_BUCKETS])
        ring = self._words[R.OFF_RING // 8]
        events = dropped = 0
        if ring and ring % 8 == 0 and ring + 16 <= len(self._map):
            events = self._words[(ring + R.RING_HEAD) // 8]
            dropped = self._words[(ring + R.RING_DROPPED) // 8]
        return RegionCounts(hits, histograms, events, dropped,
                            self._words[R.OFF_RETURNS_MISSED // 8], bool(ring))

    def close(self) -> None:
        self._words.release()
        self._map.close()


def open_live(path: str) -> Optional[LiveRegion]:
    """A reader for `path`, or None while its process is still setting it up (or the
    file went away). RegionError for a file that is not a region we can read."""
    try:
        return LiveRegion(path)
    except (NotReady, FileNotFoundError):
        return None
    except (OSError, ValueError) as e:  # unreadable, or mmap of an emptied file
        raise R.RegionError(f"{path}: {getattr(e, 'strerror', None) or e}")
