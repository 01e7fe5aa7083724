"""The trace reader's handling of a record claimed but not yet published.

A writer claims a position, then fills and publishes its record. A writer
descheduled in between (a busy machine; threads under qemu) leaves the record
unfinished for a while: the reader must wait for it rather than count it lost,
and give it up only when it stays unfinished for long (its writer died).
These regions are made by hand: a template as the runtime copies it, with a ring.
"""

from __future__ import annotations

import struct

from urewrite.trampolines import region as R
from urewrite.trampolines.ring import RingReader

ENTRIES = 16


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_region(path) -> None:
    template, layout = R.build_template([R.ProbeInfo("f", 0, 0x1000)], "app", b"\x01" * 20, 62)
    data = bytearray(template.ljust(layout.region_size, b"\0"))
    ring = len(data)
    data += bytes(R.RING_RECORDS + ENTRIES * R.RECORD_SIZE)
    struct.pack_into("<QI", data, R.OFF_RING, ring, ENTRIES)
    struct.pack_into("<Q", data, R.OFF_REGION_SIZE, len(data))
    path.write_bytes(bytes(data))


def claim(path, head: int) -> None:
    """Writers have claimed positions up to `head`."""
    with open(path, "r+b") as f:
        f.seek(_ring(path) + R.RING_HEAD)
        f.write(struct.pack("<Q", head))


def publish(path, pos: int, arg: int) -> None:
    """The record at `pos`, complete: sequence 2 * pos + 2, probe 0, one argument."""
    with open(path, "r+b") as f:
        f.seek(_ring(path) + R.RING_RECORDS + pos % ENTRIES * R.RECORD_SIZE)
        f.write(struct.pack("<QQIIIxxxxq", 2 * pos + 2, 0, 0, 7, 1, arg))


def _ring(path) -> int:
    with open(path, "rb") as f:
        f.seek(R.OFF_RING)
        return struct.unpack("<Q", f.read(8))[0]


def reader(path, clock: Clock) -> RingReader:
    ring = RingReader(str(path))
    ring.clock = clock
    return ring


def ring_with_a_gap(tmp_path) -> tuple:
    """(path, clock, reader) of a ring whose positions 0 and 2 are published, and 1
    claimed but not yet: its writer was descheduled, or died."""
    path, clock = tmp_path / "r", Clock()
    make_region(path)
    ring = reader(path, clock)
    claim(path, 3)
    publish(path, 0, 10)
    publish(path, 2, 12)
    return path, clock, ring


def test_a_record_finished_late_is_delivered_in_order_not_lost(tmp_path):
    path, clock, ring = ring_with_a_gap(tmp_path)
    assert [e.args for e in ring.poll()] == [[10]]
    for _ in range(10):  # many polls, well within the wait: nothing given up
        clock.now += 0.05
        assert ring.poll() == []
    publish(path, 1, 11)
    events = ring.poll()
    assert [(e.args, e.after_loss) for e in events] == [([11], False), ([12], False)]
    assert ring.lost() == 0


def test_a_record_never_finished_is_given_up_after_a_while(tmp_path):
    path, clock, ring = ring_with_a_gap(tmp_path)
    assert [e.args for e in ring.poll()] == [[10]]
    for _ in range(5):  # polls in quick succession: not long enough
        assert ring.poll() == []
    clock.now += RingReader.STALE_SECONDS
    events = ring.poll()
    assert [(e.args, e.after_loss) for e in events] == [([12], True)]
    assert ring.lost() == 1


def test_the_last_poll_gives_up_what_is_unfinished_at_once(tmp_path):
    path, clock = tmp_path / "r", Clock()
    make_region(path)
    ring = reader(path, clock)
    claim(path, 2)
    publish(path, 1, 11)
    assert ring.poll() == []
    assert [e.args for e in ring.poll(final=True)] == [[11]]
    assert ring.lost() == 1


def test_a_record_published_while_the_reader_copies_it_is_delivered(tmp_path):
    # the reader reads every sequence before its copy and again after: a record
    # finished in between is complete by the second read, and must not count as lost
    path, _, ring = ring_with_a_gap(tmp_path)
    reads = []
    sequences = ring.sequences

    def publishing_meanwhile(first, count):
        reads.append(first)
        if len(reads) == 1:
            found = sequences(first, count)
            publish(path, 1, 11)  # its writer finishes while the records are copied
            return found
        return sequences(first, count)

    ring.sequences = publishing_meanwhile
    events = ring.poll()
    assert [(e.args, e.after_loss) for e in events] == [([10], False), ([11], False),
                                                      ([12], False)]
    assert ring.lost() == 0


def test_a_reader_opened_while_the_region_is_set_up_waits_for_its_ring(tmp_path, monkeypatch):
    # set-up copies the header, then writes the pid, ..., and the ring last: a reader
    # that read the header before the ring could name every event with pid 0
    path = tmp_path / "r"
    make_region(path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<QI", data, R.OFF_RING, 0, 0)  # set-up under way: no ring yet
    path.write_bytes(bytes(data))
    read_region = R.read_region

    def setup_finishing_meanwhile(p):
        found = read_region(p)
        make_region(path)  # the rest of set-up, the ring last
        with open(path, "r+b") as f:
            f.seek(R.OFF_PID)
            f.write(struct.pack("<I", 4242))
        return found

    monkeypatch.setattr(R, "read_region", setup_finishing_meanwhile)
    ring = RingReader(str(path))
    assert not ring.has_ring  # (so the tracer opens it again later)
    ring.close()
    monkeypatch.setattr(R, "read_region", read_region)
    ring = RingReader(str(path))
    assert ring.has_ring and ring.info.pid == 4242


def test_why_events_were_lost_is_told_apart(tmp_path):
    from urewrite.commands import loss_message
    from urewrite.reader.tracing import RingSummary
    # never finished (its thread stopped in the middle): no lap took the ring over
    _, _, ring = ring_with_a_gap(tmp_path)
    ring.poll(final=True)
    assert ring.lost() == 1 and not ring.was_full()
    # lapped: the writers went round the ring before the reader came
    path = tmp_path / "lapped"
    make_region(path)
    ring = reader(path, Clock())
    claim(path, ENTRIES + 4)
    for pos in range(4, ENTRIES + 4):
        publish(path, pos, pos)
    assert [e.args for e in ring.poll()] == [[pos] for pos in range(4, ENTRIES + 4)]
    assert ring.lost() == 4 and ring.was_full()
    full, unfinished = (RingSummary("app", 7, 20, 4, full) for full in (True, False))
    assert loss_message(full).endswith("4 of 20 events lost: the ring was full; try a "
                                       "larger --ring")
    assert loss_message(unfinished).endswith("4 of 20 events lost: their threads stopped "
                                             "while writing them (killed, or the process "
                                             "exited)")
