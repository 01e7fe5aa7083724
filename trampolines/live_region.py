"""Reads a region while its process runs: mapped read-only, never written.

`region.read_region` copies the file with pread, which is right once the
writer is gone. A live reader must instead load each counter with one
aligned 8-byte load, or a read racing with a carry (0x0ff -> 0x100) could see
half of each value and a counter would jump back and forth. numpy's arithmetic
on u64 elements of the 8-aligned mapping loads each element whole (x86_64 and
AArch64 access an aligned 8-byte element of a vector load single-copy atomically),
so every counter read is a value it really held, and totals only ever grow from
one read to the next. The probe table is parsed once per rewrite (region_reader's
TableCache), not once per file.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from urewrite.trampolines import region as R
from urewrite.trampolines.region_reader import Sums, TableCache, open_region_file, read_header


@dataclass(frozen=True)
class LiveProbe:
    name: str
    kind: str
    address: int
    histogram: int  # index among the row's latency histograms, -1 when none


@dataclass
class RegionCounts:
    """One read of a region: hits per probe (table order), latency buckets per
    probe that has a histogram, and the ring's, return-address and latency counters."""
    hits: List[int]
    histograms: List[Optional[List[int]]]
    ring_events: int  # events the writers took a position for (the ring's head)
    ring_dropped: int  # events a writer gave up because their record was busy
    returns_missed: int
    traced: bool = False  # the process has an event ring (it runs under trace)
    latency_missed: int = 0  # returns of measured functions that gave no latency sample
    timed: bool = False  # calls of functions probed at entry and return are timed


class NotReady(Exception):
    """The file exists but its process has not finished setting it up: try later."""


class LiveRegion:
    """A region file mapped read-only. Raises NotReady while it is being set up and
    RegionError when it is not a region this reader knows. `tables`: a cache shared
    by the regions a watcher opens (processes of one rewrite share a probe table)."""

    def __init__(self, path: str, tables: Optional[TableCache] = None):
        self.path = path
        tables = tables or TableCache()
        fd = open_region_file(path)  # (no symlink, FIFO or device: see region_reader)
        try:
            st = os.fstat(fd)
            self.inode = (st.st_dev, st.st_ino)
            if st.st_size < R.HEADER_SIZE:
                raise NotReady(path)  # created, not sized yet
            magic, pid = struct.unpack("<8s64xi", os.pread(fd, R.OFF_PID + 4, 0))
            if magic == b"\0" * 8 or pid == 0:
                raise NotReady(path)  # sized, template or pid not written yet
            self.header = read_header(fd, path, st.st_size)
            self._table = tables.table(fd, self.header, path)
            self.probes: Tuple[LiveProbe, ...] = tables.derived(self._table, "live", lambda: tuple(
                LiveProbe(*fields) for fields in zip(self._table.names, self._table.kinds,
                                                    self._table.addresses,
                                                    self._table.histograms)))
            self._map = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        h = self.header
        self.pid, self.machine, self.load_bias, self.object = h.pid, h.machine, h.load_bias, \
            h.object
        self.slots, self.count = h.slots, h.count

    def _sums(self, timed: bool) -> List[int]:
        """Each u64 of a row (counters, then histograms where calls are timed) summed
        over the rows in use and the shared row, every one read with one aligned 8-byte
        load (numpy's loads of u64 elements on an 8-aligned mapping)."""
        h = self.header
        in_use = h.row_words if timed else h.count
        words = np.frombuffer(self._map, dtype="<u8", count=len(self._map) // 8)
        try:
            owners = words[h.owners_off // 8:][:h.slots * R.OWNER_ENTRY_SIZE // 8]
            rows = np.flatnonzero(owners[::R.OWNER_ENTRY_SIZE // 8]).tolist() + [h.slots]
            sums = Sums(in_use)
            for slot in rows:
                start = (h.counters_off + slot * h.stride) // 8
                sums.add(0, words[start:start + in_use])
            return sums.values()
        finally:
            del words

    def read(self) -> RegionCounts:
        # (the flag is read each time: the set-up sets it after the pid a reader waits for)
        timed = R.timed(self._map)
        sums = self._sums(timed)
        hits = sums[:self.count]
        histograms: List[Optional[List[int]]] = []
        for p in self.probes:
            if p.histogram < 0 or not timed:
                histograms.append(None)
                continue
            base = self.count + R.LATENCY_BUCKETS * p.histogram
            histograms.append(sums[base:base + R.LATENCY_BUCKETS])
        ring = struct.unpack_from("<Q", self._map, R.OFF_RING)[0]
        words = memoryview(self._map)[:len(self._map) // 8 * 8].cast("Q")
        try:
            events = dropped = 0
            if ring and ring % 8 == 0 and ring + 16 <= len(self._map):
                events = words[(ring + R.RING_HEAD) // 8]
                dropped = words[(ring + R.RING_DROPPED) // 8]
            returns_missed = words[R.OFF_RETURNS_MISSED // 8]
            latency_missed = words[R.OFF_LATENCY_MISSED // 8]
        finally:
            words.release()
        return RegionCounts(hits, histograms, events, dropped, returns_missed, bool(ring),
                            latency_missed, timed)

    def close(self) -> None:
        self._map.close()


def open_live(path: str, tables: Optional[TableCache] = None) -> Optional[LiveRegion]:
    """A reader for `path`, or None while its process is still setting it up (or the
    file went away). RegionError for a file that is not a region we can read."""
    try:
        return LiveRegion(path, tables)
    except (NotReady, FileNotFoundError):
        return None
    except (OSError, ValueError) as e:  # unreadable, or mmap of an emptied file
        raise R.RegionError(f"{path}: {getattr(e, 'strerror', None) or e}")
