"""The `.urewrite.live` section: where a rewritten object keeps its process state.

A live tracer (`urewrite stat -p PID`) arms a running process by writing into
the state memory of each rewritten object it maps (reader/arming.py). The rewriter
writes this small descriptor into every output as a non-allocated section, so
the tracer can find that memory from the file alone: link-time addresses (plus
the load bias it reads from /proc/PID/maps) and the offsets of the fields it
writes. The offsets come from the backend (`Backend.live_state`), so the
format is the same for every architecture.

    magic "URWLIVE\\0", u32 version, u32 e_machine,
    u64 link_table  (the runtime's first word holds this address: a check)
    u64 state, u64 state_size, u64 semaphores (count, then their addresses)
    u32 offsets into the state memory, in FIELDS order
    char tag[64]    the region file names' prefix, NUL-padded
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Dict, Optional

SECTION = ".urewrite.live"
MAGIC = b"URWLIVE\0"
VERSION = 2  # 2 added latency; 1 (files rewritten before it) is read too
# region: the state word (0 not set up, 1 disarmed, else the region's address);
# setup_lock: the thread setting up (0: none); started: environment read;
# dir_too_long: the environment's value was too long; ring_entries: events asked
# for (0: no ring); dir: the region directory (dir_max bytes and a NUL);
# name: the region file name the runtime last made; latency: a byte, 1 when calls
# are to be timed (version 1's runtime times them always and has no such byte).
FIELDS = ("region", "setup_lock", "started", "dir_too_long", "ring_entries", "dir",
          "dir_max", "name", "latency")
FIELDS_BY_VERSION = {1: FIELDS[:-1], 2: FIELDS}
TAG_SIZE = 64
_HEAD = struct.Struct("<8sIIQQQQ")
_OFFSETS = struct.Struct(f"<{len(FIELDS)}I")
SIZE = _HEAD.size + _OFFSETS.size + TAG_SIZE


@dataclass(frozen=True)
class LiveNote:
    machine: int
    link_table: int
    state: int
    state_size: int
    semaphores: int
    offsets: Dict[str, int]
    tag: str
    # not in the descriptor: the first PT_LOAD's address minus its file offset, so a
    # reader turns where /proc/PID/maps shows file offset 0 into the load bias
    file_delta: int = 0


def build(machine: int, link_table: int, state: int, state_size: int, semaphores: int,
          offsets: Dict[str, int], tag: str) -> bytes:
    if set(offsets) != set(FIELDS):
        raise AssertionError(f"live state offsets: {sorted(offsets)}")
    raw_tag = tag.encode()
    if len(raw_tag) >= TAG_SIZE:
        raise AssertionError(f"file tag too long: {tag}")
    return (_HEAD.pack(MAGIC, VERSION, machine, link_table, state, state_size, semaphores)
            + _OFFSETS.pack(*(offsets[f] for f in FIELDS)) + raw_tag.ljust(TAG_SIZE, b"\0"))


def parse(data: bytes) -> Optional[LiveNote]:
    """The descriptor, or None when `data` is not one this version knows."""
    if len(data) < _HEAD.size:
        return None
    magic, version, machine, link_table, state, state_size, semaphores = \
        _HEAD.unpack_from(data)
    fields = FIELDS_BY_VERSION.get(version)
    if magic != MAGIC or fields is None:
        return None
    offsets_layout = struct.Struct(f"<{len(fields)}I")
    end = _HEAD.size + offsets_layout.size + TAG_SIZE
    if len(data) < end:
        return None
    offsets = dict(zip(fields, offsets_layout.unpack_from(data, _HEAD.size)))
    tag = data[_HEAD.size + offsets_layout.size:end].split(b"\0", 1)[0].decode("ascii",
                                                                              "replace")
    return LiveNote(machine, link_table, state, state_size, semaphores, offsets, tag)


def read(path: str) -> Optional[LiveNote]:
    """The descriptor of an ELF file, read from its section headers only. None when
    the file is not a 64-bit little-endian ELF or has no (known) descriptor.
    Raises OSError when the file cannot be read."""
    with open(path, "rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return None
        shoff, = struct.unpack_from("<Q", header, 40)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", header, 58)
        if not shoff or shentsize < 64 or shnum == 0 or shstrndx >= shnum or shnum > 1 << 16:
            return None
        phoff, = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        f.seek(phoff)
        phdrs = f.read(phentsize * phnum) if phentsize >= 56 and phnum < 1 << 12 else b""
        loads = [struct.unpack_from("<IIQQ", phdrs, i * phentsize)
                 for i in range(len(phdrs) // max(phentsize, 1))]
        loads = [(vaddr - offset) for kind, _, offset, vaddr in loads if kind == 1]
        if not loads:
            return None
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        if len(table) < shentsize * shnum:
            return None

        def section(i):
            return struct.unpack_from("<IIQQQQ", table, i * shentsize)  # name, type, flags,
        _, _, _, _, names_at, names_size = section(shstrndx)        # addr, offset, size
        f.seek(names_at)
        names = f.read(min(names_size, 1 << 20))
        wanted = SECTION.encode() + b"\0"
        for i in range(shnum):
            name, _, _, _, offset, size = section(i)
            if names[name:name + len(wanted)] == wanted:
                f.seek(offset)
                note = parse(f.read(min(size, 4096)))
                return note and dataclasses.replace(note, file_delta=loads[0])
    return None
