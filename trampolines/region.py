"""The shared-memory region: one file per process and rewritten object.

The layout is documented for third parties in urewrite.h beside this file and
in docs/region.md; this module is its single source of truth in Python. The
rewriter builds the fixed part (header, probe table, names) as a template that
the runtime copies into the region at set-up; readers sum the counters.

    header (512 bytes)
    probe table: probe_count x {u64 address, u32 kind, u32 name_offset}
    names: NUL-terminated strings
    owner table: slot_count x {u64 thread_pointer, u64 counters_address, u32 tid, ...}
    counters: (slot_count + 1) x slot_stride bytes, u64 per probe;
              the last row is shared and only ever updated atomically
    ring (only under `urewrite trace`): {u64 head, u64 dropped, ...} then
              ring_entries records of RECORD_SIZE bytes
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import List, Optional

MAGIC = b"UREWRITE"
VERSION = 2
HEADER_SIZE = 512
PROBE_ENTRY_SIZE = 16
OWNER_ENTRY_SIZE = 32
SLOT_COUNT = 256  # per-thread counter rows; a power of two (the hit path masks a hash)
FILE_SUFFIX = ".ure"
ENV_VAR = "UREWRITE_DIR"
TRACE_ENV_VAR = "UREWRITE_TRACE"  # ring entries: set, the region gets an event ring
# set (to anything but "0"): functions probed at entry and return are timed, each call
# two clock reads (stat --latency); unset, their probes only count
LATENCY_ENV_VAR = "UREWRITE_LATENCY"
FLAG_LATENCY = 1  # header flags: the calls of functions probed at entry and return are timed
# header flags, set in the template: the runtime sets FLAG_LATENCY only when asked (a file
# rewritten before it sets neither, and times every call)
FLAG_LATENCY_ASKED = 2

KIND_ENTRY, KIND_RETURN, KIND_USDT, KIND_ADDRESS = 1, 2, 3, 4
KIND_NAMES = {KIND_ENTRY: "entry", KIND_RETURN: "return", KIND_USDT: "usdt",
              KIND_ADDRESS: "address"}  # address: an instruction inside a function

# Header field offsets, shared with the runtime's assembly source.
OFF_MAGIC = 0
OFF_VERSION = 8
OFF_HEADER_SIZE = 12
OFF_REGION_SIZE = 16
OFF_PROBE_COUNT = 24
OFF_SLOT_COUNT = 28
OFF_PROBES = 32
OFF_STRINGS = 40
OFF_OWNERS = 48
OFF_COUNTERS = 56
OFF_SLOT_STRIDE = 64
OFF_PID = 72
OFF_MACHINE = 76
OFF_LOAD_BIAS = 80
OFF_BUILD_ID_SIZE = 88
OFF_FLAGS = 92
OFF_BUILD_ID = 96
OFF_OBJECT = 128
OBJECT_NAME_MAX = 255
# version 2: the event ring and its clock
OFF_RING = 384
OFF_RING_ENTRIES = 392
OFF_RECORD_SIZE = 396
OFF_CLOCK_REF_TICKS = 400
OFF_CLOCK_REF_NS = 408
OFF_CLOCK_HZ = 416
OFF_CLOCK_KIND = 424
OFF_LATENCY_COUNT = 428  # histograms per row (functions probed at entry and return)
OFF_NS_MULT = 432  # nanoseconds per clock tick, 32.32 fixed point
# calls whose return address could not be redirected: their returns went uncounted
OFF_RETURNS_MISSED = 440
# returns of functions measured for latency that gave no sample (their entry was
# not on the thread's stack of open calls: it was full, or another thread's)
OFF_LATENCY_MISSED = 448
# a Go program's open calls measured for latency, keyed by goroutine (docs/region.md,
# "Latency histograms"): where the table starts (0: none) and its entries
OFF_GO_CALLS = 456
OFF_GO_CALL_COUNT = 464
CLOCK_TSC, CLOCK_CNTVCT = 1, 2
# x86_64: the TSC's rate, measured by the first process of a region directory, for the
# others (docs/region.md): magic, u64 ticks per second, u64 ticks and u64 ns of a pair
CLOCK_FILE = "tsc.clock"
CLOCK_FILE_MAGIC = b"URWCLOCK"
CLOCK_FILE_FORMAT = struct.Struct("<8sQQQ")

# Latency: in each row, after the counters, LATENCY_BUCKETS u64 per histogram
# (bucket 0: under 1 ns; bucket k: [2^(k-1), 2^k) ns), then the thread's stack of
# open calls: u64 depth, then LATENCY_DEPTH entries of {u64 site rsp, u64 ticks}.
LATENCY_BUCKETS = 64
LATENCY_DEPTH = 126
LATENCY_STACK_SIZE = 8 + 8 + 16 * LATENCY_DEPTH  # depth, pad, entries
# Go code: open calls in one table of the region, keyed by (g, stack.hi - sp), since a
# goroutine moves between threads and its stack moves as it grows. Entries of
# {u64 g (0: never used, 1: free again), u64 stack.hi - sp, u64 ticks, pad}, a call's
# place found from a hash of its key within GO_CALL_PROBES entries.
GO_CALLS = 1 << 16  # (a recursion 20,000 deep takes a third of them)
GO_CALL_SIZE = 32
GO_CALL_PROBES = 32
KIND_MASK = 0xFF  # a probe's kind field: kind in the low byte, histogram + 1 in bits 16-31,
ARGUMENTS_SHIFT = 8  # and 1 + the values its events carry in bits 8-15 (0: not said)
MAX_HISTOGRAMS = 0xFFFF  # (histogram + 1 fits in those 16 bits)

# owner entry: thread pointer, counter row address, kernel thread id, and where the
# thread's libc keeps its id (i32, from the thread pointer; 0: unknown): runtime state
OWNER_TID = 16
OWNER_TID_AT = 20
# After the owner table, a thread name (comm, NUL-padded) per entry, runtime state: what
# a probe program's `comm` reads, learnt on the thread's first need (prctl PR_GET_NAME).
# Entry k's name is at owners_offset + THREAD_NAMES + k * COMM_SIZE.
COMM_SIZE = 16
THREAD_NAMES = OWNER_ENTRY_SIZE * SLOT_COUNT
assert 2 * COMM_SIZE == OWNER_ENTRY_SIZE  # (the runtime halves an entry's offset)

# A thread's owner entry: its thread pointer times HASH_MULTIPLIER (mod 2^64),
# (>> SLOT_SHIFT) & SLOT_MASK, is the entry's byte offset in the owner table: the
# top bits of the product pick one of SLOT_COUNT entries of OWNER_ENTRY_SIZE bytes.
HASH_MULTIPLIER = 0x9E3779B97F4A7C15
_SLOT_BITS = SLOT_COUNT.bit_length() - 1
_ENTRY_BITS = OWNER_ENTRY_SIZE.bit_length() - 1
assert 1 << _SLOT_BITS == SLOT_COUNT and 1 << _ENTRY_BITS == OWNER_ENTRY_SIZE
SLOT_SHIFT = 64 - _SLOT_BITS - _ENTRY_BITS
SLOT_MASK = (SLOT_COUNT - 1) * OWNER_ENTRY_SIZE
# A thread whose entry another thread owns looks at the next entries (wrapping),
# this many in all, for its own or a free one; then it counts in the shared row.
OWNER_PROBES = 8

# the ring: a control line, then records
RING_HEAD, RING_DROPPED, RING_RECORDS = 0, 8, 64
RECORD_SIZE = 128
REC_SEQ, REC_TICKS, REC_PROBE, REC_TID, REC_NARGS, REC_ARGS = 0, 8, 16, 20, 24, 32
MAX_ARGS = 12  # (RECORD_SIZE - REC_ARGS) / 8: as many as sdt.h gives a probe
RING_MIN, RING_MAX, RING_DEFAULT = 16, 1 << 22, 1 << 16

_HEADER = struct.Struct("<8sIIQIIQQQQQiIqII32s256sQIIQQQIIQQQQI")
assert _HEADER.size == 468


def _align(value: int, to: int) -> int:
    return (value + to - 1) & -to


@dataclass(frozen=True)
class ProbeInfo:
    name: str
    kind: int
    address: int
    histogram: int = -1  # a return probe's latency histogram, -1 when none
    arguments: int = -1  # the values its events carry (a return probe's: 1), -1: not said


@dataclass(frozen=True)
class Layout:
    probe_count: int
    probes_offset: int
    strings_offset: int
    owners_offset: int
    counters_offset: int
    slot_stride: int
    region_size: int
    slot_count: int = SLOT_COUNT
    go_calls_offset: int = 0  # the Go program's table of open calls, 0 when none


def histograms(probes: List[ProbeInfo]) -> int:
    return sum(1 for p in probes if p.histogram >= 0)


def row_bytes(probe_count: int, histogram_count: int) -> int:
    """Counters, then histograms and the stack of open calls when there are any."""
    size = 8 * probe_count
    if histogram_count:
        size += 8 * LATENCY_BUCKETS * histogram_count + LATENCY_STACK_SIZE
    return size


def layout_for(probes: List[ProbeInfo], go_program: bool = False) -> Layout:
    """`go_program`: a Go program measuring latency gets its table of open calls."""
    names_size = sum(len(p.name.encode()) + 1 for p in probes)
    probes_offset = HEADER_SIZE
    strings_offset = probes_offset + PROBE_ENTRY_SIZE * len(probes)
    owners_offset = _align(strings_offset + names_size, 64)
    counters_offset = _align(owners_offset + (OWNER_ENTRY_SIZE + COMM_SIZE) * SLOT_COUNT, 64)
    stride = _align(max(row_bytes(len(probes), histograms(probes)), 8), 64)
    size = _align(counters_offset + stride * (SLOT_COUNT + 1), 4096)
    go_calls = 0
    if go_program and histograms(probes):
        go_calls, size = size, size + GO_CALLS * GO_CALL_SIZE
    return Layout(len(probes), probes_offset, strings_offset, owners_offset,
                  counters_offset, stride, size, go_calls_offset=go_calls)


def build_template(probes: List[ProbeInfo], object_name: str, build_id: bytes,
                   machine: int, go_program: bool = False) -> tuple:
    """The header, probe table and names, as the runtime copies them: (bytes, Layout)."""
    layout = layout_for(probes, go_program)
    name = object_name.encode()[:OBJECT_NAME_MAX].decode(errors="ignore").encode()
    header = _HEADER.pack(MAGIC, VERSION, HEADER_SIZE, layout.region_size, len(probes),
                          SLOT_COUNT, layout.probes_offset, layout.strings_offset,
                          layout.owners_offset, layout.counters_offset, layout.slot_stride,
                          0, machine, 0, len(build_id[:32]), FLAG_LATENCY_ASKED, build_id[:32],
                          name,
                          0, 0, RECORD_SIZE, 0, 0, 0, 0, histograms(probes), 0, 0, 0,
                          layout.go_calls_offset,
                          GO_CALLS if layout.go_calls_offset else 0)
    out = bytearray(header.ljust(HEADER_SIZE, b"\0"))
    names = bytearray()
    for probe in probes:
        kind = probe.kind | ((probe.histogram + 1) << 16 if probe.histogram >= 0 else 0)
        if probe.arguments >= 0:
            kind |= (probe.arguments + 1) << ARGUMENTS_SHIFT
        out += struct.pack("<QII", probe.address, kind, len(names))
        names += probe.name.encode() + b"\0"
    out += names
    return bytes(out), layout


@dataclass
class ProbeCount:
    name: str
    kind: str
    address: int
    hits: int
    histogram: Optional[List[int]] = None  # latency: count per log2 bucket of ns


@dataclass
class Region:
    path: str
    pid: int
    object: str
    build_id: str
    load_bias: int
    machine: int
    probes: List[ProbeCount] = field(default_factory=list)
    threads: int = 0  # per-thread slots in use
    returns_missed: int = 0  # calls not redirected: their returns went uncounted
    latency_missed: int = 0  # returns of measured functions that gave no latency sample
    timed: bool = False  # its calls of functions probed at entry and return were timed
    # the probe table its probes were read with (region_reader.ProbeTable, shared by the
    # regions of one rewrite), or None
    table: object = field(default=None, repr=False, compare=False)
    # its probes' hits in the table's order where the reader left `probes` to be made
    # when needed (region_reader.probes_made), else None
    hits: Optional[List[int]] = field(default=None, repr=False, compare=False)


class RegionError(Exception):
    pass


def timed(header) -> bool:
    """Whether a region's process timed the calls of functions probed at entry and
    return: latency asked for, or a file rewritten before calls were timed only when
    asked (its runtime times them all). Else its histograms hold nothing."""
    flags = struct.unpack_from("<I", header, OFF_FLAGS)[0]
    return bool(flags & FLAG_LATENCY or not flags & FLAG_LATENCY_ASKED)


def read_region(path: str) -> Region:
    """Read one region file and sum each probe's counters over all rows."""
    from urewrite.trampolines import region_reader
    return region_reader.to_region(region_reader.read_counts_of(path,
                                                                region_reader.TableCache()))


def template_probe_names(template: bytes) -> List[str]:
    """The probe names of a region template, the header, probe table and names a
    rewritten file carries (its .urewrite.rodata section); [] if it is not one."""
    return [name for name, _, _ in template_probes(template)]


def template_probe_arguments(template: bytes) -> List[int]:
    """The values each probe's events carry, by probe number (-1: the file does not
    say: a rewrite of an earlier urewrite); [] if it is not a template."""
    try:
        if template[:8] != MAGIC:
            return []
        count, = struct.unpack_from("<I", template, OFF_PROBE_COUNT)
        probes_off, = struct.unpack_from("<Q", template, OFF_PROBES)
        kinds = [struct.unpack_from("<I", template, probes_off + i * PROBE_ENTRY_SIZE + 8)[0]
                 for i in range(count)]
        return [((kind >> ARGUMENTS_SHIFT) & 0xFF) - 1 for kind in kinds]
    except struct.error:
        return []


def template_probes(template: bytes) -> List[tuple]:
    """(name, kind, address) of each probe of a region template, by probe number;
    [] if it is not one."""
    try:
        if template[:8] != MAGIC:
            return []
        count, = struct.unpack_from("<I", template, OFF_PROBE_COUNT)
        probes_off, strings_off = struct.unpack_from("<QQ", template, OFF_PROBES)
        probes = []
        for i in range(count):
            address, kind, name_off = struct.unpack_from("<QII", template,
                                                         probes_off + i * PROBE_ENTRY_SIZE)
            start = strings_off + name_off
            name = template[start:template.index(b"\0", start)].decode(errors="replace")
            probes.append((name, kind & KIND_MASK, address))
        return probes
    except (struct.error, ValueError):
        return []


def read_regions(directory: str, problems: Optional[List[str]] = None) -> List[Region]:
    """Every region a run left in `directory`, in a stable order.

    A file that cannot be read (a process killed during set-up, say) is skipped
    and described in `problems` when given, else raises RegionError.
    """
    from urewrite.trampolines import region_reader
    tables = region_reader.TableCache()
    regions = []
    for path in region_reader.region_paths(directory):
        try:
            regions.append(region_reader.to_region(region_reader.read_counts_of(path, tables)))
        except RegionError as e:
            if problems is None:
                raise
            problems.append(str(e))
    return regions
