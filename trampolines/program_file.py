"""The files `urewrite run` leaves in the region directory for a rewritten object's
runtime to map: the code of a probe program, and the maps it updates.

    TAG.program  (mapped read and execute; a regular file of the process's user or
                  root, writable by no one else, or it is not mapped)
        u64 magic, u64 probes (the object's probe count), u64 table offset,
        u64 code offset (page-aligned), u64 code bytes, u64 run (a number of the
        run's, also the maps' second word: a hit runs the code only on the maps of
        its run, whatever a live re-arm is replacing), u64 what the code reads of
        its context beyond the arguments (USES_*: the rest is not filled in), u64 1 +
        the arguments it reads (arg0 .. the highest; the others are not evaluated and
        read 0; 0: all of them), u64 the maps area's bytes (a smaller maps file is
        not mapped), u64 offset and u64 bytes of the area's head (below), u64 the
        offset of the direct table (below; 0: none: every hit takes the trace path),
        table: u64 per probe: 1 + the offset of its function in the code, or 0,
        direct table: u64 per probe: the offset of its direct entry from the table's
        own start, or 0 where the program has no code at the probe (nothing to run),
        the area's head: its first words, as programs/maps.py's initial area has them
    TAG.maps     (programs/maps.py's area: u64 magic, u64 run, ..., as the tracer
                  made it: the maps' shapes for readers; no process writes it)
    maps.RUN.UID.PID  (the same area, each process's own, mapped shared, read and
                  write: the process makes it, 0600, sized, its head written from the
                  program file; RUN is the run's number in decimal, UID the process's
                  user, PID its own. Its own, so that no two processes write one map
                  entry's cache line, and so that a process that changed its user needs
                  nothing of another's. The tracer adds up the run's.)

TAG is the object's region file tag (the .urewrite.rodata template's, as in
TAG.PID.ure). When both are mapped, every hit of the object leaves the counting path
for the program. Where the probe has a direct entry, the trampoline calls it (the
"direct path", arch/*/direct_entry.py: it reads the arguments where the site's
registers are, fills the context and calls the probe's function, with no runtime
routine in between); else, or where the entry finds the point's arguments are not
where it reads them, the trace path's runtime routine calls the function with its
context:

    u64 args[12]     the probe's arguments, as its descriptors say (a return
                     probe's: its return value)
    u64 pid, tid, nsecs (CLOCK_MONOTONIC), maps (the maps area's address)
    char comm[64]    the process's name at set-up, NUL-padded
    u64 event        the runtime's printf() routine: an event of probe number
                     PRINTF_PROBE + N (printf N) in the process's ring, with the values
    u32 probe, kind  a C callback's: the probe's number in its object and its kind,
    u64 name, area   its name (NUL-terminated) and its own area in the maps file,
                     filled in by the callback's stub for the probe (programs/callback.py;
                     trampolines/urewrite.h declares the whole as struct urewrite_context)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Dict, Optional

PROGRAM_SUFFIX = ".program"
MAPS_SUFFIX = ".maps"
# "URWPROG4", little-endian: the runtime maps a program file only with its own magic,
# so that one of an older context (208 bytes, before the callbacks' fields) never runs
# a callback's stub that writes past it (3), and an x86_64 entry never reads the region
# where the binding's place said before it moved into the region word's line (4)
MAGIC = 0x3447_4f52_5057_5255
MAPS_MAGIC = 0x3153_5041_4d57_5255  # "URWMAPS1": the first word of the maps area
OWN_MAPS_PREFIX = "maps."  # maps.RUN.UID.PID: a process's own maps (above)
HEADER = struct.Struct("<12Q")
RUN_AT = 40  # the header's run word
DIRECT_AT = 88  # the header's direct table offset
PAGE = 4096

ARGUMENTS = 12
CTX_ARGS = 0
CTX_PID = 96
CTX_TID = 104
CTX_NSECS = 112
CTX_MAPS = 120
CTX_COMM = 128
COMM_BYTES = 64
CTX_EVENT = 192  # the runtime's routine for printf(): edi = format, rsi = words, rdx = count
# What a C callback's stub for the probe fills in before the callback (programs/callback.py);
# a program's code neither writes nor reads them
CTX_PROBE = 200  # u32 the probe's number in its object, then u32 its kind (region.KIND_*)
CTX_KIND = 204
CTX_NAME = 208  # the probe's name, NUL-terminated
CTX_AREA = 216  # the probe's own area in the maps file (--call-area bytes)
CTX_SIZE = 224
USES_NSECS, USES_TID, USES_COMM = 1, 2, 4  # (maps are always there)
# pid and the printf routine: the trace path fills them in always, a direct entry only
# where these say the code reads them (a program's pid, checked reads, printf; a
# callback: always)
USES_PID, USES_EVENT = 8, 16
# the maps' address (a program's code always reads it), and a C callback's probe
# number, kind and name, its area (made from the maps': USES_AREA comes with USES_MAPS):
# a callback's filled in where its code may read them (Backend.context_read)
USES_MAPS, USES_PROBE, USES_AREA = 32, 64, 128


def context_uses(offsets) -> int:
    """USES_* of the context's words (by offset) that code reads: a program's fields
    (lower.py), or the words a callback's code may load (Backend.context_read)."""
    uses = USES_NSECS * (CTX_NSECS in offsets) | USES_TID * (CTX_TID in offsets) | \
        USES_COMM * any(CTX_COMM <= w < CTX_EVENT for w in offsets) | \
        USES_PID * (CTX_PID in offsets) | USES_EVENT * (CTX_EVENT in offsets) | \
        USES_MAPS * (CTX_MAPS in offsets) | \
        USES_PROBE * bool({CTX_PROBE, CTX_NAME} & set(offsets)) | USES_AREA * (CTX_AREA in offsets)
    return uses | USES_MAPS * bool(uses & USES_AREA)  # (the area is the maps' + offset)
PRINTF_PROBE = 0x7FFF0000  # a printf() event's probe number: this plus the printf's


@dataclass(frozen=True)
class DirectEntry:
    """A probe's direct entry (Backend.direct_entries): how a trampoline's hit runs
    the probe's function without the runtime's trace path."""

    function: int  # the function's offset in the program's code (`void f(context *)`)
    expected: tuple  # ArgSpecs of the probe's arguments as the entry reads them: a
    # point whose descriptors differ takes the trace path
    reads: int  # the arguments the function reads (arg0 .. reads - 1; the rest: 0)
    uses: int  # what else of the context it reads (program_file.USES_*)
    # (argument N, constant, comparison, signed): the function does nothing unless
    # argument N compares so with the constant (a program's leading predicate), or None;
    # (N, place, comparison, True, kind): floating-point register N (lower.py's fcompare)
    predicate: Optional[tuple] = None
    # the registers (by name) the function and what it calls may write
    # (Backend.registers_written), or None: any its calling convention lets it
    writes: Optional[frozenset] = None
    # whether the function needs the stack aligned as its calling convention says (C
    # code); a program's own code does not
    aligned: bool = True


@dataclass(frozen=True)
class BuiltProgram:
    """A program file built into a rewrite (rewriter/segment.py), with the direct
    entries it has, by probe number, each's `function` counted from the file's start:
    a trampoline may do what the entry does itself (Backend.built_in_call)."""

    blob: bytes
    entries: Dict[int, DirectEntry]
    entry_at: Dict[int, int] = None  # each one's direct entry, from the file's start


def build(probe_count: int, code: bytes, entries: Dict[int, int], run: int,
          uses: int = USES_NSECS | USES_TID | USES_COMM, arguments: int = ARGUMENTS,
          maps_head: bytes = b"", maps_bytes: int = 0,
          direct: Optional[Dict[int, int]] = None) -> bytes:
    """The .program file: `entries` maps a probe's number to its function's offset,
    `direct` to its direct entry's (none: no direct table); `maps_head`: the first
    bytes of the maps area (magic, run, ...), of `maps_bytes`."""
    table_offset = HEADER.size
    direct_offset = table_offset + 8 * probe_count if direct is not None else 0
    head_offset = _head_offset(probe_count, direct is not None)
    code_offset = code_start(probe_count, len(maps_head), direct is not None)
    table = [0] * probe_count
    for probe, offset in entries.items():
        table[probe] = offset + 1
    direct_table = [0] * probe_count if direct is not None else []
    for probe, offset in (direct or {}).items():
        direct_table[probe] = code_offset + offset - direct_offset
    head = HEADER.pack(MAGIC, probe_count, table_offset, code_offset, len(code), run, uses,
                       1 + arguments, maps_bytes, head_offset, len(maps_head), direct_offset)
    body = head + struct.pack(f"<{probe_count}Q", *table) + \
        struct.pack(f"<{len(direct_table)}Q", *direct_table) + maps_head
    return body.ljust(code_offset, b"\0") + code


def code_start(probe_count: int, head_bytes: int, direct: bool) -> int:
    """Where build() puts the code in the file: the code may address the header by
    its distance (the direct entries read the run there)."""
    return _page(_head_offset(probe_count, direct) + head_bytes)


def _head_offset(probe_count: int, direct: bool) -> int:
    """Where the maps' head starts: after the header and the table (or two)."""
    return HEADER.size + 8 * probe_count * (1 + direct)


def own_maps_name(run: int, uid: int) -> str:
    """The prefix of the maps files of user `uid`'s processes of run `run`: each is
    this, a dot and its pid (above)."""
    return f"{OWN_MAPS_PREFIX}{run}.{uid}"


def _page(n: int) -> int:
    return (n + PAGE - 1) & ~(PAGE - 1)
