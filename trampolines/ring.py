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
import time
from dataclasses import dataclass
from typing import List, Optional

from urewrite.trampolines import region as R
from urewrite.trampolines.region_reader import open_region_file

# sequence, ticks, probe, tid, argument count, then the arguments
_RECORD = struct.Struct(f"<QQIII4x{R.MAX_ARGS}q{R.RECORD_SIZE - R.REC_ARGS - 8 * R.MAX_ARGS}x")
_WORDS_PER_RECORD = R.RECORD_SIZE // 8


@dataclass
class Event:
    pid: int
    object: str
    probe: str
    kind: str
    ts_ns: int
    tid: int
    args: List[int]
    address: int = 0  # the probe's, as in the region's probe table (a return probe: its function's)
    # an entry or return event of a function probed at both: each pair bounds one call
    paired: bool = False
    after_loss: bool = False  # events of this ring were lost just before this one
    number: int = -1  # the probe number the record holds (a probe program's printf: its own)


class RingReader:
    """Follows one region file's ring; `poll()` returns the events completed since."""

    # an unfinished record is given up once this many polls and this long have passed
    # it by: its writer may only be descheduled (a busy machine, threads under qemu
    # were seen stalled past 30 ms), and then it finishes the record later
    STALE_POLLS = 3
    STALE_SECONDS = 1.0
    clock = staticmethod(time.monotonic)

    def __init__(self, path: str):
        self.path = path
        fd = open_region_file(path)  # (no symlink, FIFO or device: see region_reader)
        try:
            self.map = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._words = memoryview(self.map)[:len(self.map) // 8 * 8].cast("Q")
        hdr = self.map
        # the ring first: set-up stores it after the rest of the header, so the rest
        # is complete once it is there (read before it, the header may still be being
        # copied: pid 0, names half written)
        self.ring = struct.unpack_from("<Q", hdr, R.OFF_RING)[0]
        self.entries = struct.unpack_from("<I", hdr, R.OFF_RING_ENTRIES)[0]
        self.info = R.read_region(path)
        entries = {p.address for p in self.info.probes if p.kind == "entry"}
        self._paired = entries & {p.address for p in self.info.probes if p.kind == "return"}
        self.ref_ticks, self.ref_ns, self.hz = struct.unpack_from("<QQQ", hdr,
                                                                  R.OFF_CLOCK_REF_TICKS)
        self.next = 0  # next position to deliver
        self.delivered = 0
        self._waiting = 0  # polls that found the record at `next` unfinished
        self._waiting_since = 0.0  # when the first of them did
        self._gap = False  # positions lost since the last event delivered
        self.overrun = 0  # of the positions lost, those a later lap took over (ring full)

    @property
    def has_ring(self) -> bool:
        return bool(self.ring and self.entries)

    def head(self) -> int:
        return struct.unpack_from("<Q", self.map, self.ring + R.RING_HEAD)[0]

    def dropped(self) -> int:
        return struct.unpack_from("<Q", self.map, self.ring + R.RING_DROPPED)[0]

    def lost(self) -> int:
        return self.head() - self.delivered

    def was_full(self) -> bool:
        """Whether any event was lost for want of room (overwritten by a later lap, or
        dropped by its writer); the others were never finished: their thread stopped
        in the middle (killed, or the process exited)."""
        return bool(self.overrun or self.dropped())

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
        events: List[Event] = []
        head = self.head()
        while self.next < head:
            if head - self.next > self.entries:  # lapped: overwritten before we came
                self.overrun += head - self.entries - self.next
                self.next = head - self.entries
                self._gap = True
            if not self._read_span(head, final, events):
                break
        return events

    def _read_span(self, head: int, final: bool, events: List[Event]) -> bool:
        """Deliver positions from `next` up to `head` or the ring's end, whichever
        comes first. False when a record still being written stops us; True with
        `next` short of that when a record was published while it was copied.

        A batched seqlock: every sequence is read before the records are copied
        and again after. A record is delivered only when both reads show it
        complete for this position; sequences only grow, so nothing wrote it in
        between, and the copy is neither torn nor a later lap's event."""
        pos = self.next
        index = pos % self.entries
        count = min(head - pos, self.entries - index)
        first = (self.ring + R.RING_RECORDS + index * R.RECORD_SIZE) // 8
        before = self.sequences(first, count)
        copy = self._words[first:first + count * _WORDS_PER_RECORD].tobytes()
        after = self.sequences(first, count)
        probes = self.info.probes
        for i, record in enumerate(_RECORD.iter_unpack(copy)):
            want = 2 * (pos + i) + 2
            if before[i] != want or after[i] != want:
                if before[i] < want == after[i]:  # published while we copied: copy again
                    self.next = pos + i
                    return True
                if before[i] < want and after[i] < want and not final \
                        and not self._stale():
                    self._waiting += 1  # still being written: look again next poll
                    self.next = pos + i
                    return False
                self._waiting = 0  # overwritten, dropped, or never finished: lost
                self._gap = True
                self.overrun += before[i] > want or after[i] > want
                continue
            self._waiting = 0
            _, ticks, probe, tid, nargs = record[:5]
            p = probes[probe] if probe < len(probes) else None
            events.append(Event(self.info.pid, self.info.object, p.name if p else str(probe),
                                p.kind if p else "?", self._ns(ticks), tid,
                                list(record[5:5 + min(nargs, R.MAX_ARGS)]),
                                p.address if p else 0,
                                bool(p) and p.kind in ("entry", "return")
                                and p.address in self._paired, self._gap, probe))
            self._gap = False
            self.delivered += 1
        self.next = pos + count
        return True

    def sequences(self, first: int, count: int) -> List[int]:
        """The sequences of `count` records from word `first` on."""
        sequences = self._words[first:first + count * _WORDS_PER_RECORD:_WORDS_PER_RECORD]
        try:
            return sequences.tolist()
        finally:
            sequences.release()

    def _stale(self) -> bool:
        """Whether the unfinished record at `next` has been waited for long enough
        (the first poll that finds it unfinished starts the wait)."""
        if self._waiting == 0:
            self._waiting_since = self.clock()
        return self._waiting >= self.STALE_POLLS and \
            self.clock() - self._waiting_since >= self.STALE_SECONDS

    def close(self) -> None:
        self._words.release()
        self.map.close()


def open_ring(path: str) -> Optional[RingReader]:
    """A reader for the region at `path`, or None while it is not set up yet."""
    try:
        reader = RingReader(path)
    except (OSError, ValueError, R.RegionError):
        return None
    return reader
