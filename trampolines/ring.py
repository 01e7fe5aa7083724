"""Reads the event ring of a region (present under `urewrite trace`).

Writers claim a position with an atomic add on `head`, then its record by
moving the record's sequence from an even value below 2*pos+1 to 2*pos+1
(odd: being written), and publish it as 2*pos+2. A writer that finds its record
busy or already newer drops the event and counts it in `dropped`. So a reader
takes position `pos` only when the sequence reads 2*pos+2 before and after it
copies the record: no torn or duplicate event is ever delivered, and
head - delivered is exactly the number of events lost.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import List, Optional

from urewrite.trampolines import region as R

_RECORD = struct.Struct("<QQIII")


@dataclass
class Event:
    pid: int
    object: str
    probe: str
    kind: str
    ts_ns: int
    tid: int
    args: List[int]


class RingReader:
    """Follows one region file's ring; `poll()` returns the events completed since."""

    STALE_POLLS = 3  # an unfinished record passed by this many polls is given up

    def __init__(self, path: str):
        self.path = path
        fd = os.open(path, os.O_RDONLY)
        try:
            self.map = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.info = R.read_region(path)
        hdr = self.map
        self.ring = struct.unpack_from("<Q", hdr, R.OFF_RING)[0]
        self.entries = struct.unpack_from("<I", hdr, R.OFF_RING_ENTRIES)[0]
        self.ref_ticks, self.ref_ns, self.hz = struct.unpack_from("<QQQ", hdr,
                                                                  R.OFF_CLOCK_REF_TICKS)
        self.next = 0  # next position to deliver
        self.delivered = 0
        self._waiting = 0

    @property
    def has_ring(self) -> bool:
        return bool(self.ring and self.entries)

    def head(self) -> int:
        return struct.unpack_from("<Q", self.map, self.ring + R.RING_HEAD)[0]

    def dropped(self) -> int:
        return struct.unpack_from("<Q", self.map, self.ring + R.RING_DROPPED)[0]

    def lost(self) -> int:
        return self.head() - self.delivered

    def _ns(self, ticks: int) -> int:
        if not self.hz:  # opened during set-up: the clock is calibrated after the ring
            self.ref_ticks, self.ref_ns, self.hz = struct.unpack_from(
                "<QQQ", self.map, R.OFF_CLOCK_REF_TICKS)
        if not self.hz:
            return 0
        return self.ref_ns + (ticks - self.ref_ticks) * 1_000_000_000 // self.hz

    def poll(self, final: bool = False) -> List[Event]:
        """Events completed since the last poll; with `final` (the writer is gone),
        every position not complete by now counts as lost."""
        if not self.has_ring:
            return []
        events = []
        head = self.head()
        while self.next < head:
            pos = self.next
            if head - pos > self.entries:  # lapped: overwritten before we came
                self.next = head - self.entries
                continue
            at = self.ring + R.RING_RECORDS + (pos % self.entries) * R.RECORD_SIZE
            want = 2 * pos + 2
            seq, ticks, probe, tid, nargs = _RECORD.unpack_from(self.map, at)
            if seq != want:
                if seq > want or final or self._waiting >= self.STALE_POLLS:
                    self.next += 1  # overwritten, dropped, or never finished: lost
                    self._waiting = 0
                    continue
                self._waiting += 1  # still being written: look again next poll
                break
            args = list(struct.unpack_from(f"<{min(nargs, R.MAX_ARGS)}q", self.map,
                                           at + R.REC_ARGS))
            if struct.unpack_from("<Q", self.map, at)[0] != want:
                self.next += 1  # overwritten while we copied it: lost, not torn
                continue
            self._waiting = 0
            self.next += 1
            self.delivered += 1
            p = self.info.probes[probe] if probe < len(self.info.probes) else None
            events.append(Event(self.info.pid, self.info.object, p.name if p else str(probe),
                                p.kind if p else "?", self._ns(ticks), tid, args))
        return events

    def close(self) -> None:
        self.map.close()


def open_ring(path: str) -> Optional[RingReader]:
    """A reader for the region at `path`, or None while it is not set up yet."""
    try:
        reader = RingReader(path)
    except (OSError, ValueError, R.RegionError):
        return None
    return reader
